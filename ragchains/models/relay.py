"""A model call's output handed from the work that produces it to the caller that reads it,
so that a caller who leaves never holds the model.

The call's slot in the model's queue (``ragchains.models.queue``), its connection to an upstream
server and its llama.cpp decoding all belong to a *producer*: an asyncio task, or a job on a
thread, that runs the call to its end whatever its reader does and puts each chunk in a
``Handoff``. The reader takes the chunks as they come. When the reader goes (its task is
cancelled, its generator closed) or its request ends, the producer is stopped: between two
chunks, or at once where it can be interrupted (a task is cancelled; a llama.cpp decode is
aborted, ``ragchains.models.embedded``). A reader abandoned at a ``yield`` and never closed costs
at most the rest of the call (its ``max_tokens``): nothing here waits for a reader to come
back, so no slot is held across a ``yield``.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_END = object()


@dataclass(frozen=True)
class _Failed:
    error: BaseException


def _taken(item: Any) -> Any:
    """An item as its reader takes it: the end marker, a chunk, or the producer's failure
    raised."""
    if isinstance(item, _Failed):
        raise item.error
    return item


class Handoff(Generic[T]):
    """Chunks from a producer on any thread to one reader: a thread (``loop`` None) or a
    coroutine on ``loop``. ``stop`` tells the producer to stop (its hooks interrupt it)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop
        # One of the two, by the reader's kind.
        self._sync: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._async: asyncio.Queue[Any] | None = asyncio.Queue() if loop is not None else None
        self.stopped = threading.Event()
        self._lock = threading.Lock()
        self._on_stop: list[Callable[[], None]] = []
        self._reason: BaseException | None = None
        self._ended = False

    # ------------------------------------------------------------------ producer's side
    def put(self, item: T) -> bool:
        """Hand ``item`` over; False once nobody will read it (stopped, or the reader's
        event loop is closed): the producer should stop."""
        if self.stopped.is_set():
            return False
        return self._deliver(item)

    def end(self, error: BaseException | None = None) -> None:
        """The producer is done: the reader gets ``error`` (raised), or the end. A producer
        stopped ends with the reason it was stopped for (its own error is the stop's echo:
        a cancelled task, an aborted decode)."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
            if self.stopped.is_set():
                error = self._reason
        self._deliver(_END if error is None else _Failed(error))

    def on_stop(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` when the handoff is stopped (at once if it is): it interrupts the
        producer. Hooks run on the stopping thread and must be safe there."""
        with self._lock:
            if not self.stopped.is_set():
                self._on_stop.append(hook)
                return
        hook()

    # ------------------------------------------------------------------ either side
    def stop(self, reason: BaseException | None = None) -> None:
        """Stop the producer. ``reason``: what a reader still reading gets (none: the reader
        has gone)."""
        with self._lock:
            if self.stopped.is_set():
                return
            self._reason = reason
            self.stopped.set()
            hooks, self._on_stop = self._on_stop, []
        for hook in hooks:
            hook()

    # ------------------------------------------------------------------ reader's side
    def __iter__(self) -> Iterator[T]:
        try:
            while (item := _taken(self._sync.get())) is not _END:
                yield item
        finally:
            self.stop()

    async def __aiter__(self) -> AsyncIterator[T]:
        assert self._async is not None, "a handoff to a thread is read with for, not async for"
        try:
            while (item := _taken(await self._async.get())) is not _END:
                yield item
        finally:
            self.stop()

    def _deliver(self, item: Any) -> bool:
        if self._loop is None or self._async is None:
            self._sync.put(item)
            return True
        try:
            self._loop.call_soon_threadsafe(self._async.put_nowait, item)
        except RuntimeError:  # the reader's event loop is closed: nobody will read
            self.stop()
            return False
        return True


def produce_in_thread(
    executor: Executor,
    chunks: Iterator[T],
    handoff: Handoff[T],
    *,
    on_end: Callable[[], None],
) -> None:
    """Run ``chunks`` on ``executor``, handing each to ``handoff`` and stopping between two
    once it is stopped; ``on_end`` runs when the producer is done, whatever ended it (it
    releases the model's slot). The caller's context goes along (LangChain's runs, tracing).
    """
    context = contextvars.copy_context()

    def job() -> None:
        try:
            try:
                if not handoff.stopped.is_set():
                    for chunk in chunks:
                        if not handoff.put(chunk):
                            break
            finally:
                close = getattr(chunks, "close", None)  # a generator's: its own clean-up runs here
                if close is not None:
                    close()
            handoff.end()
        except BaseException as exc:  # the reader gets it, in its own thread or task
            handoff.end(exc)
        finally:
            on_end()

    try:
        executor.submit(context.run, job)
    except BaseException:  # an executor shut down: nothing will run
        on_end()
        raise


def produce_in_task(
    produce: Callable[[Handoff[T]], Awaitable[None]], handoff: Handoff[T]
) -> asyncio.Task[None]:
    """Run ``produce(handoff)`` as a task of its own (in a copy of the caller's context), which
    ``handoff.stop`` cancels; it ends the handoff however it ends."""

    async def run() -> None:
        try:
            await produce(handoff)
        except BaseException as exc:
            handoff.end(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        else:
            handoff.end()

    loop = asyncio.get_running_loop()
    task = loop.create_task(run())

    def cancel() -> None:
        # At once on the task's own loop: a task granted its turn in the same step as its
        # reader went then gives the turn back unused, instead of starting the call.
        if _running_loop() is loop:
            task.cancel()
        else:
            loop.call_soon_threadsafe(task.cancel)

    handoff.on_stop(cancel)
    return task


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
