"""Writing an index folder: each ingest writes a whole new generation and makes it current
atomically, under a lock that keeps a second writer out (the format: ``retrievers.indexformat``).

A writer builds a new generation in a hidden temporary folder, renames it into place, then
swaps CURRENT with ``os.replace``. A crash at any point leaves CURRENT naming the previous,
complete generation; leftovers are removed by the next successful write.

The original files are kept beside the generations, by their sha256 (``store_originals``,
before the generation naming them is written); after each commit those it does not name go.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import sqlite3
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from ragchains.retrievers.indexformat import (
    BM25_DIR,
    CHUNKS_FILE,
    CURRENT_FILE,
    DENSE_FILE,
    FILES_DIR,
    FORMAT_NAME,
    FORMAT_VERSION,
    GEN_PREFIX,
    LOCK_FILE,
    MANIFEST_FILE,
    Chunk,
    FileRecord,
    IndexBusyError,
    IndexLoadError,
    IndexWriteError,
    StoredBM25,
    current_generation,
    generation_checksums,
    is_file_id,
    read_manifest,
)

_TMP_PREFIX = ".tmp-gen-"
_TMP_ORIGINAL = ".tmp-"  # an original being copied, in FILES_DIR
_COPY_BLOCK = 1 << 20


@dataclass
class IndexContents:
    """Everything a writer needs: rows in order, their vectors, and the per-file records."""

    chunks: list[Chunk]
    vectors: np.ndarray
    files: list[FileRecord]
    fields: dict[str, str]
    embedder: dict[str, Any]
    chunking: dict[str, Any]
    # The run's --access rules, kept for the next run that gives none (retrievers.access).
    access_rules: list[dict[str, Any]] = field(default_factory=list)
    # Whether the generation refers to the originals of its files (FILES_DIR); False: it
    # refers to none, and those stored go once it is current (``ingest --no-originals``).
    originals: bool = True


@contextmanager
def writer_lock(index_dir: str | Path) -> Iterator[None]:
    """Hold the index's writer lock; a second writer fails at once instead of racing."""
    root = Path(index_dir)
    created = not root.exists()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / LOCK_FILE, "a+b") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise IndexBusyError(
                f"another ingest is writing {root}; wait for it to finish"
            ) from None
        try:
            yield
        finally:
            if created and [p.name for p in root.iterdir()] == [LOCK_FILE]:
                # Nothing was written: leave no empty index folder behind.
                (root / LOCK_FILE).unlink()
                root.rmdir()
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_chunk_store(path: Path, chunks: Sequence[Chunk], files: Sequence[FileRecord]) -> None:
    con = sqlite3.connect(path)
    try:
        con.executescript(
            """
            CREATE TABLE chunks (
                row INTEGER PRIMARY KEY,
                id TEXT NOT NULL UNIQUE,
                source TEXT NOT NULL,
                text TEXT NOT NULL,
                metadata TEXT NOT NULL
            );
            CREATE TABLE files (
                source TEXT PRIMARY KEY,
                sha256 TEXT NOT NULL,
                size INTEGER NOT NULL,
                chunk_count INTEGER NOT NULL,
                format TEXT NOT NULL,
                access TEXT NOT NULL DEFAULT '[]',
                details TEXT NOT NULL DEFAULT '{}'
            );
            """
        )
        con.executemany(
            "INSERT INTO chunks (row, id, source, text, metadata) VALUES (?, ?, ?, ?, ?)",
            (
                (row, c.id, c.metadata["source"], c.text, json.dumps(c.metadata, sort_keys=True))
                for row, c in enumerate(chunks)
            ),
        )
        con.executemany(
            "INSERT INTO files (source, sha256, size, chunk_count, format, access, details) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                (
                    f.source,
                    f.sha256,
                    f.size,
                    f.chunk_count,
                    f.format,
                    json.dumps(list(f.access)),
                    json.dumps(f.details, sort_keys=True),
                )
                for f in files
            ),
        )
        con.commit()
    finally:
        con.close()


def _disk_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if isinstance(exc, sqlite3.OperationalError):
        return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
    if isinstance(exc, RuntimeError):  # FAISS reports a failed fwrite with strerror(errno)
        return any(os.strerror(code) in str(exc) for code in (errno.ENOSPC, errno.EDQUOT))
    return False


