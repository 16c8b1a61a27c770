"""A turn's state as its first stages hand it on, and the small helpers every chain's stages
share to run as LCEL runnables.

Each stage of a chain is a ``RunnablePassthrough.assign(key=stage)``: it reads the state so
far and adds one key, never changing what is there. The state after each stage is a
``TypedDict`` that extends the one before it; the first ones live here, the later ones
beside the data their stage adds (``chains.retrieve``: ``Searched``, ``Found``, ``Kept``;
``chains.requery``: ``Requeried``).
"""

import asyncio
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
)
from typing import Any, TypeVar

from langchain_core.messages import BaseMessage
from langchain_core.runnables import Runnable, RunnableConfig, RunnableGenerator, RunnableLambda
from langchain_core.runnables.utils import AddableDict
from pydantic import BaseModel
from typing_extensions import TypedDict  # pydantic reads it on Python 3.11 (schemas, graphs)

from ragchains.chains.options import Options
from ragchains.retrievers.filters import MetadataFilter

In = TypeVar("In")
Out = TypeVar("Out")


class TurnInput(TypedDict):
    """A chat or ask turn's input, checked: the history as message objects (an ask turn has
    none, and the filters it was given)."""

    question: str
    chat_history: list[BaseMessage]
    filters: list[MetadataFilter]
    started: float  # time.perf_counter() when the turn began: the total in its timings


class Configured(TurnInput):
    """After ``configure``: the request's choices, resolved once."""

    options: Options


def read_input(model: type[BaseModel], inputs: Any) -> dict[str, Any]:
    """``inputs`` checked as ``model``, as a dict of its fields; values stay as parsed
    (a chat history stays message objects)."""
    data = inputs if isinstance(inputs, model) else model.model_validate(inputs)
    return dict(data)


def gathered(parts: Iterable[Mapping[str, Any]]) -> Any:
    """The state a streaming stage was handed, from the parts it arrived in: an ``assign``
    before it streams the passed-through keys first, then each new key."""
    state: dict[str, Any] = {}
    for part in parts:
        state.update(part)
    return state


async def agathered(parts: AsyncIterable[Mapping[str, Any]]) -> Any:
    state: dict[str, Any] = {}
    async for part in parts:
        state.update(part)
    return state


def quick(func: Callable[[In], Out], *, name: str) -> RunnableLambda[Any, Any]:
    """``RunnableLambda(func)`` for a quick function that never blocks: async callers run it
    in their own task instead of a worker thread (a sync-only ``RunnableLambda`` hops to
    the executor on every async call, which concurrent turns queue for)."""

    async def on_the_loop(value: In) -> Out:
        return func(value)

    # Typed Any in, Any out: a stage reads a TypedDict that ``assign`` hands on as a dict.

    return RunnableLambda(func, afunc=on_the_loop, name=name)


def stage(
    func: Callable[..., Out],
    afunc: Callable[..., Awaitable[Out]],
    *,
    name: str,
    needs: tuple[str, ...] = (),
) -> RunnableLambda[Any, Any]:
    """A stage that waits on I/O (a model, a search pool): ``func`` for sync callers,
    ``afunc`` for async ones; both may take the run's ``config`` (LangChain passes it to a
    parameter of that name) to hand to the runnables they call.

    ``needs``: the state's keys the stage reads. A stage is the mapper of a
    ``RunnablePassthrough.assign``, which streams by starting the mapper in a task of its
    own; when the run stops early (a client that goes away, an earlier stage that fails),
    LangChain leaves that task running, never awaited, on a state that ends short
    (langchain-ai/langchain#40508). Without a key it needs, the async stage is cancelled, as
    its run was, instead of failing on a KeyError nobody retrieves (the log's "Task
    exception was never retrieved"). Sync runs never end short: they are left as they are.
    """
    if not needs:
        return RunnableLambda(func, afunc=afunc, name=name)

    async def unless_cut_short(state: Mapping[str, Any], config: RunnableConfig) -> Out:
        missing = [key for key in needs if key not in state]
        if missing:
            raise asyncio.CancelledError(f"the run ended before {missing[0]!r} reached {name}")
        return await afunc(state, config)

    return RunnableLambda(func, afunc=unless_cut_short, name=name)


def answer_stage(
    transform: Callable[[Iterator[Any], RunnableConfig], Iterator[AddableDict]],
    atransform: Callable[[AsyncIterator[Any], RunnableConfig], AsyncIterator[AddableDict]],
) -> Runnable[Any, Any]:
    """The ``answer`` stage: a ``RunnableGenerator`` over the state streamed in, whose
    ``AddableDict`` chunks ``invoke`` (and LangServe, ``astream_log``) add up into one."""
    # RunnableGenerator hands the run's config to a transform that takes one; its type hints
    # name the input only.
    return RunnableGenerator(transform, atransform, name="answer")  # type: ignore[arg-type]
