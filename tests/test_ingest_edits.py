"""Edits of a collection (the documents API's jobs) run through the ingest pipeline: they keep
every file they do not name, label their files with the groups given, record who uploaded
them, read a file again on request, and report their progress page by page; a run over
input folders keeps what was uploaded. For an index folder (the store's run shares the plan:
tests/test_documents_served.py serves both)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from ragchains.factory import run_ingest
from ragchains.ingest.edits import CollectionEdit
from ragchains.ingest.errors import NothingIngestedError
from ragchains.ingest.progress import IngestProgress
from ragchains.ingest.report import SKIPPED, IngestReport, read_ingest_log
from ragchains.ingestjobs import Job
from ragchains.retrievers.searchindex import load_index
from ragchains.settings import Settings
from tests.conftest import FIXTURES
from tests.documents import scanned_pdf


def _files(index: Path) -> dict[str, Any]:
    loaded = load_index(index)
    try:
        return loaded.store.files()
    finally:
        loaded.close()


@pytest.fixture
def collection(tmp_path: Path, settings: Settings, embedder: Any) -> Path:
    docs = tmp_path / "docs"
    shutil.copytree(FIXTURES / "docs", docs)
    index = tmp_path / "index"
    run_ingest(settings, [docs], index, embedder=embedder, progress=False)
    return index


def _edit(settings: Settings, embedder: Any, index: Path, edit: CollectionEdit) -> IngestReport:
    return run_ingest(settings, (), index, embedder=embedder, progress=False, edit=edit)


def test_an_edit_keeps_what_it_does_not_name_and_labels_what_it_adds(
    collection: Path, tmp_path: Path, settings: Settings, embedder: Any
) -> None:
    before = _files(collection)
    note = tmp_path / "staged.md"
    note.write_text("# Parking\n\nVisitors park on level two of the north garage.\n")
    report = _edit(
        settings,
        embedder,
        collection,
        CollectionEdit(
            files={"team/parking.md": note}, groups={"team/parking.md": ("ops",)}, by="eddie"
        ),
    )
    assert report.added == ["team/parking.md"] and not report.removed and report.wrote
    after = _files(collection)
    assert set(after) == set(before) | {"team/parking.md"}
    added = after["team/parking.md"]
    assert added.access == ("ops",) and added.details["uploaded_by"] == "eddie"
    assert added.details["left_out"] == [] and added.details["ingested_at"]
    assert all(after[s].sha256 == before[s].sha256 for s in before)

    # A run over the input folder keeps the upload; an edit removes it.
    mirror = run_ingest(
        settings, [tmp_path / "docs"], collection, embedder=embedder, progress=False
    )
    assert "team/parking.md" not in mirror.removed and "team/parking.md" in _files(collection)
    gone = _edit(
        settings, embedder, collection, CollectionEdit(removes=frozenset({"team/parking.md"}))
    )
    assert gone.removed == ["team/parking.md"] and set(_files(collection)) == set(before)


def test_an_edit_whose_only_file_cannot_be_read_changes_nothing_and_says_why(
    collection: Path, tmp_path: Path, settings: Settings, embedder: Any
) -> None:
    before = _files(collection)
    bad = tmp_path / "broken.pdf"
    bad.write_bytes(b"%PDF-1.7\nnot really a pdf")
    with pytest.raises(NothingIngestedError, match=r"broken\.pdf"):
        _edit(settings, embedder, collection, CollectionEdit(files={"team/broken.pdf": bad}))
    assert _files(collection) == before


def test_a_skipped_file_is_logged_with_its_groups_until_it_is_read(
    collection: Path, tmp_path: Path, settings: Settings, embedder: Any
) -> None:
    good, bad = tmp_path / "good.md", tmp_path / "bad.pdf"
    good.write_text("# Lockers\n\nLockers are emptied every Friday evening.\n")
    bad.write_bytes(b"%PDF-1.7\nbroken")
    report = _edit(
        settings,
        embedder,
        collection,
        CollectionEdit(
            files={"team/good.md": good, "team/bad.pdf": bad},
            groups={"team/good.md": ("ops",), "team/bad.pdf": ("ops",)},
        ),
    )
    assert report.added == ["team/good.md"] and [s.source for s in report.skipped] == [
        "team/bad.pdf"
    ]
    logged = read_ingest_log(collection)[SKIPPED]
    assert logged["team/bad.pdf"]["groups"] == ["ops"] and logged["team/bad.pdf"]["reason"]
    fixed = tmp_path / "fixed.md"
    fixed.write_text("# Lockers, again\n\nThe key is at the front desk.\n")
    _edit(settings, embedder, collection, CollectionEdit(removes=frozenset({"team/bad.pdf"})))
    assert "team/bad.pdf" not in read_ingest_log(collection)[SKIPPED]


def test_reading_again_parses_an_unchanged_file(
    collection: Path, settings: Settings, embedder: Any
) -> None:
    source = "docs/guide.md"
    path = FIXTURES / "docs" / "guide.md"
    plain = _edit(settings, embedder, collection, CollectionEdit(files={source: path}))
    assert plain.unchanged == [source] and not plain.wrote
    again = _edit(
        settings,
        embedder,
        collection,
        CollectionEdit(files={source: path}, read_again=frozenset({source})),
    )
    assert source not in again.added and again.progress.files_done == 1


def test_a_scan_reports_its_pages_as_they_are_read(
    collection: Path, tmp_path: Path, settings: Settings, embedder: Any
) -> None:
    scan = scanned_pdf(tmp_path, pages=3)
    report = IngestReport(index=collection)
    seen: list[dict[str, Any]] = []
    report.progress.on_change = lambda: seen.append(report.progress.snapshot())
    run_ingest(
        settings,
        (),
        collection,
        embedder=embedder,
        progress=False,
        edit=CollectionEdit(files={"scans/three.pdf": scan}),
        report=report,
    )
    percents = [s["percent"] for s in seen]
    assert percents == sorted(percents) and percents[-1] == 100
    # Pages counted before the file was done: a long scan's progress moves.
    assert any(s["files_done"] == 0 and s["pages"] > 0 for s in seen), seen
    assert any(s["files_done"] == 0 and 0 < s["percent"] < 70 for s in seen), seen
    assert seen[-1]["pages"] == 3 and seen[-1]["stage"] == "done"
    record = _files(collection)["scans/three.pdf"]
    assert record.details["pages"] == 3 and record.details["ocr_pages"] == 3
    assert 0.5 < record.details["ocr_confidence"] <= 1

    # A server's job is not done when its run is: it still takes the new index in.
    job = Job(id="j", kind="upload", by="eddie", paths=["scans/three.pdf"], state="running")
    job.progress = report.progress
    shown = job.as_dict()["progress"]
    assert shown["stage"] == "writing" and shown["percent"] < 100, shown
    job.state = "done"
    assert job.as_dict()["progress"]["percent"] == 100


def test_a_page_told_after_its_file_is_read_is_not_counted_twice() -> None:
    # A worker's page messages and its file's result travel apart: the last page's message
    # can come in after the result (CI once counted 4 pages of a 3-page scan).
    progress = IngestProgress()
    progress.reading(1)
    progress.pages_told(
        [("pages", "scan.pdf", 3), ("page", "scan.pdf", 1), ("page", "scan.pdf", 1)]
    )
    progress.file_read("scan.pdf", pages=3, chunks=2)
    progress.pages_told([("page", "scan.pdf", 1)])
    assert progress.pages == 3 and progress.files_done == 1
