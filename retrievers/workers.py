"""Where retrieval's CPU work runs for async callers: off the event loop, in a small pool.

Searching (query encoding, BM25, FAISS) and reranking are CPU work. On an async call they
must not run on the event loop, where they would stall every other turn; nor in the loop's
default pool, whose threads also serve whatever has no async path and may sit blocked for
seconds (a sync-only chat model waiting for its server), so a search could queue behind them.
A pool with a thread per core is enough: more threads than cores only contend for the GIL.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def cpu_pool(threads: int | None = None) -> ThreadPoolExecutor:
    """A pool for retrieval's CPU work: ``threads`` (default: one per core) at most, started
    on first use."""
    return ThreadPoolExecutor(threads or os.cpu_count() or 1, thread_name_prefix="ragchains-cpu")


async def run_off_loop(
    executor: Executor | None, func: Callable[..., T], /, *args: Any, **kwargs: Any
) -> T:
    """``func(*args, **kwargs)`` in ``executor`` (None: the loop's default pool), with the
    caller's context variables (LangChain's run config and callbacks) as they are here."""
    call = functools.partial(contextvars.copy_context().run, func, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(executor, call)
