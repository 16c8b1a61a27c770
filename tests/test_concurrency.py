"""Concurrent turns never queue behind one another (issue 13: async-native stages).

No timings here (these machines are too noisy for them): each test is built so that a turn
that waited for another, or for a thread, would never finish. The models below only answer
once every concurrent call is in flight at the same moment; a generous timeout turns a
regression into a failure instead of a hang.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda
from langchain_core.runnables.utils import AddableDict
from pydantic import PrivateAttr

from ragchains.chains.llm import LLM, PromptedModel
from ragchains.chains.state import Step, StreamStep, Turn, settled
from ragchains.factory import Service, build_service
from ragchains.llms import ChatLlamaCpp, LockedChatLlamaCpp
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.settings import Settings
from tests.fakes import RecordingModel
from tests.servers import FakeOpenAI, fake_openai_server

TURNS = 64
HANG_GUARD = 120.0  # seconds; only a regression comes near it
QUESTION = "what does the standard plan cost?"
ANSWER = "The standard plan costs $45.00 a month [employee-handbook.md#benefit-plans]."
REWRITE = "search_sources(search_query='standard plan cost')"


class AsyncOnlyChat(BaseChatModel):
    """A chat model with only an async path: its sync methods fail the test. Streams wait,
    when ``gate`` is set, until that many streams are open at once."""

    gate: int = 0
    _open: int = PrivateAttr(0)
    _all_in: asyncio.Event | None = PrivateAttr(None)

    @property
    def _llm_type(self) -> str:
        return "async-only"

    def _generate(self, *args: Any, **kwargs: Any) -> ChatResult:
        raise AssertionError("the sync _generate ran on an async call")

    def _stream(self, *args: Any, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        raise AssertionError("the sync _stream ran on an async call")

    async def _agenerate(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage(REWRITE))])

    async def _astream(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        if self.gate:
            if self._all_in is None:
                self._all_in = asyncio.Event()
            self._open += 1
            if self._open == self.gate:
                self._all_in.set()
            await asyncio.wait_for(self._all_in.wait(), HANG_GUARD)
        for word in ANSWER.split(" "):
            yield ChatGenerationChunk(message=AIMessageChunk(word + " "))


class RefusingPool(ThreadPoolExecutor):
    """An event loop's default pool that fails whatever is sent to it."""

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a turn used the event loop's default thread pool")


def service_with(
    settings: Settings, index: Path, embedder: SentenceTransformerEmbedder, model: BaseChatModel
) -> Service:
    # Every chunk is kept (threshold -1), so every turn streams an answer from the model.
    changed = settings.model_copy(update={"requery": False, "rerank_threshold": -1.0})
    return build_service(changed, index, llm=LLM(model=model, name="fake"), embedder=embedder)


def drain(chain: Any, inputs: Any) -> Any:
    async def collect() -> list[Any]:
        return [chunk async for chunk in chain.astream(inputs)]

    return collect()


def test_turns_use_the_async_path_only_and_no_default_pool_thread(
    settings: Settings, sample_index: Path, embedder: SentenceTransformerEmbedder
) -> None:
    """What a turn waits for (the model, retrieval's CPU work) never occupies a thread of the
    loop's default pool, where it could queue behind calls blocked on something else: the
    model through its async API, retrieval and reranking in their own pool, quick steps and
    the answer's tokens on the loop."""
    service = service_with(settings, sample_index, embedder, AsyncOnlyChat())
    chains = service.chains

    async def run() -> list[Any]:
        asyncio.get_running_loop().set_default_executor(RefusingPool(1))
        return [
            await drain(chains.chat, {"question": QUESTION}),
            await chains.chat.ainvoke({"question": QUESTION}),
            await drain(chains.ask, {"question": QUESTION}),
            await chains.rewrite.ainvoke({"question": QUESTION}),
            await chains.retrieve.ainvoke({"query": "standard plan"}),
            await drain(chains.answer, {"question": QUESTION, "documents": []}),
        ]

    streamed, invoked, asked, rewritten, documents, abstained = asyncio.run(run())
    answer = "".join(chunk.get("answer", "") for chunk in streamed)
    assert answer.strip() == ANSWER and invoked["answer"].strip() == ANSWER
    assert invoked["citations"][0]["label"] == "employee-handbook.md#benefit-plans"
    assert "".join(chunk.get("answer", "") for chunk in asked).strip() == ANSWER
    # The rewrite adds nothing from a conversation: the user's own words are searched.
    assert rewritten.search_query == QUESTION and documents
    assert abstained[-1]["abstained"] is True