def _write_failure(
    exc: BaseException, root: Path, writing: str, previous: str | None
) -> IndexWriteError | None:
    """The error to report for ``exc``, raised while ``writing`` (a name within the new
    generation, or CURRENT) before CURRENT changed; None when ``exc`` is no I/O failure."""
    unchanged = (
        f"nothing was changed (the previous generation {previous} is still current)"
        if previous
        else "nothing was written (the index has no generation yet)"
    )
    where = (
        f"{root} (switching {CURRENT_FILE} to the new generation)"
        if writing == CURRENT_FILE
        else f"{writing} in {root}"
        if writing.startswith(f"{FILES_DIR}/")
        else f"the new generation's {writing} in {root}"
    )
    if _disk_full(exc):
        code = exc.errno if isinstance(exc, OSError) and exc.errno else errno.ENOSPC
        message = (
            f"no space left on device while writing {where}: {os.strerror(code)}; {unchanged}. "
            "Free some space and run the ingest again."
        )
    elif isinstance(exc, OSError):
        code = exc.errno or errno.EIO
        message = f"cannot write {where}: {exc.strerror or exc}; {unchanged}"
    else:
        return None
    return IndexWriteError(code, message, str(root))


def write_index(
    index_dir: str | Path,
    contents: IndexContents,
    *,
    bm25: StoredBM25,
    dense: faiss.Index,
    dense_info: dict[str, Any],
    bm25_info: dict[str, Any],
    originals: Mapping[str, tuple[str, Path]] | None = None,
    notes: list[str] | None = None,
) -> Path:
    """Write a new generation and make it current; return its folder. ``originals``: the
    files whose bytes to keep (``store_originals``), stored once the generation's own files
    are written and before it is made current; why one was not kept goes to ``notes``.

    The previous generation stays loadable until the final ``os.replace`` of CURRENT. A
    failed write (a full disk, say) removes what it wrote and raises ``IndexWriteError``.
    """
    root = Path(index_dir)
    root.mkdir(parents=True, exist_ok=True)
    n = len(contents.chunks)
    if contents.vectors.shape[0] != n or dense.ntotal != n:
        raise ValueError(
            f"index rows disagree: {n} chunks, {contents.vectors.shape[0]} vectors, "
            f"{dense.ntotal} in FAISS"
        )
    try:
        previous: str | None = current_generation(root).name
    except IndexLoadError:
        previous = None
    number = _generation_number(root, previous) + 1
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]
    tmp = root / f"{_TMP_PREFIX}{stamp}"
    final = root / f"{GEN_PREFIX}{stamp}"
    pointer_tmp = root / f".{CURRENT_FILE}.{stamp}"
    writing = CHUNKS_FILE
    switched = False
    added: list[Path] = []
    tmp.mkdir()
    try:
        _write_chunk_store(tmp / CHUNKS_FILE, contents.chunks, contents.files)
        writing = f"{BM25_DIR}/"
        bm25.save(str(tmp / BM25_DIR), allow_pickle=False, show_progress=False)
        writing = DENSE_FILE
        faiss.write_index(dense, str(tmp / DENSE_FILE))
        writing = MANIFEST_FILE
        manifest = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "embedder": contents.embedder,
            "chunking": contents.chunking,
            "chunk_count": n,
            "file_count": len(contents.files),
            "fields": dict(sorted(contents.fields.items())),
            "dense": dense_info,
            "bm25": bm25_info,
            "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
            # Additive: each generation one more than the one it replaces, as a store's.
            "generation": number,
            "access_rules": contents.access_rules,
            "originals": contents.originals,
            # Additive (readers of format 1 ignore it): generations without it still load.
            "checksums": generation_checksums(tmp),
        }
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        for path in sorted(tmp.rglob("*")):
            if path.is_file():
                writing = path.relative_to(tmp).as_posix()
                with open(path, "rb") as fh:
                    os.fsync(fh.fileno())
        stored = store_originals(root, originals or {}, raw_errors=True)
        added = stored.added
        if notes is not None:
            notes.extend(stored.notes)
        writing = CURRENT_FILE
        os.rename(tmp, final)
        _fsync_dir(root)
        pointer_tmp.write_text(final.name + "\n", encoding="utf-8")
        with open(pointer_tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(pointer_tmp, root / CURRENT_FILE)
        switched = True
        _fsync_dir(root)
    except BaseException as exc:
        if switched:  # the new generation is current and whole; only its fsync is in doubt
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)
        pointer_tmp.unlink(missing_ok=True)
        for path in added:  # whole, but no generation names them
            path.unlink(missing_ok=True)
        if isinstance(exc, _OriginalWriteError):
            writing, exc = exc.writing, exc.cause
        failure = _write_failure(exc, root, writing, previous)
        if failure is None:
            raise exc
        raise failure from exc
    _remove_stale(root, keep=final.name)
    remove_orphans(root, {f.sha256 for f in contents.files} if contents.originals else set())
    return final


