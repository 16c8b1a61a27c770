"""The chat and ask graphs: rewrite → retrieve → compress → (re-query) → answer.

Both are LCEL sequences of named stages. They stream: the first event carries the sources
(and the query that found them), then ``{"answer": token}`` events, then citations, prompt
refs and timings. ``invoke`` returns those events merged into one dict (``ChatOutput``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.runnables import Runnable, RunnableConfig, RunnableGenerator, RunnableLambda
from langchain_core.runnables.utils import AddableDict, ConfigurableFieldSpec
from pydantic import BaseModel, ConfigDict, Field

from chains.answer import AnswerInput, Citation, build_answer_chain
from chains.llm import LLM, ChatHistory
from chains.retrieve import (
    MAX_K,
    RetrievalOptions,
    Searcher,
    Source,
    build_retrieve_chain,
    to_source,
)
from chains.rewrite import (
    RewriteInput,
    RewriteOutput,
    build_rewrite_chain,
    expand_glossary,
    lines_grammar,
    parse_alternatives,
)
from prompts.registry import PromptRegistry
from retrievers.filters import MetadataFilter

# The prompts every domain must be able to resolve (its own or the default domain's).
REQUIRED_PROMPTS = ("rewrite", "multi_query", "requery", "answer")
# The prompts each servable runnable may use, for checking a request before any work.
PROMPTS_USED = {
    "chat": REQUIRED_PROMPTS,
    "ask": ("answer",),
    "rewrite": ("rewrite", "multi_query"),
    "retrieve": (),
}

# What a request may choose through ``config["configurable"]``; nothing else is accepted.
CONFIGURABLE_SPECS = (
    ConfigurableFieldSpec(
        id="domain",
        annotation=str | None,
        default=None,
        name="Domain",
        description="prompt domain, e.g. hr or catalog; default: the 'default' domain",
    ),
    ConfigurableFieldSpec(
        id="prompt_version",
        annotation=int | str | dict[str, int | str] | None,
        default=None,
        name="Prompt version",
        description="N (or 'vN') for every prompt, or {prompt name: N}; default: the latest",
    ),
    ConfigurableFieldSpec(
        id="k",
        annotation=int | None,
        default=None,
        name="k",
        description=f"chunks retrieved and handed to the compressor (1-{MAX_K})",
    ),
    ConfigurableFieldSpec(
        id="threshold",
        annotation=float | None,
        default=None,
        name="Threshold",
        description="minimum compressor score for a chunk to be kept",
    ),
)
CONFIGURABLE_KEYS = tuple(spec.id for spec in CONFIGURABLE_SPECS)


def check_configurable(
    prompts: PromptRegistry, configurable: Mapping[str, Any] | None, mode: str = "chat"
) -> None:
    """Fail before any work if a request's domain, prompt version, k or threshold is bad.

    Raises PromptSelectionError, or ValueError for a key that is not one of
    ``CONFIGURABLE_KEYS`` or a value of the wrong kind.
    """
    configurable = configurable or {}
    unknown = sorted(set(configurable) - set(CONFIGURABLE_KEYS))
    if unknown:
        raise ValueError(
            f"unknown configurable key(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(CONFIGURABLE_KEYS)}"
        )
    domain = prompts.domain(configurable.get("domain"))
    for name in PROMPTS_USED[mode]:
        if name == "multi_query" and domain.multi_query < 2:
            continue
        prompts.select(name, configurable)
    RetrievalOptions.from_configurable(configurable)


class ChatInput(BaseModel):
    question: str = Field(min_length=1)
    chat_history: ChatHistory = Field(default_factory=list)


class AskInput(BaseModel):
    question: str = Field(min_length=1)
    filters: list[MetadataFilter] = Field(default_factory=list)


class RequeryReport(BaseModel):
    first_query: str
    first_best_score: float
    query: str | None = Field(None, description="the model's new query; None if unusable")
    best_score: float | None = None
    kept: bool = Field(False, description="the new query's results replaced the first ones")


class ChatOutput(BaseModel):
    """The merged stream of a chat or ask turn."""

    sources: list[Source]
    search_query: str
    filters: list[MetadataFilter]
    alternatives: list[str] = Field(default_factory=list)
    requeried: bool = Field(False, description="a re-query was asked (see requery)")
    requery: RequeryReport | None = None
    notes: list[str] = Field(default_factory=list)
    compressor: dict[str, Any] = Field(default_factory=dict)
    answer: str
    citations: list[Citation]
    abstained: bool
    prompts: dict[str, str]
    timings: dict[str, float] = Field(description="seconds per stage, and total")


@dataclass(frozen=True)
class RequeryPolicy:
    """When to re-query, and when the new results are clearly better."""

    enabled: bool = True
    below: float | None = None  # None: the compressor's default for its scorer
    min_ratio: float = 1.1
    min_gain: float = 0.05

    def keeps(self, old: float, new: float) -> bool:
        return new >= max(old * self.min_ratio, old + self.min_gain)


class _Turn(BaseModel):
    """State handed from stage to stage within one turn."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    question: str
    chat_history: ChatHistory = Field(default_factory=list)
    search_query: str = ""
    filters: list[MetadataFilter] = Field(default_factory=list)
    alternatives: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    prompts: dict[str, str] = Field(default_factory=dict)
    documents: list[Document] = Field(default_factory=list)
    best_score: float | None = None
    requery: RequeryReport | None = None
    started: float = Field(default_factory=time.perf_counter)
    timings: dict[str, float] = Field(default_factory=dict)

    def timed(self, stage: str, since: float) -> None:
        self.timings[stage] = round(time.perf_counter() - since, 4)