def test_64_concurrent_turns_are_all_in_flight_at_once(
    settings: Settings, sample_index: Path, embedder: SentenceTransformerEmbedder
) -> None:
    """The model streams only when all 64 turns are waiting for it at once: a turn held up
    by another (a lock, a pool slot, a stage that blocks the loop) would never get there."""
    service = service_with(settings, sample_index, embedder, AsyncOnlyChat(gate=TURNS))

    async def run() -> list[list[Any]]:
        asyncio.get_running_loop().set_default_executor(RefusingPool(1))
        turns = [drain(service.chains.chat, {"question": QUESTION}) for _ in range(TURNS)]
        return list(await asyncio.wait_for(asyncio.gather(*turns), HANG_GUARD))

    for chunks in asyncio.run(run()):
        assert "".join(chunk.get("answer", "") for chunk in chunks).strip() == ANSWER


@pytest.fixture(scope="module")
def gated_upstream() -> Iterator[FakeOpenAI]:
    with fake_openai_server() as server:
        yield server


@pytest.mark.slow
@pytest.mark.parametrize("route", ["/chat/stream", "/v1/chat/completions"])
def test_64_concurrent_streams_over_http_reach_the_openai_upstream_at_once(
    serve_samples: Callable[..., AbstractContextManager[str]],
    gated_upstream: FakeOpenAI,
    route: str,
) -> None:
    """The real app with the OpenAI-compatible provider, serving 64 streams at once through
    a default pool of 2 threads. The upstream answers the rewrite calls only when all 64 are
    in at once: a model called through its sync API (a pool thread each) or a client pool
    with fewer connections would break the gate."""
    gated_upstream.gate = threading.Barrier(TURNS, timeout=HANG_GUARD / 2)
    changes = {
        "llm_provider": "openai",
        "openai_model": "ok-gated",
        "openai_base_url": gated_upstream.base_url,
        "llm_max_retries": 0,
        "llm_timeout": HANG_GUARD,
        "worker_threads": 2,
        "requery": False,
    }

    async def stream(client: httpx.AsyncClient, n: int) -> str:
        question = f"{QUESTION} ({n})"
        if route == "/chat/stream":
            body: dict[str, Any] = {"input": {"question": question}}
        else:
            messages = [{"role": "user", "content": question}]
            body = {"model": "default", "messages": messages, "stream": True}
        async with client.stream("POST", route, json=body) as response:
            assert response.status_code == 200, await response.aread()
            return "\n".join([line async for line in response.aiter_lines()])

    async def all_at_once(base: str) -> list[str]:
        limits = httpx.Limits(max_connections=TURNS, max_keepalive_connections=TURNS)
        async with httpx.AsyncClient(base_url=base, timeout=HANG_GUARD, limits=limits) as client:
            streams = [stream(client, n) for n in range(TURNS)]
            return list(await asyncio.wait_for(asyncio.gather(*streams), HANG_GUARD))

    try:
        with serve_samples(**changes) as base:
            bodies = asyncio.run(all_at_once(base))
    finally:
        gated_upstream.gate = None
    for body in bodies:
        assert "event: error" not in body and 'data: {"error"' not in body, body[-300:]
        assert "data: [DONE]" in body or "event: end" in body
        assert "answer from ok-gated" in body
    assert gated_upstream.requests["ok-gated"] >= TURNS


class _FakeDecoding(ChatLlamaCpp):
    """ChatLlamaCpp's decoding, replaced: a few tokens, no model file."""

    def _stream(self, *args: Any, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        for word in ("one", "two", "three"):
            yield ChatGenerationChunk(message=AIMessageChunk(word + " "))


class _LockedFake(LockedChatLlamaCpp, _FakeDecoding):  # type: ignore[misc]
    """The embedded model's locking over fake decoding."""


def test_embedded_model_queues_async_callers_without_holding_threads() -> None:
    """One llama.cpp context: async calls take turns, and those waiting hold no thread. With
    a default pool of one thread, a waiting call that held it would leave the call that has
    the model no thread to decode its next token in."""
    model = _LockedFake.model_construct(model_path="none.gguf", streaming=True)

    async def one() -> str:
        return "".join([str(c.content) async for c in model.astream("hi")])

    async def run() -> tuple[list[str], list[Any]]:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(1))
        streams = asyncio.gather(*(one() for _ in range(8)))
        invokes = asyncio.gather(*(model.ainvoke("hi") for _ in range(4)))
        together = asyncio.gather(streams, invokes)
        return await asyncio.wait_for(together, HANG_GUARD)  # type: ignore[return-value]

    streamed, invoked = asyncio.run(run())
    assert streamed == ["one two three "] * 8
    assert [m.content for m in invoked] == ["one two three "] * 4


