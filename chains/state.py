"""A turn's state as the stages pass it on: a plain dict, read from the chain's input type and
gathered back from the chunks a streaming step receives it in."""

from __future__ import annotations

import inspect
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import aclosing, closing
from typing import Any

from langchain_core.runnables import Runnable, RunnableBinding, RunnableConfig, RunnableSequence
from langchain_core.runnables.config import (
    ensure_config,
    get_async_callback_manager_for_config,
    get_callback_manager_for_config,
    patch_config,
    var_child_runnable_config,
)
from langchain_core.runnables.graph import Graph
from langchain_core.runnables.utils import ConfigurableFieldSpec, get_unique_config_specs
from langchain_core.tracers._streaming import _StreamingCallbackHandler
from pydantic import BaseModel

Call = Callable[[Any, RunnableConfig], Any]
ACall = Callable[[Any, RunnableConfig], Awaitable[Any]]


class Step(Runnable[Any, Any]):
    """One named run of a function of a turn's state: what a ``RunnableLambda`` is to
    callbacks, ``astream_events`` and ``get_graph``, at a fraction of its cost per call.

    ``func(value)`` or ``func(value, config)`` answers sync callers; ``afunc`` (same forms,
    a coroutine) async ones. Without ``afunc`` async callers run ``func`` on the event loop:
    only for quick functions that never block. ``config_specs``: what the step lets a request
    choose (``configurable``), declared so LangServe and ``config_schema`` see it: a callable,
    asked when they are needed (a compressor knows its default threshold once loaded).

    Why not a RunnableLambda: every call of one inspects the signatures of the functions it
    calls (four times), copies the config twice and, on the async path, starts a task. For
    the dozen runs of a chat turn that was two thirds of the search stages' cost on the
    event loop, which 64 concurrent turns queue for. A step decides how to call its
    functions once, when it is built, and awaits them in the caller's task; the child
    config (callbacks of the step's run) is passed to them and set as the current one, as
    LangChain does.
    """

    def __init__(
        self,
        func: Callable[..., Any],
        afunc: Callable[..., Awaitable[Any]] | None = None,
        *,
        name: str,
        config_specs: Callable[[], Sequence[ConfigurableFieldSpec]] | None = None,
    ) -> None:
        self.name = name
        self.call: Call = with_config_arg(func)
        if afunc is not None:
            self.acall: ACall = with_config_arg(afunc)
        else:
            call = self.call

            async def on_loop(value: Any, config: RunnableConfig) -> Any:
                return call(value, config)

            self.acall = on_loop
        self._specs = config_specs

    @property
    def config_specs(self) -> list[ConfigurableFieldSpec]:
        return list(self._specs()) if self._specs is not None else []

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        run, config = _start(config, input, self.get_name())
        child = _child(config, run)
        token = var_child_runnable_config.set(child)
        try:
            output = self.call(input, child)
        except BaseException as exc:
            run.on_chain_error(exc)
            raise
        finally:
            var_child_runnable_config.reset(token)
        run.on_chain_end(output)
        return output

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        run, config = await _astart(config, input, self.get_name())
        child = _child(config, run)
        # Set and reset in this task, around the await: nested steps do the same, in order.
        token = var_child_runnable_config.set(child)
        try:
            output = await self.acall(input, child)
        except BaseException as exc:
            await run.on_chain_error(exc)
            raise
        finally:
            var_child_runnable_config.reset(token)
        await run.on_chain_end(output)
        return output


def with_config_arg(func: Callable[..., Any]) -> Callable[[Any, RunnableConfig], Any]:
    """``func`` called as ``func(value, config)``, whether or not it takes the config (the
    one extra argument a step's function may take, as a RunnableLambda would pass it)."""
    if "config" in inspect.signature(func).parameters:
        return func
    return lambda value, config: func(value)


def inline(func: Callable[[Any], Any], *, name: str) -> Step:
    """A step for a quick function that never blocks: async callers (the server) run it on
    the event loop, not in a worker thread."""
    return Step(func, name=name)


def read_input(model: type[BaseModel], inputs: Any) -> dict[str, Any]:
    """``inputs`` checked as ``model``, as a dict of its fields; values stay as parsed
    (a chat history stays message objects)."""
    data = inputs if isinstance(inputs, model) else model.model_validate(inputs)
    return dict(data)


def gather(chunks: Iterable[Any]) -> Any:
    """The one input a streaming step was given, merged from the chunks it arrived in (an
    ``assign`` before it streams the passed-through keys and the new ones separately)."""
    merged: Any = None
    for chunk in chunks:
        if isinstance(merged, Mapping) and isinstance(chunk, Mapping):
            merged = {**merged, **chunk}
        else:
            merged = chunk
    if merged is None:
        raise ValueError("the step got no input")
    return merged


async def agather(chunks: AsyncIterator[Any]) -> Any:
    return gather([chunk async for chunk in chunks])


