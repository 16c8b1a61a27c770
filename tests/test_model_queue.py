"""The model's queue (ragchains.models.queue) with a fake chat model: order by the arrival of the
request a call serves, the answer gate (first tokens in order of arrival), the bound on a
request's wait (a batch's too), admission, and the context reaching LangChain's runs.
Events, not timings, decide what happens when; bounds are generous."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda
from pydantic import PrivateAttr

from ragchains.chains.answer import create_answer_chain
from ragchains.chains.llm import ANSWER_TAG, LLM
from ragchains.models.queue import (
    ModelBusy,
    ModelQueue,
    Ticket,
    current_ticket,
    model_busy,
    model_queues,
)
from ragchains.models.queued import QueuedChatModel
from tests.tickets import request_ticket

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


def queued(queue: ModelQueue, **options: Any) -> Any:
    """The fake model behind a queue, as our models are."""
    return QueuedChatModel(model=_Gated(**options), queue=queue)


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
    model = queued(ModelQueue(1))

    async def run() -> list[str]:
        async def turn(name: str, ticket_made: asyncio.Event, second: asyncio.Event) -> None:
            with request_ticket():
                ticket_made.set()
                await second.wait()  # issued when the test says
                await call(model, f"{name}-rewrite")
                await call(model, f"{name}-answer")

        holder = asyncio.create_task(call(model, "holder"))
        await until(lambda: model.model._started == ["holder"], "the holder has the model")
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
        model.model.release("holder")
        await holder
        # Each call ends once every turn still going has asked for its next call: a turn's
        # answer is asked for while the later turns' rewrites wait.
        for name in ORDER[1:]:
            await until(lambda name=name: model.model._started[-1] == name, f"{name} started")

            def all_asked() -> bool:
                return model.queue.status()["waiting"] == sum(not t.done() for t in tasks) - 1

            await until(all_asked, f"the others asked while {name} runs")
            model.model.release(name)
        await asyncio.wait_for(asyncio.gather(*tasks), GUARD)
        return model.model._started

    # Call by call, first come first served would be A, B, C's rewrites, then the answers.
    assert asyncio.run(run()) == ORDER


def test_a_request_waits_no_longer_than_its_bound_and_the_slot_passes_on() -> None:
    model = queued(ModelQueue(1))

    async def run() -> tuple[ModelBusy, dict[str, Any], str]:
        holder = asyncio.create_task(call(model, "holder"))
        await until(lambda: model.model._started == ["holder"], "the holder has the model")
        with request_ticket(max_wait=0.2) as ticket, pytest.raises(ModelBusy) as refused:
            await call(model, "impatient")
        assert ticket.waited >= 0.2
        after = model.queue.status()
        patient = asyncio.create_task(call(model, "patient"))
        await until(lambda: model.queue.status()["waiting"] == 1, "the patient one waits")
        model.model.release("holder")
        model.model.release("patient")
        await holder
        return refused.value, after, await asyncio.wait_for(patient, GUARD)

    busy, status, reply = asyncio.run(run())
    assert busy.retry_after >= 1 and "busy" in str(busy)
    assert status["waiting"] == 0 and status["gave_up"] == 1 and status["busy"] == 1
    assert reply == "reply to patient"
    assert "impatient" not in model.model._started


def test_all_of_a_requests_calls_share_its_bound() -> None:
    """The bound is the request's, not each call's: what one call waited is not waited
    again by the next."""
    model = queued(ModelQueue(1))

    async def run() -> Ticket:
        holder = asyncio.create_task(call(model, "holder"))
        await until(lambda: model.model._started == ["holder"], "the holder has the model")
        with request_ticket(max_wait=GUARD) as ticket:
            ticket.waited = GUARD - 0.1  # as if its earlier calls had waited that long
            with pytest.raises(ModelBusy):
                await call(model, "late")
        model.model.release("holder")
        await holder
        return ticket

    assert asyncio.run(run()).waited >= GUARD


def test_admission_refuses_a_request_whose_wait_would_be_over_its_bound() -> None:
    """Requests in progress ahead of a new one count in its estimate (at the recent model
    time per request), and it is refused at once, saying when to retry."""
    queue = ModelQueue(1)
    model = queued(queue, free=True, pause=0.05)

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
    assert queue.status()["requests"] == 3 and queue.status()["refused"] == 1


def test_slots_serve_that_many_calls_at_once() -> None:
    model = queued(ModelQueue(2))

    async def run() -> dict[str, Any]:
        tasks = [asyncio.create_task(call(model, f"c{n}")) for n in range(3)]
        await until(lambda: len(model.model._started) == 2, "two calls started")
        status = model.queue.status()
        for n in range(3):
            model.model.release(f"c{n}")
        await asyncio.wait_for(asyncio.gather(*tasks), GUARD)
        return status

    status = asyncio.run(run())
    assert status["busy"] == 2 and status["waiting"] == 1
    assert model.queue.status()["busy"] == 0


def test_a_waiter_that_goes_away_leaves_the_queue() -> None:
    model = queued(ModelQueue(1))

    async def run() -> tuple[dict[str, Any], str]:
        holder = asyncio.create_task(call(model, "holder"))
        await until(lambda: model.model._started == ["holder"], "the holder has the model")
        gone = asyncio.create_task(call(model, "gone"))
        await until(lambda: model.queue.status()["waiting"] == 1, "it waits")
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        status = model.queue.status()
        next_one = asyncio.create_task(call(model, "next"))
        model.model.release("holder")
        model.model.release("next")
        await holder
        return status, await asyncio.wait_for(next_one, GUARD)

    status, reply = asyncio.run(run())
    assert status["waiting"] == 0 and reply == "reply to next"
    assert "gone" not in model.model._started


def test_the_request_reaches_the_model_through_lcel_and_executor_threads() -> None:
    """The ticket set where a request starts is the one its model calls see: through a
    ``prompt | model`` run, and in the executor thread LangChain runs a sync model in."""
    prompt = ChatPromptTemplate.from_messages([("human", "{q}")])
    model = queued(ModelQueue(1), free=True)

    async def run() -> Ticket:
        with request_ticket() as ticket:
            await (prompt | model).ainvoke({"q": "hi"})  # _generate, in a thread
            async for _ in (prompt | model).astream({"q": "hi"}):  # _astream, here
                pass
        return ticket

    ticket = asyncio.run(run())
    assert model.model._tickets == [ticket, ticket]
    assert model.model._threads and model.model._threads[0] != threading.main_thread().name


def test_the_queues_of_a_model_with_fallbacks_and_bindings_are_found() -> None:
    shared = ModelQueue(4)
    primary, fallback = queued(shared), queued(shared)
    other = queued(ModelQueue(1))
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


# ----------------------------------------------------------------------------- a batch
PAUSE = 0.3  # seconds each call of the batch test holds the model


def test_a_batch_on_an_idle_queue_waits_once_and_counts_as_its_inputs() -> None:
    """A batch is one request whose turns run side by side: its wait is the time during which
    any of its calls waits, not the waits of its calls added up (4 turns of 2 calls waited
    4.8 s "in all" in 2.1 s and went past a 3 s bound on an idle queue). In the estimates,
    each of its inputs is a request's work."""
    model = queued(ModelQueue(1), free=True, pause=PAUSE)
    turns = 4
    bound = 1.25 * turns * 2 * PAUSE  # over the batch's own model time: it never waits that

    async def turn(name: str) -> str:
        await call(model, f"{name}-rewrite")
        return await call(model, f"{name}-answer")

    async def run() -> tuple[list[str], Ticket, float]:
        with request_ticket(max_wait=bound) as ticket:
            ticket.inputs = turns
            model.queue.admit(ticket)
            start = time.monotonic()
            replies = await RunnableLambda(turn).abatch([f"t{n}" for n in range(turns)])
            return replies, ticket, time.monotonic() - start

    replies, ticket, wall = asyncio.run(run())
    assert replies == [f"reply to t{n}-answer" for n in range(turns)]
    assert 0 < ticket.waited <= wall  # the calls' waits overlap: counted once
    status = model.queue.status()
    assert status["calls"] == 2 * turns and status["gave_up"] == 0
    # The batch's model time over its inputs: a turn's two calls, not all eight.
    assert status["seconds_per_request"] < 4 * status["seconds_per_call"], status


