"""A model call holds its turn only while it runs (issue 39), in process: sync callers take
turns in the same queue as async ones; a reader abandoned at a ``yield`` (never resumed,
never closed) leaves no turn held; a request that ends stops its calls, waiting or running;
an HTTP request whose client disconnects is cancelled (``CancelOnDisconnect``); and the
embedded model's decoding stops inside a prompt it is reading.

Events decide what happens when; deadlines are generous guards, never timed assertions.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import AIMessageChunk
from langchain_core.outputs import ChatGenerationChunk

from ragchains.models.embedded import ChatLlamaCpp, queued_llama
from ragchains.models.queue import (
    ModelBusy,
    ModelQueue,
    RequestEnded,
    Ticket,
)
from ragchains.serving.departures import CLIENT_GONE, CancelOnDisconnect
from tests.tickets import as_request, request_ticket

GUARD = 60.0  # seconds: only a regression (a hang) comes near it
TOKENS = 400


class _SlowDecoding(ChatLlamaCpp):
    """ChatLlamaCpp's decoding replaced: ``TOKENS`` tokens, 10 ms each, no model file; counts
    the tokens it made."""

    def _stream(self, *args: Any, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        for n in range(TOKENS):
            time.sleep(0.01)
            made.append(n)
            yield ChatGenerationChunk(message=AIMessageChunk(f"t{n} "))


made: list[int] = []


def slow_model() -> Any:
    """The embedded model's queue and its one decoding thread, over slow fake decoding."""
    made.clear()
    decoding = _SlowDecoding.model_construct(model_path="none.gguf", streaming=True)
    return queued_llama(decoding, ModelQueue(1))


def wait_for(check: Any, what: str) -> None:
    deadline = time.monotonic() + GUARD
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_reader_abandoned_mid_stream_holds_no_turn() -> None:
    """The defect of issue 39 in process: a stream read for one token and then left alone
    (its generator kept, never resumed nor closed) held the model's lock for good. Now the
    call runs to its end in its producer and lets the model go; a second caller gets it."""
    model = slow_model()

    async def run() -> str:
        left = model.astream("hi").__aiter__()
        await left.__anext__()  # one token, then the reader never comes back
        other = await asyncio.wait_for(model.ainvoke("again"), GUARD)
        assert left is not None  # still referenced: no garbage collection closes it
        return str(other.content)

    assert asyncio.run(run()).startswith("t0 t1")
    sync = model.stream("hi")
    next(sync)  # the same from a thread: left open after one token
    assert str(model.invoke("again").content).startswith("t0 t1")
    assert model.queue.status()["busy"] == 0
    del sync


def test_a_reader_that_goes_stops_the_call_between_two_tokens() -> None:
    """A closed stream (sync) and a cancelled one (async) stop the decoding: far fewer than
    all its tokens are made, and the model is free."""
    model = slow_model()
    stream = model.stream("hi")
    next(stream)
    stream.close()
    wait_for(lambda: model.queue.status()["busy"] == 0, "the turn is given back")
    assert len(made) < TOKENS // 2

    made.clear()

    async def run() -> None:
        async def read() -> None:
            async for _ in model.astream("hi"):
                pass

        task = asyncio.create_task(read())
        while not made:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    wait_for(lambda: model.queue.status()["busy"] == 0, "the turn is given back")
    assert len(made) < TOKENS // 2


def test_a_request_that_ends_stops_its_calls_waiting_and_running() -> None:
    """Its client gone, a request's ticket closes: its call running is stopped (the reader
    left behind, an orphaned task, gets RequestEnded), its call waiting leaves the queue,
    and a call it makes afterwards does not start."""
    model = slow_model()

    async def run() -> tuple[list[str], dict[str, Any]]:
        seen: list[str] = []

        async def orphan() -> None:
            async for chunk in model.astream("hi"):
                seen.append(str(chunk.content))

        ticket = Ticket()
        with as_request(ticket):  # the tasks started now are the request's
            running = asyncio.create_task(orphan())
            waiting = asyncio.create_task(model.ainvoke("second"))
        while model.queue.status()["waiting"] < 1:
            await asyncio.sleep(0.01)
        ticket.close()
        with pytest.raises(RequestEnded):
            await asyncio.wait_for(running, GUARD)
        with pytest.raises(RequestEnded):
            await asyncio.wait_for(waiting, GUARD)
        with as_request(ticket), pytest.raises(RequestEnded):
            await model.ainvoke("after")
        return seen, model.queue.status()

    seen, status = asyncio.run(run())
    wait_for(lambda: model.queue.status()["busy"] == 0, "the turn is given back")
    assert len(seen) < TOKENS // 2 and status["waiting"] == 0


