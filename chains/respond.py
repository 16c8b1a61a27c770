"""The answer stage of a chat or ask turn: a ``RunnableGenerator`` whose first chunk carries
the sources and what found them (with the compressor's threshold and the best score it saw
before the cut: why a turn kept nothing), then the answer's tokens (``chains.answer``), then its
citations (and whether it is uncited or incomplete, with the notes that say so), prompt refs
and timings. The chunks are ``AddableDict``s: they add up into the turn's one output
(``ChatOutput``).

The timings are the stages' own runs as callbacks saw them (``StageClock``, which the chain
carries): each stage's seconds, the answer's until its last chunk, and the turn's total.
"""

from collections.abc import Callable
from typing import Any
from uuid import UUID

from langchain_core.documents import BaseDocumentCompressor
from langchain_core.runnables import Runnable
from langchain_core.runnables.utils import AddableDict

from ragchains.chains.answer import Answerer, AnswerPlan, AnswerState, Reply, replying
from ragchains.chains.compress import Compressed, compressor_status
from ragchains.chains.requery import Requeried, RequeryReport
from ragchains.chains.retrieve import Retrieved, to_source
from ragchains.chains.rewrite import RewriteOutput
from ragchains.observability.stages import StageClock

# The answerer's style and notes are known before it answers: the head event says them.
# Notes it learns while answering (uncited, cut short) come with its ending, adding to them;
# its prompt ref goes with the turn's others, in the tail.
_SAID_IN_HEAD = ("answer_style", "notes")


class TurnReply(Reply):
    """A turn's answer as it is written: the head (sources and what found them) first, then
    the answer's events without what the head said, then the tail (prompt refs, timings)."""

    def __init__(
        self, plan: AnswerPlan, head: AddableDict, tail: Callable[[], AddableDict]
    ) -> None:
        super().__init__(plan)
        self.head = head
        self.said = list(head["notes"])
        self.tail = tail

    def opening(self) -> list[AddableDict]:
        return [self.head, *self.unsaid(super().opening())]

    def read(self, piece: Any) -> list[AddableDict]:
        return self.unsaid(super().read(piece))

    def ending(self) -> list[AddableDict]:
        return [*self.unsaid(super().ending()), self.tail()]

    def unsaid(self, events: list[AddableDict]) -> list[AddableDict]:
        """The answer's events without what the head said: the style, the notes known before
        the answer. ``AddableDict``s add lists up: the turn's notes are the head's, then
        these."""
        kept = []
        for event in events:
            notes = [note for note in event.get("notes", []) if note not in self.said]
            for key in (*_SAID_IN_HEAD, "prompt"):
                event.pop(key, None)
            if notes:
                event["notes"] = notes
            if event:
                kept.append(event)
        return kept


class Respond:
    """The answer step of a turn: the first event carries the sources and what found them,
    then the answer streams, then citations, prompt refs and timings (from ``clock``)."""

    def __init__(
        self, answerer: Answerer, compressor: BaseDocumentCompressor | None, clock: StageClock
    ) -> None:
        self.answerer = answerer
        self.compressor = compressor
        self.clock = clock

    def head(self, state: Requeried) -> AddableDict:
        search: RewriteOutput = state["search"]
        retrieved: Retrieved = state["retrieved"]
        requery: RequeryReport | None = state.get("requery")
        style, note = self.answerer.style(state["options"])
        return AddableDict(
            sources=[to_source(d).model_dump() for d in state["compressed"].documents],
            search_query=search.search_query,
            filters=[f.model_dump() for f in search.filters],
            alternatives=search.alternatives,
            requeried=requery is not None,
            requery=requery.model_dump() if requery else None,
            notes=[*search.notes, *retrieved.notes, *([note] if note else [])],
            compressor=self.status(state["compressed"]),
            best_score=state["compressed"].best_score,
            answer_style=style,
        )

    def status(self, compressed: Compressed) -> dict[str, Any]:
        """What compressed this turn, with the threshold the request applied."""
        status = compressor_status(self.compressor)
        if compressed.threshold is not None:
            status["threshold"] = compressed.threshold
        return status

    @staticmethod
    def answer_state(state: Requeried) -> AnswerState:
        return AnswerState(
            question=state["question"],
            chat_history=state["chat_history"],
            documents=state["compressed"].documents,
            options=state["options"],
        )

    def tail(self, state: Requeried, run: UUID, answer_prompt: str | None) -> AddableDict:
        """The prompt refs the turn used, and its timings as the stages' runs reported them
        (a re-query's only when it was asked)."""
        search: RewriteOutput = state["search"]
        prompts = dict(search.prompts)
        timings = self.clock.timings(run)
        if state.get("requery") is not None:
            prompts["requery"] = state["options"].prompts["requery"]
        else:
            timings.pop("requery", None)
        if answer_prompt:
            prompts["answer"] = answer_prompt
        return AddableDict(prompts=prompts, timings=timings)

    def reply(self, state: Requeried, run: UUID) -> TurnReply:
        plan = self.answerer.plan(self.answer_state(state))
        return TurnReply(plan, self.head(state), lambda: self.tail(state, run, plan.prompt))

    def stage(self) -> Runnable[Any, Any]:
        """The ``answer`` stage: a ``RunnableGenerator`` streaming the turn's output."""
        return replying(self.reply)
