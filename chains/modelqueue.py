"""A bounded, first-come-first-served queue in front of a chat model.

A model serves ``slots`` calls at once (one llama.cpp context: one; an OpenAI-compatible
server: as many as it runs in parallel). Further calls wait, ordered by when the *request*
they serve arrived, not by when the call was made: a chat turn calls the model more than
once (rewrite, answer, maybe a re-query), and if each call queued at the back, every turn's
answer would wait behind every later turn's rewrite. By arrival, the first request in gets
its first answer token first, and the queue's order is the order of arrival.

A request is a ``Ticket`` in a context variable (``request_ticket``): asyncio tasks and
LangChain's runs (its executor threads copy the context) see the one their request
opened. A call made outside any request is a request of its own, arriving as it is made.

A ticket's ``max_wait`` bounds the time its request spends waiting for the model, all of
its calls together: a call that would wait beyond it stops waiting and raises
``ModelBusy``, which says when to try again. Before a request starts, ``ModelQueue.admit``
estimates its wait (the model work of the requests ahead, spread over the slots, at the
recent time per request) and refuses it at once with ``ModelBusy`` when the estimate is
over the bound: a server answers that with 503 and Retry-After before any stream starts.

The queue belongs with the model (``TakesTurns``): whoever composes the model in process
gets the same order and bounds as the server. Only async calls queue; sync ones (``invoke``
and ``batch`` in threads) keep to the model's own locking.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import math
import statistics
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from pydantic import Field

# How many recent waits (per call, per request) the queue keeps for its status.
RECENT = 200
# Weight of the newest sample in the running means of service time.
SMOOTHING = 0.2


class ModelBusy(Exception):
    """The chat model is too busy for this request's wait to stay within its bound;
    ``retry_after``: whole seconds after which the wait is likely to fit."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(eq=False)
class Ticket:
    """One request's place in the model's queues: when it arrived, how long it may wait
    for the model in all (None: as long as it takes), and how long it has waited."""

    arrived: float = field(default_factory=time.monotonic)
    max_wait: float | None = None
    waited: float = 0.0
    queues: list[ModelQueue] = field(default_factory=list)  # those that admitted it
    gave_up: bool = False  # a call stopped waiting: its request did not finish its work

    def time_left(self) -> float | None:
        return None if self.max_wait is None else self.max_wait - self.waited

    def close(self) -> None:
        """The request is over: the queues that admitted it stop counting its work."""
        queues, self.queues = self.queues, []
        for queue in queues:
            queue.finished(self)


REQUEST: ContextVar[Ticket | None] = ContextVar("ragchains_model_request", default=None)


@contextlib.contextmanager
def request_ticket(max_wait: float | None = None) -> Iterator[Ticket]:
    """A request starts: the model calls made in this context (and the tasks and LangChain
    runs it starts) take their turns as this request, by its arrival."""
    ticket = Ticket(max_wait=max_wait)
    token = REQUEST.set(ticket)
    try:
        yield ticket
    finally:
        REQUEST.reset(token)
        ticket.close()


def current_ticket() -> Ticket | None:
    return REQUEST.get()


class _Mean:
    """An exponentially weighted running mean (None before the first sample)."""

    def __init__(self) -> None:
        self.value: float | None = None

    def add(self, sample: float) -> None:
        self.value = (
            sample if self.value is None else self.value + SMOOTHING * (sample - self.value)
        )


@dataclass(eq=False)
class _Waiter:
    key: tuple[float, int]  # (arrival of its request, order of the call)
    ticket: Ticket | None
    wake: Callable[[], None]
    since: float = field(default_factory=time.monotonic)
    hold: _Hold | None = None  # set when granted a slot

    def __lt__(self, other: _Waiter) -> bool:
        return self.key < other.key


@dataclass(eq=False)
class _Hold:
    ticket: Ticket | None
    since: float = field(default_factory=time.monotonic)


