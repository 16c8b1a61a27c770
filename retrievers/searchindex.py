"""A loaded generation (``SearchIndex``: chunk store, BM25 model, FAISS index) that the
retrievers search, and ``load_index``, which loads one only after checking its format,
embedder, checksums and that its parts agree (the format: ``retrievers.indexformat``)."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from ragchains.retrievers.access import AccessLabels, current_groups
from ragchains.retrievers.chunkstore import ChunkStore
from ragchains.retrievers.filewatch import FileDamage, ServedFiles
from ragchains.retrievers.filters import BASE_FIELDS, MetadataColumns
from ragchains.retrievers.fusion import FusionConfig
from ragchains.retrievers.fusionfile import read_fusion
from ragchains.retrievers.indexformat import (
    BM25_DIR,
    BM25_LENGTHS_FILE,
    CHUNKS_FILE,
    DENSE_FILE,
    GENERATION_PARTS,
    EmbedderMismatchError,
    FileRecord,
    IndexChecksumError,
    IndexDamagedError,
    StoredBM25,
    current_generation,
    damaged,
    embedder_mismatch,
    file_problem,
    original_path,
    read_manifest,
    recorded_checksums,
)
from ragchains.retrievers.scope import DocumentScope, scope_mask

# Rows of vectors checked for NaN/Inf at a time, in legacy generations: bounds the copy.
_FINITE_BATCH = 65536
# Scope masks kept per generation (a bool per row each; domains are few).
_KEPT_SCOPES = 64

log = logging.getLogger(__name__)


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
    # The files it was loaded from, as they were then (``load_index`` sets it).
    files: ServedFiles | None = field(default=None, repr=False, compare=False)
    # visible_fields by the caller's (known) groups.
    _visible_fields: dict[frozenset[str], dict[str, str]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    # The rows of each domain's scope (by its key): a generation is searched with a few.
    _scopes: dict[str, np.ndarray] = field(
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

    def scope_rows(self, scope: DocumentScope | None) -> np.ndarray | None:
        """The rows within a domain's ``scope``; None: every row (no scope). Worked out once
        per generation and scope (a dict read after that): the scope's globs are matched
        against every source name."""
        if scope is None or scope.everything:
            return None
        found = self._scopes.get(scope.key)
        if found is None:
            if len(self._scopes) >= _KEPT_SCOPES:  # scopes edited live: the old ones go
                self._scopes.clear()
            found = self._scopes[scope.key] = scope_mask(self.columns, scope)
        return found

    def scope_sources(self, scope: DocumentScope) -> set[str] | None:
        """The source names of the files with a chunk within ``scope``; None: every file."""
        rows = self.scope_rows(scope)
        return None if rows is None else self.columns.values_in("source", rows)

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

    @cached_property
    def _files_by_id(self) -> dict[str, list[FileRecord]]:
        by_id: dict[str, list[FileRecord]] = {}
        for record in self.store.files().values():
            by_id.setdefault(record.sha256, []).append(record)
        return {sha: sorted(found, key=lambda r: r.source) for sha, found in by_id.items()}

    def file_records(self, file_id: str) -> list[FileRecord]:
        """The records of the files whose bytes have this sha256 (several names may hold
        the same bytes), by source; [] for an id the generation does not hold. Who may read
        them is the caller's to check (``FileRecord.access``)."""
        return list(self._files_by_id.get(file_id, ()))

    def original(self, file_id: str) -> Path | None:
        """Where the original bytes of a file this generation holds are kept, or None: not
        one of its files, kept by a run with ``--no-originals``, or before originals were
        kept. The caller opens it once (an ingest deletes the originals it no longer needs;
        an open file stays readable)."""
        if not self._files_by_id.get(file_id) or self.manifest.get("originals") is False:
            return None
        path = original_path(self.folder, file_id)
        return path if path is not None and path.is_file() else None

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

    def damage(self) -> FileDamage | None:
        """Damage found since the load: what a query could not read, else a file that no
        longer holds the bytes loaded from it (a stat per file; see ``ServedFiles``)."""
        if self.store.damage is not None:
            return FileDamage(CHUNKS_FILE, self.store.damage)
        return self.files.damage() if self.files is not None else None

    def close(self) -> None:
        self.store.close()

    # A loaded generation never changes: it is its own pinned generation (see LiveIndex).
    def pinned(self) -> SearchIndex:
        return self

    def pin(self) -> AbstractContextManager[SearchIndex]:
        return nullcontext(self)


