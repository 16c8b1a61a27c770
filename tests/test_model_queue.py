"""The model's queue (chains.modelqueue) with a fake chat model: order by the arrival of the
request a call serves, the bound on a request's wait, admission, and the context reaching
LangChain's runs. Events, not timings, decide what happens when; bounds are generous."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.prompts import ChatPromptTemplate
from pydantic import PrivateAttr

from ragchains.chains.llm import LLM
from ragchains.chains.modelqueue import (
    ModelBusy,
    ModelQueue,
    TakesTurns,
    Ticket,
    current_ticket,
    model_busy,
    model_queues,
    request_ticket,
)

GUARD = 30.0  # seconds: only a regression comes near it


class _Gated(BaseChatModel):
    """Each call is named by its prompt, records when it starts, and ends when the test
    opens its gate (``release``) or at once (``free``)."""

    free: bool = False
    pause: float = 0.0  # seconds a free call takes
    _started: list[str] = PrivateAttr(default_factory=list)
    _gates: dict[str, asyncio.Event] = PrivateAttr(default_factory=dict)
    _tickets: list[Ticket | None] = PrivateAttr(default_factory=list)
    _threads: list[str] = PrivateAttr(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "gated"

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        # Reached through LangChain's default async path (ainvoke), in an executor thread.
        self._threads.append(threading.current_thread().name)
        self._tickets.append(current_ticket())
        return ChatResult(generations=[ChatGeneration(message=AIMessage("sync"))])

    async def _call(self, messages: list[BaseMessage]) -> str:
        name = str(messages[-1].content)
        self._started.append(name)
        self._tickets.append(current_ticket())
        await asyncio.sleep(self.pause)
        if not self.free:
            gate = self._gates.setdefault(name, asyncio.Event())
            await asyncio.wait_for(gate.wait(), GUARD)
        return f"reply to {name}"

    async def _astream(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        text = await self._call(messages)
        yield ChatGenerationChunk(message=AIMessageChunk(content=text))

    def release(self, name: str) -> None:
        self._gates.setdefault(name, asyncio.Event()).set()


class Queued(TakesTurns, _Gated):
    """The fake model behind a queue, as our models are (TakesTurns first)."""


async def until(check: Any, what: str) -> None:
    async with asyncio.timeout(GUARD):
        while not check():
            await asyncio.sleep(0.005)


async def call(model: Any, name: str) -> str:
    return "".join([str(chunk.content) async for chunk in model.astream(name)])


ORDER = [
    "holder",
    "A-rewrite",
    "B-rewrite",  # the model is free as A's rewrite ends, before A asks again
    "A-answer",  # before C's rewrite, which has waited longer: A arrived first
    "B-answer",
    "C-rewrite",
    "C-answer",
]


def test_calls_are_served_in_order_of_their_requests_arrival_not_their_own() -> None:
    """A turn's second call (its answer) goes before the first calls of turns that arrived
    later, however long they have been waiting: arrival order, not call order."""
    model = Queued(queue=ModelQueue(1))

    async def run() -> list[str]:
        async def turn(name: str, ticket_made: asyncio.Event, second: asyncio.Event) -> None:
            with request_ticket():
                ticket_made.set()
                await second.wait()  # issued when the test says
                await call(model, f"{name}-rewrite")
                await call(model, f"{name}-answer")

        holder = asyncio.create_task(call(model, "holder"))
        await until(lambda: model._started == ["holder"], "the holder has the model")
        go = {name: asyncio.Event() for name in "ABC"}
        tasks = []
        for name in "ABC":  # tickets in this order: A arrived first
            made = asyncio.Event()
            tasks.append(asyncio.create_task(turn(name, made, go[name])))
            await made.wait()
            await asyncio.sleep(0.01)
        # Calls are made in the order C, B, A: the queue serves them by arrival all the same.
        for n, name in enumerate("CBA", start=1):
            go[name].set()
            await until(lambda n=n: model.queue.status()["waiting"] == n, f"{n} waiting")
        model.release("holder")
        await holder
        # Each call ends once every turn still going has asked for its next call: a turn's
        # answer is asked for while the later turns' rewrites wait.
        for name in ORDER[1:]:
            await until(lambda name=name: model._started[-1] == name, f"{name} started")

            def all_asked() -> bool:
                return model.queue.status()["waiting"] == sum(not t.done() for t in tasks) - 1

            await until(all_asked, f"the others asked while {name} runs")
            model.release(name)
        await asyncio.wait_for(asyncio.gather(*tasks), GUARD)
        return model._started

    # Call by call, first come first served would be A, B, C's rewrites, then the answers.
    assert asyncio.run(run()) == ORDER


def test_a_request_waits_no_longer_than_its_bound_and_the_slot_passes_on() -> None:
    model = Queued(queue=ModelQueue(1))

    async def run() -> tuple[ModelBusy, dict[str, Any], str]:
        holder = asyncio.create_task(call(model, "holder"))
        await until(lambda: model._started == ["holder"], "the holder has the model")
        with request_ticket(max_wait=0.2) as ticket, pytest.raises(ModelBusy) as refused:
            await call(model, "impatient")
        assert ticket.waited >= 0.2
        after = model.queue.status()
        patient = asyncio.create_task(call(model, "patient"))
        await until(lambda: model.queue.status()["waiting"] == 1, "the patient one waits")
        model.release("holder")
        model.release("patient")
        await holder
        return refused.value, after, await asyncio.wait_for(patient, GUARD)

    busy, status, reply = asyncio.run(run())
    assert busy.retry_after >= 1 and "busy" in str(busy)
    assert status["waiting"] == 0 and status["gave_up"] == 1 and status["busy"] == 1
    assert reply == "reply to patient"
    assert "impatient" not in model._started


def test_all_of_a_requests_calls_share_its_bound() -> None:
    """The bound is the request's, not each call's: what one call waited is not waited
    again by the next."""
    model = Queued(queue=ModelQueue(1))

    async def run() -> Ticket:
        holder = asyncio.create_task(call(model, "holder"))
        await until(lambda: model._started == ["holder"], "the holder has the model")
        with request_ticket(max_wait=GUARD) as ticket:
            ticket.waited = GUARD - 0.1  # as if its earlier calls had waited that long
            with pytest.raises(ModelBusy):
                await call(model, "late")
        model.release("holder")
        await holder
        return ticket

    assert asyncio.run(run()).waited >= GUARD


def test_admission_refuses_a_request_whose_wait_would_be_over_its_bound() -> None:
    """Requests in progress ahead of a new one count in its estimate (at the recent model
    time per request), and it is refused at once, saying when to retry."""
    queue = ModelQueue(1)
    model = Queued(queue=queue, free=True, pause=0.05)

    async def one_request() -> None:
        with request_ticket(max_wait=GUARD) as ticket:
            queue.admit(ticket)
            await call(model, "work")

    asyncio.run(one_request())
    per_request = queue.status()["seconds_per_request"]
    assert per_request is not None and per_request > 0
    # Requests in progress ahead: each still owes a request's model time.
    ahead = [Ticket(max_wait=GUARD) for _ in range(3)]
    for ticket in ahead:
        queue.admit(ticket)
    limit = 2.5 * per_request
    late = Ticket(max_wait=limit)
    with pytest.raises(ModelBusy) as refused:
        queue.admit(late)
    assert refused.value.retry_after >= 1
    assert queue.status()["refused"] == 1 and queue.status()["requests"] == 3
    ahead[0].close()
    ahead[1].close()
    queue.admit(late)  # one request ahead: within the bound
    assert queue.status()["requests"] == 2
    # A request that arrived earlier is not counted in for one that arrived before it.
    first = Ticket(arrived=ahead[2].arrived - 1, max_wait=0.0)
    queue.admit(first)


def test_slots_serve_that_many_calls_at_once() -> None:
    model = Queued(queue=ModelQueue(2))

    async def run() -> dict[str, Any]:
        tasks = [asyncio.create_task(call(model, f"c{n}")) for n in range(3)]
        await until(lambda: len(model._started) == 2, "two calls started")
        status = model.queue.status()
        for n in range(3):
            model.release(f"c{n}")
        await asyncio.wait_for(asyncio.gather(*tasks), GUARD)
        return status

    status = asyncio.run(run())
    assert status["busy"] == 2 and status["waiting"] == 1
    assert model.queue.status()["busy"] == 0


def test_a_waiter_that_goes_away_leaves_the_queue() -> None:
    model = Queued(queue=ModelQueue(1))

    async def run() -> tuple[dict[str, Any], str]:
        holder = asyncio.create_task(call(model, "holder"))
        await until(lambda: model._started == ["holder"], "the holder has the model")
        gone = asyncio.create_task(call(model, "gone"))
        await until(lambda: model.queue.status()["waiting"] == 1, "it waits")
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        status = model.queue.status()
        next_one = asyncio.create_task(call(model, "next"))
        model.release("holder")
        model.release("next")
        await holder
        return status, await asyncio.wait_for(next_one, GUARD)

    status, reply = asyncio.run(run())
    assert status["waiting"] == 0 and reply == "reply to next"
    assert "gone" not in model._started


def test_the_request_reaches_the_model_through_lcel_and_executor_threads() -> None:
    """The ticket set where a request starts is the one its model calls see: through a
    ``prompt | model`` run, and in the executor thread LangChain runs a sync model in."""
    prompt = ChatPromptTemplate.from_messages([("human", "{q}")])
    model = Queued(queue=ModelQueue(1), free=True)

    async def run() -> Ticket:
        with request_ticket() as ticket:
            await (prompt | model).ainvoke({"q": "hi"})  # _generate, in a thread
            async for _ in (prompt | model).astream({"q": "hi"}):  # _astream, here
                pass
        return ticket

    ticket = asyncio.run(run())
    assert model._tickets == [ticket, ticket]
    assert model._threads and model._threads[0] != threading.main_thread().name


def test_the_queues_of_a_model_with_fallbacks_and_bindings_are_found() -> None:
    shared = ModelQueue(4)
    primary, fallback = Queued(queue=shared), Queued(queue=shared)
    other = Queued(queue=ModelQueue(1))
    model = primary.bind(temperature=0).with_fallbacks([fallback, other])
    assert model_queues(model) == [shared, other.queue]
    assert model_queues(LLM(model=model, name="x").model)[0] is shared


def test_busy_is_found_inside_groups_and_causes() -> None:
    busy = ModelBusy("busy", 3)
    try:
        raise RuntimeError("wrapped") from busy
    except RuntimeError as exc:
        wrapped = exc
    assert model_busy(ExceptionGroup("g", [ValueError("x"), wrapped])) is busy
    assert model_busy(ValueError("x")) is None


def test_settings_refuse_a_queue_without_slots() -> None:
    with pytest.raises(ValueError, match="slot"):
        ModelQueue(0)
