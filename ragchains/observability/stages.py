"""The stages of a turn as the observers (traces, metrics) see them in LCEL's callbacks.

A stage is a run named in ``STAGES`` below the chain's own run, with no stage above it: the
chat chain's ``rewrite``, ``retrieve``, ``compress``, ``requery`` and ``answer`` (the ask
chain has no ``rewrite`` or ``requery``). The chain's own run is never a stage, so the
``/retrieve`` route's run (named ``retrieve``) holds its ``retrieve`` and ``compress``
stages; runs inside a stage (its model call, its search) belong to that stage.

``StageClock`` times each turn's stages from those callbacks, for the turn's own output
(its ``timings``): the stages measure nothing themselves.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
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
    """A callback handler that follows runs to place the runs inside them: each start goes
    to ``run_started``, each end or error to ``run_ended``. Retrievers' and tools' runs are
    only followed; subclasses that look into chain runs (their outputs, their errors) or
    model runs handle those themselves."""

    # Called on the event loop, in the run's own context, not in a thread of the default
    # pool: each call is a few dictionary operations, and runs stay in order.
    run_inline = True

    def run_started(self, run_id: UUID, parent_run_id: UUID | None, name: str | None) -> None:
        raise NotImplementedError

    def run_ended(self, run_id: UUID) -> None:
        raise NotImplementedError

    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self.run_started(run_id, parent_run_id, kwargs.get("name"))

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.run_ended(run_id)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self.run_ended(run_id)

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


@dataclass
class _Timed:
    """A turn being timed: when it started, its stages' seconds so far (those that ended),
    the stages still running (run id -> name and start), and when the last stage ended."""

    started: float
    took: dict[str, float] = field(default_factory=dict)
    running: dict[UUID, tuple[str, float]] = field(default_factory=dict)
    last_end: float = 0.0

    def since(self, started: float) -> float:
        """When a stage that started at ``started`` began its work: streamed, every stage of
        a sequence starts with the stream, then waits for the stage before it; its time is
        counted from the later of its start and the last stage's end."""
        return max(started, self.last_end)


class StageClock(RunFollower):
    """How long each stage of a turn took, from its runs' callbacks.

    A chain that reports its timings carries one (``with_config(callbacks=[clock])``) and,
    from any run inside the turn (its answer stage, before its last chunk), reads them with
    ``timings``: every stage that ran, in ``STAGES`` order, with the ones still running
    counted until then, and ``total`` since the turn's own run started. Turns are forgotten
    as their runs end. Chain and retriever runs only, as ``StageMetrics`` sees them.
    """

    ignore_llm = True
    ignore_chat_model = True
    ignore_agent = True  # tools too
    ignore_retry = True
    ignore_custom_event = True

    def __init__(self) -> None:
        self.tracker = StageTracker()
        self._turns: dict[UUID, _Timed] = {}  # each turn's top run
        self._lock = threading.Lock()

    def run_started(self, run_id: UUID, parent_run_id: UUID | None, name: str | None) -> None:
        run = self.tracker.start(run_id, parent_run_id, name)
        now = time.perf_counter()
        with self._lock:
            if StageTracker.is_top(run_id, run):
                self._turns[run_id] = _Timed(now)
            elif StageTracker.is_stage(run_id, run) and (turn := self._turns.get(run.top)):
                turn.running[run_id] = (str(run.stage), now)

    def run_ended(self, run_id: UUID) -> None:
        run = self.tracker.end(run_id)
        if run is None:
            return
        now = time.perf_counter()
        with self._lock:
            if StageTracker.is_top(run_id, run):
                self._turns.pop(run_id, None)
            elif StageTracker.is_stage(run_id, run) and (turn := self._turns.get(run.top)):
                stage, started = turn.running.pop(run_id, ("", now))
                if stage:
                    turn.took[stage] = turn.took.get(stage, 0.0) + now - turn.since(started)
                    turn.last_end = now

    def timings(self, run_id: UUID) -> dict[str, float]:
        """The seconds of each stage of the turn ``run_id`` is in, and ``total``; empty for
        a run this clock never saw."""
        run = self.tracker.get(run_id)
        now = time.perf_counter()
        with self._lock:
            turn = self._turns.get(run.top) if run is not None else None
            if turn is None:
                return {}
            took = dict(turn.took)
            for stage, started in turn.running.values():
                took[stage] = took.get(stage, 0.0) + max(now - turn.since(started), 0.0)
            total = now - turn.started
        seconds = {stage: round(took[stage], 4) for stage in STAGES if stage in took}
        return {**seconds, "total": round(total, 4)}
