"""The on-disk index: a versioned folder, written atomically, loaded with checks.

Layout of an index directory::

    INDEX/
      CURRENT              name of the live generation (replaced atomically)
      gen-<stamp>/         one complete, immutable generation
        manifest.json      format version, embedder, chunk count, field types, build time,
                           and the sha256 of every other file of the generation (checked at load)
        chunks.sqlite      chunk text + metadata (JSON) by row, and the per-file records
        bm25/              bm25s arrays (.npy, loaded with allow_pickle=False) + JSON vocab,
                           and each row's length in tokens (doc_lengths.npy)
        dense.faiss        FAISS index over the normalised embeddings, rows = chunk rows
      fusion.json          optional: how the hybrid retriever fuses BM25 and dense here, as
                           ``ragchains eval tune --apply`` recommends (kept across ingests)

A writer builds a new generation in a hidden temporary folder, renames it into place, then
swaps CURRENT with ``os.replace``. A crash at any point leaves CURRENT naming the previous,
complete generation; leftovers are removed by the next successful write. No pickle anywhere.

Loading checks each file against the checksum the manifest recorded, so bytes damaged on disk
(a bad sector, a stray write) stop the load with the file's name instead of serving NaN
scores or garbled chunks.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import sqlite3
import threading
import uuid
import weakref
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import bm25s
import faiss
import numpy as np
from langchain_core.documents import Document
from pydantic import ValidationError

from ragchains.retrievers.access import AccessLabels, current_groups
from ragchains.retrievers.filters import BASE_FIELDS, MetadataColumns
from ragchains.retrievers.fusion import FUSION_FIELDS, FusionConfig

FORMAT_NAME = "ragchains-index"
FORMAT_VERSION = 1
CURRENT_FILE = "CURRENT"
MANIFEST_FILE = "manifest.json"
CHUNKS_FILE = "chunks.sqlite"
BM25_DIR = "bm25"
DENSE_FILE = "dense.faiss"
LOCK_FILE = ".lock"
FUSION_FILE = "fusion.json"
FUSION_FORMAT = "ragchains-fusion"
FUSION_FORMAT_VERSION = 1
BM25_LENGTHS_FILE = "doc_lengths.npy"
_GEN_PREFIX = "gen-"
_TMP_PREFIX = ".tmp-gen-"
_DIGEST = "sha256"
# Rows of vectors checked for NaN/Inf at a time, in legacy generations: bounds the copy.
_FINITE_BATCH = 65536

log = logging.getLogger(__name__)


class StoredBM25(bm25s.BM25):
    """bm25s's model and each row's length in tokens, saved beside its arrays.

    bm25s keeps only finished scores; scoring over a subset of rows (those a caller may read,
    see ``bm25.bm25_search``) needs the lengths to take out the whole index's average length.
    A generation written before they were kept loads with ``doc_lengths`` None.
    """

    # float64 in memory: sums over a caller's rows neither overflow nor convert per query.
    doc_lengths: np.ndarray | None = None

    def save(self, save_dir: str, **kwargs: Any) -> None:  # type: ignore[override]
        super().save(save_dir, **kwargs)
        if self.doc_lengths is not None:
            lengths = self.doc_lengths.astype(np.int32)  # token counts: whole numbers
            np.save(Path(save_dir) / BM25_LENGTHS_FILE, lengths, allow_pickle=False)

    @classmethod
    def load(cls, save_dir: str, **kwargs: Any) -> StoredBM25:  # type: ignore[override]
        model = super().load(save_dir, **kwargs)
        lengths = Path(save_dir) / BM25_LENGTHS_FILE
        if lengths.exists():
            model.doc_lengths = np.load(lengths, allow_pickle=False).astype(np.float64)
        return model  # type: ignore[no-any-return]


class IndexLoadError(ValueError):
    """Base for index problems; the message names the folder and what is wrong."""


class IndexNotFoundError(IndexLoadError):
    pass


class IndexFormatError(IndexLoadError):
    pass


class IndexDamagedError(IndexLoadError):
    pass


class IndexChecksumError(IndexDamagedError):
    """A file of the generation is missing or its bytes differ from those written."""


class EmbedderMismatchError(IndexLoadError):
    pass


@dataclass
class Chunk:
    """One retrievable unit: the text and its metadata (source, citation label, typed fields)."""

    id: str
    text: str
    metadata: dict[str, Any]


@dataclass
class FileRecord:
    """What the index knows of one ingested file, for incremental re-runs."""

    source: str
    sha256: str
    size: int
    chunk_count: int
    format: str
    # Who may read it (see retrievers.access); () = everyone.
    access: tuple[str, ...] = ()


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


# ----------------------------------------------------------------------------- writing
class IndexBusyError(IndexLoadError):
    pass


class IndexWriteError(OSError):
    """A new generation could not be written (a full disk, say). An OSError, as the failure
    it reports; its message names the file and says the index did not change."""

    def __str__(self) -> str:
        return str(self.strerror)


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
                access TEXT NOT NULL DEFAULT '[]'
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
            "INSERT INTO files (source, sha256, size, chunk_count, format, access) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (
                (f.source, f.sha256, f.size, f.chunk_count, f.format, json.dumps(list(f.access)))
                for f in files
            ),
        )
        con.commit()
    finally:
        con.close()


def file_sha256(path: Path) -> tuple[str, int]:
    """A file's sha256 (hex) and size, read once."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest(), os.fstat(fh.fileno()).st_size


