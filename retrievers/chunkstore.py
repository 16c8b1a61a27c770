"""Reading a generation's ``chunks.sqlite``: chunk text and metadata by row, and the per-file
records (written by ``retrievers.indexwriter``)."""

from __future__ import annotations

import json
import sqlite3
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import Any

from langchain_core.documents import Document

from ragchains.retrievers.indexformat import (
    CHUNKS_FILE,
    Chunk,
    FileRecord,
    IndexDamagedError,
    damaged,
)

# SQLite's result codes for a file that is not a sound database.
_DAMAGED = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})


class ChunkStore:
    """Read-only access to the chunk table; safe to share between threads.

    A query that finds the file damaged raises ``IndexDamagedError`` naming it: damage can
    lie in pages no check at load touched (or in a generation written without checksums).
    What it found is kept in ``damage`` (SQLite's words, no path), for readiness probes.
    """

    def __init__(self, path: Path, index_dir: str | Path | None = None) -> None:
        self.path = path
        self._where = index_dir if index_dir is not None else path.parent.parent
        self._con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        self._lock = threading.Lock()
        self.damage: str | None = None
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
                # Damage stays damage; a full disk or too many open files pass.
                if getattr(exc, "sqlite_errorcode", 0) & 0xFF in _DAMAGED:  # primary code
                    self.damage = self.damage or f"cannot be read ({exc})"
                raise IndexDamagedError(damaged(self._where, f"{CHUNKS_FILE}: {exc}")) from exc

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
    def _file_columns(self) -> frozenset[str]:
        with self._reading() as con:
            return frozenset(c[1] for c in con.execute("PRAGMA table_info(files)"))

    def files(self) -> dict[str, FileRecord]:
        # Files written before access labels have no such column: everyone reads them; and
        # before their details, none are known.
        access = "access" if "access" in self._file_columns else "'[]'"
        details = "details" if "details" in self._file_columns else "'{}'"
        with self._reading() as con:
            rows = con.execute(
                f"SELECT source, sha256, size, chunk_count, format, {access}, {details} FROM files"
            ).fetchall()
        return {
            r[0]: FileRecord(r[0], r[1], r[2], r[3], r[4], tuple(json.loads(r[5])), _details(r[6]))
            for r in rows
        }


def _details(text: str) -> dict[str, Any]:
    found = json.loads(text)
    return found if isinstance(found, dict) else {}
