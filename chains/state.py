"""A turn's state as its first stages hand it on, and the small helpers every chain's stages
share to run as LCEL runnables.

Each stage of a chain is a ``RunnablePassthrough.assign(key=stage)``: it reads the state so
far and adds one key, never changing what is there. The state after each stage is a
``TypedDict`` that extends the one before it; the first ones live here, the later ones
beside the data their stage adds (``chains.retrieve``: ``Searched``, ``Found``, ``Kept``;
``chains.requery``: ``Requeried``).

A stage is written once. What it does around its sub-runnable (a model, a retriever, a
compressor) is pure and shared; the sync and async paths differ only in calling that
runnable with ``invoke`` or ``ainvoke`` (``Call``, ``calling``). Async is the served path:
nothing quick hops to a worker thread (``quick``). How long each stage took is not measured
here: callbacks see every stage's run (``ragchains.observability.stages``).
"""

import asyncio
from collections.abc import AsyncIterable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from langchain_core.messages import BaseMessage
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
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


def _unless_cut_short(state: Any, needs: tuple[str, ...], name: str) -> None:
    """Cancel a stage's async run on a state that ends short of a key it ``needs``.

    A stage is the mapper of a ``RunnablePassthrough.assign``, which streams by starting the
    mapper in a task of its own; when the run stops early (a client that goes away, an
    earlier stage that fails), LangChain leaves that task running, never awaited, on a state
    that ends short (langchain-ai/langchain#40508). Without a key it needs, the stage is
    cancelled, as its run was, instead of failing on a KeyError nobody retrieves (the log's
    "Task exception was never retrieved"). Sync runs never end short: they are left as they
    are.
    """
    missing = [key for key in needs if key not in state]
    if missing:
        raise asyncio.CancelledError(f"the run ended before {missing[0]!r} reached {name}")


def quick(
    func: Callable[[In], Out], *, name: str, needs: tuple[str, ...] = ()
) -> RunnableLambda[Any, Any]:
    """``RunnableLambda(func)`` for a quick function that never blocks: async callers run it
    in their own task instead of a worker thread (a sync-only ``RunnableLambda`` hops to
    the executor on every async call, which concurrent turns queue for). ``needs``: the
    state's keys it reads (``_unless_cut_short``)."""

    async def on_the_loop(value: In) -> Out:
        _unless_cut_short(value, needs, name)
        return func(value)

    # Typed Any in, Any out: a stage reads a TypedDict that ``assign`` hands on as a dict.
    return RunnableLambda(func, afunc=on_the_loop, name=name)


def _as_is(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Call:
    """One call a stage makes: the runnable, its input, and what the stage makes of its
    output (``then``), which is the stage's result or, for a stage that calls again, the
    next ``Call``. ``invoke`` and ``ainvoke`` are the one place where a stage's sync and
    async paths differ; the run's ``config`` makes the runnable's run a child of the
    stage's."""

    runnable: Runnable[Any, Any]
    input: Any
    then: Callable[[Any], Any] = _as_is

    def invoke(self, config: RunnableConfig | None = None) -> Any:
        out = self.then(self.runnable.invoke(self.input, config))
        return out.invoke(config) if isinstance(out, Call) else out

    async def ainvoke(self, config: RunnableConfig | None = None) -> Any:
        out = self.then(await self.runnable.ainvoke(self.input, config))
        return await out.ainvoke(config) if isinstance(out, Call) else out


def calling(
    plan: Callable[[Any], Call], *, name: str, needs: tuple[str, ...] = ()
) -> RunnableLambda[Any, Any]:
    """A stage that waits on I/O (a model, a search, a reranker): ``plan`` (quick and pure)
    says for a state which ``Call`` to make; sync callers ``invoke`` it, async callers
    ``ainvoke`` it. ``needs``: the state's keys ``plan`` reads (``_unless_cut_short``)."""

    def call(state: Any, config: RunnableConfig) -> Any:
        return plan(state).invoke(config)

    async def acall(state: Any, config: RunnableConfig) -> Any:
        _unless_cut_short(state, needs, name)
        return await plan(state).ainvoke(config)

    return RunnableLambda(call, afunc=acall, name=name)