def _digest(path: Path) -> str:
    return f"{_DIGEST}:{file_sha256(path)[0]}"


def _checksums(gen: Path) -> dict[str, str]:
    """The digest of every file of a generation but its manifest, by POSIX path within it."""
    return {
        path.relative_to(gen).as_posix(): _digest(path)
        for path in sorted(gen.rglob("*"))
        if path.is_file() and path.name != MANIFEST_FILE
    }


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
) -> Path:
    """Write a new generation and make it current; return its folder.

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
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]
    tmp = root / f"{_TMP_PREFIX}{stamp}"
    final = root / f"{_GEN_PREFIX}{stamp}"
    pointer_tmp = root / f".{CURRENT_FILE}.{stamp}"
    writing = CHUNKS_FILE
    switched = False
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
            "access_rules": contents.access_rules,
            # Additive (readers of format 1 ignore it): generations without it still load.
            "checksums": _checksums(tmp),
        }
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        for path in sorted(tmp.rglob("*")):
            if path.is_file():
                writing = path.relative_to(tmp).as_posix()
                with open(path, "rb") as fh:
                    os.fsync(fh.fileno())
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
        failure = _write_failure(exc, root, writing, previous)
        if failure is None:
            raise
        raise failure from exc
    _remove_stale(root, keep=final.name)
    return final


def _remove_stale(root: Path, *, keep: str) -> None:
    """Delete generations other than ``keep`` and leftovers of interrupted writes."""
    for entry in root.iterdir():
        name = entry.name
        stale_gen = name.startswith(_GEN_PREFIX) and name != keep
        leftover = name.startswith(_TMP_PREFIX) or name.startswith(f".{CURRENT_FILE}.")
        if stale_gen or leftover:
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- fusion.json
class FusionFileError(IndexLoadError):
    pass


def write_fusion(
    index_dir: str | Path, config: FusionConfig, provenance: dict[str, Any] | None = None
) -> Path:
    """Write ``fusion.json`` into an existing index folder (atomically); return its path.

    It sits beside the generations, so re-ingesting keeps it; ``provenance`` (what it was
    tuned on, and how well it did) is stored with it for people, never read back.
    """
    root = Path(index_dir)
    current_generation(root)  # an index folder, not any folder
    path = root / FUSION_FILE
    tmp = root / f".{FUSION_FILE}.{uuid.uuid4().hex[:8]}"
    tmp.write_text(fusion_json(config, provenance), encoding="utf-8")
    os.replace(tmp, path)
    return path


def fusion_json(config: FusionConfig, provenance: dict[str, Any] | None = None) -> str:
    """The text of a fusion.json file."""
    body: dict[str, Any] = {
        "format": FUSION_FORMAT,
        "format_version": FUSION_FORMAT_VERSION,
        **config.model_dump(),
    }
    if provenance:
        body["tuned"] = provenance
    return json.dumps(body, indent=2, default=str) + "\n"


def read_fusion(index_dir: str | Path) -> FusionConfig | None:
    """The fusion ``fusion.json`` in the index folder sets, or None when there is none.

    Fields it leaves out take the built-in defaults.
    """
    path = Path(index_dir) / FUSION_FILE
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FusionFileError(f"{path} is not valid JSON ({exc}); fix or delete it") from exc
    if not isinstance(body, dict) or body.get("format") != FUSION_FORMAT:
        raise FusionFileError(f"{path} is not a {FUSION_FORMAT} file; fix or delete it")
    if body.get("format_version") != FUSION_FORMAT_VERSION:
        raise FusionFileError(
            f"{path} has format version {body.get('format_version')!r}; this ragchains reads "
            f"version {FUSION_FORMAT_VERSION} only. Delete it or run `ragchains eval tune` again."
        )
    try:
        return FusionConfig(**{k: v for k, v in body.items() if k in FUSION_FIELDS})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" if e["loc"] else e["msg"]
            for e in exc.errors()
        )
        raise FusionFileError(f"{path}: {problems}; fix or delete it") from None


# ----------------------------------------------------------------------------- reading
def current_generation(index_dir: str | Path) -> Path:
    root = Path(index_dir)
    pointer = root / CURRENT_FILE
    if not root.exists():
        raise IndexNotFoundError(f"no index at {root}: run `ragchains ingest PATH --index {root}`")
    if not pointer.is_file():
        raise IndexNotFoundError(
            f"{root} is not a ragchains index (no {CURRENT_FILE} file); "
            f"build one with `ragchains ingest PATH --index {root}`"
        )
    name = pointer.read_text(encoding="utf-8").strip()
    if not name.startswith(_GEN_PREFIX) or "/" in name or not (root / name).is_dir():
        raise IndexDamagedError(
            _damaged(root, f"{CURRENT_FILE} names {name!r}, which is not there")
        )
    return root / name


def _repair(index_dir: str | Path) -> str:
    return (
        f"rebuild it with `ragchains ingest PATH... --index {index_dir} --rebuild`, "
        "or restore the folder from a backup"
    )


def _damaged(index_dir: str | Path, what: str) -> str:
    return f"index {index_dir} is damaged: {what}; {_repair(index_dir)}"


def read_manifest(index_dir: str | Path, gen: Path) -> dict[str, Any]:
    """A generation's manifest, checked for format and version."""
    try:
        manifest = json.loads((gen / MANIFEST_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise IndexDamagedError(_damaged(index_dir, f"{MANIFEST_FILE} is missing")) from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise IndexDamagedError(
            _damaged(index_dir, f"{MANIFEST_FILE} is not valid JSON ({exc})")
        ) from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise IndexFormatError(f"{index_dir} does not hold a {FORMAT_NAME} manifest")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise IndexFormatError(
            f"index {index_dir} has format version {version!r}; this ragchains reads version "
            f"{FORMAT_VERSION} only. Rebuild it with `ragchains ingest --rebuild` or use the "
            "ragchains release that wrote it."
        )
    return manifest


class ChunkStore:
    """Read-only access to the chunk table; safe to share between threads.

    A query that finds the file damaged raises ``IndexDamagedError`` naming it: damage can
    lie in pages no check at load touched (or in a generation written without checksums).
    """

    def __init__(self, path: Path, index_dir: str | Path | None = None) -> None:
        self.path = path
        self._where = index_dir if index_dir is not None else path.parent.parent
        self._con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        self._lock = threading.Lock()
        # Closed as soon as the store is dropped: a connection is otherwise freed only by
        # the cycle collector, never for one loaded before the server's gc.freeze(), and a
        # replaced generation's deleted file would keep its disk space until shutdown.
        self._closer = weakref.finalize(self, self._con.close)

    def close(self) -> None:
        self._closer()

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                yield self._con
            except (sqlite3.ProgrammingError, sqlite3.InterfaceError):
                raise  # our misuse (a closed store, say), not the file's fault
            except sqlite3.DatabaseError as exc:
                raise IndexDamagedError(_damaged(self._where, f"{CHUNKS_FILE}: {exc}")) from exc

    def count(self) -> int:
        with self._reading() as con:
            return int(con.execute("SELECT COUNT(*) FROM chunks").fetchone()[0])

    def problems(self) -> list[str]:
        """What SQLite's own structural check finds wrong with the file (none: sound)."""
        with self._reading() as con:
            found = [str(row[0]) for row in con.execute("PRAGMA quick_check")]
        return [] if found == ["ok"] else found

    def documents(self, rows: Sequence[int]) -> list[Document]:
        """Documents for the given rows, in the order given."""
        if not rows:
            return []
        wanted = [int(r) for r in rows]
        marks = ",".join("?" * len(wanted))
        with self._reading() as con:
            found = {
                row: (cid, text, meta)
                for row, cid, text, meta in con.execute(
                    f"SELECT row, id, text, metadata FROM chunks WHERE row IN ({marks})", wanted
                )
            }
        docs = []
        for row in wanted:
            cid, text, meta = found[row]
            metadata = json.loads(meta)
            metadata["chunk_id"] = cid
            docs.append(Document(id=cid, page_content=text, metadata=metadata))
        return docs

    def rows(self, ids: Sequence[str]) -> dict[str, int]:
        """The row of each chunk id that is in the store."""
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        with self._reading() as con:
            return dict(con.execute(f"SELECT id, row FROM chunks WHERE id IN ({marks})", list(ids)))

    def ids(self) -> list[str]:
        """Every chunk id, in row order."""
        with self._reading() as con:
            return [cid for (cid,) in con.execute("SELECT id FROM chunks ORDER BY row")]

    def iter_chunks(self) -> Iterator[Chunk]:
        with self._reading() as con:
            rows = con.execute("SELECT id, text, metadata FROM chunks ORDER BY row").fetchall()
        for cid, text, meta in rows:
            yield Chunk(id=cid, text=text, metadata=json.loads(meta))

    def iter_metadata(self) -> Iterator[dict[str, Any]]:
        with self._reading() as con:
            rows = con.execute("SELECT metadata FROM chunks ORDER BY row").fetchall()
        for (meta,) in rows:
            yield json.loads(meta)

    @cached_property
    def _has_access_column(self) -> bool:
        # Files written before access labels have no such column: everyone reads them.
        with self._reading() as con:
            return any(c[1] == "access" for c in con.execute("PRAGMA table_info(files)"))

    def files(self) -> dict[str, FileRecord]:
        access = "access" if self._has_access_column else "'[]'"
        with self._reading() as con:
            rows = con.execute(
                f"SELECT source, sha256, size, chunk_count, format, {access} FROM files"
            ).fetchall()
        return {
            r[0]: FileRecord(r[0], r[1], r[2], r[3], r[4], tuple(json.loads(r[5]))) for r in rows
        }


@dataclass
class SearchIndex:
    """A loaded generation: chunk store, BM25, FAISS and (lazily) typed metadata columns."""

    path: Path
    manifest: dict[str, Any]
    store: ChunkStore
    bm25: StoredBM25
    dense: faiss.Index
    # The index folder's fusion.json (see ``read_fusion``), if it has one.
    fusion: FusionConfig | None = None
    # visible_fields by the caller's (known) groups.
    _visible_fields: dict[frozenset[str], dict[str, str]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def fields(self) -> dict[str, str]:
        return self.manifest["fields"]  # type: ignore[no-any-return]

    def readable_rows(self) -> np.ndarray | None:
        """The rows this request's caller may read; None: every row (no access control for
        the request, the labels are then never built; or nothing labelled)."""
        groups = current_groups()
        return None if groups is None else self.access.mask(groups)

    def visible_fields(self) -> dict[str, str]:
        """The fields this request's caller may filter on: those with a value in a row it
        may read (a field only hidden files have is not told of, even in an error)."""
        groups = current_groups()
        if groups is None or not self.access.labelled:
            return self.fields
        key = self.access.known(groups)
        if key not in self._visible_fields:  # one per set of groups: callers share a few
            present = set(self.columns.present_in(self.access.rows_for(key))) | BASE_FIELDS.keys()
            self._visible_fields[key] = {f: t for f, t in self.fields.items() if f in present}
        return self._visible_fields[key]

    @cached_property
    def access(self) -> AccessLabels:
        """Who may read each row, for masks (built on first use, like ``columns``)."""
        files = self.store.files()
        return AccessLabels(self.columns, {s: f.access for s, f in files.items()})

    @cached_property
    def columns(self) -> MetadataColumns:
        """Typed filter columns, built on first use: re-ingesting never needs them."""
        return MetadataColumns(list(self.store.iter_metadata()), self.fields)

    def __len__(self) -> int:
        return int(self.manifest["chunk_count"])

    def vectors(self) -> np.ndarray:
        """All stored embeddings, row-aligned (used to carry vectors over on re-ingest)."""
        n = self.dense.ntotal
        if n == 0:
            return np.zeros((0, self.dense.d), dtype=np.float32)
        return self.dense.reconstruct_n(0, n)

    def stored_vectors(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        """The embeddings stored for these chunk ids (those the index holds)."""
        rows = self.store.rows(ids)
        return {cid: np.asarray(self.dense.reconstruct(row)) for cid, row in rows.items()}

    @property
    def folder(self) -> Path:
        """The index folder (the parent of its generations)."""
        return self.path.parent

    @property
    def location(self) -> str:
        return str(self.folder)

    def describe(self) -> dict[str, Any]:
        """What /readyz reports about the index."""
        return {
            "kind": "disk",
            "path": str(self.folder),
            "generation": self.path.name,
            "chunks": len(self),
            "fields": self.fields,
        }

    def close(self) -> None:
        self.store.close()

    # A loaded generation never changes: it is its own pinned generation (see LiveIndex).
    def pinned(self) -> SearchIndex:
        return self

    def pin(self) -> AbstractContextManager[SearchIndex]:
        return nullcontext(self)


def embedder_mismatch(
    where: str, recorded: dict[str, Any], name: str | None, dimension: int | None
) -> str | None:
    """Why the embedder ``recorded`` by an index or store (``where``) does not fit this run's
    ``name`` and ``dimension`` (None: not checked), or None when it fits."""
    if name is not None and recorded.get("name") != name:
        return (
            f"{where} was built with embedder {recorded.get('name')!r} "
            f"(dimension {recorded.get('dimension')}), but this run uses {name!r}. "
            "Use the same embedder, or rebuild with `ragchains ingest --rebuild`."
        )
    if dimension is not None and recorded.get("dimension") != dimension:
        return (
            f"{where} holds {recorded.get('dimension')}-dimensional vectors, but the embedder "
            f"gives {dimension}. Rebuild with `ragchains ingest --rebuild`."
        )
    return None


def load_index(
    index_dir: str | Path,
    *,
    embedder_name: str | None = None,
    embedder_dimension: int | None = None,
    generation: Path | None = None,
) -> SearchIndex:
    """Load the current generation (or ``generation``, a folder of the index), checking
    format, embedder, checksums and internal consistency."""
    gen = generation or current_generation(index_dir)  # once: a writer may switch CURRENT
    manifest = read_manifest(index_dir, gen)
    problem = embedder_mismatch(
        f"index {index_dir}", manifest.get("embedder") or {}, embedder_name, embedder_dimension
    )
    if problem:
        raise EmbedderMismatchError(problem)
    fusion = read_fusion(index_dir)
    checksums = _recorded_checksums(index_dir, manifest)
    if checksums is None:
        log.warning(
            "index %s has no checksums (an older ragchains wrote it), so damaged files can go "
            "unnoticed; rebuild it with `ragchains ingest --rebuild` to record them",
            index_dir,
        )
    else:
        # Hashes every byte once per load, never per request: sha256 runs at ~0.5 GB/s on
        # the 2-core test machine, so a 300 MB dense.faiss adds about half a second to a
        # start-up that spends longer loading models.
        for name, recorded in checksums.items():
            wrong = _file_problem(gen, name, recorded)
            if wrong:
                raise IndexChecksumError(_damaged(index_dir, f"{name} {wrong}"))
    index = _open_generation(index_dir, gen, manifest, legacy=checksums is None)
    index.fusion = fusion
    return index


def _recorded_checksums(index_dir: str | Path, manifest: dict[str, Any]) -> dict[str, str] | None:
    """The manifest's checksums by file name, or None for a generation written without."""
    checksums = manifest.get("checksums")
    if checksums is None:
        return None
    if not isinstance(checksums, dict) or not all(
        isinstance(name, str)
        and isinstance(value, str)
        and value.startswith(f"{_DIGEST}:")
        and not Path(name).is_absolute()
        and ".." not in Path(name).parts
        for name, value in checksums.items()
    ):
        raise IndexDamagedError(_damaged(index_dir, f"{MANIFEST_FILE} has malformed checksums"))
    # Every part must be covered: a list that leaves one out would vouch for it unchecked.
    uncovered = [
        part
        for part in (CHUNKS_FILE, DENSE_FILE, f"{BM25_DIR}/")
        if not any(name == part or name.startswith(part) for name in checksums)
    ]
    if uncovered:
        raise IndexDamagedError(
            _damaged(index_dir, f"{MANIFEST_FILE} records no checksum for {', '.join(uncovered)}")
        )
    return dict(sorted(checksums.items()))


def _file_problem(gen: Path, name: str, recorded: str) -> str | None:
    """What is wrong with one file the manifest lists, or None when its bytes are those
    written."""
    try:
        actual = _digest(gen / name)
    except FileNotFoundError:
        return "is missing"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if actual != recorded:
        return f"does not match the {_DIGEST} checksum recorded when it was written"
    return None


def _open_generation(
    index_dir: str | Path, gen: Path, manifest: dict[str, Any], *, legacy: bool
) -> SearchIndex:
    for name in (CHUNKS_FILE, DENSE_FILE, BM25_DIR):
        if not (gen / name).exists():
            raise IndexDamagedError(_damaged(index_dir, f"{name} is missing"))
    try:
        store = ChunkStore(gen / CHUNKS_FILE, index_dir)
    except sqlite3.DatabaseError as exc:
        raise IndexDamagedError(_damaged(index_dir, f"{CHUNKS_FILE}: {exc}")) from exc
    try:
        return _check_and_open(index_dir, gen, manifest, store, legacy=legacy)
    except BaseException:
        store.close()
        raise


def _check_and_open(
    index_dir: str | Path,
    gen: Path,
    manifest: dict[str, Any],
    store: ChunkStore,
    *,
    legacy: bool,
) -> SearchIndex:
    stored = store.count()
    try:
        dense = faiss.read_index(str(gen / DENSE_FILE))
    except RuntimeError as exc:
        raise IndexDamagedError(_damaged(index_dir, f"{DENSE_FILE} cannot be read")) from exc
    try:
        bm25 = StoredBM25.load(str(gen / BM25_DIR), allow_pickle=False, show_progress=False)
    except Exception as exc:  # bm25s raises several kinds on truncated or missing arrays
        raise IndexDamagedError(_damaged(index_dir, f"{BM25_DIR}/ cannot be read ({exc})")) from exc
    counts = {
        "manifest": manifest.get("chunk_count"),
        "chunks.sqlite": stored,
        "dense.faiss": dense.ntotal,
        "bm25": int(bm25.scores["num_docs"]),
    }
    if bm25.doc_lengths is not None:
        counts[f"{BM25_DIR}/{BM25_LENGTHS_FILE}"] = len(bm25.doc_lengths)
    if len(set(counts.values())) != 1:
        detail = ", ".join(f"{k}={v}" for k, v in counts.items())
        raise IndexDamagedError(_damaged(index_dir, f"row counts disagree ({detail})"))
    dimension = (manifest.get("embedder") or {}).get("dimension")
    if dense.d != dimension:
        raise IndexDamagedError(
            _damaged(index_dir, f"FAISS dimension {dense.d} != manifest {dimension}")
        )
    if legacy:  # no checksum vouches for the vectors: refuse the damage that shows as NaN
        bad = _first_nonfinite_row(dense)
        if bad is not None:
            raise IndexDamagedError(
                _damaged(index_dir, f"{DENSE_FILE} holds NaN or infinite values (row {bad})")
            )
    return SearchIndex(path=gen, manifest=manifest, store=store, bm25=bm25, dense=dense)


def _first_nonfinite_row(dense: faiss.Index) -> int | None:
    for start in range(0, dense.ntotal, _FINITE_BATCH):
        block = dense.reconstruct_n(start, min(_FINITE_BATCH, dense.ntotal - start))
        finite = np.isfinite(block).all(axis=1)
        if not finite.all():
            return start + int(np.argmin(finite))
    return None


# ----------------------------------------------------------------------------- verifying
@dataclass(frozen=True)
class FileCheck:
    """One file of a generation: its name within it (POSIX) and what is wrong (None: sound)."""

    name: str
    problem: str | None


@dataclass
class Verification:
    """What ``verify_index`` found in the current generation of an index folder."""

    folder: Path
    generation: str
    # False: an older ragchains wrote it without checksums; only presence, SQLite's own
    # check, row counts and finite vectors could be checked.
    checksummed: bool
    files: list[FileCheck]
    rows: int | None = None  # the row count every part agrees on, once opened
    # Why the whole is damaged (a file, or what opening the parts found), or None: sound.
    damage: str | None = None

    @property
    def sound(self) -> bool:
        return self.damage is None


def verify_index(index_dir: str | Path) -> Verification:
    """Check every file of the current generation against its recorded checksum, then open
    the parts and check their row counts (and fusion.json); never raises for damage that
    the result can report. Raises ``IndexLoadError`` when the folder is no index, or its
    CURRENT or manifest cannot be read."""
    root = Path(index_dir)
    gen = current_generation(root)
    manifest = read_manifest(index_dir, gen)
    checksums = _recorded_checksums(index_dir, manifest)
    result = Verification(root, gen.name, checksums is not None, [])
    if checksums is None:
        for name in (CHUNKS_FILE, DENSE_FILE, BM25_DIR):
            result.files.append(FileCheck(name, _unrecorded_problem(gen, name)))
    else:
        for name, recorded in checksums.items():
            result.files.append(FileCheck(name, _file_problem(gen, name, recorded)))
    bad = [f for f in result.files if f.problem]
    if bad:
        what = (
            f"{bad[0].name} {bad[0].problem}"
            if len(bad) == 1
            else f"{len(bad)} of {len(result.files)} files are damaged "
            f"({', '.join(f.name for f in bad)})"
        )
        result.damage = _damaged(index_dir, what)
        return result
    try:
        # legacy=False: the vectors were scanned above.
        index = _open_generation(index_dir, gen, manifest, legacy=False)
        result.rows = len(index)
        index.close()
        read_fusion(index_dir)
    except IndexLoadError as exc:
        result.damage = str(exc)
    return result


def _unrecorded_problem(gen: Path, name: str) -> str | None:
    """What is wrong with one part of a generation written without checksums, as far as its
    own structure shows (None: nothing found)."""
    path = gen / name
    if not path.exists():
        return "is missing"
    if name == CHUNKS_FILE:
        store = ChunkStore(path)
        try:
            found = store.problems()
        except IndexDamagedError as exc:
            return f"cannot be read ({exc.__cause__})"
        finally:
            store.close()
        return f"fails SQLite's integrity check ({'; '.join(found[:3])})" if found else None
    if name == DENSE_FILE:
        try:
            bad = _first_nonfinite_row(faiss.read_index(str(path)))
        except RuntimeError:
            return "cannot be read"
        return None if bad is None else f"holds NaN or infinite values (row {bad})"
    try:
        StoredBM25.load(str(path), allow_pickle=False, show_progress=False)
    except Exception as exc:  # bm25s raises several kinds on truncated or missing arrays
        return f"cannot be read ({exc})"
    return None