def load_index(
    index_dir: str | Path,
    *,
    embedder_name: str | None = None,
    embedder_dimension: int | None = None,
    embedder_backend: str | None = None,
    generation: Path | None = None,
) -> SearchIndex:
    """Load the current generation (or ``generation``, a folder of the index), checking
    format, embedder, checksums and internal consistency."""
    gen = generation or current_generation(index_dir)  # once: a writer may switch CURRENT
    manifest = read_manifest(index_dir, gen)
    problem = embedder_mismatch(
        f"index {index_dir}",
        manifest.get("embedder") or {},
        embedder_name,
        embedder_dimension,
        embedder_backend,
    )
    if problem:
        raise EmbedderMismatchError(problem)
    fusion = read_fusion(index_dir)
    checksums = recorded_checksums(index_dir, manifest)
    # Stamped before they are hashed: a change from here on shows at the next probe.
    files = ServedFiles(gen, checksums or _legacy_files(gen), checksums)
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
            wrong = file_problem(gen, name, recorded)
            if wrong:
                raise IndexChecksumError(damaged(index_dir, f"{name} {wrong}"))
    index = open_generation(index_dir, gen, manifest, legacy=checksums is None)
    index.fusion = fusion
    index.files = files
    return index


def _legacy_files(gen: Path) -> list[str]:
    """The files of a generation written without checksums, by name within it."""
    bm25 = sorted(p.name for p in (gen / BM25_DIR).glob("*") if p.is_file())
    return [CHUNKS_FILE, DENSE_FILE, *(f"{BM25_DIR}/{name}" for name in bm25)]


def open_generation(
    index_dir: str | Path, gen: Path, manifest: dict[str, Any], *, legacy: bool
) -> SearchIndex:
    """Open a generation's parts and check that they agree; ``legacy``: no checksum vouched
    for its vectors, so they are scanned for NaN and infinities."""
    for name in GENERATION_PARTS:
        if not (gen / name).exists():
            raise IndexDamagedError(damaged(index_dir, f"{name} is missing"))
    try:
        store = ChunkStore(gen / CHUNKS_FILE, index_dir)
    except sqlite3.DatabaseError as exc:
        raise IndexDamagedError(damaged(index_dir, f"{CHUNKS_FILE}: {exc}")) from exc
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
        raise IndexDamagedError(damaged(index_dir, f"{DENSE_FILE} cannot be read")) from exc
    try:
        bm25 = StoredBM25.load(str(gen / BM25_DIR), allow_pickle=False, show_progress=False)
    except Exception as exc:  # bm25s raises several kinds on truncated or missing arrays
        raise IndexDamagedError(damaged(index_dir, f"{BM25_DIR}/ cannot be read ({exc})")) from exc
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
        raise IndexDamagedError(damaged(index_dir, f"row counts disagree ({detail})"))
    dimension = (manifest.get("embedder") or {}).get("dimension")
    if dense.d != dimension:
        raise IndexDamagedError(
            damaged(index_dir, f"FAISS dimension {dense.d} != manifest {dimension}")
        )
    if legacy:  # no checksum vouches for the vectors: refuse the damage that shows as NaN
        bad = first_nonfinite_row(dense)
        if bad is not None:
            raise IndexDamagedError(
                damaged(index_dir, f"{DENSE_FILE} holds NaN or infinite values (row {bad})")
            )
    return SearchIndex(path=gen, manifest=manifest, store=store, bm25=bm25, dense=dense)


def first_nonfinite_row(dense: faiss.Index) -> int | None:
    """The first row of ``dense`` holding NaN or an infinity, or None."""
    for start in range(0, dense.ntotal, _FINITE_BATCH):
        block = dense.reconstruct_n(start, min(_FINITE_BATCH, dense.ntotal - start))
        finite = np.isfinite(block).all(axis=1)
        if not finite.all():
            return start + int(np.argmin(finite))
    return None
