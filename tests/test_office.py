"""Word, PowerPoint and Excel files built from known text: each sentence comes back under the
right section, slide or sheet and row, every chunk with its location (index folder, store and
HTTP), and each bad file is skipped or cut with its reason while nothing indexed is lost."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from ragchains.factory import build_retriever
from ragchains.ingest.chunking import Chunker, chunk_file
from ragchains.ingest.loaders import load_file
from ragchains.ingest.parts import LoadOptions, SkipFile
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.indexformat import Chunk
from ragchains.retrievers.searchindex import load_index
from ragchains.settings import Settings
from tests.fixtures.make_office import (
    encrypt_office,
    write_docx,
    write_long_xlsx,
    write_many_parts,
    write_pptx,
    write_xlsx,
    write_zip_bomb,
)
from tests.servers import ragchains_serve
from tests.test_cli import run

TABLE_HEADER = "| Plan | Monthly price | Dental |\n|---|---|---|"


def _chunks(path: Path, embedder: SentenceTransformerEmbedder, **options: object) -> list[Chunk]:
    chunker = Chunker(embedder.count_tokens, chunk_size=200, chunk_overlap=40)
    return chunk_file(f"in/{path.name}", load_file(path, LoadOptions(**options)), chunker)  # type: ignore[arg-type]


def _holding(chunks: list[Chunk], words: str) -> Chunk:
    found = [c for c in chunks if words in c.text]
    assert len(found) == 1, [c.text for c in chunks]
    return found[0]


# ----------------------------------------------------------------------------- Word
def test_word_headings_become_sections_and_tables_stay_tables(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    path = write_docx(tmp_path / "handbook.docx", comment="Check the badge hours with security.")
    chunks = _chunks(path, embedder)
    assert {c.metadata["title"] for c in chunks} == {"Onboarding handbook"}
    assert {c.metadata["author"] for c in chunks} == {"People Team"}
    memory = _holding(chunks, "thirty-two gigabytes")
    assert memory.metadata["citation"] == "handbook.docx#equipment"
    assert memory.metadata["section"] == "Onboarding > Equipment"
    assert "- Monitors are ordered through the facilities desk." in memory.text
    rotated = _holding(chunks, "rotated every ninety days")
    assert rotated.metadata["citation"] == "handbook.docx#passwords"
    assert rotated.metadata["location"]["section"] == "Security > Passwords"
    table = _holding(chunks, "| Standard | $45.00 | No |")
    assert table.text.startswith(TABLE_HEADER)
    # Comments are review remarks, not content: only read when asked.
    assert not any("badge hours" in c.text for c in chunks)
    noted = _holding(_chunks(path, embedder, include_notes=True), "badge hours")
    assert noted.metadata["citation"] == "handbook.docx#notes"
    assert "Comment (Reviewer)" in noted.text


def test_a_long_word_table_is_split_between_rows_under_its_header(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    rows = [["Room", "Floor", "Seats"]] + [
        [f"Room {i}", str(i % 5), str(10 + i)] for i in range(80)
    ]
    path = write_docx(tmp_path / "rooms.docx", [(1, "Meeting rooms")], table=rows)
    chunker = Chunker(embedder.count_tokens, chunk_size=64, chunk_overlap=10)
    loaded = load_file(path)
    table = [c for c in chunk_file("in/rooms.docx", loaded, chunker) if "| Room " in c.text]
    assert len(table) > 3
    header = "| Room | Floor | Seats |\n|---|---|---|\n"
    seen = []
    for chunk in table:
        assert chunk.text.startswith(header)
        assert embedder.count_tokens(chunk.text) <= 64
        body = chunk.text[len(header) :].splitlines()
        seen.extend(body)
        # The location spans the rows in the part's text, without the repeated header.
        part = loaded.parts[-1].text
        place = chunk.metadata["location"]
        assert part[place["start"] : place["end"]] == "\n".join(body)
    assert seen == [f"| Room {i} | {i % 5} | {10 + i} |" for i in range(80)]


# ----------------------------------------------------------------------------- PowerPoint
def test_each_slide_is_a_part_with_its_number_title_table_and_notes(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    chunks = _chunks(write_pptx(tmp_path / "deck.pptx"), embedder)
    assert [c.metadata["citation"] for c in chunks] == [f"deck.pptx#slide={n}" for n in range(1, 5)]
    first = chunks[0]
    assert first.text.splitlines()[0] == "Quarterly review"
    assert "Revenue grew twelve percent" in first.text
    assert "Speaker notes: Thank the sales team." in first.text
    assert first.metadata["slide"] == 1 and first.metadata["location"]["slide"] == 1
    lisbon = _holding(chunks, "Lisbon office")
    assert lisbon.metadata["section"] == "Office move"
    assert TABLE_HEADER in chunks[3].text and "| Plus | $80.00 | Yes |" in chunks[3].text


# ----------------------------------------------------------------------------- Excel
def test_sheet_rows_are_cited_by_sheet_and_row_with_typed_columns(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    path = write_xlsx(tmp_path / "prices.xlsx")
    loaded = load_file(path)
    assert loaded.title == "Sensor prices"
    assert loaded.partial == ["sheet 'Costs' is hidden: left out", "sheet 'Notes' is empty"]
    chunks = chunk_file(
        "in/prices.xlsx", loaded, Chunker(embedder.count_tokens, chunk_size=200, chunk_overlap=40)
    )
    labels = [c.metadata["citation"] for c in chunks]
    # Row numbers as the sheet shows them: two header rows, so data starts at row 3.
    assert labels == [
        "prices.xlsx#sheet=EU&row=3",
        "prices.xlsx#sheet=EU&row=4",
        "prices.xlsx#sheet=EU&row=5",
        "prices.xlsx#sheet=US&row=2",
    ]
    probe = chunks[0]
    # The merged 'Price' header heads both currency columns.
    assert probe.text == "Product: Humidity probe\nPrice EUR: 89\nPrice USD: 95\nIn stock: yes"
    assert probe.metadata["Price EUR"] == 89 and probe.metadata["In stock"] is True
    assert probe.metadata["location"] == {
        "sheet": "EU",
        "row": 3,
        "section": "EU",
        "start": 0,
        "end": len(probe.text),
    }
    # A formula gives the value saved with the file.
    assert chunks[1].metadata["Price USD"] == 132.55
    assert not any("Unit cost" in c.text for c in chunks)  # the hidden sheet


# ----------------------------------------------------------------------------- bad files
def test_bad_office_files_are_refused_with_their_reason(tmp_path: Path) -> None:
    good = write_docx(tmp_path / "good.docx")
    cases = {
        encrypt_office(good, tmp_path / "locked.docx"): (
            "password-protected Word file (encrypted); save a copy without a password"
        ),
        write_zip_bomb(tmp_path / "bomb.docx"): (
            "Word file would unzip to 601 MB, over the cap of 512 MB (a zip bomb?)"
        ),
        write_many_parts(tmp_path / "parts.pptx"): "PowerPoint file has 6,017 parts",
        tmp_path / "cut.xlsx": "corrupt Excel file (not a readable zip archive",
        tmp_path / "sheet.docx": "not a Word document (it holds a .xlsx document)",
    }
    (tmp_path / "cut.xlsx").write_bytes(write_xlsx(tmp_path / "x.xlsx").read_bytes()[:2000])
    shutil.copy(tmp_path / "x.xlsx", tmp_path / "sheet.docx")
    for path, reason in cases.items():
        with pytest.raises(SkipFile) as refused:
            load_file(path)
        assert str(refused.value).startswith(reason), path.name


@pytest.mark.e2e
def test_ingest_reads_office_files_and_keeps_them_through_bad_versions(
    tmp_path: Path, settings: Settings, embedder: SentenceTransformerEmbedder
) -> None:
    """`ragchains ingest` as a user runs it: the files are found by their sentences with the
    right labels; then each is replaced by a bad file, and the run says why and keeps the
    version it had; a workbook over the row cap is cut and the cut is reported."""
    inputs, index = tmp_path / "in", tmp_path / "idx"
    inputs.mkdir()
    write_docx(inputs / "handbook.docx")
    write_pptx(inputs / "deck.pptx")
    write_xlsx(inputs / "prices.xlsx")
    first = run("ingest", inputs, "--index", index)
    assert first.returncode == 0, first.stderr
    assert "3 added, 0 updated, 0 removed, 0 unchanged, 0 skipped" in first.stdout
    assert "partly read in/prices.xlsx: sheet 'Costs' is hidden: left out" in first.stderr

    loaded = load_index(index)
    before = {c.id for c in loaded.store.iter_chunks()}
    for chunk in loaded.store.iter_chunks():
        assert chunk.metadata["location"], chunk.metadata
    retriever = build_retriever(settings, loaded, embedder)
    for question, label in [
        ("How much memory do engineers' laptops have?", "handbook.docx#equipment"),
        ("How often are passwords rotated?", "handbook.docx#passwords"),
        ("When does the Lisbon office move?", "deck.pptx#slide=3"),
        ("How many engineers join the platform group?", "deck.pptx#slide=2"),
        ("What does the rain gauge cost in euros?", "prices.xlsx#sheet=EU&row=5"),
        ("Which warehouse has the wind vane?", "prices.xlsx#sheet=US&row=2"),
    ]:
        top = retriever.invoke(question)[0]
        assert top.metadata["citation"] == label, (question, top.metadata["citation"])

    encrypt_office(write_docx(tmp_path / "plain.docx"), inputs / "handbook.docx")
    (inputs / "deck.pptx").write_bytes((inputs / "deck.pptx").read_bytes()[:1500])
    write_zip_bomb(inputs / "prices.xlsx")
    write_long_xlsx(inputs / "stock.xlsx", 1_000_000)
    second = run("ingest", inputs, "--index", index, env={"RAGCHAINS_MAX_SHEET_ROWS": "40"})
    assert second.returncode == 0, second.stderr
    assert "1 added, 0 updated, 0 removed, 0 unchanged, 3 skipped" in second.stdout
    for line in [
        "skipped in/handbook.docx: password-protected Word file (encrypted); save a copy "
        "without a password (previous version kept)",
        "skipped in/deck.pptx: corrupt PowerPoint file (not a readable zip archive",
        "skipped in/prices.xlsx: Excel file would unzip to 601 MB, over the cap of 512 MB",
        "partly read in/stock.xlsx: sheet 'Stock': kept rows 2-41 of 1,000,001 (the cap is 40 "
        "rows per workbook)",
    ]:
        assert line in second.stderr, second.stderr
    after = load_index(index)
    kept = {c.id for c in after.store.iter_chunks() if c.metadata["source"] != "in/stock.xlsx"}
    assert kept == before
    stock = [c for c in after.store.iter_chunks() if c.metadata["source"] == "in/stock.xlsx"]
    assert len(stock) == 40 and stock[-1].metadata["citation"] == "stock.xlsx#sheet=Stock&row=41"

    nothing = run("ingest", inputs / "handbook.docx", "--index", tmp_path / "fresh")
    assert nothing.returncode == 1 and "nothing could be ingested" in nothing.stderr
    assert not (tmp_path / "fresh").exists() or not any((tmp_path / "fresh").glob("gen-*"))


@pytest.mark.e2e
def test_locations_reach_the_store_and_http_callers(tmp_path: Path, pg_url: str) -> None:
    """Ingested into PostgreSQL and served by `ragchains serve --store`: /retrieve returns
    each document's location, and /ask each source's."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    write_pptx(inputs / "deck.pptx")
    write_xlsx(inputs / "prices.xlsx")
    ingested = run("ingest", inputs, "--store", pg_url)
    assert ingested.returncode == 0, ingested.stderr
    with ragchains_serve("--store", pg_url) as base:
        found = httpx.post(
            f"{base}/retrieve/invoke",
            json={"input": {"query": "When does the Lisbon office move?"}},
            timeout=60,
        )
        assert found.status_code == 200, found.text
        documents = found.json()["output"]
        assert documents and all(d["metadata"]["location"] for d in documents)
        top = documents[0]["metadata"]
        assert top["citation"] == "deck.pptx#slide=3"
        assert top["location"]["slide"] == 3 and top["location"]["section"] == "Office move"
        asked = httpx.post(
            f"{base}/ask/invoke",
            json={"input": {"question": "What does the rain gauge cost in euros?"}},
            timeout=120,
        )
        assert asked.status_code == 200, asked.text
        sources = asked.json()["output"]["sources"]
        rows = [s for s in sources if s["label"] == "prices.xlsx#sheet=EU&row=5"]
        assert rows and rows[0]["location"]["sheet"] == "EU" and rows[0]["location"]["row"] == 5