class Settled(RunnableBinding[Any, Any]):  # type: ignore[no-redef]  # pydantic plugin
    """Steps that produce nothing until they are done, run as one call even in a stream.

    Streamed, LCEL runs every step of a sequence through its streaming path (a tee of the
    input and a task per chunk at each level), all on the event loop: for a chat turn's
    search stages, which stream nothing, that took 6.2 ms of the loop's CPU where invoking
    them takes 3.6 ms, and 64 concurrent turns queue for the loop. ``stream`` and ``astream``
    here wait for the whole input and make one ``invoke`` / ``ainvoke``. The steps are
    unchanged otherwise: ``get_graph()`` draws them, and each reports its own run to
    callbacks (``astream_events``) as before.

    Async, a sequence's steps are invoked in the caller's task, one after the other, under
    the sequence's run (``RunnableSequence.ainvoke`` starts a task and copies the context
    for each step).
    """

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        if not isinstance(self.bound, RunnableSequence) or kwargs:
            return await super().ainvoke(input, config, **kwargs)
        run, config = await _astart(self._merge_configs(config), input, self.bound.get_name())
        try:
            for i, step in enumerate(self.bound.steps, start=1):
                input = await step.ainvoke(input, _child(config, run, f"seq:step:{i}"))
        except BaseException as exc:
            await run.on_chain_error(exc)
            raise
        await run.on_chain_end(input)
        return input

    def stream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        yield self.invoke(input, config, **kwargs)

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        yield await self.ainvoke(input, config, **kwargs)

    def transform(
        self, input: Iterator[Any], config: RunnableConfig | None = None, **kwargs: Any
    ) -> Any:
        yield self.invoke(gather(input), config, **kwargs)

    async def atransform(
        self, input: AsyncIterator[Any], config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        yield await self.ainvoke(await agather(input), config, **kwargs)


class _StreamedRun(Runnable[Any, Any]):
    """Chunks that add up, made by ``_produce`` (sync callers) or ``_aproduce`` (async) as
    one run: started, streamed (a streaming handler, ``astream_events`` or ``astream_log``,
    sees each chunk), ended with their sum or the error. ``invoke`` returns the sum; a
    streamed input is gathered into one first. The producer gets the run (to make children
    of it) and the config; the run's child config is the current one while it works, as
    LangChain sets it, and it is closed when the consumer stops early. Keyword arguments
    are not used. LangChain's own streaming runs start a task per chunk at each level.
    """

    def _produce(self, input: Any, run: Any, config: RunnableConfig) -> Iterator[Any]:
        raise NotImplementedError

    def _aproduce(self, input: Any, run: Any, config: RunnableConfig) -> AsyncIterator[Any]:
        raise NotImplementedError

    def stream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        run, config = _start(config, input, self.get_name())
        current = _child(config, run)
        produced = self._produce(input, run, config)
        chunks = _tapped(run, produced, asynchronous=False)
        total: Any = None
        try:
            while True:
                token = var_child_runnable_config.set(current)
                try:
                    chunk = next(chunks)
                except StopIteration:
                    break
                finally:
                    var_child_runnable_config.reset(token)
                yield chunk
                total = _plus(total, chunk)
        except BaseException as exc:  # the producer ends (its children report) first
            for iterator in (chunks, produced):
                getattr(iterator, "close", lambda: None)()
            run.on_chain_error(exc)
            raise
        run.on_chain_end(total)

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        run, config = await _astart(config, input, self.get_name())
        current = _child(config, run)
        produced = self._aproduce(input, run, config)
        chunks = _tapped(run, produced, asynchronous=True)
        total: Any = None
        try:
            while True:
                # Set and reset around each step of the producer, in this task.
                token = var_child_runnable_config.set(current)
                try:
                    chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
                finally:
                    var_child_runnable_config.reset(token)
                yield chunk
                total = _plus(total, chunk)
        except BaseException as exc:  # the producer ends (its children report) first
            for iterator in (chunks, produced):
                close = getattr(iterator, "aclose", None)
                if close is not None:
                    await close()
            await run.on_chain_error(exc)
            raise
        await run.on_chain_end(total)

    def transform(
        self, input: Iterator[Any], config: RunnableConfig | None = None, **kwargs: Any
    ) -> Any:
        yield from self.stream(gather(input), config)

    async def atransform(
        self, input: AsyncIterator[Any], config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        async for chunk in self.astream(await agather(input), config):
            yield chunk

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        return added(self.stream(input, config))

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        return added([chunk async for chunk in self.astream(input, config)])


class StreamStep(_StreamedRun):
    """One named run of a generator of a turn's state: what a ``RunnableGenerator`` is to
    callbacks, ``astream_events`` and ``astream_log``, without a task per chunk.

    ``gen(state, config)`` yields the chunks for sync callers, ``agen(state, config)`` for
    async ones; the chunks must add up (``AddableDict``): ``invoke`` returns their sum.
    """

    def __init__(
        self,
        gen: Callable[[Any, RunnableConfig], Iterator[Any]],
        agen: Callable[[Any, RunnableConfig], AsyncIterator[Any]],
        *,
        name: str,
    ) -> None:
        self.name = name
        self.gen, self.agen = gen, agen

    def _produce(self, input: Any, run: Any, config: RunnableConfig) -> Iterator[Any]:
        return self.gen(input, _child(config, run))

    def _aproduce(self, input: Any, run: Any, config: RunnableConfig) -> AsyncIterator[Any]:
        return self.agen(input, _child(config, run))


class Turn(_StreamedRun):
    """A turn: ``search`` (steps that stream nothing) invoked, then ``answer`` streamed, as
    one run. What ``settled(search) | answer`` is, with the run's output streamed by the
    answer alone.

    LCEL's sequence streams every step through its own streaming path, at each level a tee
    of the input and a task per chunk; for a chat turn that was a fifth of the event loop's
    work per turn, which concurrent turns queue for. ``get_graph`` draws the same stages as
    the sequence would; callbacks see the same runs (the turn's, the search's and its
    steps', the answer's), the search and the answer as the turn's steps 1 and 2.
    """

    def __init__(self, search: Runnable[Any, Any], answer: Runnable[Any, Any], *, name: str):
        self.name = name
        self.search = settled(search)
        self.answer = answer

    @property
    def config_specs(self) -> list[ConfigurableFieldSpec]:
        return get_unique_config_specs([*self.search.config_specs, *self.answer.config_specs])

    def get_graph(self, config: RunnableConfig | None = None) -> Graph:
        return (self.search | self.answer).get_graph(config)

    def _produce(self, input: Any, run: Any, config: RunnableConfig) -> Iterator[Any]:
        state = self.search.invoke(input, _child(config, run, "seq:step:1"))
        # Closed with the turn: a consumer that stops early stops the answer at once.
        answer: Any = self.answer.stream(state, _child(config, run, "seq:step:2"))
        with closing(answer):
            yield from answer

    async def _aproduce(self, input: Any, run: Any, config: RunnableConfig) -> AsyncIterator[Any]:
        state = await self.search.ainvoke(input, _child(config, run, "seq:step:1"))
        answer: Any = self.answer.astream(state, _child(config, run, "seq:step:2"))
        async with aclosing(answer):
            async for chunk in answer:
                yield chunk


def _naming(config: RunnableConfig, name: str) -> dict[str, Any]:
    """The name and id a run starts with: the config's ``run_name`` and ``run_id`` (taken
    out: they are this run's, not its children's), else ``name``."""
    return {"name": config.get("run_name") or name, "run_id": config.pop("run_id", None)}


def _start(config: RunnableConfig | None, input: Any, name: str) -> tuple[Any, RunnableConfig]:
    """A run of ``input`` started under ``config``; the run and the config, complete."""
    config = ensure_config(config)
    manager = get_callback_manager_for_config(config)
    return manager.on_chain_start(None, input, **_naming(config, name)), config


async def _astart(
    config: RunnableConfig | None, input: Any, name: str
) -> tuple[Any, RunnableConfig]:
    """``_start`` for async runs."""
    config = ensure_config(config)
    manager = get_async_callback_manager_for_config(config)
    return await manager.on_chain_start(None, input, **_naming(config, name)), config


def _child(config: RunnableConfig, run: Any, tag: str | None = None) -> RunnableConfig:
    """The config of a run's child (a sequence's step tagged as LCEL tags it)."""
    return patch_config(config, callbacks=run.get_child(tag))


def _plus(total: Any, chunk: Any) -> Any:
    """``total`` with ``chunk`` added; chunks that do not add up: the last one stands."""
    if total is None:
        return chunk
    try:
        return total + chunk
    except TypeError:
        return chunk


def added(chunks: Iterable[Any]) -> Any:
    """A stream's chunks added up, as ``invoke`` returns them."""
    total: Any = None
    for chunk in chunks:
        total = _plus(total, chunk)
    return total


def _tapped(run: Any, iterator: Any, *, asynchronous: bool) -> Any:
    """``iterator`` as the run's streaming handler (``astream_events``, ``astream_log``)
    sees it, when one is listening; LangChain's own streaming runs do the same."""
    for handler in run.handlers:
        if isinstance(handler, _StreamingCallbackHandler):
            if asynchronous:
                return handler.tap_output_aiter(run.run_id, iterator)
            return handler.tap_output_iter(run.run_id, iterator)
    return iterator


def settled(steps: Runnable[Any, Any]) -> Runnable[Any, Any]:
    """``steps`` run with one ``invoke`` / ``ainvoke`` when a caller streams (see Settled)."""
    return Settled(bound=steps)
