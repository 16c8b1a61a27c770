"""A bounded, first-come-first-served queue in front of a chat model.

A model serves ``slots`` calls at once (one llama.cpp context: one; an OpenAI-compatible
server: as many as it runs in parallel). Further calls wait, ordered by when the *request*
they serve arrived, not by when the call was made: a chat turn calls the model more than
once (rewrite, answer, maybe a re-query), and if each call queued at the back, every turn's
answer would wait behind every later turn's rewrite. By arrival, the first request in gets
its first answer token first, and the queue's order is the order of arrival.

Arrival order alone does not make first tokens come in order: while an earlier request is
still retrieving (after a re-query, say) and calls no model, a free slot would serve a later
request's answer. So a call that starts an answer (``first_token``: the answer stage's model
run, ``ragchains.models.queued``) gets a slot only while the free slots leave one for every
earlier request admitted here and still open that has not had its own answer call granted (the
*answer gate*): with one slot, after them all; with slots to spare, at once. Other calls take
any free slot in order.

A request is a ``Ticket``, which a run carries in its ``RunnableConfig`` (``configurable``
under ``TICKET_KEY``; LangChain hands a run's configurable down to every run below it, the
model's included): the HTTP routes and MCP's tools put their request's there
(``with_ticket``). A call made outside any request is a request of its own, arriving as it
is made, with no bound and no gate.

A ticket's ``max_wait`` bounds the time its request spends waiting for the model: the wall
time during which at least one of its calls waits (a batch's calls wait side by side, and
that is one wait, not one per call), the answer gate included. A call that would wait
beyond it stops waiting and raises ``ModelBusy``, which says when to try again. Before a
request starts, ``ModelQueue.admit`` estimates its wait (the model work of the requests
ahead, spread over the slots, at the recent time per request, a batch's per input) and
refuses it at once with ``ModelBusy`` when the estimate is over the bound: a server answers
that with 503 and Retry-After before any stream starts.

The queue belongs with the model (``QueuedChatModel``, ``ragchains.models.queued``): whoever
composes the model in process gets the same order and bounds as the server, sync calls
(``invoke`` and ``batch`` in threads, the command line) and async ones alike. A call holds its
slot only while it runs, in a producer of its own (``ragchains.models.relay``), never across a
``yield`` its reader might not resume. A request ends (``Ticket.close``: answered, or its
client gone) and its calls end with it: one waiting leaves the queue, one running is stopped,
a new one does not start (``RequestEnded``).
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
from dataclasses import dataclass, field
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.runnables import ensure_config

# How many recent waits (per call, per request) the queue keeps for its status.
RECENT = 200
# Weight of the newest sample in the running means of service time.
SMOOTHING = 0.2


class RequestEnded(Exception):
    """The request a model call serves has ended (its client has gone, or it was answered):
    the call does not start, or stops where it is. Only work left running for a request that
    has ended sees it (an orphaned task: the request's own was cancelled). An exception, not
    a cancellation: LangChain's ``agenerate`` reads a cancelled call's result as a reply."""

    def __init__(self, message: str = "the request has ended: its client has gone") -> None:
        super().__init__(message)


class ModelBusy(Exception):
    """The chat model is too busy for this request's wait to stay within its bound;
    ``retry_after``: whole seconds after which the wait is likely to fit."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(eq=False)
class Ticket:
    """One request's place in the model's queues: when it arrived, how long it may wait
    for the model in all (None: as long as it takes), how many inputs it runs (a batch's
    each do a request's work) and how long it has waited."""

    arrived: float = field(default_factory=time.monotonic)
    max_wait: float | None = None
    inputs: int = 1
    waited: float = 0.0  # ended spans of waiting; ``waiting_time`` adds the ongoing one
    queues: list[ModelQueue] = field(default_factory=list)  # those that admitted it
    gave_up: bool = False  # a call stopped waiting: its request did not finish its work
    closed: bool = False  # the request is over: no model work is done for it any more
    _on_close: dict[object, Callable[[], None]] = field(
        default_factory=dict, init=False, repr=False
    )
    _calls_waiting: int = field(default=0, init=False, repr=False)
    _since: float = field(default=0.0, init=False, repr=False)  # start of the ongoing span
    # Its calls may wait in more than one queue (a fallback's), under each queue's lock.
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def waiting_time(self, now: float | None = None) -> float:
        """Seconds during which at least one of its calls waited, up to ``now``."""
        with self._lock:
            if self._calls_waiting == 0:
                return self.waited
            return self.waited + (now if now is not None else time.monotonic()) - self._since

    def time_left(self, now: float | None = None) -> float | None:
        return None if self.max_wait is None else self.max_wait - self.waiting_time(now)

    def call_waits(self, since: float) -> None:
        """One of its calls starts waiting at ``since``."""
        with self._lock:
            if self._calls_waiting == 0:
                self._since = since
            self._calls_waiting += 1

    def call_waited(self, until: float) -> None:
        """One of its calls stops waiting at ``until``."""
        with self._lock:
            self._calls_waiting -= 1
            if self._calls_waiting == 0:
                self.waited += max(0.0, until - self._since)

    def on_close(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when the request ends (at once if it has): it stops model work
        done for the request. Returns what takes the callback back (that work has ended)."""
        key = object()
        with self._lock:
            if not self.closed:
                self._on_close[key] = callback
                return lambda: self._forget(key)
        callback()
        return _nothing

    def _forget(self, key: object) -> None:
        with self._lock:
            self._on_close.pop(key, None)

    def close(self) -> None:
        """The request is over (answered, or its client has gone): model work still running
        for it stops, a call of it still waiting leaves the queue, and the queues that
        admitted it stop counting its work."""
        with self._lock:  # once: a request may end as its client leaves, then unwind
            self.closed = True
            callbacks = list(self._on_close.values())
            self._on_close.clear()
        for callback in callbacks:
            callback()
        queues, self.queues = self.queues, []
        for queue in queues:
            queue.finished(self)


@contextlib.contextmanager
def held_ticket(max_wait: float | None = None) -> Iterator[Ticket]:
    """A request's ticket from now to the end of the block, then closed: the model work
    still waiting or running for it ends (``Ticket.close``)."""
    ticket = Ticket(max_wait=max_wait)
    try:
        yield ticket
    finally:
        ticket.close()


# Where a run's config carries its request's ticket: configurable[TICKET_KEY].
TICKET_KEY = "__ragchains_ticket"


def with_ticket(configurable: dict[str, Any], ticket: Ticket | None) -> dict[str, Any]:
    """``configurable`` carrying ``ticket`` (unchanged for None)."""
    return configurable if ticket is None else {**configurable, TICKET_KEY: ticket}


def current_ticket() -> Ticket | None:
    """The ticket of the request the current run serves (its config's), else None (a
    request of its own)."""
    ticket = (ensure_config().get("configurable") or {}).get(TICKET_KEY)
    return ticket if isinstance(ticket, Ticket) else None


def _nothing() -> None:
    return None


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
    first_token: bool  # starts an answer: waits at the answer gate
    wake: Callable[[], None]
    since: float = field(default_factory=time.monotonic)
    hold: _Hold | None = None  # set when granted a slot
    ended: bool = False  # its request ended while it waited

    def __lt__(self, other: _Waiter) -> bool:
        return self.key < other.key


@dataclass(eq=False)
class _Hold:
    ticket: Ticket | None
    since: float = field(default_factory=time.monotonic)


@dataclass
class _Request:
    """An admitted request's work here: model seconds held so far, and whether its answer
    call has been granted (the answer gate opens for later requests' answers)."""

    held: float = 0.0
    answering: bool = False


class ModelQueue:
    """``slots`` calls at once; the others wait in order of their request's arrival, answer
    calls behind the answer gate (see the module's docstring). Safe across threads and event
    loops (one model may serve several loops)."""

    def __init__(self, slots: int = 1) -> None:
        if slots < 1:
            raise ValueError(f"a model queue needs at least one slot, not {slots}")
        self.slots = slots
        self._lock = threading.Lock()
        self._order = itertools.count()
        self._waiting: list[_Waiter] = []  # sorted: first to be served first
        self._holds: set[_Hold] = set()
        self._requests: dict[Ticket, _Request] = {}  # admitted, not yet finished
        self._call_seconds = _Mean()  # one call's hold of a slot
        self._request_seconds = _Mean()  # one request's holds, all its calls together
        self._call_waits: deque[float] = deque(maxlen=RECENT)
        self._request_waits: deque[float] = deque(maxlen=RECENT)
        # Counters, for metrics: calls served, seconds they waited, requests refused at
        # admission, calls that gave up waiting.
        self._calls = 0
        self._wait_seconds = 0.0
        self._refused = 0
        self._gave_up = 0

    # ------------------------------------------------------------------ taking a turn
    @contextlib.asynccontextmanager
    async def turn(self, *, first_token: bool = False) -> AsyncIterator[None]:
        """Hold one slot for the block (see ``acquire``)."""
        hold = await self.acquire(first_token=first_token)
        try:
            yield
        finally:
            self.release(hold)

    @contextlib.contextmanager
    def held(self, *, first_token: bool = False) -> Iterator[None]:
        """``turn`` for a thread: it blocks while it waits."""
        hold = self.acquire_blocking(first_token=first_token)
        try:
            yield
        finally:
            self.release(hold)

    async def acquire(self, *, first_token: bool = False) -> _Hold:
        """One slot, after waiting for it in order (``first_token``: the call starts an
        answer, and waits at the answer gate too), for the request of ``current_ticket()``;
        ``release`` it once the call is done. ``ModelBusy`` when the wait would outgrow the
        request's bound, ``RequestEnded`` when the request ends first."""
        ticket = current_ticket()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            loop.call_soon_threadsafe(_resolve, future)

        arrived = self._arrive(ticket, first_token, wake)
        if isinstance(arrived, _Hold):
            return arrived
        # Not wait_for: Python 3.11's returns the result of a future done as the waiting task
        # is cancelled, and a caller that went away would use the slot after all.
        with self._while_waiting(arrived) as left:
            async with asyncio.timeout(left):
                await future
        return self._granted(arrived)

    def acquire_blocking(self, *, first_token: bool = False) -> _Hold:
        """``acquire`` for a thread (``invoke`` and ``batch`` from threads, the command line):
        the same order, gate and bound; the thread blocks while it waits."""
        ticket = current_ticket()
        woken = threading.Event()
        arrived = self._arrive(ticket, first_token, woken.set)
        if isinstance(arrived, _Hold):
            return arrived
        with self._while_waiting(arrived) as left:  # Ctrl-C too leaves the queue
            if not woken.wait(left):
                raise TimeoutError
        return self._granted(arrived)

    @contextlib.contextmanager
    def _while_waiting(self, waiter: _Waiter) -> Iterator[float | None]:
        """While ``waiter`` waits (for as long as the block is given: its request's time
        left): its request's end evicts it; whatever ends its wait early takes it out of the
        queue, its bound reached as ``ModelBusy``."""
        ticket = waiter.ticket
        untie = ticket.on_close(lambda: self._evict(waiter)) if ticket is not None else _nothing
        try:
            left = ticket.time_left(waiter.since) if ticket is not None else None
            if left is not None and left <= 0:
                raise TimeoutError
            yield left
        except BaseException as exc:
            error = self._left_waiting(waiter, exc)
            if error is exc:
                raise
            raise error from None
        finally:
            untie()

    def release(self, hold: _Hold) -> None:
        """The call holding ``hold`` is done: its slot goes to the next waiter. Safe on any
        thread."""
        with self._lock:
            self._end(hold)

    def _arrive(
        self, ticket: Ticket | None, first_token: bool, wake: Callable[[], None]
    ) -> _Hold | _Waiter:
        """A call arrives: a slot at once, or its place among the waiters."""
        with self._lock:
            if ticket is not None and ticket.closed:
                raise RequestEnded()
            # Free slots have no eligible waiter (``_grant`` runs after every change).
            if len(self._holds) < self.slots and self._may_start(ticket, first_token):
                self._count_wait(0.0)
                hold = self._take(ticket, first_token)
                self._grant()  # an answer started: later answers may now start too
                return hold
            arrived = ticket.arrived if ticket is not None else time.monotonic()
            waiter = _Waiter((arrived, next(self._order)), ticket, first_token, wake)
            bisect.insort(self._waiting, waiter)
            if ticket is not None:
                ticket.call_waits(waiter.since)
            return waiter

    def _left_waiting(self, waiter: _Waiter, exc: BaseException) -> BaseException:
        """``waiter`` stopped waiting on ``exc`` (its bound, or its caller went): it leaves
        the queue. What its caller raises: ``ModelBusy`` for the bound, else ``exc``."""
        with self._lock:
            if waiter.hold is not None:  # granted as it gave up: pass the slot on
                self._end(waiter.hold, counted=False)
            elif waiter in self._waiting:
                self._waiting.remove(waiter)
                self._stop_waiting(waiter, time.monotonic())
            if not isinstance(exc, TimeoutError):
                return exc
            self._gave_up += 1
            if waiter.ticket is not None:
                waiter.ticket.gave_up = True
            return self._busy(waiter.ticket)

    @staticmethod
    def _granted(waiter: _Waiter) -> _Hold:
        if waiter.ended:
            raise RequestEnded()
        assert waiter.hold is not None  # set before it was woken
        return waiter.hold

    def _evict(self, waiter: _Waiter) -> None:
        """``waiter``'s request has ended: it leaves the queue, and its caller is told."""
        with self._lock:
            if waiter not in self._waiting:  # granted already (its caller sees the end)
                return
            self._waiting.remove(waiter)
            self._stop_waiting(waiter, time.monotonic())
            waiter.ended = True
        with contextlib.suppress(RuntimeError):  # its event loop is closed: nobody waits
            waiter.wake()

    def _may_start(self, ticket: Ticket | None, first_token: bool) -> bool:
        """The answer gate (lock held, a slot free): a call that starts an answer takes a
        slot only if the free ones leave one for each request admitted here before its own
        that has neither started its answer nor finished. One slot: it waits for them all;
        many (an OpenAI-compatible server): it waits only when taking a slot would hold up
        an earlier answer, so a model with room to spare is never left idle."""
        if not first_token or ticket is None or ticket not in self._requests:
            return True
        owed = sum(
            not request.answering
            for other, request in self._requests.items()
            if other.arrived < ticket.arrived
        )
        return self.slots - len(self._holds) - 1 >= owed

    def _take(self, ticket: Ticket | None, first_token: bool) -> _Hold:
        hold = _Hold(ticket)
        self._holds.add(hold)
        request = self._requests.get(ticket) if ticket is not None else None
        if first_token and request is not None:
            request.answering = True
        return hold

    def _grant(self) -> None:
        """Free slots go to the first waiters that may start (lock held)."""
        while len(self._holds) < self.slots:
            waiter = next(
                (w for w in self._waiting if self._may_start(w.ticket, w.first_token)), None
            )
            if waiter is None:
                return
            self._waiting.remove(waiter)
            now = time.monotonic()
            self._stop_waiting(waiter, now)
            waiter.hold = self._take(waiter.ticket, waiter.first_token)
            try:
                waiter.wake()
            except RuntimeError:  # its event loop is closed: nobody is waiting there
                self._holds.discard(waiter.hold)
                waiter.hold = None

    def _end(self, hold: _Hold, *, counted: bool = True) -> None:
        """``hold`` ends (lock held): its time counts (unless ``counted`` is False: a slot
        granted as its caller gave up was not used), its slot goes on."""
        self._holds.discard(hold)
        if counted:
            held = time.monotonic() - hold.since
            self._call_seconds.add(held)
            request = self._requests.get(hold.ticket) if hold.ticket is not None else None
            if request is not None:
                request.held += held
        self._grant()

    def _stop_waiting(self, waiter: _Waiter, now: float) -> None:
        self._count_wait(now - waiter.since)
        if waiter.ticket is not None:
            waiter.ticket.call_waited(now)

    def _count_wait(self, waited: float) -> None:
        self._calls += 1
        self._wait_seconds += waited
        self._call_waits.append(waited)

    # ------------------------------------------------------------------ admission
    def admit(self, ticket: Ticket) -> None:
        """Count ``ticket``'s request in, or refuse it with ``ModelBusy`` when its estimated
        wait is over its bound. Its work counts in later requests' estimates (and its answer
        in the answer gate) until ``ticket.close()``."""
        with self._lock:
            if ticket in self._requests:
                return
            if ticket.max_wait is not None:
                ahead = self._work_ahead(ticket.arrived, ticket)
                if ahead > ticket.max_wait:
                    self._refused += 1
                    retry = _retry_after(ahead, ticket.max_wait)
                    raise ModelBusy(self._busy_message(ahead), retry)
            self._requests[ticket] = _Request()
            ticket.queues.append(self)

    def finished(self, ticket: Ticket) -> None:
        with self._lock:
            request = self._requests.pop(ticket, None)
            if request is None:
                return
            if not ticket.gave_up:  # a request cut short would make the next estimates low
                self._request_seconds.add(request.held / max(1, ticket.inputs))
            self._request_waits.append(ticket.waiting_time())
            self._grant()  # the answer gate may open

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
        for other, request in self._requests.items():
            if other is not ticket and other.arrived <= arrived:
                owed = per_request * other.inputs - request.held - holding.get(other, 0.0)
                due += max(0.0, owed)
        # Calls of no admitted request: each waiting one costs a call.
        due += per_call * sum(
            1
            for waiter in self._waiting
            if waiter.key[0] <= arrived and waiter.ticket not in self._requests
        )
        return due / self.slots

    def _busy(self, ticket: Ticket | None) -> ModelBusy:
        """The error of a call that waited as long as its request may (lock held)."""
        bound = ticket.max_wait if ticket is not None and ticket.max_wait is not None else 0.0
        ahead = self._work_ahead(time.monotonic())
        message = f"the chat model is busy: no turn within {bound:g} s of waiting"
        return ModelBusy(message, _retry_after(ahead, bound))

    def _busy_message(self, ahead: float) -> str:
        waiting = len(self._requests)
        return (
            f"the chat model is busy: about {ahead:.0f} s of work is ahead "
            f"({waiting} request{'s' if waiting != 1 else ''} in progress)"
        )

    # ------------------------------------------------------------------ status
    def status(self) -> dict[str, Any]:
        """What the queue is doing now, and what it has done lately (and in all: calls
        served, seconds they waited, requests refused, calls that gave up waiting)."""
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
                "calls": self._calls,
                "wait_seconds": round(self._wait_seconds, 3),
                "refused": self._refused,
                "gave_up": self._gave_up,
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


def _chat_models(model: Any) -> Iterator[BaseChatModel]:
    """The chat models in a runnable around chat models (bindings, fallbacks)."""
    pending = [model]
    while pending:
        item = pending.pop(0)
        if isinstance(item, BaseChatModel):
            yield item
            continue
        for name in ("bound", "runnable"):
            inner = getattr(item, name, None)
            if inner is not None:
                pending.append(inner)
        pending.extend(getattr(item, "fallbacks", None) or [])


def model_queues(model: Any) -> list[ModelQueue]:
    """The queues of a chat model, or of a runnable around chat models (a binding, a model
    with fallbacks), first model's first."""
    found: list[ModelQueue] = []
    for chat_model in _chat_models(model):
        queue = getattr(chat_model, "queue", None)
        if isinstance(queue, ModelQueue) and queue not in found:
            found.append(queue)
    return found


def first_queue(model: Any) -> ModelQueue | None:
    """The queue a request waits in first: its first model's (a fallback, sharing a server
    or not, is asked only when that one failed)."""
    queues = model_queues(model)
    return queues[0] if queues else None


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, the members of exception groups (anyio task groups raise those) and causes."""
    seen: set[int] = set()
    pending = [exc]
    while pending:
        error = pending.pop(0)
        if id(error) in seen:
            continue
        seen.add(id(error))
        yield error
        if isinstance(error, BaseExceptionGroup):
            pending.extend(error.exceptions)
        if error.__cause__ is not None:
            pending.append(error.__cause__)


def model_busy(exc: BaseException) -> ModelBusy | None:
    """The ``ModelBusy`` that ``exc`` is, groups or was caused by; None if none."""
    return next((error for error in causes(exc) if isinstance(error, ModelBusy)), None)
