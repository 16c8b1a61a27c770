"""The ingestion pipeline: bad files skipped with reasons, incremental re-runs, chunk identity."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from ragchains.ingest.chunking import Chunker
from ragchains.ingest.discovery import discover
from ragchains.ingest.errors import IngestError
from ragchains.ingest.report import IngestReport
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.searchindex import load_index
from tests.fixtures.make_pdf import write_encrypted_pdf, write_pdf

Ingest = Callable[..., IngestReport]


def _reasons(report: IngestReport) -> dict[str, str]:
    return {s.source: s.reason for s in report.skipped}


def _write_bad_files(folder: Path) -> None:
    folder.mkdir()
    (folder / "good.txt").write_text("Plain good text about apple orchards and cider.")
    (folder / "corrupt.pdf").write_bytes(b"%PDF-1.4\n1 0 obj << /Type /Catalog >>\ngarbage\n")
    write_encrypted_pdf(folder / "locked.pdf", "Secret payroll numbers.")
    (folder / "binary.txt").write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00" * 20)
    (folder / "empty.md").write_bytes(b"")
    (folder / "blank.txt").write_text("   \n\n  ")
    (folder / "latin1.txt").write_bytes("Caf\xe9 cr\xe8me br\xfbl\xe9e".encode("latin-1"))
    (folder / "gone.txt").symlink_to(folder / "does-not-exist.txt")
    (folder / "drawing.svg").write_text("<svg/>")


def test_bad_files_are_skipped_with_reasons(tmp_path: Path, ingest_into: Ingest) -> None:
    _write_bad_files(tmp_path / "in")
    report = ingest_into(tmp_path / "in", tmp_path / "idx")
    reasons = _reasons(report)
    assert report.added == ["in/good.txt"]
    assert reasons["in/corrupt.pdf"].startswith("corrupt PDF")
    assert reasons["in/locked.pdf"] == "encrypted PDF (password required)"
    assert reasons["in/binary.txt"].startswith("binary file")
    assert reasons["in/empty.md"] == "empty file"
    assert reasons["in/blank.txt"] == "empty file"
    assert reasons["in/latin1.txt"].startswith("not valid UTF-8 text")
    assert reasons["in/gone.txt"].startswith("unreadable")
    assert reasons["in/drawing.svg"] == "unsupported file type '.svg'"
    assert report.counts()["skipped"] == 8
    index = load_index(tmp_path / "idx")
    assert len(index) == 1


def test_a_loader_crash_is_that_files_reason(
    docs_dir: Path, embedder: SentenceTransformerEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a worker does with a loader that raises (in this process: a worker's loaders are
    its own; tests/test_parse_budgets.py kills real workers)."""
    import ragchains.ingest.loaders as loaders
    from ragchains.ingest import parsing
    from ragchains.ingest.parts import LoadOptions

    def broken(path: Path, options: object) -> None:
        raise ImportError("some parser dependency is missing")

    monkeypatch.setitem(loaders.LOADERS, ".html", broken)
    chunker = Chunker(embedder.token_counter(), chunk_size=64, chunk_overlap=8)
    state = {"chunker": chunker, "options": LoadOptions(), "budget": parsing.ParseBudget()}
    monkeypatch.setattr(parsing, "_worker", state)
    page, text = docs_dir / "page.html", next(docs_dir.glob("*.md"))
    assert parsing._parse(parsing.ParseJob("docs/page.html", page, "0" * 64)) == (
        "could not be parsed (ImportError: some parser dependency is missing)"
    )
    read = parsing._parse(parsing.ParseJob("docs/x.md", text, "0" * 64))
    assert isinstance(read, parsing.Parsed) and read.chunks


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_permission_denied_is_skipped(tmp_path: Path, ingest_into: Ingest) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "ok.txt").write_text("Readable text.")
    locked = folder / "locked.txt"
    locked.write_text("You cannot read me.")
    locked.chmod(0)
    report = ingest_into(folder, tmp_path / "idx")
    assert _reasons(report)["in/locked.txt"].startswith("unreadable")


def test_nothing_ingestable_fails_and_writes_nothing(tmp_path: Path, ingest_into: Ingest) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "empty.txt").write_text("")
    (folder / "binary.txt").write_bytes(b"\x00\x01\x02")
    with pytest.raises(IngestError, match="nothing could be ingested"):
        ingest_into(folder, tmp_path / "idx")
    assert not (tmp_path / "idx").exists()  # no half-made index folder either


def test_missing_input_path_is_an_error(tmp_path: Path, ingest_into: Ingest) -> None:
    with pytest.raises(IngestError, match="input path not found"):
        ingest_into(tmp_path / "nope", tmp_path / "idx")


def test_symlinks_outside_roots_are_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("outside the root")
    root = tmp_path / "root"
    root.mkdir()
    (root / "inside.txt").write_text("inside")
    (root / "link-file.txt").symlink_to(outside / "secret.txt")
    (root / "link-dir").symlink_to(outside, target_is_directory=True)
    (root / "alias.txt").symlink_to(root / "inside.txt")
    found = discover([root])
    assert sorted(found.files) == ["root/alias.txt", "root/inside.txt"]
    assert {s.source: s.reason for s in found.skipped} == {
        "root/link-dir": "symlink leads outside the given roots",
        "root/link-file.txt": "symlink leads outside the given roots",
    }