def test_prompted_model_is_one_run_and_reads_text_on_the_loop() -> None:
    """A prompt sent to a model: the same replies and chunks as prompt | model (| parser),
    the model's call its only run, its async path never in a thread."""
    template = ChatPromptTemplate.from_messages([("system", "Be brief."), ("human", "{q}")])
    recording = RecordingModel(responses=["a b"])
    assert PromptedModel(template, recording, text=True).invoke({"q": "hi"}) == "a b"
    assert [m.content for m in recording.seen[0]] == ["Be brief.", "hi"]
    text = PromptedModel(
        template, GenericFakeChatModel(messages=iter([AIMessage("a b")])), text=True
    )
    stock = template | GenericFakeChatModel(messages=iter([AIMessage("a b")])) | StrOutputParser()
    assert list(text.stream({"q": "hi"})) == list(stock.stream({"q": "hi"})) == ["a", " ", "b"]

    async def run() -> tuple[Any, Any, list[str], list[str]]:
        asyncio.get_running_loop().set_default_executor(RefusingPool(1))
        message = PromptedModel(template, AsyncOnlyChat(), text=False)
        streamed = PromptedModel(template, AsyncOnlyChat(), text=True)
        events = streamed.astream_events({"q": "hi"}, version="v2")
        starts = [e["name"] async for e in events if e["event"].endswith("_start")]
        pieces = [piece async for piece in streamed.astream({"q": "hi"})]
        return (
            await message.ainvoke({"q": "hi"}),
            await streamed.ainvoke({"q": "hi"}),
            pieces,
            starts,
        )

    reply, said, pieces, starts = asyncio.run(run())
    assert isinstance(reply, AIMessage) and reply.content == REWRITE and said == REWRITE
    assert "".join(pieces).strip() == ANSWER and all(isinstance(p, str) for p in pieces)
    assert starts == ["AsyncOnlyChat"]


def test_settled_steps_stream_as_one_invoke() -> None:
    calls: list[str] = []

    def step(name: str) -> RunnableLambda[Any, Any]:
        return RunnableLambda(lambda x: calls.append(name) or x + 1, name=name)

    steps = step("one") | step("two")
    chain = settled(steps) | RunnableLambda(lambda x: x * 10, name="last")
    assert list(chain.stream(1)) == [30]
    assert asyncio.run(drain(chain, 1)) == [30]
    assert chain.invoke(1) == 30 and calls == ["one", "two"] * 3
    nodes = [node.name for node in chain.get_graph().nodes.values()]
    assert nodes.index("one") < nodes.index("two") < nodes.index("last")

    async def names() -> list[str]:
        return [e["name"] async for e in chain.astream_events(1, version="v2")]

    assert {"one", "two", "last"} <= set(asyncio.run(names()))


def test_a_step_is_one_named_run_whose_children_nest_under_it() -> None:
    """A Step reports to callbacks as a RunnableLambda does: its run by name, its failure,
    and a runnable its function calls (with or without the config) as a child run."""
    inner = RunnableLambda(lambda x: x + 1, name="inner")

    def add(x: int, config: Any) -> int:
        return inner.invoke(x, config) + inner.invoke(x)  # the config given, then the current

    async def aadd(x: int, config: Any) -> int:
        return await inner.ainvoke(x, config) + await inner.ainvoke(x)

    def fail(x: int) -> int:
        raise ValueError("no")

    step = Step(add, aadd, name="adding")
    failing = Step(fail, name="failing")

    async def events(runnable: Any) -> list[tuple[str, str, int]]:
        seen = []
        async for e in runnable.astream_events(1, version="v2"):
            seen.append((e["event"], e["name"], len(e["parent_ids"])))
        return seen

    assert step.invoke(1) == 4 and asyncio.run(step.ainvoke(1)) == 4
    seen = asyncio.run(events(step))
    assert ("on_chain_start", "adding", 0) in seen and ("on_chain_end", "adding", 0) in seen
    assert [e[1] for e in seen].count("adding") == 2  # a start and an end
    assert [e for e in seen if e[1] == "inner" and e[0] == "on_chain_end"] == [
        ("on_chain_end", "inner", 1)
    ] * 2
    errors = ErrorNames()
    with pytest.raises(ValueError, match="no"):
        failing.invoke(1, {"callbacks": [errors]})
    with pytest.raises(ValueError, match="no"):
        asyncio.run(failing.ainvoke(1, {"callbacks": [errors]}))
    assert errors.names == ["failing", "failing"]


