"""A chat model whose calls take turns in a ``ModelQueue``: ``QueuedChatModel(model=...,
queue=...)`` wraps any LangChain chat model, and is one to whoever calls it.

The wrapper implements BaseChatModel's own hooks (``_generate``, ``_stream`` and their async
twins) by taking a turn in the queue and then calling the same hook of the model it wraps, in
a producer that holds the turn until the call ends (``ragchains.models.relay``). It holds no
state of a call: the queue orders and bounds, the producer runs, the model answers. What
LangChain reads about a model for its runs and traces (its type, parameters, LangSmith
parameters, token counts, tools) is the wrapped model's. The wrapped model's own callbacks,
tags, cache and rate limiter are not used: its hooks are called, not its runnable methods
(give those to the wrapper).

A call starts an answer, and waits at the queue's answer gate, when its run is tagged
``ANSWER_TAG`` (the answer stage tags its ``prompt | model``; LangChain hands a run's tags
down to the runs below it). The hooks find the run's tags in the run manager LangChain hands
them when the model is invoked or batched. When it is streamed, LangChain hands
``_stream`` and ``_astream`` no run manager (``BaseChatModel.stream`` and ``astream``,
langchain-core 1.8); the tags are then those of the run the model is a step of, which LangChain
keeps in a context variable for the steps it runs and ``ensure_config()`` returns. So the
tag goes on a runnable around the model (a ``prompt | model`` sequence, a lambda), not on the
model or a binding of it alone, which a stream would not see.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, Protocol, TypeVar, cast

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import LangSmithParams, LanguageModelInput
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableBinding, ensure_config
from pydantic import Field, model_validator

from ragchains.chains.llm import ANSWER_TAG
from ragchains.models.queue import ModelQueue, RequestEnded, current_ticket
from ragchains.models.relay import Handoff, produce_in_task, produce_in_thread

T = TypeVar("T")

RunManager = CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun


class CallRunner(Protocol):
    """Where the calls of a model without an async path of its own run (``executor``), and
    ``running``: a call's work as it runs there, stopped when its handoff is (the embedded
    model's ``ContextOwner`` aborts a llama.cpp decode)."""

    @property
    def executor(self) -> Executor: ...

    def running(self, work: Iterator[T], handoff: Handoff[Any]) -> Iterator[T]: ...


class CallThreads:
    """Threads for the calls of the models that share a queue: one per slot, made as
    needed. A call stopped there stops between two chunks."""

    def __init__(self, slots: int) -> None:
        self.executor = ThreadPoolExecutor(slots, thread_name_prefix="model-call")

    def running(self, work: Iterator[T], handoff: Handoff[Any]) -> Iterator[T]:
        return work


_THREADS: weakref.WeakKeyDictionary[ModelQueue, CallThreads] = weakref.WeakKeyDictionary()
_THREADS_LOCK = threading.Lock()


def call_threads(queue: ModelQueue) -> CallThreads:
    """The threads of the calls that take turns in ``queue`` (a model and its fallback
    sharing a server share them)."""
    with _THREADS_LOCK:
        threads = _THREADS.get(queue)
        if threads is None:
            threads = _THREADS[queue] = CallThreads(queue.slots)
        return threads