def test_hidden_files_are_passed_over(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / ".git").mkdir(parents=True)
    (root / ".git" / "config.txt").write_text("x")
    (root / ".hidden.md").write_text("# x")
    (root / "shown.md").write_text("# y")
    assert list(discover([root]).files) == ["root/shown.md"]


def test_incremental_reruns(docs_dir: Path, tmp_path: Path, ingest_into: Ingest) -> None:
    index_dir = tmp_path / "idx"
    first = ingest_into(docs_dir, index_dir)
    assert len(first.added) == 6 and first.wrote
    total = first.chunks_total

    again = ingest_into(docs_dir, index_dir)
    assert again.counts() == {
        "added": 0,
        "updated": 0,
        "removed": 0,
        "unchanged": 6,
        "skipped": 0,
    }
    assert not again.wrote and again.chunks_embedded == 0

    notes = docs_dir / "notes.txt"
    notes.write_text(notes.read_text() + "\nThe autumn swap is in October.\n")
    (docs_dir / "beds.json").unlink()
    (docs_dir / "new.md").write_text("# New\n\nA brand new page about beekeeping.\n")
    third = ingest_into(docs_dir, index_dir)
    assert third.updated == ["docs/notes.txt"]
    assert third.removed == ["docs/beds.json"]
    assert third.added == ["docs/new.md"]
    assert len(third.unchanged) == 4
    # Only the edited file's and the new file's chunks were embedded.
    index = load_index(index_dir)
    changed = [
        c for c in index.store.iter_chunks() if c.metadata["source"] in third.updated + third.added
    ]
    assert third.chunks_embedded == len(changed)
    # Out: the two beds rows and the old notes chunk; in: the changed chunks.
    assert len(index) == total - 2 - 1 + len(changed)
    sources = {c.metadata["source"] for c in index.store.iter_chunks()}
    assert "docs/beds.json" not in sources and "docs/new.md" in sources


def test_file_that_turns_bad_keeps_its_previous_version(
    docs_dir: Path, tmp_path: Path, ingest_into: Ingest
) -> None:
    index_dir = tmp_path / "idx"
    ingest_into(docs_dir, index_dir)
    (docs_dir / "notes.txt").write_bytes(b"\xff\xfe\x00broken")
    report = ingest_into(docs_dir, index_dir)
    assert report.kept_previous == ["docs/notes.txt"]
    assert "docs/notes.txt" in _reasons(report)
    texts = [c.text for c in load_index(index_dir).store.iter_chunks()]
    assert any("seed swap" in t for t in texts)


def test_chunks_respect_token_budget_and_overlap(embedder: SentenceTransformerEmbedder) -> None:
    chunker = Chunker(embedder.count_tokens, chunk_size=40, chunk_overlap=10)
    text = " ".join(f"Sentence number {i} talks about topic {i % 7}." for i in range(60))
    pieces = chunker.split(text)
    assert len(pieces) > 5
    assert all(embedder.count_tokens(p) <= 40 for p in pieces)
    # Consecutive pieces share text (the overlap).
    assert all(set(a.split()[-3:]) & set(b.split()) for a, b in itertools.pairwise(pieces))
    with pytest.raises(ValueError, match="chunk_overlap"):
        Chunker(embedder.count_tokens, chunk_size=10, chunk_overlap=10)


def test_chunk_identity_is_stable(docs_dir: Path, tmp_path: Path, ingest_into: Ingest) -> None:
    ingest_into(docs_dir, tmp_path / "a")
    ingest_into(docs_dir, tmp_path / "b", rebuild=True)
    ids_a = [c.id for c in load_index(tmp_path / "a").store.iter_chunks()]
    ids_b = [c.id for c in load_index(tmp_path / "b").store.iter_chunks()]
    assert ids_a == ids_b and len(set(ids_a)) == len(ids_a)
    chunks = {c.metadata["citation"]: c for c in load_index(tmp_path / "a").store.iter_chunks()}
    drip = chunks["guide.md#drip-lines"]
    assert drip.metadata["section"] == "Garden guide > Watering > Drip lines"
    assert drip.metadata["source"] == "docs/guide.md"
    assert drip.metadata["title"] == "Garden guide"
    assert len(drip.metadata["content_hash"]) == 64
    assert chunks["tools.csv#row=3"].metadata["price"] == 129.99


def test_pdf_citation_labels(tmp_path: Path, ingest_into: Ingest) -> None:
    folder = tmp_path / "pdfs"
    folder.mkdir()
    write_pdf(folder / "handbook.pdf", ["Intro page.", "Vacation is 25 days.", "Sick leave."])
    ingest_into(folder, tmp_path / "idx")
    labels = sorted(
        c.metadata["citation"] for c in load_index(tmp_path / "idx").store.iter_chunks()
    )
    assert labels == ["handbook.pdf#page=1", "handbook.pdf#page=2", "handbook.pdf#page=3"]


def test_conflicting_field_types_become_strings(tmp_path: Path, ingest_into: Ingest) -> None:
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "a.csv").write_text("item,code\nbolt,12\n")
    (folder / "b.csv").write_text("item,code\nnut,X-7\n")
    report = ingest_into(folder, tmp_path / "idx")
    assert any("'code'" in note for note in report.notes)
    index = load_index(tmp_path / "idx")
    assert index.fields["code"] == "string"
    assert {c.metadata["code"] for c in index.store.iter_chunks()} == {"12", "X-7"}