@dataclass
class Graphs:
    """Every runnable the server exposes: the two graphs and the stages on their own."""

    chat: Runnable[Any, dict[str, Any]]
    ask: Runnable[Any, dict[str, Any]]
    rewrite: Runnable[Any, RewriteOutput]
    retrieve: Runnable[Any, Any]
    answer: Runnable[Any, dict[str, Any]]


def build_graphs(
    *,
    llm: LLM,
    prompts: PromptRegistry,
    searcher: Searcher,
    fields: Mapping[str, str],
    history_tokens: int = 1024,
    requery: RequeryPolicy | None = None,
) -> Graphs:
    policy = requery or RequeryPolicy()
    rewrite_chain = build_rewrite_chain(
        llm=llm, prompts=prompts, fields=fields, history_tokens=history_tokens
    )
    answer_chain = build_answer_chain(llm=llm, prompts=prompts, history_tokens=history_tokens)

    def start_chat(inputs: ChatInput | Mapping[str, Any]) -> _Turn:
        data = inputs if isinstance(inputs, ChatInput) else ChatInput.model_validate(inputs)
        return _Turn(question=data.question, chat_history=data.chat_history)

    def start_ask(inputs: AskInput | Mapping[str, Any]) -> _Turn:
        data = inputs if isinstance(inputs, AskInput) else AskInput.model_validate(inputs)
        query = " ".join(data.question.split())
        return _Turn(question=data.question, search_query=query, filters=data.filters)

    def rewrite(turn: _Turn, config: RunnableConfig) -> _Turn:
        since = time.perf_counter()
        out = rewrite_chain.invoke(
            RewriteInput(question=turn.question, chat_history=turn.chat_history), config
        )
        turn.search_query, turn.filters = out.search_query, out.filters
        turn.alternatives, turn.notes = out.alternatives, out.notes
        turn.prompts.update(out.prompts)
        turn.timed("rewrite", since)
        return turn

    def retrieve(turn: _Turn, config: RunnableConfig) -> _Turn:
        since = time.perf_counter()
        found = searcher.search(
            turn.search_query, filters=turn.filters, alternatives=turn.alternatives, config=config
        )
        turn.documents, turn.best_score = found.documents, found.best_score
        turn.timed("retrieve", since)
        return turn

    def requery_step(turn: _Turn, config: RunnableConfig) -> _Turn:
        below = policy.below if policy.below is not None else searcher.compressor.requery_below
        if not policy.enabled or turn.best_score is None or turn.best_score >= below:
            return turn
        since = time.perf_counter()
        configurable = config.get("configurable") or {}
        prompt = prompts.select("requery", configurable)
        reply = (llm.prompted(prompt, grammar=lines_grammar(1)) | StrOutputParser()).invoke(
            {"question": turn.question, "previous_query": turn.search_query}, config
        )
        # A usable query that differs from the one already searched, or nothing.
        fresh = parse_alternatives(reply, main=turn.search_query, count=1)
        glossary = prompts.domain(configurable.get("domain")).query_glossary
        new = expand_glossary(fresh[0], glossary) if fresh else None
        report = RequeryReport(
            first_query=turn.search_query, first_best_score=turn.best_score, query=new
        )
        turn.prompts["requery"] = prompt.ref
        if new:
            found = searcher.search(new, filters=turn.filters, config=config)
            report.best_score = found.best_score
            if found.best_score is not None and policy.keeps(turn.best_score, found.best_score):
                report.kept = True
                turn.search_query, turn.alternatives = new, []
                turn.documents, turn.best_score = found.documents, found.best_score
        turn.requery = report
        turn.timed("requery", since)
        return turn

    def head(turn: _Turn) -> AddableDict:
        """The first event: what was searched and the sources the answer may use."""
        return AddableDict(
            sources=[to_source(d).model_dump() for d in turn.documents],
            search_query=turn.search_query,
            filters=[f.model_dump() for f in turn.filters],
            alternatives=turn.alternatives,
            requeried=turn.requery is not None,
            requery=turn.requery.model_dump() if turn.requery else None,
            notes=turn.notes,
            compressor=searcher.compressor.status(),
        )

    def tail(turn: _Turn, since: float, answer_prompt: str | None) -> AddableDict:
        if answer_prompt:
            turn.prompts["answer"] = answer_prompt
        turn.timed("answer", since)
        turn.timed("total", turn.started)
        return AddableDict(prompts=dict(turn.prompts), timings=dict(turn.timings))

    def answer_input(turn: _Turn) -> AnswerInput:
        return AnswerInput(
            question=turn.question, chat_history=turn.chat_history, documents=turn.documents
        )

    def answer(inputs: Iterator[_Turn], config: RunnableConfig) -> Iterator[AddableDict]:
        (turn,) = list(inputs)
        yield head(turn)
        since, prompt = time.perf_counter(), None
        for event in answer_chain.stream(answer_input(turn), config):
            prompt = event.pop("prompt", prompt)
            if event:
                yield AddableDict(event)
        yield tail(turn, since, prompt)

    async def aanswer(
        inputs: AsyncIterator[_Turn], config: RunnableConfig
    ) -> AsyncIterator[AddableDict]:
        (turn,) = [item async for item in inputs]
        yield head(turn)
        since, prompt = time.perf_counter(), None
        async for event in answer_chain.astream(answer_input(turn), config):
            prompt = event.pop("prompt", prompt)
            if event:
                yield AddableDict(event)
        yield tail(turn, since, prompt)

    answer_step: Runnable[Any, Any] = RunnableGenerator(
        cast(Any, answer), cast(Any, aanswer)
    ).with_config(run_name="answer")
    retrieve_step = RunnableLambda(retrieve).with_config(run_name="retrieve")
    chat = (
        RunnableLambda(start_chat).with_config(run_name="start")
        | RunnableLambda(rewrite).with_config(run_name="rewrite")
        | retrieve_step
        | RunnableLambda(requery_step).with_config(run_name="requery")
        | answer_step
    )
    ask = RunnableLambda(start_ask).with_config(run_name="start") | retrieve_step | answer_step
    return Graphs(
        chat=chat.with_types(input_type=ChatInput, output_type=ChatOutput).with_config(
            run_name="chat"
        ),
        ask=ask.with_types(input_type=AskInput, output_type=ChatOutput).with_config(run_name="ask"),
        rewrite=rewrite_chain,
        retrieve=build_retrieve_chain(searcher),
        answer=answer_chain,
    )