class QueuedChatModel(BaseChatModel):
    """``model`` whose calls take turns in ``queue``: sync and async calls alike wait in it,
    in order, within their request's bound; a call whose run is the answer's (tagged
    ``ANSWER_TAG``) waits at the answer gate too. ``model`` streams: it implements
    ``_stream`` or ``_astream``.

    Each call, once its turn comes, is run by a producer that holds the turn until the call
    ends: a task for a model with an async path of its own (an upstream server: cancelling
    it closes the connection), else a thread of ``runner`` (by default the queue's
    ``call_threads``). The caller reads the chunks; when it goes, or its request ends, the
    call is stopped. The wait comes before the call: a deadline the model sets on its call
    starts with its turn.
    """

    model: BaseChatModel
    queue: ModelQueue = Field(default_factory=ModelQueue, exclude=True)
    runner: Any = Field(default=None, exclude=True)  # a CallRunner; None: call_threads(queue)
    streaming: bool = False

    @model_validator(mode="before")
    @classmethod
    def _streams_as_its_model(cls, data: Any) -> Any:
        """LangChain reads ``streaming`` and ``disable_streaming`` (whether ``invoke``
        streams) off the model it runs: those set on the wrapped model pass to the wrapper."""
        model = data.get("model") if isinstance(data, dict) else None
        if isinstance(model, BaseChatModel):
            for name in ("streaming", "disable_streaming"):
                if name in model.model_fields_set and hasattr(model, name):
                    data.setdefault(name, getattr(model, name))
        return data

    @model_validator(mode="after")
    def _model_streams(self) -> QueuedChatModel:
        # Overriding _stream tells LangChain the model streams: one that does not would fail
        # in stream and astream instead of answering in one piece.
        if not (self._has_own("_stream") or self._has_own("_astream")):
            raise TypeError(
                f"QueuedChatModel queues a model that streams; {type(self.model).__name__} "
                "implements neither _stream nor _astream"
            )
        return self

    def _has_own(self, hook: str) -> bool:
        """Whether the model implements LangChain's ``hook`` itself (else: its sync hooks
        run in a producer thread, never LangChain's default of a sync stream advanced from
        executor threads, which nobody closes when its reader goes)."""
        return getattr(type(self.model), hook) is not getattr(BaseChatModel, hook)

    # ------------------------------------------------------------------ the model's own
    @property
    def _llm_type(self) -> str:
        return self.model._llm_type

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return dict(self.model._identifying_params)

    def _get_invocation_params(
        self, stop: list[str] | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        return self.model._get_invocation_params(stop=stop, **kwargs)

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        return self.model._get_ls_params(stop=stop, **kwargs)

    def _combine_llm_outputs(self, llm_outputs: list[dict[str, Any] | None], /) -> dict[str, Any]:
        return self.model._combine_llm_outputs(llm_outputs)

    def get_token_ids(self, text: str) -> list[int]:
        return self.model.get_token_ids(text)

    def get_num_tokens(self, text: str) -> int:
        return self.model.get_num_tokens(text)

    def get_num_tokens_from_messages(self, messages: list[BaseMessage], tools: Any = None) -> int:
        return self.model.get_num_tokens_from_messages(messages, tools)

    @property
    def accepts_grammar(self) -> bool:
        """Whether the model takes a GBNF grammar per call (``chains.llm.LLM.of``)."""
        return bool(getattr(self.model, "accepts_grammar", False))

    @property
    def count_tokens(self) -> Callable[[str], int] | None:
        """The model's own token counter, if it has one (``chains.llm.LLM.of``)."""
        counter = getattr(self.model, "count_tokens", None)
        return counter if callable(counter) else None

    def bind_tools(
        self, tools: Any, *, tool_choice: str | None = None, **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """The tools as the model formats them, bound to this model: its calls take turns."""
        bound = self.model.bind_tools(tools, tool_choice=tool_choice, **kwargs)
        if not isinstance(bound, RunnableBinding) or bound.bound is not self.model:
            raise NotImplementedError(
                f"{type(self.model).__name__}.bind_tools gives no binding of the model"
            )
        return self.bind(**bound.kwargs)

    # ------------------------------------------------------------------ LangChain's hooks
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        first_token = starts_answer(run_manager)
        call = self.model._generate
        work = _made_there(lambda: iter([call(messages, stop, run_manager, **kwargs)]))
        return _only(self._in_thread(work, self.queue.acquire_blocking(first_token=first_token)))

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        first_token = starts_answer(run_manager)
        call = self.model._stream
        work = _made_there(lambda: call(messages, stop, run_manager, **kwargs))
        chunks = self._in_thread(work, self.queue.acquire_blocking(first_token=first_token))
        try:
            yield from chunks
        finally:
            chunks.stop()  # the reader has gone (its generator closed) or read all

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        first_token = starts_answer(run_manager)
        reader: Handoff[ChatResult]
        if self._has_own("_agenerate"):
            call = self.model._agenerate

            async def produce(handoff: Handoff[ChatResult]) -> None:
                async with self.queue.turn(first_token=first_token):
                    handoff.put(await call(messages, stop, run_manager, **kwargs))

            reader = self._in_task(produce)
        else:
            below = self.model._generate
            manager = run_manager.get_sync() if run_manager else None  # for its sync hook
            work = _made_there(lambda: iter([below(messages, stop, manager, **kwargs)]))
            hold = await self.queue.acquire(first_token=first_token)
            reader = self._in_thread(work, hold, asynchronous=True)
        return _only([result async for result in reader])

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        first_token = starts_answer(run_manager)
        reader: Handoff[ChatGenerationChunk]
        if self._has_own("_astream"):
            call = self.model._astream

            async def produce(handoff: Handoff[ChatGenerationChunk]) -> None:
                # The model's stream is closed when the task is cancelled: an upstream's
                # connection with it.
                async with (
                    self.queue.turn(first_token=first_token),
                    contextlib.aclosing(
                        cast(AsyncGenerator[Any, None], call(messages, stop, run_manager, **kwargs))
                    ) as chunks,
                ):
                    async for chunk in chunks:
                        if not handoff.put(chunk):
                            return

            reader = self._in_task(produce)
        else:
            below = self.model._stream
            manager = run_manager.get_sync() if run_manager else None  # for its sync hook
            work = _made_there(lambda: below(messages, stop, manager, **kwargs))
            hold = await self.queue.acquire(first_token=first_token)
            reader = self._in_thread(work, hold, asynchronous=True)
        try:
            async for chunk in reader:
                yield chunk
        finally:
            reader.stop()  # the reader has gone (cancelled, closed) or has read all

    # ------------------------------------------------------------------ producers
    def _runner(self) -> CallRunner:
        return (
            cast(CallRunner, self.runner) if self.runner is not None else call_threads(self.queue)
        )

    def _in_thread(self, work: Iterator[T], hold: Any, *, asynchronous: bool = False) -> Handoff[T]:
        """The chunks of ``work`` run in a producer thread that holds ``hold`` until it ends;
        for a reader here (``for``) or, ``asynchronous``, on this event loop (``async for``)."""
        loop = asyncio.get_running_loop() if asynchronous else None
        handoff: Handoff[T] = Handoff(loop)
        untie = _stopped_with_request(handoff)

        def ended() -> None:
            untie()
            self.queue.release(hold)

        runner = self._runner()
        produce_in_thread(runner.executor, runner.running(work, handoff), handoff, on_end=ended)
        return handoff

    def _in_task(self, produce: Callable[[Handoff[T]], Awaitable[None]]) -> Handoff[T]:
        """The chunks ``produce`` hands over from a task of its own (which takes the turn)."""
        handoff: Handoff[T] = Handoff(asyncio.get_running_loop())
        untie = _stopped_with_request(handoff)
        produce_in_task(produce, handoff).add_done_callback(lambda _: untie())
        return handoff


def starts_answer(run_manager: RunManager | None) -> bool:
    """Whether the call's run is the answer's: ``ANSWER_TAG`` among its run's tags (from
    ``run_manager``), or, where LangChain hands none (a stream), among those of the run it is
    a step of (see the module's docstring)."""
    tags = run_manager.tags if run_manager is not None else ensure_config().get("tags")
    return ANSWER_TAG in (tags or ())


def _made_there(make: Callable[[], Iterator[T]]) -> Iterator[T]:
    """``make()``'s items, made in the producer: the call starts there, not here."""
    yield from make()


def _stopped_with_request(handoff: Handoff[Any]) -> Callable[[], None]:
    """Stop ``handoff``'s producer when the current request ends; what unties the two."""
    ticket = current_ticket()
    if ticket is None:
        return _nothing
    return ticket.on_close(lambda: handoff.stop(RequestEnded()))


def _nothing() -> None:
    return None


def _only(items: Iterable[T]) -> T:
    (item,) = items
    return item
