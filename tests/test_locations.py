"""Every chunk of every format records where it came from, on disk and in PostgreSQL: a page
with its size and the boxes of its text (text-layer PDFs and scans alike), a slide, a sheet and
row, a record's row, a heading path, and its characters within the part."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageDraw, ImageFont
from psycopg import sql

from ragchains.retrievers.location import Location
from ragchains.retrievers.pgstore import PostgresStore
from ragchains.retrievers.searchindex import load_index
from tests.conftest import FIXTURES
from tests.fixtures.make_office import write_docx, write_pptx, write_xlsx
from tests.fixtures.make_pdf import write_pdf
from tests.test_cli import run

pytestmark = pytest.mark.e2e

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
SCANNED = "Visitors sign the register at reception and wear a red lanyard."


def _scan(path: Path, text: str) -> Path:
    """A page of text rendered at 300 dpi, as a flatbed scanner would save it."""
    page = Image.new("L", (2480, 1200), 255)
    ImageDraw.Draw(page).text((200, 300), text, font=ImageFont.truetype(FONT, 48), fill=0)
    page.save(path, dpi=(300, 300))
    return path


# What each format's location must hold besides start and end.
EXPECTED: dict[str, set[str]] = {
    "pdf": {"page", "page_width", "page_height", "boxes"},
    "png": {"page", "page_width", "page_height", "boxes", "ocr_confidence"},
    "docx": {"section"},
    "pptx": {"slide"},
    "xlsx": {"sheet", "row"},
    "csv": {"row"},
    "json": {"row"},
    "jsonl": {"row"},
    "md": {"section"},
    "html": set(),
    "txt": set(),
}


@pytest.fixture(scope="module")
def every_format(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("formats") / "in"
    shutil.copytree(FIXTURES / "docs", folder)
    write_pdf(folder / "manual.pdf", ["Prune the roses in early spring.", "Mulch beds in winter."])
    _scan(folder / "visitors.png", SCANNED)
    write_docx(folder / "handbook.docx")
    write_pptx(folder / "deck.pptx")
    write_xlsx(folder / "prices.xlsx")
    return folder


def _check(metadata: list[dict[str, Any]]) -> None:
    formats = set()
    for meta in metadata:
        suffix = meta["source"].rsplit(".", 1)[-1]
        formats.add(suffix)
        place = meta["location"]
        Location.model_validate(place)  # the shape /retrieve and /ask return
        assert EXPECTED[suffix] | {"start", "end"} <= set(place), (meta["source"], place)
        if "boxes" in place:
            assert place["boxes"], meta["source"]
            for x0, top, x1, bottom in place["boxes"]:
                assert 0 <= x0 < x1 <= place["page_width"] + 1
                assert 0 <= top < bottom <= place["page_height"] + 1
    assert formats == set(EXPECTED)


def test_every_chunk_of_every_format_has_its_location_on_disk(
    every_format: Path, tmp_path: Path
) -> None:
    ingested = run("ingest", every_format, "--index", tmp_path / "idx")
    assert ingested.returncode == 0, ingested.stderr
    index = load_index(tmp_path / "idx")
    _check([chunk.metadata for chunk in index.store.iter_chunks()])
    scanned = [c for c in index.store.iter_chunks() if c.metadata["source"] == "in/visitors.png"]
    assert scanned and "red lanyard" in scanned[0].text
    assert scanned[0].metadata["citation"] == "visitors.png#page=1"


def test_every_chunk_of_every_format_has_its_location_in_postgres(
    every_format: Path, pg_url: str
) -> None:
    ingested = run("ingest", every_format, "--store", pg_url)
    assert ingested.returncode == 0, ingested.stderr
    store = PostgresStore(pg_url)
    try:
        with store.connection() as conn:
            rows = conn.execute(
                sql.SQL("SELECT metadata FROM {}").format(store.table("chunks"))
            ).fetchall()
    finally:
        store.close()
    _check([row[0] for row in rows])