class ErrorNames(BaseCallbackHandler):
    """The names of the runs that reported a failure."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.started: dict[Any, str] = {}

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: Any, **kw: Any) -> None:
        self.started[run_id] = kw.get("name", "")

    def on_chain_error(self, error: BaseException, *, run_id: Any, **kw: Any) -> None:
        self.names.append(self.started[run_id])


def test_a_streamed_turn_sets_the_current_config_and_closes_what_it_stops() -> None:
    """Inside a StreamStep (and so a Turn) a runnable called without the config is still a
    child run, as under LangChain's own streaming runs; a consumer that stops early closes
    the generator at once, and the run reports the stop."""
    inner = RunnableLambda(lambda x: x, name="inner")
    closed: list[str] = []

    async def agen(state: Any, config: Any) -> AsyncIterator[AddableDict]:
        try:
            for n in range(3):
                yield AddableDict(n=await inner.ainvoke(n))  # no config given
        finally:
            closed.append("answer")

    def gen(state: Any, config: Any) -> Iterator[AddableDict]:
        yield from (AddableDict(n=n) for n in range(3))

    answer = StreamStep(gen, agen, name="answer")
    turn = Turn(RunnableLambda(lambda x: x, name="search"), answer, name="turn")

    async def children() -> list[int]:
        events = turn.astream_events(1, version="v2")
        return [len(e["parent_ids"]) async for e in events if e["name"] == "inner"]

    assert set(asyncio.run(children())) == {2}  # under the answer, under the turn

    errors = ErrorNames()

    async def stop_early() -> None:
        chunks = turn.astream(1, {"callbacks": [errors]})
        await anext(chunks)
        await chunks.aclose()

    asyncio.run(stop_early())
    assert closed == ["answer", "answer"]
    assert errors.names == ["answer", "turn"]  # the answer stopped, then the turn
    assert turn.invoke(1) == {"n": 3}  # 0 + 1 + 2, added as invoke returns them


def test_each_stage_of_a_turn_is_one_run(
    settings: Settings, sample_index: Path, embedder: SentenceTransformerEmbedder
) -> None:
    """A run costs about a thousand Python calls on the event loop: a stage makes one (no
    assign and map around it), and the search stages are invoked, not streamed, inside a
    streamed turn. The choices the stages declare stay declared."""
    service = service_with(settings, sample_index, embedder, AsyncOnlyChat())

    async def started() -> list[str]:
        events = service.chains.chat.astream_events({"question": QUESTION}, version="v2")
        return [e["name"] async for e in events if e["event"].endswith("_start")]

    names = asyncio.run(started())
    for stage in ("input", "configure", "rewrite", "retrieve", "compress", "answer"):
        assert names.count(stage) == 1, (stage, names)
    assert not [n for n in names if n.startswith(("RunnableParallel", "RunnableAssign"))]
    specs = {spec.id for spec in service.chains.chat.config_specs}
    assert {"domain", "k", "threshold", "rewrite_version", "answer_version"} <= specs


class CountedEncoder(SentenceTransformerEmbedder):
    """The embedder's batching around an encoder that takes a while and counts its calls
    (no model: this tests the batching, not the vectors)."""

    def __init__(self) -> None:
        super().__init__("counted")
        self.batches: list[list[str]] = []
        self.started = threading.Event()

    def encode(self, texts: list[str], *, show_progress: bool = False) -> np.ndarray:
        self.batches.append(list(texts))
        self.started.set()
        time.sleep(0.2)
        return np.array([[float(len(t)), 1.0] for t in texts], dtype=np.float32)


def test_concurrent_query_embeddings_are_batched_and_a_cancelled_caller_harms_no_other() -> None:
    encoder = CountedEncoder()

    async def run() -> list[Any]:
        first = asyncio.create_task(encoder.aencode_query("first"))
        await asyncio.to_thread(encoder.started.wait, 10)  # the first batch is being encoded
        waiting = [asyncio.create_task(encoder.aencode_query(q)) for q in ("a", "bb", "a")]
        waiting.append(asyncio.create_task(encoder.aencode_query("first")))  # being encoded
        gone = asyncio.create_task(encoder.aencode_query("bb"))
        await asyncio.sleep(0.01)
        gone.cancel()  # a client that went away
        return await asyncio.wait_for(asyncio.gather(first, *waiting), 10)

    first, a, bb, a_again, first_again = asyncio.run(run())
    # The later queries in one batch; one asked again while its batch runs is not re-encoded.
    assert encoder.batches == [["first"], ["a", "bb"]]
    assert first_again is first
    assert first.tolist() == [5.0, 1.0] and bb.tolist() == [2.0, 1.0]
    assert a.tolist() == a_again.tolist() == [1.0, 1.0]
    assert encoder.encode_query("bb") is bb  # remembered for the search that follows


def test_a_batch_that_cannot_start_leaves_no_query_waiting_forever() -> None:
    encoder = CountedEncoder()
    gone = ThreadPoolExecutor(1)
    gone.shutdown()

    async def run() -> Any:
        with pytest.raises(RuntimeError):
            await encoder.aencode_query("a", gone)
        with ThreadPoolExecutor(1) as pool:  # the next caller starts a batch of its own
            return await asyncio.wait_for(encoder.aencode_query("a", pool), 10)

    assert asyncio.run(run()).tolist() == [1.0, 1.0]
    assert encoder.batches == [["a"]]
