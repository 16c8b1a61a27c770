"""A turn's state as the stages pass it on: a plain dict, read from the chain's input type and
gathered back from the chunks a streaming step receives it in."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

from langchain_core.runnables import RunnableLambda
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
