"""Pages read inside a parse worker, told to the run that started it as they are read: a long
scan's progress shows before its file is done (OCR takes seconds a page).

The worker's loaders call ``pages_to_read`` once they know a file's page count and
``page_read`` after each page; both are no-ops unless the run listens (``listen``, from the
worker's start). Only counts cross the process boundary, never text."""

from __future__ import annotations

import contextlib
import queue
from typing import Any

# The worker's end of the run's queue, and the file it is reading (set by ``reading``).
_sink: Any = None
_source = ""


def listen(sink: Any) -> None:
    """Send this worker's page counts to ``sink`` (a multiprocessing queue)."""
    global _sink
    _sink = sink


def reading(source: str) -> None:
    global _source
    _source = source


def _send(message: tuple[str, str, int]) -> None:
    if _sink is not None:
        with contextlib.suppress(Exception):  # progress must never fail a file
            _sink.put_nowait(message)


def pages_to_read(count: int) -> None:
    """The file being read has ``count`` pages."""
    _send(("pages", _source, count))


def page_read() -> None:
    """One more page of the file being read is done."""
    _send(("page", _source, 1))


def drained(sink: Any, timeout: float) -> list[tuple[str, str, int]]:
    """The messages waiting in ``sink``, after waiting up to ``timeout`` for the first."""
    found: list[tuple[str, str, int]] = []
    try:
        found.append(sink.get(timeout=timeout))
        while True:
            found.append(sink.get_nowait())
    except queue.Empty:
        pass
    except (EOFError, OSError, ValueError):  # the queue closed under us: the run ended
        pass
    return found