# ----------------------------------------------------------------------------- answer gate
def answering(model: Any) -> Any:
    """``model`` as the answer stage calls it: a step of a run tagged as the answer's."""
    bound = LLM(model=model, name="gated").bound(temperature=0, max_tokens=8)
    return (RunnableLambda(lambda text: text) | bound).with_config(tags=[ANSWER_TAG])


async def admitted_request(
    model: Any, name: str, retrieved: asyncio.Event | None = None, *, answer: bool = True
) -> None:
    """A chat turn: rewrite, retrieve (until ``retrieved`` is set: no model call), answer."""
    with request_ticket(max_wait=GUARD) as ticket:
        model.queue.admit(ticket)
        await call(model, f"{name}-rewrite")
        if retrieved is not None:
            await retrieved.wait()
        if answer:
            await call(answering(model), f"{name}-answer")


def test_an_answer_waits_until_earlier_requests_start_theirs_other_calls_do_not() -> None:
    """While an earlier request retrieves (calls no model), a later one's rewrite takes the
    free model, but its answer waits at the gate until the earlier answer has started:
    first tokens in order of arrival. A call of no admitted request is not gated."""
    model = queued(ModelQueue(1))

    async def run() -> tuple[list[str], dict[str, Any]]:
        retrieved = asyncio.Event()
        early = asyncio.create_task(admitted_request(model, "E", retrieved))
        await until(lambda: model.model._started == ["E-rewrite"], "E rewrites")
        model.model.release("E-rewrite")
        await until(lambda: model.queue.status()["busy"] == 0, "E retrieves")
        late = asyncio.create_task(admitted_request(model, "L"))
        await until(
            lambda: model.model._started[-1:] == ["L-rewrite"], "L's rewrite runs meanwhile"
        )
        model.model.release("L-rewrite")
        await until(lambda: model.queue.status()["waiting"] == 1, "L's answer waits")
        gated = model.queue.status()
        outsider = asyncio.create_task(call(answering(model), "outsider"))
        await until(lambda: model.model._started[-1:] == ["outsider"], "no request: not gated")
        model.model.release("outsider")
        await outsider
        assert "L-answer" not in model.model._started
        retrieved.set()
        await until(lambda: model.model._started[-1:] == ["E-answer"], "E answers")
        model.model.release("E-answer")
        await until(lambda: model.model._started[-1:] == ["L-answer"], "then L")
        model.model.release("L-answer")
        await asyncio.wait_for(asyncio.gather(early, late), GUARD)
        return model.model._started, gated

    started, gated = asyncio.run(run())
    assert started == ["E-rewrite", "L-rewrite", "outsider", "E-answer", "L-answer"]
    assert gated["busy"] == 0 and gated["waiting"] == 1  # the model free, the answer held


