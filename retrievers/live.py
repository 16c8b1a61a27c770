"""An index folder served while ingests change it: each committed generation is loaded and
served without a restart, and each request keeps to the generation it started on.

``ragchains ingest`` writes a new generation beside the current one and then switches
CURRENT to it (see ``retrievers.index``). A ``LiveIndex`` notices the switch (a thread reads
CURRENT every ``poll`` seconds), loads the new generation in full (checksums, filter
columns) away from any request, and only then makes it current. A request pinned to a
generation (``pin``, which the server does for each request) reads that one to its end, even
once it is no longer current: its files stay readable after the ingest deletes them, as
they are loaded into memory or held open.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ragchains.retrievers.fusion import FusionConfig
from ragchains.retrievers.index import (
    CURRENT_FILE,
    FUSION_FILE,
    IndexLoadError,
    SearchIndex,
    load_index,
    read_fusion,
)

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0


class LiveFields(Mapping[str, str]):
    """Metadata field types as a mapping that follows the index (``read`` gives them now),
    for code that holds on to ``fields``: request validation, the rewriter's tools."""

    def __init__(self, read: Callable[[], Mapping[str, str]]) -> None:
        self._read = read

    def __getitem__(self, key: str) -> str:
        return self._read()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())


class LiveIndex:
    """The current generation of an index folder, replaced when an ingest commits another.

    Offers what the retrievers, the compressor and the server use of a ``SearchIndex``, each
    read from ``pinned()``: the generation this context is pinned to, else the current one.
    """

    def __init__(
        self,
        folder: str | Path,
        *,
        embedder_name: str | None = None,
        embedder_dimension: int | None = None,
        poll: float = POLL_SECONDS,
    ) -> None:
        self._folder = Path(folder)
        self._load_args = {"embedder_name": embedder_name, "embedder_dimension": embedder_dimension}
        self.poll = poll
        self._current = self._load()
        self._seen = (self._current.path.name, _fusion_stamp(self._folder))
        self._failed: str | None = None  # the generation that last failed to load (logged once)
        self._pin: contextvars.ContextVar[SearchIndex | None] = contextvars.ContextVar(
            f"ragchains-generation-{id(self)}", default=None
        )
        self._swap = threading.Lock()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def _load(self) -> SearchIndex:
        index = load_index(self._folder, **self._load_args)  # type: ignore[arg-type]
        _ = index.columns  # the filter columns now, not in the first request after the swap
        return index

    # -- generations ------------------------------------------------------------------
    def pinned(self) -> SearchIndex:
        """The generation this context is pinned to, else the current one."""
        return self._pin.get() or self._current

    @contextmanager
    def pin(self) -> Iterator[SearchIndex]:
        """Keep this context (a request, and the tasks and threads it starts) on the
        generation it reads now, whatever an ingest commits meanwhile; a context already
        pinned keeps its generation."""
        if self._pin.get() is not None:
            yield self.pinned()
            return
        token = self._pin.set(self._current)
        try:
            yield self._current
        finally:
            self._pin.reset(token)

    def refresh(self) -> bool:
        """Serve the generation CURRENT names (and fusion.json as it is) if either changed
        since last seen; True when something new is served. A generation that cannot be
        loaded is logged and the current one kept: the next ingest may mend it."""
        with self._swap:
            try:
                name = (self._folder / CURRENT_FILE).read_text(encoding="utf-8").strip()
            except OSError as exc:
                log.warning("index %s: cannot read %s (%s)", self._folder, CURRENT_FILE, exc)
                return False
            seen = (name, _fusion_stamp(self._folder))
            if seen == self._seen:
                return False
            try:
                if name != self._current.path.name:
                    fresh = self._load()
                else:  # the same generation, a new fusion.json (`ragchains eval tune --apply`)
                    fresh = replace(self._current, fusion=read_fusion(self._folder))
            except IndexLoadError as exc:
                if self._failed != name:
                    log.error("index %s: not serving generation %s: %s", self._folder, name, exc)
                    self._failed = name
                return False
            # Seen as loaded (load_index reads CURRENT again: an ingest may have switched
            # once more meanwhile, which the next refresh then finds).
            self._current, self._seen, self._failed = fresh, (fresh.path.name, seen[1]), None
        log.info(
            "index %s: serving generation %s (%d chunks)", self._folder, fresh.path.name, len(fresh)
        )
        return True

    def watch(self) -> None:
        """Refresh every ``poll`` seconds in a thread of its own, until ``close``."""
        if self._watcher is not None:
            return
        self._stop.clear()

        def run() -> None:
            while not self._stop.wait(self.poll):
                try:
                    self.refresh()
                except Exception:  # a bug must not stop the watching
                    log.exception("index %s: refresh failed", self._folder)

        self._watcher = threading.Thread(target=run, name="ragchains-index-watch", daemon=True)
        self._watcher.start()

    def close(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=10)
            self._watcher = None
        self._current.close()

    # -- what a SearchIndex offers, from the pinned generation ------------------------
    @property
    def fields(self) -> Mapping[str, str]:
        return LiveFields(lambda: self.pinned().fields)

    @property
    def columns(self) -> Any:
        return self.pinned().columns

    @property
    def store(self) -> Any:
        return self.pinned().store

    @property
    def bm25(self) -> Any:
        return self.pinned().bm25

    @property
    def dense(self) -> Any:
        return self.pinned().dense

    @property
    def fusion(self) -> FusionConfig | None:
        return self.pinned().fusion

    @property
    def manifest(self) -> dict[str, Any]:
        return self.pinned().manifest

    @property
    def path(self) -> Path:
        return self.pinned().path

    @property
    def folder(self) -> Path:
        return self._folder

    @property
    def location(self) -> str:
        return str(self._folder)

    def __len__(self) -> int:
        return len(self.pinned())

    def describe(self) -> dict[str, Any]:
        return self.pinned().describe()

    def stored_vectors(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        return self.pinned().stored_vectors(ids)

    def vectors(self) -> np.ndarray:
        return self.pinned().vectors()


def _fusion_stamp(folder: Path) -> tuple[int, int] | None:
    try:
        stat = (folder / FUSION_FILE).stat()
    except FileNotFoundError:
        return None
    return stat.st_mtime_ns, stat.st_size
