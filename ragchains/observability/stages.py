"""The stages of a turn as the observers (traces, metrics) see them in LCEL's callbacks.

A stage is a run named in ``STAGES`` below the chain's own run, with no stage above it: the
chat chain's ``rewrite``, ``retrieve``, ``compress``, ``requery`` and ``answer`` (the ask
chain has no ``rewrite`` or ``requery``). The chain's own run is never a stage, so the
``/retrieve`` route's run (named ``retrieve``) holds its ``retrieve`` and ``compress``
stages; runs inside a stage (its model call, its search) belong to that stage.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler

# The run names of the chains' stages (chains.graph), in the order a chat turn runs them.
STAGES = ("rewrite", "retrieve", "compress", "requery", "answer")


@dataclass(frozen=True)
class Run:
    """A run seen starting: its chain's top run, and the stage it is (or is inside)."""

    top: UUID
    stage: str | None = None  # the stage's name
    stage_id: UUID | None = None  # the stage's run (this run's own id when it is the stage)


class StageTracker:
    """Which run is which stage, from each run's start (its name and parent) to its end.

    A callback handler keeps one and calls ``start`` from every ``on_*_start`` and ``end``
    from every ``on_*_end`` and ``on_*_error``; runs are forgotten as they end.
    """

    def __init__(self) -> None:
        self._runs: dict[UUID, Run] = {}
        self._lock = threading.Lock()  # sync runs report from worker threads

    def start(self, run_id: UUID, parent_run_id: UUID | None, name: str | None) -> Run:
        with self._lock:
            parent = self._runs.get(parent_run_id) if parent_run_id is not None else None
            if parent is None:  # a chain's own run (or one whose parent was not seen)
                run = Run(top=run_id)
            elif parent.stage is not None:
                run = parent
            elif name in STAGES:
                run = Run(top=parent.top, stage=name, stage_id=run_id)
            else:
                run = Run(top=parent.top)
            self._runs[run_id] = run
            return run

    def end(self, run_id: UUID) -> Run | None:
        """The run that ended (None: never seen starting)."""
        with self._lock:
            return self._runs.pop(run_id, None)

    def get(self, run_id: UUID) -> Run | None:
        return self._runs.get(run_id)

    @staticmethod
    def is_stage(run_id: UUID, run: Run | None) -> bool:
        """Whether ``run_id`` is a stage's own run (not one inside it)."""
        return run is not None and run.stage_id == run_id

    @staticmethod
    def is_top(run_id: UUID, run: Run | None) -> bool:
        return run is not None and run.top == run_id


class RunFollower(BaseCallbackHandler):
    """A callback handler that follows the runs it does not look into (retrievers', tools')
    only to place the runs inside them: each start goes to ``run_started``, each end or
    error to ``run_ended``. Subclasses handle chain and model runs themselves."""

    # Called on the event loop, in the run's own context, not in a thread of the default
    # pool: each call is a few dictionary operations, and runs stay in order.
    run_inline = True

    def run_started(self, run_id: UUID, parent_run_id: UUID | None, name: str | None) -> None:
        raise NotImplementedError

    def run_ended(self, run_id: UUID) -> None:
        raise NotImplementedError

    def on_retriever_start(
        self,
        serialized: dict[str, Any] | None,
        query: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self.run_started(run_id, parent_run_id, kwargs.get("name"))

    def on_retriever_end(self, documents: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.run_ended(run_id)

    def on_retriever_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self.run_ended(run_id)

    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self.run_started(run_id, parent_run_id, kwargs.get("name"))

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.run_ended(run_id)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self.run_ended(run_id)