def test_the_gate_opens_when_an_earlier_request_ends_without_an_answer() -> None:
    model = queued(ModelQueue(1))

    async def run() -> list[str]:
        gone = asyncio.Event()
        early = asyncio.create_task(admitted_request(model, "E", gone, answer=False))
        await until(lambda: model.model._started == ["E-rewrite"], "E rewrites")
        model.model.release("E-rewrite")
        late = asyncio.create_task(admitted_request(model, "L"))
        await until(lambda: model.model._started[-1:] == ["L-rewrite"], "L rewrites")
        model.model.release("L-rewrite")
        await until(lambda: model.queue.status()["waiting"] == 1, "L's answer waits")
        gone.set()  # E ends (its ticket closes) without answering: L's answer goes
        await until(lambda: model.model._started[-1:] == ["L-answer"], "L answers")
        model.model.release("L-answer")
        await asyncio.wait_for(asyncio.gather(early, late), GUARD)
        return model.model._started

    assert asyncio.run(run()) == ["E-rewrite", "L-rewrite", "L-answer"]


def test_with_slots_to_spare_an_answer_starts_keeping_one_for_each_earlier_request() -> None:
    """Two slots, E still retrieving: L's answer starts at once (the other slot is kept for
    E's), M's waits until E's answer has started; then M's gets the slot L's frees. A model
    with room to spare is never left idle, and no later answer holds up an earlier one."""
    model = queued(ModelQueue(2))

    async def run() -> list[str]:
        retrieved = asyncio.Event()
        early = asyncio.create_task(admitted_request(model, "E", retrieved))
        await until(lambda: model.model._started == ["E-rewrite"], "E rewrites")
        model.model.release("E-rewrite")
        late = asyncio.create_task(admitted_request(model, "L"))
        await until(lambda: model.model._started[-1:] == ["L-rewrite"], "L rewrites")
        model.model.release("L-rewrite")
        await until(lambda: model.model._started[-1:] == ["L-answer"], "L answers at once")
        third = asyncio.create_task(admitted_request(model, "M"))
        await until(lambda: model.model._started[-1:] == ["M-rewrite"], "M rewrites")
        model.model.release("M-rewrite")
        await until(lambda: model.queue.status()["waiting"] == 1, "M's answer waits for E's")
        retrieved.set()
        await until(lambda: model.model._started[-1:] == ["E-answer"], "E answers")
        assert "M-answer" not in model.model._started  # both slots are taken
        model.model.release("L-answer")
        await until(lambda: model.model._started[-1:] == ["M-answer"], "M answers")
        model.model.release("E-answer")
        model.model.release("M-answer")
        await asyncio.wait_for(asyncio.gather(early, late, third), GUARD)
        return [name for name in model.model._started if name.endswith("-answer")]

    assert asyncio.run(run()) == ["L-answer", "E-answer", "M-answer"]


