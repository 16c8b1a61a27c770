"""Concurrent turns never queue behind one another (issue 13: async-native stages).

No timings here (these machines are too noisy for them): each test is built so that a turn
that waited for another, or for a thread, would never finish. The models below only answer
once every concurrent call is in flight at the same moment; a generous timeout turns a
regression into a failure instead of a hang.
"""

from __future__ import annotations

import asyncio
import functools
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
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import PrivateAttr

from ragchains.chains.llm import LLM
from ragchains.factory import Service, build_service
from ragchains.models.embedded import ChatLlamaCpp, queued_llama
from ragchains.prompts.registry import default_registry
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
    # Streams ended, finished or closed early (a private attribute: LangChain copies the
    # model's fields, not its private state, when it binds one).
    _closed: list[int] = PrivateAttr(default_factory=list)
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
        try:
            if self.gate:
                if self._all_in is None:
                    self._all_in = asyncio.Event()
                self._open += 1
                if self._open == self.gate:
                    self._all_in.set()
                await asyncio.wait_for(self._all_in.wait(), HANG_GUARD)
            for word in ANSWER.split(" "):
                yield ChatGenerationChunk(message=AIMessageChunk(word + " "))
        finally:
            self._closed.append(1)


def _called(fn: Any) -> list[str]:
    """The qualified names of the functions a pool job would call (LangChain's
    ``run_in_executor`` wraps them in a context's ``run`` and a closure)."""
    names, stack = [], [fn]
    while stack:
        f = stack.pop()
        if isinstance(f, functools.partial):
            stack += [f.func, *f.args]
            continue
        names.append(getattr(f, "__qualname__", ""))
        for cell in getattr(f, "__closure__", None) or ():
            value = cell.cell_contents
            if callable(value):
                stack.append(value)
    return names


class RefusingPool(ThreadPoolExecutor):
    """An event loop's default pool that fails whatever is sent to it, but for an output
    parser's parse of one chunk (LangChain's parsers hand each to the default pool on their
    async path: quick, never waiting on anything)."""

    def submit(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if not any(name.endswith(".parse_result") for name in _called(fn)):
            raise AssertionError(f"a turn used the event loop's default thread pool: {fn}")
        return super().submit(fn, *args, **kwargs)


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


def test_embedded_model_queues_async_callers_without_holding_threads() -> None:
    """One llama.cpp context: async calls take turns, and those waiting hold no thread. With
    a default pool of one thread, a waiting call that held it would leave the call that has
    the model no thread to decode its next token in."""
    # The embedded model's queue over fake decoding.
    model = queued_llama(_FakeDecoding.model_construct(model_path="none.gguf", streaming=True))

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


def test_a_prompt_is_sent_as_prompt_model_parser() -> None:
    """A prompt file sent to a model is stock LCEL: ``prompt | model | StrOutputParser()``
    (``LLM.text``) or ``prompt | model`` (``LLM.prompted``), one run named ``name@vN`` with
    the template, the model and the parser as its children;
    the model's async path is awaited, never run in a thread."""
    prompt = default_registry().get("default", "requery", None)
    llm = LLM(model=GenericFakeChatModel(messages=iter([AIMessage("a b")])), name="fake")
    variables = {"question": "hi", "previous_query": "hello"}
    text = llm.text(prompt)
    stock = (
        prompt.template
        | GenericFakeChatModel(messages=iter([AIMessage("a b")]))
        | StrOutputParser()
    )
    assert list(text.stream(variables)) == list(stock.stream(variables)) == ["a", " ", "b"]
    recording = RecordingModel(responses=["a b"])
    assert LLM(model=recording, name="rec").text(prompt).invoke(variables) == "a b"
    assert any("hello" in str(m.content) for m in recording.seen[0])

    async def run() -> tuple[Any, Any, list[str], list[tuple[str, int]]]:
        asyncio.get_running_loop().set_default_executor(RefusingPool(1))
        message = LLM(model=AsyncOnlyChat(), name="a").prompted(prompt)
        streamed = LLM(model=AsyncOnlyChat(), name="a").text(prompt)
        events = streamed.astream_events(variables, version="v2")
        starts = [
            (e["name"], len(e["parent_ids"])) async for e in events if e["event"].endswith("_start")
        ]
        pieces = [piece async for piece in streamed.astream(variables)]
        return (
            await message.ainvoke(variables),
            await streamed.ainvoke(variables),
            pieces,
            starts,
        )

    reply, said, pieces, starts = asyncio.run(run())
    assert isinstance(reply, AIMessage) and reply.content == REWRITE and said == REWRITE
    assert "".join(pieces).strip() == ANSWER and all(isinstance(p, str) for p in pieces)
    assert starts == [
        (f"requery@v{prompt.version}", 0),
        ("ChatPromptTemplate", 1),
        ("AsyncOnlyChat", 1),
        ("StrOutputParser", 1),
    ]


def test_a_consumer_that_goes_away_stops_the_models_stream(
    settings: Settings, sample_index: Path, embedder: SentenceTransformerEmbedder
) -> None:
    """A client that goes away mid-answer (the server cancels its streaming task): the
    model's stream is closed at once, and it decodes no more for nobody."""
    model = AsyncOnlyChat(gate=2)  # the stream waits for a second one that never comes
    service = service_with(settings, sample_index, embedder, model)
    seen: list[Any] = []

    async def consume() -> None:
        async for chunk in service.chains.chat.astream({"question": QUESTION}):
            seen.append(chunk)

    async def go_away() -> list[int]:
        task = asyncio.create_task(consume())
        while not seen and not task.done():  # the head (sources) came: the answer is waiting
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Read here, while the loop runs: asyncio.run closes what is left when it ends.
        return list(model._closed)

    closed = asyncio.run(go_away())
    assert seen[0]["sources"] and closed == [1]


def test_each_stage_of_a_turn_is_one_named_run(
    settings: Settings, sample_index: Path, embedder: SentenceTransformerEmbedder
) -> None:
    """``astream_events`` names each stage of a turn once, and the choices the stages
    declare are the chain's config specs."""
    service = service_with(settings, sample_index, embedder, AsyncOnlyChat())

    async def started() -> list[str]:
        events = service.chains.chat.astream_events({"question": QUESTION}, version="v2")
        return [e["name"] async for e in events if e["event"].endswith("_start")]

    names = asyncio.run(started())
    for stage in ("chat", "input", "configure", "rewrite", "retrieve", "compress", "requery"):
        assert names.count(stage) == 1, (stage, names)
    assert names.count("answer") == 1
    assert "rewrite@v1" in names[names.index("rewrite") :]  # the prompt, by name and version
    assert names.index("configure") < names.index("rewrite") < names.index("retrieve")
    assert names.index("retrieve") < names.index("compress") < names.index("requery")
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