def _generation_number(root: Path, previous: str | None) -> int:
    """The number of generation ``previous`` (0: none, or written before they were numbered,
    or unreadable: the new one is then 1)."""
    if previous is None:
        return 0
    try:
        return int(read_manifest(root, root / previous).get("generation") or 0)
    except (IndexLoadError, OSError, TypeError, ValueError):
        return 0


def _remove_stale(root: Path, *, keep: str) -> None:
    """Delete generations other than ``keep`` and leftovers of interrupted writes."""
    for entry in root.iterdir():
        name = entry.name
        stale_gen = name.startswith(GEN_PREFIX) and name != keep
        leftover = name.startswith(_TMP_PREFIX) or name.startswith(f".{CURRENT_FILE}.")
        if stale_gen or leftover:
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- originals
@dataclass
class StoredOriginals:
    """What ``store_originals`` did: the originals it added (whole, under their final names)
    and, per source, why one was not kept."""

    added: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class _SourceUnreadable(Exception):
    pass


def missing_originals(index_dir: str | Path, ids: Iterable[str]) -> set[str]:
    """The file ids among ``ids`` whose original the index folder does not hold."""
    files = Path(index_dir) / FILES_DIR
    return {i for i in ids if not (files / i).is_file()}


class _OriginalWriteError(Exception):
    """An original could not be written: ``cause``, while writing ``writing``."""

    def __init__(self, writing: str, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.writing, self.cause = writing, cause


def store_originals(
    index_dir: str | Path, wanted: Mapping[str, tuple[str, Path]], *, raw_errors: bool = False
) -> StoredOriginals:
    """Copy each file of ``wanted`` (its sha256 -> (source, path)) into ``FILES_DIR`` unless
    it is there. Each copy is written to a temporary name, fsynced, and renamed to its sha256
    only when the bytes copied hash to it: a file that changed since it was read (and hashed)
    is not kept under a hash it no longer has (a note says so; the next run reads it anew).
    A write failure (a full disk) raises ``IndexWriteError``, the copies of this call removed."""
    root = Path(index_dir)
    files = root / FILES_DIR
    stored = StoredOriginals()
    todo = sorted(missing_originals(root, [s for s in wanted if is_file_id(s)]))
    if not todo:
        return stored
    writing = f"{FILES_DIR}/"
    try:
        files.mkdir(exist_ok=True)
        for sha in todo:
            source, path = wanted[sha]
            writing = f"{FILES_DIR}/{sha[:12]}… (the original of {source})"
            try:
                kept = _copy_original(files, sha, path)
            except _SourceUnreadable as exc:
                stored.notes.append(f"{source}: original not kept ({exc})")
                continue
            if kept is None:
                stored.notes.append(
                    f"{source}: original not kept (the file changed while it was read; the "
                    "next run reads it again)"
                )
                continue
            stored.added.append(kept)
        _fsync_dir(files)
    except BaseException as exc:
        for path in stored.added:
            path.unlink(missing_ok=True)
        if raw_errors:  # write_index reports it, with the rest of its cleaning up
            raise _OriginalWriteError(writing, exc) from exc
        failure = _write_failure(exc, root, writing, _current_name(root))
        if failure is None:
            raise
        raise failure from exc
    return stored


def _current_name(root: Path) -> str | None:
    try:
        return current_generation(root).name
    except IndexLoadError:
        return None


def _copy_original(files: Path, sha: str, source: Path) -> Path | None:
    """``source`` copied to ``files/<sha>`` if its bytes hash to ``sha`` (else None)."""
    final = files / sha
    tmp = files / f"{_TMP_ORIGINAL}{uuid.uuid4().hex}"
    digest = hashlib.sha256()
    try:
        src = open(source, "rb")  # noqa: SIM115 (closed below; its errors are the source's)
    except OSError as exc:
        raise _SourceUnreadable(exc.strerror or str(exc)) from exc
    try:
        with src, open(tmp, "xb") as dst:
            while True:
                try:
                    block = src.read(_COPY_BLOCK)
                except OSError as exc:
                    raise _SourceUnreadable(exc.strerror or str(exc)) from exc
                if not block:
                    break
                digest.update(block)
                dst.write(block)
            dst.flush()
            os.fsync(dst.fileno())
        if digest.hexdigest() != sha:
            tmp.unlink()
            return None
        os.rename(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return final


def remove_orphans(index_dir: str | Path, referenced: set[str]) -> None:
    """Delete the originals not in ``referenced`` and copies an interrupted run left."""
    files = Path(index_dir) / FILES_DIR
    if not files.is_dir():
        return
    for entry in files.iterdir():
        if entry.name not in referenced or not entry.is_file():
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