def test_time_at_the_gate_counts_toward_the_bound() -> None:
    """An earlier request that never gets to its answer does not hold a later one's answer
    beyond its bound: the later one gets ModelBusy (a server's 503), not a silent wait."""
    model = queued(ModelQueue(1))

    async def run() -> tuple[Ticket, dict[str, Any]]:
        early = Ticket(max_wait=GUARD)
        model.queue.admit(early)  # admitted, retrieving for ever
        with request_ticket(max_wait=0.2) as late, pytest.raises(ModelBusy):
            model.queue.admit(late)
            await call(answering(model), "L-answer")
        status = model.queue.status()
        early.close()
        return late, status

    late, status = asyncio.run(run())
    assert late.waited >= 0.2 and late.gave_up
    assert (
        status["gave_up"] == 1 and status["waiting"] == 0 and "L-answer" not in model.model._started
    )


def test_a_slot_granted_as_its_caller_gives_up_is_passed_on_uncounted() -> None:
    """The gate opens (the earlier request closes) and in the same step the waiting caller
    is cancelled: the slot it was granted goes back, and its unused hold is no sample of a
    call's model time."""
    model = queued(ModelQueue(1))

    async def run() -> dict[str, Any]:
        early = Ticket(max_wait=GUARD)
        model.queue.admit(early)
        late = asyncio.create_task(admitted_request(model, "L"))
        await until(lambda: model.model._started == ["L-rewrite"], "L rewrites")
        model.model.release("L-rewrite")
        await until(lambda: model.queue.status()["waiting"] == 1, "L's answer waits")
        before = model.queue.status()["seconds_per_call"]
        early.close()  # grants L's answer a slot ...
        late.cancel()  # ... as it goes away
        with pytest.raises(asyncio.CancelledError):
            await late
        after = model.queue.status()
        assert after["seconds_per_call"] == before
        return after

    status = asyncio.run(run())
    assert status["busy"] == 0 and status["waiting"] == 0 and "L-answer" not in model.model._started


class _SeenQueue(ModelQueue):
    """Records whether each turn asked for was one that starts an answer."""

    def __init__(self) -> None:
        super().__init__(1)
        self.first_tokens: list[bool] = []

    async def acquire(self, *, first_token: bool = False) -> Any:
        self.first_tokens.append(first_token)
        return await super().acquire(first_token=first_token)

    def acquire_blocking(self, *, first_token: bool = False) -> Any:
        self.first_tokens.append(first_token)
        return super().acquire_blocking(first_token=first_token)


async def _streamed(chain: Any, value: Any) -> list[Any]:
    return [chunk async for chunk in chain.astream(value)]


# Each way a served chain runs: LangChain hands the model's hooks the run (and its tags) when
# the model is invoked, and not when it is streamed (then the tags are the enclosing run's).
RUNS = {
    "ainvoke": lambda chain, value: asyncio.run(chain.ainvoke(value)),
    "astream": lambda chain, value: asyncio.run(_streamed(chain, value)),
    "invoke": lambda chain, value: chain.invoke(value),
    "stream": lambda chain, value: list(chain.stream(value)),
}


@pytest.mark.parametrize("run", sorted(RUNS))
def test_only_the_answer_stages_model_calls_start_an_answer(run: str) -> None:
    """One LLM shared by a stage before the answer (here the rewriter) and the answer stage,
    in one run: only the answer's call waits at the gate (its run is tagged as the answer's),
    and the model's own code sees the same calls as a model that takes no turns."""
    from ragchains.chains.rewrite import create_rewrite_chain
    from tests.fakes import RecordingModel

    documents = [Document("The plan costs 40 a month.", metadata={"source": "plan.md"})]

    def chain(model: Any) -> Any:
        llm = LLM(model=model, name="recording")
        return (
            create_rewrite_chain(llm=llm)
            | RunnableLambda(lambda out: {"question": "plan cost", "documents": documents})
            | create_answer_chain(llm=llm, answer_style="free")
        )

    question = {"question": "what does the plan cost?"}
    queue = _SeenQueue()
    recording = RecordingModel(responses=["plan cost", "It costs 40 [plan.md]."])
    RUNS[run](chain(QueuedChatModel(model=recording, queue=queue)), question)
    assert queue.first_tokens == [False, True]
    plain = RecordingModel(responses=["plan cost", "It costs 40 [plan.md]."])
    RUNS[run](chain(plain), question)
    assert recording.kwargs == plain.kwargs != []


def test_a_model_that_does_not_stream_cannot_take_turns() -> None:
    class OnlyGenerates(BaseChatModel):
        @property
        def _llm_type(self) -> str:
            return "generates"

        def _generate(self, *args: Any, **kwargs: Any) -> ChatResult:
            return ChatResult(generations=[ChatGeneration(message=AIMessage("x"))])

    with pytest.raises(TypeError, match="neither _stream nor _astream"):
        QueuedChatModel(model=OnlyGenerates())
