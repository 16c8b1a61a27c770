"""Imported by the parsing workers' forkserver alone (its preload, ``parsing._context``):
a worker forked for a pool that has closed since ends without a traceback.

A pool may start a worker just as its last file is done (one file finished before the
second worker was up): the pool closes, and the worker, forked a moment later, cannot read
what it was sent (the pool's semaphores are gone: ``FileNotFoundError``; its pipe is closed:
``EOFError``). The forkserver prints any such failure with ``sys.excepthook`` on the
ingest's own stderr, a traceback in the middle of a run that went well. Only a failure
before the worker's target runs reaches the hook (``BaseProcess._bootstrap`` reports its
own), so a worker the pool needed and lost is still reported: as a file whose worker died.
"""

from __future__ import annotations

import sys
from types import TracebackType

UNWANTED = (FileNotFoundError, EOFError, ConnectionError)


def _quiet_unwanted_start(
    kind: type[BaseException], value: BaseException, traceback: TracebackType | None
) -> None:
    if isinstance(value, UNWANTED):
        return
    sys.__excepthook__(kind, value, traceback)


sys.excepthook = _quiet_unwanted_start
