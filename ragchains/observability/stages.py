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
from uuid import UUID

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
