"""An index folder served while ingests change it: each committed generation is loaded and
served without a restart, and each request keeps to the generation it started on.

``ragchains ingest`` writes a new generation beside the current one and then switches
CURRENT to it (see ``retrievers.indexwriter``). A ``LiveIndex`` notices the switch (a thread reads
CURRENT every ``poll`` seconds), loads the new generation in full (checksums, filter
columns) away from any request, and only then makes it current. A request pinned to a
generation (``pin``, which the server does for each request) reads that one to its end, even
once it is no longer current: its files stay readable after the ingest deletes them, as
they are loaded into memory or held open.
"""

from __future__ import annotations

import contextvars
import copy
import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ragchains.polling import Poller
from ragchains.retrievers.filewatch import FileDamage
from ragchains.retrievers.fusion import FusionConfig
from ragchains.retrievers.fusionfile import FUSION_FILE, read_fusion
from ragchains.retrievers.indexformat import FileRecord, IndexLoadError, current_generation
from ragchains.retrievers.searchindex import SearchIndex, load_index

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0
# Loads in a row of a generation that an ingest replaced (and deleted) while it loaded.
_SUPERSEDED_RETRIES = 3


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
        embedder_backend: str | None = None,
        poll: float = POLL_SECONDS,
    ) -> None:
        self._folder = Path(folder)
        self._embedder_name = embedder_name
        self._dimension = embedder_dimension
        self._backend = embedder_backend
        self.poll = poll
        self._current = self._load()
        self._seen: tuple[str | None, tuple[int, int] | None] = (
            self._current.path.name,
            _fusion_stamp(self._folder),
        )
        # The newer generation (or fusion.json) last refused, with why, for /readyz.
        self._refused: dict[str, str] | None = None
        self._unreadable = False  # CURRENT could not be read (said once)
        self._pin: contextvars.ContextVar[SearchIndex | None] = contextvars.ContextVar(
            f"ragchains-generation-{id(self)}", default=None
        )
        self._swap = threading.Lock()
        self._closed = False
        self._watcher = Poller(self.refresh, self.poll, name="ragchains-index-watch")

    def _load(self, generation: Path | None = None) -> SearchIndex:
        index = load_index(
            self._folder,
            embedder_name=self._embedder_name,
            embedder_dimension=self._dimension,
            embedder_backend=self._backend,
            generation=generation,
        )
        # The filter columns and access labels now, not in the first request after the swap.
        _ = index.columns, index.access
        return index

    # -- generations ------------------------------------------------------------------
    def pinned(self) -> SearchIndex:
        """The generation this context is pinned to, else the current one."""
        pinned = self._pin.get()
        return pinned if pinned is not None else self._current

    @contextmanager
    def pin(self) -> Iterator[SearchIndex]:
        """Keep this context (a request, and the tasks and threads it starts) on the
        generation it reads now, whatever an ingest commits meanwhile; a context already
        pinned keeps its generation."""
        pinned = self._pin.get()
        if pinned is not None:
            yield pinned
            return
        current = self._current  # once: the watcher may swap it at any moment
        token = self._pin.set(current)
        try:
            yield current
        finally:
            self._pin.reset(token)

    def refresh(self) -> bool:
        """Serve the generation CURRENT names (and fusion.json as it is) if either changed
        since last seen; True when something new is served. What cannot be served is
        logged once and not tried again until CURRENT or fusion.json changes (the next
        ingest may mend it); the current generation stays."""
        with self._swap:
            if self._closed:
                return False
            for _ in range(_SUPERSEDED_RETRIES):
                seen = (self._current_name(), _fusion_stamp(self._folder))
                if seen[0] is None or seen == self._seen:
                    return False
                try:
                    fresh = self._fresh(seen[0])
                except Exception as exc:  # IndexLoadError, or MemoryError with two loaded
                    if self._current_name() != seen[0]:
                        continue  # superseded while loading (its files deleted): the newer
                    self._seen = seen
                    self._refused = {"generation": seen[0], "error": str(exc)}
                    what = (
                        "keeping the previous fusion settings"
                        if seen[0] == self._current.path.name
                        else f"not serving generation {seen[0]}"
                    )
                    log.error("index %s: %s: %s", self._folder, what, exc)
                    return False
                self._current, self._seen, self._refused = fresh, seen, None
                break
            else:
                return False
        log.info("index %s: serving %s (%d chunks)", self._folder, fresh.path.name, len(fresh))
        return True

    def _current_name(self) -> str | None:
        """The generation CURRENT names, or None when it cannot be read (logged once)."""
        try:
            name = current_generation(self._folder).name
        except (OSError, IndexLoadError) as exc:
            if not self._unreadable:
                log.warning("index %s: no generation to serve (%s)", self._folder, exc)
            self._unreadable = True
            return None
        self._unreadable = False
        return name

    def _fresh(self, name: str) -> SearchIndex:
        if name != self._current.path.name:
            return self._load(self._folder / name)
        # The same generation, a new fusion.json (`ragchains eval tune --apply`): the
        # loaded parts, their filter columns and access labels carry over.
        fresh = copy.copy(self._current)
        fresh.fusion = read_fusion(self._folder)
        return fresh

    def watch(self) -> None:
        """Refresh every ``poll`` seconds in a thread of its own, until ``close``."""
        self._watcher.start()

    def close(self) -> None:
        self._closed = True
        self._watcher.stop()
        with self._swap:  # after any load under way: none swaps in once closed
            self._current.close()

    # -- what the retrievers, the compressor and the server use, from the pinned generation
    def visible_fields(self) -> dict[str, str]:
        return self.pinned().visible_fields()

    @property
    def fusion(self) -> FusionConfig | None:
        return self.pinned().fusion

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
        """The served generation's report, and a newer one refused (and why), if any."""
        described = self.pinned().describe()
        if self._refused is not None:
            described["refused"] = dict(self._refused)
        return described

    def damage(self) -> FileDamage | None:
        """Damage found in the served generation since it was loaded (see
        ``SearchIndex.damage``); None while CURRENT names another one: an ingest committed
        it (and may delete the served one's files), and the watcher serves it or, if it
        cannot, says why in ``describe``."""
        served = self._current
        if self._current_name() != served.path.name:
            return None
        return served.damage()

    def stored_vectors(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        return self.pinned().stored_vectors(ids)

    def file_records(self, file_id: str) -> list[FileRecord]:
        return self.pinned().file_records(file_id)

    def original(self, file_id: str) -> Path | None:
        return self.pinned().original(file_id)


def _fusion_stamp(folder: Path) -> tuple[int, int] | None:
    try:
        stat = (folder / FUSION_FILE).stat()
    except FileNotFoundError:
        return None
    return stat.st_mtime_ns, stat.st_size
