"""How far an ingest run has got: files read (and their pages and chunks), chunks embedded,
the write; with a share of the whole and an estimate of the time left. A run updates it as
it goes (``IngestReport.progress``); a documents-API job reads it from another thread, so
every update replaces whole values and ``snapshot`` copies them at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# The share of a run's time each stage takes, roughly, on these machines: parsing (and OCR)
# dominates a new file, embedding comes next, the write is quick.
_READ, _EMBED = 0.7, 0.25
STAGES = ("queued", "reading", "embedding", "writing", "done")


@dataclass
class IngestProgress:
    """One run's progress; ``on_change`` is called (from the run's thread) after each step."""

    stage: str = "queued"
    files_total: int = 0  # files to read this run (unchanged ones are not read)
    files_done: int = 0
    pages: int = 0
    chunks: int = 0  # chunks of the files read so far
    chunks_to_embed: int = 0
    chunks_embedded: int = 0
    on_change: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    # Files being read: source -> (pages it has, pages read), as its worker tells them.
    _reading: dict[str, tuple[int, int]] = field(default_factory=dict, repr=False)
    # Files whose result is in: a worker's page message can arrive after it (the queue and
    # the result travel apart) and must not count the page a second time.
    _read: set[str] = field(default_factory=set, repr=False)
    _started: float | None = field(default=None, repr=False, compare=False)
    _ended = False  # failed where it stood: nothing is left to estimate
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def _changed(self, **values: Any) -> None:
        with self._lock:
            if self._started is None and values.get("stage", self.stage) != "queued":
                self._started = time.monotonic()
            for name, value in values.items():
                setattr(self, name, value)
        if self.on_change is not None:
            self.on_change()

    def reading(self, files: int) -> None:
        self._changed(stage="reading", files_total=files)

    def file_read(self, source: str, pages: int, chunks: int) -> None:
        """``source`` is read: ``pages`` pages (those its worker told of already are not
        counted again) and ``chunks`` chunks."""
        with self._lock:
            told = self._reading.pop(source, (0, 0))[1]
            self._read.add(source)
        self._changed(
            files_done=self.files_done + 1,
            pages=self.pages + max(0, pages - told),
            chunks=self.chunks + chunks,
        )

    def pages_told(self, messages: list[tuple[str, str, int]]) -> None:
        """What parse workers told of the pages they read (``ingest.pageprogress``)."""
        read = 0
        with self._lock:
            for kind, source, count in messages:
                if source in self._read:
                    continue
                total, done = self._reading.get(source, (0, 0))
                if kind == "pages":
                    self._reading[source] = (count, done)
                else:
                    self._reading[source] = (total, done + count)
                    read += count
        if read:
            self._changed(pages=self.pages + read)

    def embedding(self, chunks: int) -> None:
        self._changed(stage="embedding", chunks_to_embed=chunks, chunks_embedded=0)

    def embedded(self, chunks: int) -> None:
        self._changed(chunks_embedded=self.chunks_embedded + chunks)

    def writing(self) -> None:
        self._changed(stage="writing")

    def done(self) -> None:
        self._changed(stage="done")

    def stopped(self) -> None:
        """The run failed where it stood (its counts stay, its estimate goes)."""
        self._changed(_ended=True)

    def fraction(self, stage: str | None = None) -> float:
        """The share of the run done, 0 to 1 (as if at ``stage``, if given)."""
        stage = stage or self.stage
        if stage == "done":
            return 1.0
        # A file being read counts for the share of its pages read.
        partly = sum(done / total for total, done in self._reading.values() if total > 0)
        read = min(1.0, (self.files_done + partly) / self.files_total) if self.files_total else 1.0
        embed = self.chunks_embedded / self.chunks_to_embed if self.chunks_to_embed else 1.0
        if stage in ("queued",):
            return 0.0
        if stage == "reading":
            return _READ * read
        if stage == "embedding":
            return _READ + _EMBED * embed
        return _READ + _EMBED  # writing

    def snapshot(self, *, finished: bool = True) -> dict[str, Any]:
        """The progress as the API shows it: counts, ``percent`` and ``eta_seconds`` (None
        until something is done to estimate from). ``finished=False``: whoever runs the
        ingest still has work after it (a server takes the new index in), so a run that is
        over shows as its last stage, never as 100 %."""
        with self._lock:
            stage = "writing" if self.stage == "done" and not finished else self.stage
            done = self.fraction(stage)
            elapsed = time.monotonic() - self._started if self._started is not None else 0.0
            going = 0 < done < 1 and elapsed > 0 and not self._ended
            eta = elapsed * (1 - done) / done if going else None
            return {
                "stage": stage,
                "files_total": self.files_total,
                "files_done": self.files_done,
                "pages": self.pages,
                "chunks": self.chunks,
                "chunks_to_embed": self.chunks_to_embed,
                "chunks_embedded": self.chunks_embedded,
                "percent": round(100 * done, 1),
                "eta_seconds": None if eta is None else round(eta, 1),
            }
