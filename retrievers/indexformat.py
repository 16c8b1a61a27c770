"""The on-disk index format: the folder's layout, names and version, the records it holds
(chunks, files), the errors a load or a write reports, and the manifest and checksums that
vouch for a generation.

Layout of an index directory::

    INDEX/
      CURRENT              name of the live generation (replaced atomically)
      gen-<stamp>/         one complete, immutable generation
        manifest.json      format version, embedder, chunk count, field types, build time,
                           its number (the one it replaced plus one), and the sha256 of every
                           other file of the generation (checked at load)
        chunks.sqlite      chunk text + metadata (JSON) by row, and the per-file records
        bm25/              bm25s arrays (.npy, loaded with allow_pickle=False) + JSON vocab,
                           and each row's length in tokens (doc_lengths.npy)
        dense.faiss        FAISS index over the normalised embeddings, rows = chunk rows
      ingests.json         the ingest runs so far and the last one's counts (``ingest.report``,
                           for a server's /metrics); written by each run, outside the generations
      fusion.json          optional: how the hybrid retriever fuses BM25 and dense here, as
                           ``ragchains eval tune --apply`` recommends (kept across ingests)
      files/<sha256>       the original bytes of each ingested file, named by their sha256
                           (content-addressed, outside the generations: an unchanged file is
                           never copied again). A generation refers to the originals of its
                           files' records, unless its manifest says ``"originals": false``
                           (``ingest --no-originals``). Written to ``files/.tmp-*`` and
                           renamed once whole and checked, before the generation naming them
                           commits; those no generation refers to go after each commit.

``retrievers.indexwriter`` writes a generation, ``retrievers.searchindex`` loads one,
``retrievers.indexverify`` checks one in full and ``retrievers.fusionfile`` reads and writes
fusion.json. No pickle anywhere.

Loading checks each file against the checksum the manifest recorded, so bytes damaged on disk
(a bad sector, a stray write) stop the load with the file's name instead of serving NaN
scores or garbled chunks.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bm25s
import numpy as np

from ragchains.retrievers.embeddings import UNRECORDED_BACKEND

FORMAT_NAME = "ragchains-index"
FORMAT_VERSION = 1
CURRENT_FILE = "CURRENT"
MANIFEST_FILE = "manifest.json"
CHUNKS_FILE = "chunks.sqlite"
BM25_DIR = "bm25"
DENSE_FILE = "dense.faiss"
# The parts every generation has: its chunks, its vectors and its BM25 folder.
GENERATION_PARTS = (CHUNKS_FILE, DENSE_FILE, BM25_DIR)
LOCK_FILE = ".lock"
FILES_DIR = "files"
BM25_LENGTHS_FILE = "doc_lengths.npy"
GEN_PREFIX = "gen-"
_DIGEST = "sha256"


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


class IndexBusyError(IndexLoadError):
    pass


class IndexWriteError(OSError):
    """A new generation could not be written (a full disk, say). An OSError, as the failure
    it reports; its message names the file and says the index did not change."""

    def __str__(self) -> str:
        return str(self.strerror)


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
    # What the documents API shows of it (see ``ingest.details``): its pages, slides or
    # rows, OCR confidence, what was left out, when it was read and who uploaded it.
    details: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------- generations
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
    if not name.startswith(GEN_PREFIX) or "/" in name or not (root / name).is_dir():
        raise IndexDamagedError(damaged(root, f"{CURRENT_FILE} names {name!r}, which is not there"))
    return root / name


def _repair(index_dir: str | Path) -> str:
    return (
        f"rebuild it with `ragchains ingest PATH... --index {index_dir} --rebuild`, "
        "or restore the folder from a backup"
    )


def damaged(index_dir: str | Path, what: str) -> str:
    """The message for an index found damaged: ``what`` is wrong, and the way to mend it."""
    return f"index {index_dir} is damaged: {what}; {_repair(index_dir)}"


def read_manifest(index_dir: str | Path, gen: Path) -> dict[str, Any]:
    """A generation's manifest, checked for format and version."""
    try:
        manifest = json.loads((gen / MANIFEST_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise IndexDamagedError(damaged(index_dir, f"{MANIFEST_FILE} is missing")) from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise IndexDamagedError(
            damaged(index_dir, f"{MANIFEST_FILE} is not valid JSON ({exc})")
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


def embedder_mismatch(
    where: str,
    recorded: dict[str, Any],
    name: str | None,
    dimension: int | None,
    backend: str | None = None,
) -> str | None:
    """Why the embedder ``recorded`` by an index or store (``where``) does not fit this run's
    ``name``, ``dimension`` and ``backend`` (None: not checked), or None when it fits."""
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
    held = recorded.get("backend") or UNRECORDED_BACKEND
    if backend is not None and held != backend:
        # Each backend's vectors are within noise of the other's, not equal: a query embedded
        # by one against chunks embedded by the other ranks slightly off, so never mixed.
        return (
            f"{where} was embedded with the {held} backend, but this run uses {backend} "
            f"(RAGCHAINS_EMBEDDING_BACKEND). Set it to {held} or auto, or rebuild with "
            "`ragchains ingest --rebuild`."
        )
    return None


def recorded_embedder(index_dir: str | Path) -> dict[str, Any] | None:
    """The embedder the current generation records (None: no readable index; loading it
    says why)."""
    try:
        manifest = read_manifest(index_dir, current_generation(index_dir))
    except (IndexLoadError, OSError, ValueError):
        return None
    recorded = manifest.get("embedder")
    return recorded if isinstance(recorded, dict) else None


def is_file_id(text: str) -> bool:
    """Whether ``text`` is a file id: a sha256 in lowercase hex (the name of an original)."""
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def original_path(index_dir: str | Path, file_id: str) -> Path | None:
    """Where the original with this id is kept in an index folder (None: not a file id)."""
    return Path(index_dir) / FILES_DIR / file_id if is_file_id(file_id) else None


# ----------------------------------------------------------------------------- checksums
def file_sha256(path: Path) -> tuple[str, int]:
    """A file's sha256 (hex) and size, read once."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest(), os.fstat(fh.fileno()).st_size


def _digest(path: Path) -> str:
    return f"{_DIGEST}:{file_sha256(path)[0]}"


def generation_checksums(gen: Path) -> dict[str, str]:
    """The digest of every file of a generation but its manifest, by POSIX path within it."""
    return {
        path.relative_to(gen).as_posix(): _digest(path)
        for path in sorted(gen.rglob("*"))
        if path.is_file() and path.name != MANIFEST_FILE
    }


def recorded_checksums(index_dir: str | Path, manifest: dict[str, Any]) -> dict[str, str] | None:
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
        raise IndexDamagedError(damaged(index_dir, f"{MANIFEST_FILE} has malformed checksums"))
    # Every part must be covered: a list that leaves one out would vouch for it unchecked.
    uncovered = [
        part
        for part in (f"{name}/" if name == BM25_DIR else name for name in GENERATION_PARTS)
        if not any(name == part or name.startswith(part) for name in checksums)
    ]
    if uncovered:
        raise IndexDamagedError(
            damaged(index_dir, f"{MANIFEST_FILE} records no checksum for {', '.join(uncovered)}")
        )
    return dict(sorted(checksums.items()))


def file_problem(gen: Path, name: str, recorded: str) -> str | None:
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
