"""Noticing that a served generation's files changed on disk after they were loaded.

A generation is checked in full when it is loaded (every byte against the manifest's
checksums), then served from memory (FAISS, BM25) and from an open ``chunks.sqlite``. Bytes
changed later are found only by the next load, or by a query that happens to read a damaged
page. ``ServedFiles`` lets a readiness probe ask cheaply and often: a ``stat`` per file per
call, compared with what stat said when the file was loaded; only a file whose stat changed
is hashed again, once per change (a restored file is found sound again). Hashing every file
on every probe would read the whole index (hundreds of MB) several times a minute.

What stat cannot show, bytes changed under an unchanged stat (bit rot below the file
system, a write that restores mtime and ctime), is for ``ragchains index verify``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ragchains.retrievers.indexformat import file_problem

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FileStamp:
    """What stat says of a file. ctime moves on every write and cannot be set back by a
    caller, so a rewrite that restores mtime still shows."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int


def file_stamp(path: Path) -> FileStamp | None:
    """The file's stamp, or None when it cannot be stat'ed (gone, or not readable)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return FileStamp(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass(frozen=True)
class FileDamage:
    """A file of the served generation that no longer holds the bytes loaded from it:
    ``name`` within the generation (POSIX, never a server path) and what is wrong."""

    name: str
    problem: str


class ServedFiles:
    """The files a loaded generation was read from, as stat saw them before they were
    checked; ``damage()`` says whether they still hold those bytes. Thread-safe."""

    def __init__(
        self, generation: Path, names: Iterable[str], checksums: Mapping[str, str] | None
    ) -> None:
        self._generation = generation
        self._checksums = dict(checksums) if checksums is not None else None
        # Taken before the load hashes the files: a change during the load shows as a
        # changed stamp at the first probe.
        self._loaded = {name: file_stamp(generation / name) for name in names}
        # The last verdict on each changed file, by the stamp it was reached on.
        self._verdicts: dict[str, tuple[FileStamp | None, str | None]] = {}
        self._lock = threading.Lock()

    def damage(self) -> FileDamage | None:
        """The first file found changed (in the order given), or None: every file is as
        loaded, or holds the same bytes under a new stat (touched, linked again)."""
        with self._lock:  # one hash per change, however many probes ask at once
            for name, loaded in self._loaded.items():
                now = file_stamp(self._generation / name)
                if now == loaded:
                    continue
                verdict = self._verdicts.get(name)
                if verdict is None or verdict[0] != now:
                    verdict = (now, self._problem(name, now))
                    self._verdicts[name] = verdict
                    if verdict[1] is not None:
                        log.error(
                            "index generation %s: %s %s (found after it was loaded)",
                            self._generation,
                            name,
                            verdict[1],
                        )
                if verdict[1] is not None:
                    return FileDamage(name, verdict[1])
        return None

    def _problem(self, name: str, now: FileStamp | None) -> str | None:
        if now is None:
            return "is missing"
        if self._checksums is None or name not in self._checksums:
            return "changed on disk (no checksum was recorded to check it against)"
        return file_problem(self._generation, name, self._checksums[name])