class ModelQueue:
    """``slots`` calls at once; the others wait in order of their request's arrival (see the
    module's docstring). ``max_wait``: the bound for calls made outside a request that set
    its own. Safe across threads and event loops (one model may serve several loops)."""

    def __init__(self, slots: int = 1, *, max_wait: float | None = None) -> None:
        if slots < 1:
            raise ValueError(f"a model queue needs at least one slot, not {slots}")
        if max_wait is not None and max_wait < 0:
            raise ValueError(f"max_wait must be 0 or more seconds, not {max_wait}")
        self.slots = slots
        self.max_wait = max_wait
        self._lock = threading.Lock()
        self._order = itertools.count()
        self._waiting: list[_Waiter] = []  # sorted: first to be served first
        self._holds: set[_Hold] = set()
        # Admitted requests not yet finished -> model seconds they have held so far.
        self._requests: dict[Ticket, float] = {}
        self._call_seconds = _Mean()  # one call's hold of a slot
        self._request_seconds = _Mean()  # one request's holds, all its calls together
        self._call_waits: deque[float] = deque(maxlen=RECENT)
        self._request_waits: deque[float] = deque(maxlen=RECENT)
        # Counters, for metrics: calls served, seconds they waited, requests refused at
        # admission, calls that gave up waiting.
        self.calls = 0
        self.wait_seconds = 0.0
        self.refused = 0
        self.gave_up = 0

    # ------------------------------------------------------------------ taking a turn
    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Hold one slot for the block, after waiting for it in order."""
        hold = await self._acquire(current_ticket())
        try:
            yield
        finally:
            self._release(hold)

    async def _acquire(self, ticket: Ticket | None) -> _Hold:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            loop.call_soon_threadsafe(_resolve, future)

        with self._lock:
            if len(self._holds) < self.slots:
                self._record_wait(ticket, 0.0)
                return self._take(ticket)
            arrived = ticket.arrived if ticket is not None else time.monotonic()
            waiter = _Waiter((arrived, next(self._order)), ticket, wake)
            bisect.insort(self._waiting, waiter)
            left = self._time_left(ticket)
        try:
            if left is not None and left <= 0:
                raise TimeoutError
            await asyncio.wait_for(future, left)
        except BaseException as exc:
            with self._lock:
                waited = time.monotonic() - waiter.since
                if waiter.hold is not None:  # granted as it gave up: pass the slot on
                    self._hand_on(waiter.hold)
                else:
                    self._waiting.remove(waiter)
                self._record_wait(ticket, waited)
                if isinstance(exc, TimeoutError):
                    self.gave_up += 1
                    if ticket is not None:
                        ticket.gave_up = True
                    raise self._busy(ticket) from None
            raise
        assert waiter.hold is not None  # set before the future was resolved
        with self._lock:
            self._record_wait(ticket, waiter.hold.since - waiter.since)
        return waiter.hold

    def _take(self, ticket: Ticket | None) -> _Hold:
        hold = _Hold(ticket)
        self._holds.add(hold)
        return hold

    def _release(self, hold: _Hold) -> None:
        with self._lock:
            self._hand_on(hold)

    def _hand_on(self, hold: _Hold) -> None:
        """``hold`` ends (lock held): its time is counted, its slot goes to the first waiter."""
        held = time.monotonic() - hold.since
        self._holds.discard(hold)
        self._call_seconds.add(held)
        if hold.ticket is not None and hold.ticket in self._requests:
            self._requests[hold.ticket] += held
        while self._waiting:
            waiter = self._waiting.pop(0)
            waiter.hold = self._take(waiter.ticket)
            try:
                waiter.wake()
                return
            except RuntimeError:  # its event loop is closed: nobody is waiting there
                self._holds.discard(waiter.hold)
                waiter.hold = None

    def _time_left(self, ticket: Ticket | None) -> float | None:
        if ticket is not None and ticket.max_wait is not None:
            return ticket.time_left()
        return self.max_wait

    def _record_wait(self, ticket: Ticket | None, waited: float) -> None:
        self.calls += 1
        self.wait_seconds += waited
        self._call_waits.append(waited)
        if ticket is not None:
            ticket.waited += waited

    # ------------------------------------------------------------------ admission
    def admit(self, ticket: Ticket) -> None:
        """Count ``ticket``'s request in, or refuse it with ``ModelBusy`` when its estimated
        wait is over its bound. Its work counts in later requests' estimates until
        ``ticket.close()``."""
        with self._lock:
            if ticket in self._requests:
                return
            limit = self._bound(ticket)
            if limit is not None:
                ahead = self._work_ahead(ticket.arrived, ticket)
                if ahead > limit:
                    self.refused += 1
                    raise ModelBusy(self._busy_message(ahead), _retry_after(ahead, limit))
            self._requests[ticket] = 0.0
            ticket.queues.append(self)

    def finished(self, ticket: Ticket) -> None:
        with self._lock:
            held = self._requests.pop(ticket, None)
            if held is None:
                return
            if not ticket.gave_up:  # a request cut short would make the next estimates low
                self._request_seconds.add(held)
            self._request_waits.append(ticket.waited)

    def _work_ahead(self, arrived: float, ticket: Ticket | None = None) -> float:
        """Seconds a request arriving at ``arrived`` is expected to wait (lock held): the
        model time still due to the requests that arrived before it, over the slots."""
        per_call = self._call_seconds.value or 0.0
        per_request = self._request_seconds.value or per_call
        now = time.monotonic()
        holding: dict[Ticket | None, float] = {}
        for hold in self._holds:
            holding[hold.ticket] = holding.get(hold.ticket, 0.0) + now - hold.since
        due = 0.0
        for other, held in self._requests.items():
            if other is not ticket and other.arrived <= arrived:
                due += max(0.0, per_request - held - holding.get(other, 0.0))
        # Calls of no admitted request: each waiting one costs a call.
        due += per_call * sum(
            1
            for waiter in self._waiting
            if waiter.key[0] <= arrived and waiter.ticket not in self._requests
        )
        return due / self.slots

    def _busy(self, ticket: Ticket | None) -> ModelBusy:
        """The error of a call that waited as long as its request may (lock held)."""
        bound = self._bound(ticket) or 0.0
        ahead = self._work_ahead(time.monotonic())
        message = f"the chat model is busy: no turn within {bound:g} s of waiting"
        return ModelBusy(message, _retry_after(ahead, bound))

    def _bound(self, ticket: Ticket | None) -> float | None:
        if ticket is not None and ticket.max_wait is not None:
            return ticket.max_wait
        return self.max_wait

    def _busy_message(self, ahead: float) -> str:
        waiting = len(self._requests)
        return (
            f"the chat model is busy: about {ahead:.0f} s of work is ahead "
            f"({waiting} request{'s' if waiting != 1 else ''} in progress)"
        )

    # ------------------------------------------------------------------ status
    def status(self) -> dict[str, Any]:
        """What the queue is doing now, and what it has done lately."""
        with self._lock:
            now = time.monotonic()
            oldest = min((w.since for w in self._waiting), default=None)
            return {
                "slots": self.slots,
                "busy": len(self._holds),
                "waiting": len(self._waiting),
                "requests": len(self._requests),
                "estimated_wait_s": round(self._work_ahead(now), 3),
                "longest_waiting_s": round(now - oldest, 3) if oldest is not None else 0.0,
                "call_wait_s": _summary(self._call_waits),
                "request_wait_s": _summary(self._request_waits),
                "seconds_per_call": _rounded(self._call_seconds.value),
                "seconds_per_request": _rounded(self._request_seconds.value),
                "refused": self.refused,
                "gave_up": self.gave_up,
            }


def _retry_after(ahead: float, limit: float) -> int:
    """Whole seconds until the work ahead has shrunk to within ``limit`` (at least 1)."""
    return max(1, math.ceil(ahead - limit))


def _summary(values: deque[float]) -> dict[str, float | int]:
    if not values:
        return {"count": 0, "median": 0.0, "max": 0.0}
    return {
        "count": len(values),
        "median": round(statistics.median(values), 3),
        "max": round(max(values), 3),
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# ----------------------------------------------------------------------------- models
class TakesTurns(BaseChatModel):
    """A chat model whose async calls take turns in its ``queue`` (a mixin: put it before
    the model's class, ``class Mine(TakesTurns, SomeChatModel)``). The wait comes before
    the call: a deadline the model sets on its call starts when its turn does."""

    queue: ModelQueue = Field(default_factory=ModelQueue, exclude=True)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        async with self.queue.turn():
            return await super()._agenerate(messages, stop, run_manager, **kwargs)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        async with self.queue.turn():
            async for chunk in super()._astream(messages, stop, run_manager, **kwargs):
                yield chunk


def model_queues(model: Any) -> list[ModelQueue]:
    """The queues of a chat model, or of a runnable around chat models (a binding, a model
    with fallbacks), first model's first."""
    found: list[ModelQueue] = []
    pending = [model]
    while pending:
        item = pending.pop(0)
        queue = getattr(item, "queue", None)
        if isinstance(queue, ModelQueue) and queue not in found:
            found.append(queue)
        for name in ("bound", "runnable"):
            inner = getattr(item, name, None)
            if inner is not None:
                pending.append(inner)
        pending.extend(getattr(item, "fallbacks", None) or [])
    return found


def model_busy(exc: BaseException) -> ModelBusy | None:
    """The ``ModelBusy`` that ``exc`` is, groups (anyio's task groups raise those) or was
    caused by; None if none."""
    seen: set[int] = set()
    pending = [exc]
    while pending:
        error = pending.pop(0)
        if id(error) in seen:
            continue
        seen.add(id(error))
        if isinstance(error, ModelBusy):
            return error
        if isinstance(error, BaseExceptionGroup):
            pending.extend(error.exceptions)
        if error.__cause__ is not None:
            pending.append(error.__cause__)
    return None
