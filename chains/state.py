"""A turn's state as the stages pass it on: a plain dict, read from the chain's input type and
gathered back from the chunks a streaming step receives it in."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import Any

from langchain_core.runnables import Runnable, RunnableBinding, RunnableConfig, RunnableLambda
from pydantic import BaseModel


def inline(func: Callable[[Any], Any], *, name: str) -> RunnableLambda[Any, Any]:
    """A step for a quick function that never blocks: async callers (the server) run it on
    the event loop, not in a worker thread (a RunnableLambda without ``afunc`` hops to one)."""

    async def afunc(value: Any) -> Any:
        return func(value)

    return RunnableLambda(func, afunc, name=name)


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
    """

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


def settled(steps: Runnable[Any, Any]) -> Runnable[Any, Any]:
    """``steps`` run with one ``invoke`` / ``ainvoke`` when a caller streams (see Settled)."""
    return Settled(bound=steps)
