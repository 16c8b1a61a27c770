"""The answer stage: cited answers from compressed chunks, abstaining without an LLM call.

Kept chunks are shown to the model as ``[label] text`` blocks. The model cites with those labels
in square brackets; ``parse_citations`` maps the markers back to chunks, in order of first use,
and drops markers that name no chunk it was given.

The stage streams: ``{"answer": token}`` events, then one event with the citations. For a model
that takes a GBNF grammar (the embedded llama.cpp one) decoding is constrained so that every
sentence ends with the label of a given chunk, or the reply is exactly the don't-know sentence:
small models otherwise forget to cite.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import (
    Runnable,
    RunnableConfig,
    RunnableGenerator,
    RunnablePassthrough,
)
from langchain_core.runnables.utils import AddableDict
from pydantic import BaseModel, Field

from ragchains.chains.llm import LLM, ChatHistory, as_llm
from ragchains.chains.options import Choices, Options
from ragchains.chains.retrieve import citation_label, compressor_score, to_source
from ragchains.chains.state import agather, gather, inline, read_input
from ragchains.prompts.registry import PromptRegistry, default_registry

DONT_KNOW = "I don't know based on the available documents."
_MARKER = re.compile(r"\[([^\[\]\n]{1,300})\]")
_SPLIT = re.compile(r"\s*[;,]\s*")


class Citation(BaseModel):
    id: str
    label: str
    source: str
    page: int | None = None
    score: float | None = None


class AnswerInput(BaseModel):
    question: str = Field(min_length=1)
    chat_history: ChatHistory = Field(default_factory=list)
    documents: list[Document] = Field(default_factory=list)


class AnswerOutput(BaseModel):
    """What ``invoke`` returns (as a dict): the stream's events merged."""

    answer: str
    citations: list[Citation]
    abstained: bool
    prompt: str | None = None  # "domain/answer@vN", None when no LLM was called


def format_context(documents: Sequence[Document]) -> str:
    """The sources block of the answer prompt: one ``[label] text`` paragraph per chunk.

    ``documents`` come best first; the block lists them best *last*, next to the question
    that follows it, where small models look most.
    """
    return "\n\n".join(
        f"[{citation_label(doc)}] {' '.join(doc.page_content.split())}"
        for doc in reversed(documents)
    )


def _score(doc: Document) -> float | None:
    score = compressor_score(doc)
    if score is not None:
        return score
    for key in ("rrf_score", "dense_score", "bm25_score"):
        value = doc.metadata.get(key)
        if value is not None:
            return float(value)
    return None


def parse_citations(answer: str, documents: Sequence[Document]) -> list[Citation]:
    """Chunks cited in ``answer``, in order of first citation; unknown markers are dropped.

    A marker may hold several labels ("[a.pdf#page=1; b.md#x]"). Where chunks share a label
    (two pieces of one section), the best-ranked of them stands for it.
    """
    by_label: dict[str, Document] = {}
    for doc in documents:
        by_label.setdefault(citation_label(doc), doc)
    cited: list[Citation] = []
    seen: set[str] = set()
    for marker in _MARKER.findall(answer):
        for label in _SPLIT.split(marker.strip()):
            hit = by_label.get(label)
            if hit is None or label in seen:
                continue
            seen.add(label)
            source = to_source(hit)
            cited.append(
                Citation(
                    id=source.id,
                    label=label,
                    source=source.source,
                    page=source.page,
                    score=_score(hit),
                )
            )
    return cited


def citation_grammar(labels: Sequence[str], *, sentences: int = 3) -> str:
    """GBNF: the don't-know sentence, or 1..``sentences`` sentences each ending in a label."""
    choices = " | ".join(json.dumps(label) for label in dict.fromkeys(labels))
    return (
        f'root ::= dontknow | sentence (" " sentence){{0,{sentences - 1}}}\n'
        f"dontknow ::= {json.dumps(DONT_KNOW)}\n"
        'sentence ::= text " [" label "]" "."?\n'
        "text ::= [^\\[\\]\\n] [^\\[\\]\\n]{0,159}\n"
        f"label ::= {choices}\n"
    )


PROMPTS = ("answer",)


