"""A look taken every few seconds in a thread of its own, for what another process changes:
an ingest's new index generation (``retrievers.live``), a store's meta
(``retrievers.pgstore``), a team's domains folder (``prompts.live``).

Polling rather than change notifications: they miss edits on network and container file
systems, and a database sends none. One failed look is logged and the next one is taken: a
bug or a file system's hiccup must not stop the following.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Poller:
    """Calls ``look()`` every ``every`` seconds from ``start()`` until ``stop()``; a look
    that raises is passed to ``failed`` (default: logged with its traceback)."""

    def __init__(
        self,
        look: Callable[[], object],
        every: float,
        *,
        name: str,
        failed: Callable[[Exception], None] | None = None,
    ) -> None:
        self.look = look
        self.every = every
        self.name = name
        self.failed = failed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10) -> None:
        """Ends the looking, after the look under way (waiting up to ``timeout`` seconds)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.look()
            except Exception as exc:
                if self.failed is not None:
                    self.failed(exc)
                else:
                    log.exception("%s: a look failed", self.name)
