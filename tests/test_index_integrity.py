"""Damaged bytes and full disks (issue 15, defects 10 and 8): checksums recorded with each
generation and checked at load, `ragchains index verify`, a damaged chunks.sqlite named, and
a write that runs out of space leaving the index as it was."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import faiss
import numpy as np
import pytest
from click.testing import CliRunner

import ragchains.retrievers.indexformat as indexformat
import ragchains.retrievers.indexwriter as index_module
from ragchains.cli import app
from ragchains.factory import build_retriever, run_ingest
from ragchains.ingest.errors import IngestError
from ragchains.ingest.report import IngestReport
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.indexformat import (
    IndexChecksumError,
    IndexDamagedError,
    IndexWriteError,
    current_generation,
)
from ragchains.retrievers.indexverify import verify_index
from ragchains.retrievers.searchindex import load_index
from ragchains.settings import Settings
from tests.conftest import FIXTURES, REPO

Ingest = Callable[..., IngestReport]
RAGCHAINS = Path(sys.executable).parent / "ragchains"


# ----------------------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def pristine(
    tmp_path_factory: pytest.TempPathFactory,
    settings: Settings,
    embedder: SentenceTransformerEmbedder,
) -> Path:
    """tests/fixtures/docs ingested once for the module; tests damage copies of it."""
    index = tmp_path_factory.mktemp("integrity") / "idx"
    run_ingest(settings, [FIXTURES / "docs"], index, embedder=embedder, progress=False)
    return index


@pytest.fixture
def index(pristine: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "idx"
    shutil.copytree(pristine, copy)
    return copy


def _manifest(index: Path) -> dict:
    return json.loads((current_generation(index) / "manifest.json").read_text())


def _make_legacy(index: Path) -> None:
    """Make the current generation look written before checksums were recorded."""
    manifest = _manifest(index)
    del manifest["checksums"]
    (current_generation(index) / "manifest.json").write_text(json.dumps(manifest, indent=2))


def _overwrite_vectors(index: Path) -> None:
    """0xFF over the last 64 bytes of dense.faiss: the tail of the flat index's last vector,
    which then holds NaNs (what the issue reported: NaN warnings, answers still 200)."""
    path = current_generation(index) / "dense.faiss"
    data = bytearray(path.read_bytes())
    data[-64:] = b"\xff" * 64
    path.write_bytes(bytes(data))
    assert np.isnan(faiss.read_index(str(path)).reconstruct_n(0, 15)).any()


def _garble_table(index: Path, table: str) -> None:
    """Overwrite the root page of one table of chunks.sqlite with garbage."""
    path = current_generation(index) / "chunks.sqlite"
    con = sqlite3.connect(path)
    try:
        (root,) = con.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = ?", [table]
        ).fetchone()
        (size,) = con.execute("PRAGMA page_size").fetchone()
    finally:
        con.close()
    data = bytearray(path.read_bytes())
    start = (root - 1) * size
    data[start : start + size] = b"\xa5" * size
    path.write_bytes(bytes(data))


def _ragchains(*args: str | Path) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAGCHAINS_")}
    result = subprocess.run(
        [str(RAGCHAINS), *map(str, args)],
        cwd=REPO,
        env=clean,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def _verify(index: Path | str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["index", "verify", "--index", str(index)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.stdout, result.stderr


# ----------------------------------------------------------------------------- (a) recorded
def test_manifest_records_a_checksum_per_file(index: Path) -> None:
    gen = current_generation(index)
    manifest = _manifest(index)
    assert manifest["format_version"] == 1
    files = {
        p.relative_to(gen).as_posix()
        for p in gen.rglob("*")
        if p.is_file() and p.name != "manifest.json"
    }
    assert {"chunks.sqlite", "dense.faiss", "bm25/vocab.index.json"} <= files
    assert set(manifest["checksums"]) == files
    for name, recorded in manifest["checksums"].items():
        assert recorded == "sha256:" + hashlib.sha256((gen / name).read_bytes()).hexdigest()


def test_checksums_are_hashed_once_per_load_not_per_query(
    index: Path, settings: Settings, embedder: SentenceTransformerEmbedder, monkeypatch
) -> None:
    calls: list[Path] = []
    real = indexformat._digest

    def counting(path: Path) -> str:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(indexformat, "_digest", counting)
    loaded = load_index(index)
    assert len(calls) == len(_manifest(index)["checksums"])
    retriever = build_retriever(settings, loaded, embedder)
    for query in ("tool shed code", "tent", "price of the beds"):
        assert retriever.invoke(query)
    assert len(calls) == len(_manifest(index)["checksums"])
    loaded.close()


# ----------------------------------------------------------------------------- (b) refused
def test_overwritten_vectors_are_refused_at_load(index: Path) -> None:
    _overwrite_vectors(index)
    with pytest.raises(IndexChecksumError) as caught:
        load_index(index)
    message = str(caught.value)
    assert message.startswith(f"index {index} is damaged: dense.faiss does not match the sha256")
    assert f"ragchains ingest PATH... --index {index} --rebuild" in message
    assert "restore the folder from a backup" in message


def test_ingest_into_a_damaged_index_says_what_to_do_once(
    index: Path, docs_dir: Path, ingest_into: Ingest
) -> None:
    _overwrite_vectors(index)
    with pytest.raises(IngestError, match=r"dense\.faiss does not match") as caught:
        ingest_into(docs_dir, index)
    assert str(caught.value).count("--rebuild") == 1, caught.value
    assert ingest_into(docs_dir, index, rebuild=True).wrote
    assert verify_index(index).sound


@pytest.mark.e2e
def test_cli_names_the_damaged_file_and_exits_2(index: Path) -> None:
    _overwrite_vectors(index)
    result = _ragchains("retrieve", "tool shed code", "--index", index)
    assert result.returncode == 2, result.stderr
    assert _errors(result.stderr) == [
        f"error: index {index} is damaged: dense.faiss does not match the sha256 checksum "
        f"recorded when it was written; rebuild it with `ragchains ingest PATH... --index "
        f"{index} --rebuild`, or restore the folder from a backup"
    ]
    assert "unexpected" not in result.stderr and result.stdout == ""


# ----------------------------------------------------------------------------- (c) verify
def test_verify_passes_a_sound_index(index: Path) -> None:
    code, out, err = _verify(index)
    assert code == 0, err
    files = len(_manifest(index)["checksums"])
    assert out.splitlines()[0] == f"index {index}, generation {current_generation(index).name}"
    assert "  ok       dense.faiss" in out.splitlines()
    assert "  ok       chunks.sqlite" in out.splitlines()
    assert sum(line.startswith("  ok ") for line in out.splitlines()) == files
    assert out.splitlines()[-1] == (
        f"index {index} is sound: {files} files match their checksums, 15 rows in every part"
    )
    assert err == ""


def test_verify_names_the_damaged_file_and_exits_1(index: Path) -> None:
    _overwrite_vectors(index)
    code, out, err = _verify(index)
    assert code == 1
    lines = out.splitlines()
    assert (
        "  DAMAGED  dense.faiss does not match the sha256 checksum recorded when it was written"
        in lines
    )
    assert "  ok       chunks.sqlite" in lines
    assert err.startswith(f"error: index {index} is damaged: dense.faiss does not match")


def test_verify_counts_several_damaged_files(index: Path) -> None:
    _overwrite_vectors(index)
    (current_generation(index) / "chunks.sqlite").unlink()
    code, out, err = _verify(index)
    assert code == 1
    assert "  DAMAGED  chunks.sqlite is missing" in out.splitlines()
    files = len(_manifest(index)["checksums"])
    assert f"2 of {files} files are damaged (chunks.sqlite, dense.faiss)" in err


def test_verify_checks_row_counts(index: Path) -> None:
    manifest = _manifest(index)
    manifest["chunk_count"] = 16  # the manifest is not checksummed: row counts catch this
    (current_generation(index) / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = _verify(index)
    assert code == 1 and "row counts disagree (manifest=16, chunks.sqlite=15" in err


def test_verify_refuses_no_index_and_a_store_url_with_one_line(tmp_path: Path) -> None:
    code, out, err = _verify(tmp_path / "nothing")
    assert code == 2 and out == ""
    missing = tmp_path / "nothing"
    assert err == f"error: no index at {missing}: run `ragchains ingest PATH --index {missing}`\n"
    code, out, err = _verify("postgresql://rag@localhost/db")
    assert code == 2 and "works on an index folder" in err and len(err.splitlines()) == 1


def test_verify_help_explains() -> None:
    result = CliRunner().invoke(app, ["index", "verify", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    assert "sha256 checksum" in text and "row counts" in text
    assert "Exits 0 when the index is sound, 1 when it is damaged" in text
    assert "verify" in CliRunner().invoke(app, ["index", "--help"]).stdout


# ----------------------------------------------------------------------------- (d) legacy
def test_legacy_index_with_nan_vectors_is_refused(index: Path) -> None:
    _make_legacy(index)
    _overwrite_vectors(index)
    with pytest.raises(
        IndexDamagedError, match=r"dense.faiss holds NaN or infinite values \(row 14\)"
    ):
        load_index(index)
    code, out, _ = _verify(index)
    assert code == 1 and "  DAMAGED  dense.faiss holds NaN or infinite values (row 14)" in out


def test_legacy_index_loads_with_one_warning(index: Path, caplog: pytest.LogCaptureFixture) -> None:
    _make_legacy(index)
    with caplog.at_level(logging.WARNING, logger="ragchains.retrievers.searchindex"):
        loaded = load_index(index)
    loaded.close()
    assert len(loaded) == 15
    warnings = [r for r in caplog.records if r.name == "ragchains.retrievers.searchindex"]
    assert len(warnings) == 1 and "has no checksums" in warnings[0].getMessage()
    code, out, _ = _verify(index)
    assert code == 0 and "has no checksums" in out and "15 rows in every part" in out


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda g: (g / "dense.faiss").write_bytes(b"junk"), "dense.faiss cannot be read"),
        (lambda g: (g / "bm25" / "params.index.json").unlink(), "bm25/ cannot be read"),
        (lambda g: (g / "chunks.sqlite").unlink(), "chunks.sqlite is missing"),
    ],
    ids=["bad-faiss", "no-bm25", "no-sqlite"],
)
def test_legacy_index_damage_is_still_named(
    index: Path, damage: Callable[[Path], object], message: str
) -> None:
    _make_legacy(index)
    damage(current_generation(index))
    with pytest.raises(IndexDamagedError, match=message):
        load_index(index)


# ----------------------------------------------------------------------------- (e) chunks.sqlite
def test_a_damaged_chunk_table_read_after_load_is_named(index: Path) -> None:
    """Without checksums, damage in pages the load does not read shows at the first query."""
    _make_legacy(index)
    _garble_table(index, "files")
    loaded = load_index(index)  # counting rows reads the id index, not the files table
    try:
        with pytest.raises(
            IndexDamagedError, match=r"chunks\.sqlite: database disk image is malformed"
        ):
            loaded.store.files()
    finally:
        loaded.close()
    code, out, _ = _verify(index)
    assert code == 1 and "  DAMAGED  chunks.sqlite" in out


def test_ingest_over_a_damaged_chunk_table_is_an_ingest_error(
    index: Path, docs_dir: Path, ingest_into: Ingest
) -> None:
    _make_legacy(index)
    _garble_table(index, "files")
    with pytest.raises(IngestError, match=r"chunks\.sqlite: database disk image is malformed"):
        ingest_into(docs_dir, index)


@pytest.mark.e2e
@pytest.mark.parametrize("legacy", [False, True], ids=["checksummed", "legacy"])
def test_cli_on_garbage_chunks_sqlite_exits_2_naming_it(index: Path, legacy: bool) -> None:
    if legacy:
        _make_legacy(index)
        _garble_table(index, "chunks")
        named = "chunks.sqlite: database disk image is malformed"
    else:
        path = current_generation(index) / "chunks.sqlite"
        data = bytearray(path.read_bytes())
        data[4096:] = os.urandom(len(data) - 4096)
        path.write_bytes(bytes(data))
        named = "chunks.sqlite does not match the sha256 checksum"
    result = _ragchains("retrieve", "tool shed code", "--index", index)
    assert result.returncode == 2, result.stderr
    errors = _errors(result.stderr)
    assert len(errors) == 1 and errors[0].startswith(f"error: index {index} is damaged: {named}")
    assert "unexpected" not in result.stderr


# ----------------------------------------------------------------------------- (f) full disk
def _no_space(*args: object, **kwargs: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _quota(*args: object, **kwargs: object) -> None:
    raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))


_FAISS_WRITE = faiss.write_index


def _to_dev_full(index: object, path: str) -> None:
    """The real FAISS writer on a device that is always full (FAISS raises RuntimeError)."""
    _FAISS_WRITE(index, "/dev/full")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize(
    ("target", "replacement", "file", "said"),
    [
        ("faiss.write_index", _to_dev_full, "dense.faiss", "No space left on device"),
        ("bm25s.BM25.save", _quota, "bm25/", "Disk quota exceeded"),
        ("os.fsync", _no_space, "bm25/data.csc.index.npy", "No space left on device"),
    ],
    ids=["faiss-dev-full", "bm25-quota", "fsync"],
)
def test_a_full_disk_changes_nothing_and_says_so(
    index: Path,
    docs_dir: Path,
    ingest_into: Ingest,
    monkeypatch: pytest.MonkeyPatch,
    target: str,
    replacement: Callable[..., None],
    file: str,
    said: str,
) -> None:
    previous = current_generation(index)
    (docs_dir / "notes.txt").write_text("Completely new notes about hedgehogs in the garden.")
    owner, _, name = target.rpartition(".")
    holder = {
        "faiss": index_module.faiss,
        "os": index_module.os,
        "bm25s.BM25": indexformat.bm25s.BM25,
    }
    monkeypatch.setattr(holder[owner], name, replacement)
    with pytest.raises(IndexWriteError) as caught:
        ingest_into(docs_dir, index)
    monkeypatch.undo()
    assert caught.value.errno in (errno.ENOSPC, errno.EDQUOT)
    assert str(caught.value) == (
        f"no space left on device while writing the new generation's {file} in {index}: "
        f"{said}; nothing was changed (the previous generation {previous.name} is still "
        "current). Free some space and run the ingest again."
    )
    assert sorted(p.name for p in index.iterdir()) == sorted(
        [".lock", "CURRENT", "files", "ingests.json", previous.name]
    )
    assert current_generation(index) == previous and verify_index(index).sound


def test_a_full_disk_on_a_new_index_leaves_no_folder(
    docs_dir: Path, tmp_path: Path, ingest_into: Ingest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(index_module.faiss, "write_index", _no_space)
    with pytest.raises(
        IndexWriteError, match=r"nothing was written \(the index has no generation yet\)"
    ):
        ingest_into(docs_dir, tmp_path / "new")
    assert not (tmp_path / "new").exists()


def test_other_write_failures_name_the_file_too(
    index: Path, docs_dir: Path, ingest_into: Ingest, monkeypatch: pytest.MonkeyPatch
) -> None:
    (docs_dir / "notes.txt").write_text("Edited.")

    def io_error(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(index_module.faiss, "write_index", io_error)
    with pytest.raises(
        IndexWriteError, match=r"cannot write the new generation\'s dense\.faiss in "
    ):
        ingest_into(docs_dir, index)


# Runs `ragchains ingest` as the console script does, with fsync failing as on a full disk.
FULL_DISK_INGEST = textwrap.dedent(
    """
    import errno, os, sys
    import ragchains.retrievers.indexwriter as index_module
    from ragchains.cli import run

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    index_module.os.fsync = full
    sys.argv = ["ragchains", *sys.argv[1:]]
    run()
    """
)


@pytest.mark.e2e
def test_cli_ingest_on_a_full_disk_is_one_line(index: Path, docs_dir: Path) -> None:
    previous = current_generation(index)
    (docs_dir / "notes.txt").write_text("Completely new notes about hedgehogs in the garden.")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAGCHAINS_")}
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            FULL_DISK_INGEST,
            "ingest",
            str(docs_dir),
            "--index",
            str(index),
            "-q",
        ],
        cwd=REPO,
        env=clean,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "unexpected" not in result.stderr
    assert _errors(result.stderr) == [
        f"error: no space left on device while writing the new generation's "
        f"bm25/data.csc.index.npy in "
        f"{index}: No space left on device; nothing was changed (the previous generation "
        f"{previous.name} is still current). Free some space and run the ingest again."
    ]
    assert sorted(p.name for p in index.iterdir()) == sorted(
        [".lock", "CURRENT", "files", "ingests.json", previous.name]
    )
    assert load_index(index).store.count() == 15


@pytest.mark.parametrize("keep", [(), ("chunks.sqlite", "dense.faiss")])
def test_checksums_that_leave_a_part_out_are_damage_not_a_pass(
    index: Path, embedder: SentenceTransformerEmbedder, keep: tuple[str, ...]
) -> None:
    """An empty or partial list would vouch for the parts it leaves out, unchecked (and,
    being no legacy index, skip the NaN scan too)."""
    manifest = _manifest(index)
    manifest["checksums"] = {k: v for k, v in manifest["checksums"].items() if k in keep}
    (current_generation(index) / "manifest.json").write_text(json.dumps(manifest, indent=2))
    with pytest.raises(IndexDamagedError, match="records no checksum for"):
        load_index(index, embedder_name=embedder.name)
