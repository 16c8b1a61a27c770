"""Checking an index folder in full (``ragchains index verify``): every file of the current
generation against its recorded checksum, then the parts opened together; what is damaged is
reported, not raised."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import faiss

from ragchains.retrievers.chunkstore import ChunkStore
from ragchains.retrievers.fusionfile import read_fusion
from ragchains.retrievers.indexformat import (
    CHUNKS_FILE,
    DENSE_FILE,
    GENERATION_PARTS,
    IndexDamagedError,
    IndexLoadError,
    StoredBM25,
    current_generation,
    damaged,
    file_problem,
    read_manifest,
    recorded_checksums,
)
from ragchains.retrievers.searchindex import first_nonfinite_row, open_generation


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
    checksums = recorded_checksums(index_dir, manifest)
    result = Verification(root, gen.name, checksums is not None, [])
    if checksums is None:
        for name in GENERATION_PARTS:
            result.files.append(FileCheck(name, _unrecorded_problem(gen, name)))
    else:
        for name, recorded in checksums.items():
            result.files.append(FileCheck(name, file_problem(gen, name, recorded)))
    bad = [f for f in result.files if f.problem]
    if bad:
        what = (
            f"{bad[0].name} {bad[0].problem}"
            if len(bad) == 1
            else f"{len(bad)} of {len(result.files)} files are damaged "
            f"({', '.join(f.name for f in bad)})"
        )
        result.damage = damaged(index_dir, what)
        return result
    try:
        # legacy=False: the vectors were scanned above.
        index = open_generation(index_dir, gen, manifest, legacy=False)
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
            bad = first_nonfinite_row(faiss.read_index(str(path)))
        except RuntimeError:
            return "cannot be read"
        return None if bad is None else f"holds NaN or infinite values (row {bad})"
    try:
        StoredBM25.load(str(path), allow_pickle=False, show_progress=False)
    except Exception as exc:  # bm25s raises several kinds on truncated or missing arrays
        return f"cannot be read ({exc})"
    return None
