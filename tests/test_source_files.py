"""The original files behind the citations (issue 26): kept at ingest (index folder and
PostgreSQL store), served by id behind access control, sandboxed when opened directly, and
the viewer's JSON computed from them with the loaders the ingest used.

The HTTP tests run `ragchains ingest` and `ragchains serve` as subprocesses, as a user does,
with a keys file of two keys in different groups and one file only one of them may read.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image, ImageDraw, ImageFont

from ragchains.retrievers.indexformat import FILES_DIR, current_generation
from ragchains.retrievers.indexwriter import store_originals
from ragchains.retrievers.pgstore import PostgresStore
from ragchains.retrievers.searchindex import load_index
from ragchains.serving.keys import add_key
from ragchains.serving.sourcefiles import SANDBOX, content_disposition
from tests.browser import open_page
from tests.fixtures.make_office import write_docx, write_pptx, write_xlsx
from tests.fixtures.make_pdf import write_pdf
from tests.servers import ragchains_serve
from tests.test_cli import run

GUIDE = """# Field guide

Intro line about the hedgehog survey.

## Counting hedgehogs

Volunteers count hedgehogs at dusk along the hedgerow transect, twice a month.

## Reporting

Counts go into the shared survey sheet by the end of the week.
"""
SECRET = "# Salary bands\n\nThe quokka salary band for senior staff runs to 118,000.\n"
PRODUCTS = "name,price,notes\nAcorn feeder,12.50,wooden\nBadger gate,40,steel\nCedar box,7,\n"
HOSTILE_HTML = """<!doctype html><html><head><title>Parking rules</title>
<script>document.title='pwned'; localStorage.setItem('pwned','1'); alert('html')</script>
</head><body><main><h1>Parking rules</h1>
<p>Staff park on levels two and three of the garage; level one is kept for visitors.</p>
<svg onload="document.title='pwned'; alert('svg')"><circle r="5"/></svg>
<img src="https://example.invalid/x.png" onerror="alert('img')">
<p>Electric cars charge at the six bays next to the garage entrance.</p>
</main></body></html>
"""
SECURITY = {
    "x-content-type-options": "nosniff",
    "content-security-policy": SANDBOX,
    "cross-origin-resource-policy": "same-origin",
    "cache-control": "private, no-cache",
}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _scan(path: Path) -> Path:
    """A two-page TIFF of printed lines at 150 dpi (OCR reads it in a second or two)."""
    font = ImageFont.load_default(size=36)
    pages = []
    for words in ("Dormouse nest boxes are checked in May.", "Owl pellets are sent to the lab."):
        page = Image.new("L", (1200, 300), 255)
        ImageDraw.Draw(page).text((40, 120), words, fill=0, font=font)
        pages.append(page)
    pages[0].save(path, save_all=True, append_images=pages[1:], dpi=(150, 150))
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("originals") / "src"
    src.mkdir()
    (src / "guide.md").write_text(GUIDE, encoding="utf-8")
    (src / "secret.md").write_text(SECRET, encoding="utf-8")
    (src / "products.csv").write_text(PRODUCTS, encoding="utf-8")
    (src / "parking.html").write_text(HOSTILE_HTML, encoding="utf-8")
    write_docx(src / "onboarding.docx")
    write_pptx(src / "deck.pptx")
    write_xlsx(src / "rates.xlsx")
    write_pdf(src / "report.pdf", ["Hedgerow report page one.", "Page two: the dusk counts."])
    _scan(src / "nests.tif")
    return src


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    path = tmp_path_factory.mktemp("keys") / "keys.toml"
    return {
        "path": str(path),
        "hr": add_key(path, "hana", ["hr"]),
        "eng": add_key(path, "erik", ["eng"]),
    }


@pytest.fixture(scope="module")
def index(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("originals-index") / "index"
    done = run("ingest", corpus, "--index", target, "--access", "src/secret.md=hr", "-q")
    assert done.returncode == 0, done.stderr
    return target


@pytest.fixture(scope="module")
def base(index: Path, keys: dict[str, str]) -> Iterator[str]:
    # /files and /retrieve call no chat model: an upstream that is never called.
    with ragchains_serve(
        "--index",
        str(index),
        RAGCHAINS_KEYS_FILE=keys["path"],
        RAGCHAINS_LLM_PROVIDER="openai",
        RAGCHAINS_OPENAI_BASE_URL="http://127.0.0.1:9/v1",
        RAGCHAINS_OPENAI_API_KEY="unused",
    ) as url:
        yield url


def _get(base: str, key: str, path: str, **kwargs: Any) -> httpx.Response:
    return httpx.get(f"{base}{path}", headers={"X-API-Key": key}, timeout=120, **kwargs)


def _chunks(index: Path) -> dict[str, list[dict[str, Any]]]:
    """Each source's chunks' metadata."""
    loaded = load_index(index)
    try:
        found: dict[str, list[dict[str, Any]]] = {}
        for chunk in loaded.store.iter_chunks():
            found.setdefault(chunk.metadata["source"], []).append(
                {**chunk.metadata, "text": chunk.text}
            )
        return found
    finally:
        loaded.close()


# ----------------------------------------------------------------------------- serving
def test_a_readable_file_is_served_whole_with_its_headers_and_a_hidden_one_is_not_told_of(
    base: str, corpus: Path, keys: dict[str, str]
) -> None:
    guide = _sha(corpus / "guide.md")
    reply = _get(base, keys["eng"], f"/files/{guide}")
    assert reply.status_code == 200
    assert reply.content == (corpus / "guide.md").read_bytes()
    assert reply.headers["content-type"] == "text/markdown; charset=utf-8"
    assert reply.headers["content-disposition"] == (
        "inline; filename=\"guide.md\"; filename*=UTF-8''guide.md"
    )
    assert reply.headers["etag"] == f'"{guide}"'
    for name, value in SECURITY.items():
        assert reply.headers[name] == value, name
    head = httpx.head(f"{base}/files/{guide}", headers={"X-API-Key": keys["eng"]})
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == str(len(reply.content))
    cached = httpx.get(
        f"{base}/files/{guide}", headers={"X-API-Key": keys["eng"], "If-None-Match": f'"{guide}"'}
    )
    assert cached.status_code == 304

    for name, kind in (
        ("report.pdf", "application/pdf"),
        ("nests.tif", "image/tiff"),
        ("products.csv", "text/csv; charset=utf-8"),
        ("parking.html", "text/html; charset=utf-8"),
        ("rates.xlsx", "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"),
    ):
        served = _get(base, keys["eng"], f"/files/{_sha(corpus / name)}")
        assert served.status_code == 200, name
        assert served.headers["content-type"] == kind
        assert served.content == (corpus / name).read_bytes()

    # Hidden from eng, readable by hr; hidden, unknown, malformed: one and the same 404.
    secret = _sha(corpus / "secret.md")
    assert _get(base, keys["hr"], f"/files/{secret}").content == (corpus / "secret.md").read_bytes()
    refusals = [
        _get(base, keys["eng"], f"/files/{secret}"),
        _get(base, keys["eng"], f"/files/{secrets.token_hex(32)}"),
        _get(base, keys["eng"], "/files/not-a-file-id"),
        _get(base, keys["eng"], f"/files/{secret.upper()}"),
        _get(base, keys["eng"], f"/files/{secret}/view"),
        _get(base, keys["eng"], f"/files/{secret}/image?page=1"),
        _get(base, keys["eng"], f"/files/{secrets.token_hex(32)}/view"),
    ]
    for refused in refusals:
        assert refused.status_code == 404
        assert refused.json() == {"detail": "no such file"}
        assert refused.content == refusals[0].content
        assert sorted(set(refused.headers) - {"date"}) == sorted(
            set(refusals[0].headers) - {"date"}
        )
    head = httpx.head(f"{base}/files/{secret}", headers={"X-API-Key": keys["eng"]})
    assert head.status_code == 404
    assert httpx.get(f"{base}/files/{guide}").status_code == 401  # a key is needed


def test_retrieve_sources_carry_the_file_id_and_format(
    base: str, corpus: Path, keys: dict[str, str]
) -> None:
    body = {"input": {"query": "volunteers count hedgehogs at dusk"}}
    reply = httpx.post(
        f"{base}/retrieve/invoke", json=body, headers={"X-API-Key": keys["eng"]}, timeout=120
    )
    assert reply.status_code == 200, reply.text
    docs = reply.json()["output"]
    guide = next(d for d in docs if d["metadata"]["source"] == "src/guide.md")
    assert guide["metadata"]["file_id"] == _sha(corpus / "guide.md")
    assert guide["metadata"]["format"] == "markdown"
    assert all(d["metadata"]["source"] != "src/secret.md" for d in docs)


def test_the_view_of_each_kind_points_where_its_chunks_do(
    base: str, corpus: Path, index: Path, keys: dict[str, str]
) -> None:
    chunks = _chunks(index)
    for name, kind in (
        ("guide.md", "text"),
        ("onboarding.docx", "text"),
        ("deck.pptx", "text"),
        ("parking.html", "text"),
    ):
        file_id = _sha(corpus / name)
        view = _get(base, keys["hr"], f"/files/{file_id}/view")
        assert view.status_code == 200, view.text
        body = view.json()
        assert body["kind"] == kind and body["file_id"] == file_id and body["name"] == name
        assert body["source"] == f"src/{name}"
        assert set(body) == {"file_id", "name", "source", "format", "title", "kind", "parts"}
        parts = body["parts"]
        for chunk in chunks[f"src/{name}"]:
            assert chunk["file_id"] == file_id and chunk["format"] == body["format"]
            where = chunk["location"]
            anchor = chunk["citation"].partition("#")[2]
            # The chunk's span is in exactly one part of its anchor (and slide or section);
            # a table's chunk repeats the table's header lines above the rows it spans.
            span = [
                p["text"][where["start"] : where["end"]]
                for p in parts
                if p["anchor"] == anchor
                and p["slide"] == where.get("slide")
                and p["section"] == where.get("section")
            ]
            assert [t for t in span if t and chunk["text"].endswith(t)], (name, chunk, parts)
            if "|---|" not in chunk["text"]:
                assert chunk["text"] in span, name
    deck = _get(base, keys["hr"], f"/files/{_sha(corpus / 'deck.pptx')}/view").json()
    assert [p["slide"] for p in deck["parts"]] == [1, 2, 3, 4]

    # A PDF: its pages (the viewer draws the bytes itself).
    pdf = _get(base, keys["hr"], f"/files/{_sha(corpus / 'report.pdf')}/view").json()
    assert (pdf["kind"], pdf["pages"], pdf["format"]) == ("pdf", 2, "pdf")
    assert "parts" not in pdf and "table" not in pdf
    pdf_id = _sha(corpus / "report.pdf")
    drawn = _get(base, keys["hr"], f"/files/{pdf_id}/image?page=2")
    assert drawn.status_code == 200 and drawn.content.startswith(b"\x89PNG")
    assert _get(base, keys["hr"], f"/files/{pdf_id}/image?page=3").status_code == 404

    # A CSV: rows by the numbers its chunks cite, the cells as written.
    csv_id = _sha(corpus / "products.csv")
    table = _get(base, keys["hr"], f"/files/{csv_id}/view?row=2&around=1").json()["table"]
    assert table["columns"] == ["name", "price", "notes"] and table["sheets"] == []
    assert table["rows"] == [
        {"row": 1, "cells": ["Acorn feeder", "12.50", "wooden"]},
        {"row": 2, "cells": ["Badger gate", "40", "steel"]},
        {"row": 3, "cells": ["Cedar box", "7", ""]},
    ]
    assert table["total_rows"] == 3 and table["sheet"] is None
    badger = next(c for c in chunks["src/products.csv"] if "Badger" in c["text"])
    assert badger["location"]["row"] == 2
    first = _get(base, keys["hr"], f"/files/{csv_id}/view?around=0").json()["table"]
    assert [r["row"] for r in first["rows"]] == [1]

    # A workbook: each visible sheet by the row numbers the sheet shows.
    xlsx_id = _sha(corpus / "rates.xlsx")
    for chunk in chunks["src/rates.xlsx"]:
        where = chunk["location"]
        shown = _get(
            base,
            keys["hr"],
            f"/files/{xlsx_id}/view",
            params={"row": where["row"], "sheet": where["sheet"], "around": 0},
        ).json()["table"]
        assert shown["sheet"] == where["sheet"]
        assert [r["row"] for r in shown["rows"]] == [where["row"]]
        for column, cell in zip(shown["columns"], shown["rows"][0]["cells"], strict=True):
            if cell:
                assert f"{column}: {cell}" in chunk["text"]
    sheets = _get(base, keys["hr"], f"/files/{xlsx_id}/view").json()["table"]["sheets"]
    assert len(sheets) >= 2 and "Internal" not in sheets  # hidden sheets are left out
    bad = _get(base, keys["hr"], f"/files/{xlsx_id}/view?sheet=Nope")
    assert bad.status_code == 404 and "no sheet 'Nope'" in bad.json()["detail"]
    assert _get(base, keys["hr"], f"/files/{xlsx_id}/view?around=51").status_code == 422


def test_an_image_has_pages_in_the_units_of_its_boxes_and_each_page_as_png(
    base: str, corpus: Path, index: Path, keys: dict[str, str]
) -> None:
    file_id = _sha(corpus / "nests.tif")
    view = _get(base, keys["hr"], f"/files/{file_id}/view").json()
    assert (view["kind"], view["pages"], view["format"]) == ("image", 2, "image")
    assert view["page_sizes"] == [[576.0, 144.0], [576.0, 144.0]]  # 1200x300 px at 150 dpi
    for chunk in _chunks(index)["src/nests.tif"]:
        where = chunk["location"]
        size = view["page_sizes"][where["page"] - 1]
        assert [where["page_width"], where["page_height"]] == size
        for x0, top, x1, bottom in where["boxes"]:
            assert 0 <= x0 < x1 <= size[0] and 0 <= top < bottom <= size[1]
    for page in (1, 2):
        png = _get(base, keys["hr"], f"/files/{file_id}/image?page={page}")
        assert png.status_code == 200 and png.headers["content-type"] == "image/png"
        assert png.content.startswith(b"\x89PNG") and png.headers["x-content-type-options"]
    assert _get(base, keys["hr"], f"/files/{file_id}/image?page=3").status_code == 404
    assert _get(base, keys["hr"], f"/files/{file_id}/image?page=0").status_code == 422


@pytest.mark.browser
def test_an_html_file_opened_directly_runs_nothing(
    base: str, corpus: Path, keys: dict[str, str], browser: Any
) -> None:
    """The CSP's sandbox: the page's script and the SVG's onload never run, and the image
    from elsewhere is not fetched. Chromium says so on the console ("Blocked script
    execution in '…' because the document's frame is sandboxed", "Loading the image '…'
    violates the following Content Security Policy directive"): those are the policy
    working, and allowed. Any other console error (the browser's own /favicon.ico request
    included: the server answers it 204) fails the test."""
    file_id = _sha(corpus / "parking.html")
    context = browser.new_context(extra_http_headers={"X-API-Key": keys["hr"]})
    try:
        dialogs: list[str] = []
        watched = open_page(context, f"{base}/healthz")  # the site's origin: its localStorage
        page = watched.page
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        missing: list[str] = []
        page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
        page.goto(f"{base}/files/{file_id}")
        page.wait_for_load_state("load")
        assert page.locator("h1").inner_text() == "Parking rules"  # rendered, as HTML
        assert page.title() == "Parking rules"
        assert dialogs == []
        # The sandboxed document has an opaque origin: it can reach no storage at all.
        page.goto(f"{base}/healthz")
        assert page.evaluate("() => localStorage.getItem('pwned')") is None
        assert missing == []
        blocked = ("Blocked script execution", "Content Security Policy", "sandboxed")
        others = [e for e in watched.errors if not any(b in e for b in blocked)]
        assert others == [], (others, missing)
        assert any("Blocked script execution" in e for e in watched.errors)  # it was tried
    finally:
        context.close()


# ----------------------------------------------------------------------------- index folder
def test_a_re_ingest_keeps_only_the_originals_its_generation_names(
    tmp_path: Path, ingest_into: Callable[..., Any]
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text(GUIDE, encoding="utf-8")
    (docs / "b.md").write_text(SECRET, encoding="utf-8")
    (docs / "copy.md").write_text(GUIDE, encoding="utf-8")  # the same bytes: one original
    index = tmp_path / "idx"
    ingest_into(docs, index)
    files = index / FILES_DIR
    old_b = _sha(docs / "b.md")
    assert sorted(p.name for p in files.iterdir()) == sorted({_sha(docs / "a.md"), old_b})
    assert (files / old_b).read_bytes() == (docs / "b.md").read_bytes()

    (docs / "b.md").write_text(SECRET + "\nA new line.\n", encoding="utf-8")
    (docs / "copy.md").unlink()
    report = ingest_into(docs, index)
    assert report.updated == ["docs/b.md"]
    assert sorted(p.name for p in files.iterdir()) == sorted(
        {_sha(docs / "a.md"), _sha(docs / "b.md")}
    )
    loaded = load_index(index)
    try:
        assert loaded.original(_sha(docs / "b.md")) == files / _sha(docs / "b.md")
        assert loaded.original(old_b) is None
        assert [r.source for r in loaded.file_records(_sha(docs / "a.md"))] == ["docs/a.md"]
    finally:
        loaded.close()

    # An index written before originals were kept gets them at its next run, however idle.
    for path in files.iterdir():
        path.unlink()
    idle = ingest_into(docs, index)
    assert not idle.changed and len(list(files.iterdir())) == 2


def test_a_file_changed_while_read_or_a_failed_copy_leaves_no_original_under_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ragchains.retrievers.indexwriter as writer

    index = tmp_path / "idx"
    index.mkdir()
    source = tmp_path / "a.md"
    source.write_text(GUIDE, encoding="utf-8")
    recorded = _sha(source)
    source.write_text(GUIDE + "edited after it was hashed\n", encoding="utf-8")
    stored = store_originals(index, {recorded: ("docs/a.md", source)})
    assert stored.added == [] and "changed while it was read" in stored.notes[0]
    assert list((index / FILES_DIR).iterdir()) == []  # neither the copy nor its temporary

    # A copy cut off mid-way (a full disk) leaves nothing under a final name.
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(3 * 1024 * 1024))
    written = 0
    real_write = writer.os.fsync

    def full_disk(fd: int) -> None:
        nonlocal written
        written += 1
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer.os, "fsync", full_disk)
    with pytest.raises(OSError, match="no space left on device"):
        store_originals(index, {_sha(big): ("docs/big.bin", big)})
    monkeypatch.setattr(writer.os, "fsync", real_write)
    assert written == 1 and list((index / FILES_DIR).iterdir()) == []


def test_a_failed_ingest_removes_the_originals_it_stored(
    docs_dir: Path, tmp_path: Path, ingest_into: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import ragchains.retrievers.indexwriter as writer

    index = tmp_path / "idx"
    ingest_into(docs_dir, index)
    before = sorted(p.name for p in (index / FILES_DIR).iterdir())
    generation = current_generation(index)
    (docs_dir / "new.md").write_text(GUIDE, encoding="utf-8")
    real = writer.os.rename

    def no_rename(src: Any, dst: Any) -> None:
        if str(src).endswith(".tmp-gen-") or ".tmp-gen-" in str(src):
            raise OSError(5, "Input/output error")
        real(src, dst)

    monkeypatch.setattr(writer.os, "rename", no_rename)
    with pytest.raises(OSError, match="Input/output error"):
        ingest_into(docs_dir, index)
    monkeypatch.undo()
    assert current_generation(index) == generation
    assert sorted(p.name for p in (index / FILES_DIR).iterdir()) == before


# ----------------------------------------------------------------------------- PostgreSQL
def test_the_store_keeps_serves_and_drops_originals(
    pg_url: str, tmp_path: Path, ingest_into: Callable[..., Any]
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text(GUIDE, encoding="utf-8")
    (docs / "b.md").write_text(SECRET, encoding="utf-8")
    ingest_into(docs, pg_url)
    store = PostgresStore(pg_url)
    try:
        a, b = _sha(docs / "a.md"), _sha(docs / "b.md")
        assert store.original(a) == (docs / "a.md").read_bytes()
        assert [r.source for r in store.file_records(b)] == ["docs/b.md"]
        assert store.missing_originals([a, b]) == set()
        with ragchains_serve(
            "--store",
            pg_url,
            RAGCHAINS_LLM_PROVIDER="openai",
            RAGCHAINS_OPENAI_BASE_URL="http://127.0.0.1:9/v1",
            RAGCHAINS_OPENAI_API_KEY="unused",
        ) as url:
            served = httpx.get(f"{url}/files/{a}", timeout=60)
            assert served.status_code == 200 and served.content == (docs / "a.md").read_bytes()
            assert served.headers["content-security-policy"] == SANDBOX
            view = httpx.get(f"{url}/files/{a}/view", timeout=60).json()
            assert [p["section"] for p in view["parts"]][:2] == [
                "Field guide",
                "Field guide > Counting hedgehogs",
            ]
            assert httpx.get(f"{url}/files/{secrets.token_hex(32)}").status_code == 404

        # b deleted and a replaced: their originals go with them, in the ingest's commit.
        (docs / "b.md").unlink()
        (docs / "a.md").write_text(GUIDE + "\nA late addition.\n", encoding="utf-8")
        ingest_into(docs, pg_url)
        assert store.original(a) is None and store.original(b) is None
        assert store.original(_sha(docs / "a.md")) == (docs / "a.md").read_bytes()
        with store.connection() as conn:
            count = conn.execute(f'SELECT count(*) FROM "{store.schema}".originals').fetchone()
        assert count is not None and count[0] == 1
    finally:
        store.close()


def test_content_disposition_names_any_file_safely() -> None:
    assert content_disposition('Plan "B"; 100%.pdf') == (
        "inline; filename=\"Plan _B__ 100_.pdf\"; filename*=UTF-8''Plan%20%22B%22%3B%20100%25.pdf"
    )
    assert content_disposition("Übersicht.md").endswith("filename*=UTF-8''%C3%9Cbersicht.md")
    assert json.dumps(content_disposition("ü")).isascii()


def test_no_originals_keeps_none_and_a_later_run_keeps_them_again(
    tmp_path: Path, ingest_into: Callable[..., Any]
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text(GUIDE, encoding="utf-8")
    index = tmp_path / "idx"
    ingest_into(docs, index)
    assert len(list((index / FILES_DIR).iterdir())) == 1
    ingest_into(docs, index, originals=False)  # nothing else changed: written all the same
    assert list((index / FILES_DIR).iterdir()) == []
    loaded = load_index(index)
    try:
        assert loaded.manifest["originals"] is False
        assert loaded.original(_sha(docs / "a.md")) is None
    finally:
        loaded.close()
    ingest_into(docs, index)
    assert [p.name for p in (index / FILES_DIR).iterdir()] == [_sha(docs / "a.md")]
    help_text = run("ingest", "--help").stdout
    assert "--no-originals" in help_text