def test_sync_callers_take_turns_by_arrival_within_their_bound() -> None:
    """Threads wait in the same first-come queue as coroutines: by their request's arrival,
    not their call's, and no longer than the request's bound."""
    queue = ModelQueue(1)
    first = Ticket()
    second = Ticket()  # arrived after ``first``, calls before it
    hold = queue.acquire_blocking()
    order: list[str] = []

    def caller(name: str, ticket: Ticket) -> None:
        with as_request(ticket), queue.held():  # in this thread's own context
            order.append(name)

    late = threading.Thread(target=caller, args=("second", second))
    late.start()
    wait_for(lambda: queue.status()["waiting"] == 1, "the second waits")
    early = threading.Thread(target=caller, args=("first", first))
    early.start()
    wait_for(lambda: queue.status()["waiting"] == 2, "both wait")
    queue.release(hold)
    late.join(GUARD)
    early.join(GUARD)
    assert order == ["first", "second"]

    hold = queue.acquire_blocking()
    with request_ticket(max_wait=0.2), pytest.raises(ModelBusy):
        queue.acquire_blocking()
    queue.release(hold)
    status = queue.status()
    assert status["busy"] == status["waiting"] == 0 and status["gave_up"] == 1


# ----------------------------------------------------------------------------- HTTP
def test_a_request_whose_client_disconnects_is_cancelled_and_one_answered_is_not() -> None:
    """``CancelOnDisconnect``: a client gone before the reply is complete cancels the route
    (``on_departure`` first; counted as 499); a disconnect after the reply cancels nothing."""
    events: list[str] = []

    async def slow_app(scope: Any, receive: Any, send: Any) -> None:
        await receive()  # the body
        try:
            await asyncio.sleep(GUARD)
        except asyncio.CancelledError:
            events.append("cancelled")
            raise

    async def quick_app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})
        await asyncio.sleep(0.05)  # work after the reply
        events.append("after the reply")

    async def serve(app: Any) -> dict[str, Any]:
        messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        messages.put_nowait({"type": "http.request", "body": b"{}", "more_body": False})
        scope: dict[str, Any] = {"type": "http", "path": "/chat/invoke"}
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        middleware = CancelOnDisconnect(
            app, watched=lambda path: True, on_departure=lambda s: events.append("departed")
        )
        served = asyncio.create_task(middleware(scope, messages.get, send))
        await asyncio.sleep(0.02)
        messages.put_nowait({"type": "http.disconnect"})
        await asyncio.wait_for(served, GUARD)
        return scope

    scope = asyncio.run(serve(slow_app))
    assert events == ["departed", "cancelled"] and scope["state"][CLIENT_GONE]
    events.clear()
    scope = asyncio.run(serve(quick_app))
    assert events == ["after the reply"] and CLIENT_GONE not in scope.get("state", {})


# ----------------------------------------------------------------------------- llama.cpp
@pytest.mark.slow
def test_the_embedded_model_stops_inside_a_prompt_it_is_reading(smollm: Any) -> None:
    """Cancelled while llama.cpp reads a long prompt, the decode is aborted within it (the
    context holds fewer tokens than the prompt), and the next call answers as a clean one."""
    model = smollm.model.bind(temperature=0, max_tokens=8)
    client = smollm.model.model.client  # the llama.cpp model behind its queue
    prompt = "Repeat after me: " + " ".join(f"word{n}" for n in range(900))
    prompt_tokens = len(client.tokenize(prompt.encode()))
    clean = str(model.invoke("Say hello.").content)

    async def run() -> None:
        async def read() -> None:
            async for _ in model.astream(prompt):
                pass

        task = asyncio.create_task(read())
        while smollm.model.queue.status()["busy"] == 0:  # its turn has come: it reads
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    wait_for(lambda: smollm.model.queue.status()["busy"] == 0, "the turn is given back")
    assert client.n_tokens < prompt_tokens
    assert str(model.invoke("Say hello.").content) == clean
