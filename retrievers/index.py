"""The on-disk index: a versioned folder, written atomically, loaded with checks.

Layout of an index directory::

    INDEX/
      CURRENT              name of the live generation (replaced atomically)
      gen-<stamp>/         one complete, immutable generation
        manifest.json      format version, embedder, chunk count, field types, build time
        chunks.sqlite      chunk text + metadata (JSON) by row, and the per-file records
        bm25/              bm25s arrays (.npy, loaded with allow_pickle=False) + JSON vocab
        dense.faiss        FAISS index over the normalised embeddings, rows = chunk rows
      fusion.json          optional: how the hybrid retriever fuses BM25 and dense here, as
                           ``ragchains eval tune --apply`` recommends (kept across ingests)

A writer builds a new generation in a hidden temporary folder, renames it into place, then
swaps CURRENT with ``os.replace``. A crash at any point leaves CURRENT naming the previous,
complete generation; leftovers are removed by the next successful write. No pickle anywhere.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sqlite3
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import bm25s
import faiss
import numpy as np
from langchain_core.documents import Document
from pydantic import ValidationError

from ragchains.retrievers.filters import MetadataColumns
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
_GEN_PREFIX = "gen-"
_TMP_PREFIX = ".tmp-gen-"


class IndexLoadError(ValueError):
    """Base for index problems; the message names the folder and what is wrong."""


class IndexNotFoundError(IndexLoadError):
    pass


class IndexFormatError(IndexLoadError):
    pass


class IndexDamagedError(IndexLoadError):
    pass


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


@dataclass
class IndexContents:
    """Everything a writer needs: rows in order, their vectors, and the per-file records."""

    chunks: list[Chunk]
    vectors: np.ndarray
    files: list[FileRecord]
    fields: dict[str, str]
    embedder: dict[str, Any]
    chunking: dict[str, Any]


# ----------------------------------------------------------------------------- writing
class IndexBusyError(IndexLoadError):
    pass


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
                format TEXT NOT NULL
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
            "INSERT INTO files (source, sha256, size, chunk_count, format) VALUES (?, ?, ?, ?, ?)",
            ((f.source, f.sha256, f.size, f.chunk_count, f.format) for f in files),
        )
        con.commit()
    finally:
        con.close()


def write_index(
    index_dir: str | Path,
    contents: IndexContents,
    *,
    bm25: bm25s.BM25,
    dense: faiss.Index,
    dense_info: dict[str, Any],
    bm25_info: dict[str, Any],
) -> Path:
    """Write a new generation and make it current; return its folder.

    The previous generation stays loadable until the final ``os.replace`` of CURRENT.
    """
    root = Path(index_dir)
    root.mkdir(parents=True, exist_ok=True)
    n = len(contents.chunks)
    if contents.vectors.shape[0] != n or dense.ntotal != n:
        raise ValueError(
            f"index rows disagree: {n} chunks, {contents.vectors.shape[0]} vectors, "
            f"{dense.ntotal} in FAISS"
        )
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]
    tmp = root / f"{_TMP_PREFIX}{stamp}"
    final = root / f"{_GEN_PREFIX}{stamp}"
    tmp.mkdir()
    try:
        _write_chunk_store(tmp / CHUNKS_FILE, contents.chunks, contents.files)
        bm25.save(str(tmp / BM25_DIR), allow_pickle=False, show_progress=False)
        faiss.write_index(dense, str(tmp / DENSE_FILE))
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
        }
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        for path in tmp.rglob("*"):
            if path.is_file():
                with open(path, "rb") as fh:
                    os.fsync(fh.fileno())
        os.rename(tmp, final)
        _fsync_dir(root)
        pointer_tmp = root / f".{CURRENT_FILE}.{stamp}"
        pointer_tmp.write_text(final.name + "\n", encoding="utf-8")
        with open(pointer_tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(pointer_tmp, root / CURRENT_FILE)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
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
            f"index {root} is damaged: {CURRENT_FILE} names {name!r}, which is not there"
        )
    return root / name


def read_manifest(index_dir: str | Path) -> dict[str, Any]:
    gen = current_generation(index_dir)
    try:
        manifest = json.loads((gen / MANIFEST_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise IndexDamagedError(
            f"index {index_dir} is damaged: {MANIFEST_FILE} is missing"
        ) from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise IndexDamagedError(
            f"index {index_dir} is damaged: {MANIFEST_FILE} is not valid JSON ({exc})"
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
    """Read-only access to the chunk table; safe to share between threads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        self._lock = threading.Lock()

    def close(self) -> None:
        self._con.close()

    def count(self) -> int:
        with self._lock:
            return int(self._con.execute("SELECT COUNT(*) FROM chunks").fetchone()[0])

    def documents(self, rows: Sequence[int]) -> list[Document]:
        """Documents for the given rows, in the order given."""
        if not rows:
            return []
        wanted = [int(r) for r in rows]
        marks = ",".join("?" * len(wanted))
        with self._lock:
            found = {
                row: (cid, text, meta)
                for row, cid, text, meta in self._con.execute(
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
        with self._lock:
            return dict(
                self._con.execute(f"SELECT id, row FROM chunks WHERE id IN ({marks})", list(ids))
            )

    def ids(self) -> list[str]:
        """Every chunk id, in row order."""
        with self._lock:
            return [cid for (cid,) in self._con.execute("SELECT id FROM chunks ORDER BY row")]

    def iter_chunks(self) -> Iterator[Chunk]:
        with self._lock:
            rows = self._con.execute(
                "SELECT id, text, metadata FROM chunks ORDER BY row"
            ).fetchall()
        for cid, text, meta in rows:
            yield Chunk(id=cid, text=text, metadata=json.loads(meta))

    def iter_metadata(self) -> Iterator[dict[str, Any]]:
        with self._lock:
            rows = self._con.execute("SELECT metadata FROM chunks ORDER BY row").fetchall()
        for (meta,) in rows:
            yield json.loads(meta)

    def files(self) -> dict[str, FileRecord]:
        with self._lock:
            rows = self._con.execute(
                "SELECT source, sha256, size, chunk_count, format FROM files"
            ).fetchall()
        return {r[0]: FileRecord(*r) for r in rows}


@dataclass
class SearchIndex:
    """A loaded generation: chunk store, BM25, FAISS and (lazily) typed metadata columns."""

    path: Path
    manifest: dict[str, Any]
    store: ChunkStore
    bm25: bm25s.BM25
    dense: faiss.Index
    # The index folder's fusion.json (see ``read_fusion``), if it has one.
    fusion: FusionConfig | None = None

    @property
    def fields(self) -> dict[str, str]:
        return self.manifest["fields"]  # type: ignore[no-any-return]

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
) -> SearchIndex:
    """Load the current generation, checking format, embedder and internal consistency."""
    manifest = read_manifest(index_dir)
    gen = current_generation(index_dir)
    problem = embedder_mismatch(
        f"index {index_dir}", manifest.get("embedder") or {}, embedder_name, embedder_dimension
    )
    if problem:
        raise EmbedderMismatchError(problem)
    fusion = read_fusion(index_dir)
    for name in (CHUNKS_FILE, DENSE_FILE, BM25_DIR):
        if not (gen / name).exists():
            raise IndexDamagedError(f"index {index_dir} is damaged: {name} is missing")
    try:
        store = ChunkStore(gen / CHUNKS_FILE)
    except sqlite3.DatabaseError as exc:
        raise IndexDamagedError(f"index {index_dir} is damaged: {CHUNKS_FILE}: {exc}") from exc
    try:
        index = _check_and_open(index_dir, gen, manifest, store)
    except BaseException:
        store.close()
        raise
    index.fusion = fusion
    return index


def _check_and_open(
    index_dir: str | Path, gen: Path, manifest: dict[str, Any], store: ChunkStore
) -> SearchIndex:
    try:
        stored = store.count()
    except sqlite3.DatabaseError as exc:
        raise IndexDamagedError(f"index {index_dir} is damaged: {CHUNKS_FILE}: {exc}") from exc
    try:
        dense = faiss.read_index(str(gen / DENSE_FILE))
    except RuntimeError as exc:
        raise IndexDamagedError(
            f"index {index_dir} is damaged: {DENSE_FILE} cannot be read"
        ) from exc
    try:
        bm25 = bm25s.BM25.load(str(gen / BM25_DIR), allow_pickle=False, show_progress=False)
    except Exception as exc:  # bm25s raises several kinds on truncated or missing arrays
        raise IndexDamagedError(
            f"index {index_dir} is damaged: {BM25_DIR}/ cannot be read ({exc})"
        ) from exc
    counts = {
        "manifest": manifest.get("chunk_count"),
        "chunks.sqlite": stored,
        "dense.faiss": dense.ntotal,
        "bm25": int(bm25.scores["num_docs"]),
    }
    if len(set(counts.values())) != 1:
        detail = ", ".join(f"{k}={v}" for k, v in counts.items())
        raise IndexDamagedError(f"index {index_dir} is damaged: row counts disagree ({detail})")
    dimension = (manifest.get("embedder") or {}).get("dimension")
    if dense.d != dimension:
        raise IndexDamagedError(
            f"index {index_dir} is damaged: FAISS dimension {dense.d} != manifest {dimension}"
        )
    return SearchIndex(path=gen, manifest=manifest, store=store, bm25=bm25, dense=dense)
