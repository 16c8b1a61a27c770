"""The answer stage of a chat or ask turn: a ``RunnableGenerator`` whose first chunk carries
the sources and what found them (with the compressor's threshold and the best score it saw
before the cut: why a turn kept nothing), then the answer's tokens (``chains.answer``), then its
citations (and whether it is uncited or incomplete, with the notes that say so), prompt refs
and timings. The chunks are ``AddableDict``s: they add up into the turn's one output
(``ChatOutput``).
"""

import time
from collections.abc import AsyncIterator, Generator, Iterator
from contextlib import aclosing, closing
from typing import Any

from langchain_core.documents import BaseDocumentCompressor
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.utils import AddableDict

from ragchains.chains.answer import Answerer, AnswerState
from ragchains.chains.compress import Compressed, compressor_status
from ragchains.chains.requery import Requeried, RequeryReport
from ragchains.chains.retrieve import Retrieved, to_source
from ragchains.chains.rewrite import RewriteOutput
from ragchains.chains.state import agathered, answer_stage, gathered

# The answerer's style and notes are known before it answers: the head event says them.
# Notes it learns while answering (uncited, cut short) come with its ending, adding to them.
_SAID_IN_HEAD = ("answer_style", "notes")


class Respond:
    """The answer step of a turn: the first event carries the sources and what found them,
    then the answer streams, then citations, prompt refs and timings."""

    def __init__(self, answerer: Answerer, compressor: BaseDocumentCompressor | None) -> None:
        self.answerer = answerer
        self.compressor = compressor

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

    @staticmethod
    def tail(state: Requeried, since: float, answer_prompt: str | None) -> AddableDict:
        search: RewriteOutput = state["search"]
        prompts = dict(search.prompts)
        timings: dict[str, float] = {}
        if "rewrite" in search.prompts:
            timings["rewrite"] = search.seconds
        timings["retrieve"] = state["retrieved"].seconds
        timings["compress"] = state["compressed"].seconds
        if state.get("requery") is not None:
            prompts["requery"] = state["requery_prompt"]
            timings["requery"] = state["requery_seconds"]
        if answer_prompt:
            prompts["answer"] = answer_prompt
        now = time.perf_counter()
        timings["answer"] = round(now - since, 4)
        timings["total"] = round(now - state["started"], 4)
        return AddableDict(prompts=prompts, timings=timings)

    @staticmethod
    def unsaid(event: AddableDict, said: list[str]) -> AddableDict:
        """An answer event without what the head said: the style, the notes known before
        the answer (``said``). ``AddableDict``s add lists up: the turn's notes are the
        head's, then these."""
        notes = [note for note in event.get("notes", []) if note not in said]
        for key in _SAID_IN_HEAD:
            event.pop(key, None)
        if notes:
            event["notes"] = notes
        return event

    def transform(
        self, states: Iterator[Requeried], config: RunnableConfig
    ) -> Generator[AddableDict, None, None]:
        state: Requeried = gathered(states)
        head = self.head(state)
        said = list(head["notes"])
        yield head
        since, prompt = time.perf_counter(), None
        with closing(self.answerer.events(self.answer_state(state), config)) as events:
            for event in events:
                prompt = event.pop("prompt", prompt)
                if event := self.unsaid(event, said):
                    yield event
        yield self.tail(state, since, prompt)

    async def atransform(
        self, states: AsyncIterator[Requeried], config: RunnableConfig
    ) -> AsyncIterator[AddableDict]:
        state: Requeried = await agathered(states)
        head = self.head(state)
        said = list(head["notes"])
        yield head
        since, prompt = time.perf_counter(), None
        async with aclosing(self.answerer.aevents(self.answer_state(state), config)) as events:
            async for event in events:
                prompt = event.pop("prompt", prompt)
                if event := self.unsaid(event, said):
                    yield event
        yield self.tail(state, since, prompt)

    def stage(self) -> Runnable[Any, Any]:
        """The ``answer`` stage: a ``RunnableGenerator`` streaming the turn's output."""
        return answer_stage(self.transform, self.atransform)