@dataclass
class _Plan:
    chain: Runnable[dict[str, Any], str] | None  # None: abstain without calling the LLM
    variables: dict[str, Any]
    documents: list[Document]
    prompt: str | None


class _Written:
    """The answer as it streams: leading blanks dropped, the whole text kept for citations."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def add(self, piece: str) -> AddableDict | None:
        if not self.parts:
            piece = piece.lstrip()
        if not piece:
            return None
        self.parts.append(piece)
        return AddableDict(answer=piece)

    @property
    def text(self) -> str:
        return "".join(self.parts)


def _ending(text: str, plan: _Plan) -> AddableDict:
    """The stream's last event: citations parsed from the whole answer."""
    citations = parse_citations(text, plan.documents)
    abstained = plan.chain is None or (
        not citations and DONT_KNOW.lower().rstrip(".") in text.lower()
    )
    return AddableDict(
        citations=[c.model_dump() for c in citations], abstained=abstained, prompt=plan.prompt
    )


class Answerer:
    """The answer step over a turn's state (``question``, ``chat_history``, ``documents``
    and the resolved ``options``): streams ``{"answer": token}`` events, then one event with
    ``citations``, ``abstained`` and the ``prompt`` ref. With no documents it abstains without
    calling the model."""

    def __init__(self, *, llm: LLM, history_tokens: int = 1024) -> None:
        self.llm = llm
        self.history_tokens = history_tokens

    def plan(self, state: Mapping[str, Any]) -> _Plan:
        documents: list[Document] = list(state.get("documents") or [])
        if not documents:
            return _Plan(None, {}, [], None)
        options: Options = state["options"]
        prompt = options.prompt("answer")
        labels = [citation_label(d) for d in documents]
        chain = self.llm.text(prompt, grammar=citation_grammar(labels))
        history = self.llm.trim_history(state.get("chat_history") or [], self.history_tokens)
        variables = {
            "question": state["question"],
            "context": format_context(documents),
            "chat_history": history,
        }
        return _Plan(chain, variables, documents, prompt.ref)

    def stream(self, state: Mapping[str, Any], config: RunnableConfig) -> Iterator[AddableDict]:
        p = self.plan(state)
        written = _Written()
        for piece in [DONT_KNOW] if p.chain is None else p.chain.stream(p.variables, config):
            if (event := written.add(piece)) is not None:
                yield event
        yield _ending(written.text, p)

    async def astream(
        self, state: Mapping[str, Any], config: RunnableConfig
    ) -> AsyncIterator[AddableDict]:
        p = self.plan(state)
        written = _Written()
        if p.chain is None:
            written.add(DONT_KNOW)
            yield AddableDict(answer=DONT_KNOW)
        else:
            async for piece in p.chain.astream(p.variables, config):
                if (event := written.add(piece)) is not None:
                    yield event
        yield _ending(written.text, p)


def create_answer_chain(
    *,
    llm: LLM | BaseChatModel,
    prompts: PromptRegistry | None = None,
    history_tokens: int = 1024,
) -> Runnable[AnswerInput | dict[str, Any], dict[str, Any]]:
    """Answer from the given chunks only, with citations; abstain without calling the LLM
    when there are none. Streams ``answer`` tokens, then ``citations``."""
    answerer = Answerer(llm=as_llm(llm), history_tokens=history_tokens)
    choices = Choices(prompts or default_registry(), PROMPTS)

    def stream(inputs: Iterator[Any], config: RunnableConfig) -> Iterator[AddableDict]:
        yield from answerer.stream(gather(inputs), config)

    async def astream(
        inputs: AsyncIterator[Any], config: RunnableConfig
    ) -> AsyncIterator[AddableDict]:
        async for event in answerer.astream(await agather(inputs), config):
            yield event

    # RunnableGenerator passes the run's config to functions that take one; its type hints
    # do not say so.
    answer: Runnable[Any, Any] = RunnableGenerator(
        cast(Any, stream), cast(Any, astream), name="answer"
    )
    chain = (
        inline(partial(read_input, AnswerInput), name="input")
        | RunnablePassthrough.assign(options=choices.step())
        | answer
    )
    return chain.with_types(input_type=AnswerInput, output_type=AnswerOutput).with_config(
        run_name="answer"
    )
