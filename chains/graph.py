"""The chat and ask chains: rewrite → retrieve → compress → (re-query) → answer.

Each is one LCEL sequence over the turn's state, a dict that each stage extends with one key
(``RunnablePassthrough.assign``); nothing is changed in place:

    input       question, chat_history (ask: question, filters), started
    configure   options   the request's domain, prompts, k and threshold, resolved once
    rewrite     search    query, filters, alternatives, notes (ask: the question as asked)
    retrieve    retrieved documents from the retriever (all phrasings fused), notes
    compress    compressed documents kept by the compressor, best score, threshold
    requery     a ``RunnableBranch``: only when the best score is low, a new query from the
                model, searched and compressed; adopted only when clearly better
    answer      a ``RunnableGenerator`` that streams the sources (and the answer style)
                first, then the answer's tokens, then its citations, prompt refs and timings

``get_graph()`` draws these stages and ``astream_events`` reports each by name. Streamed
chunks are ``AddableDict``s, so ``invoke``, ``RemoteRunnable.stream``, ``astream_log`` and
LangServe's playground merge them into one dict (``ChatOutput``).

The parts are LangChain's contracts: any chat model, any ``BaseRetriever`` (or runnable from a
query to documents), any ``BaseDocumentCompressor``; see ``chains.retrieve`` for what each
must offer for filters, ``k``, thresholds and the re-query to reach it.
"""

import time
from collections.abc import AsyncIterator, Generator, Iterator, Mapping
from contextlib import aclosing, closing
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, cast

from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import (
    Runnable,
    RunnableBranch,
    RunnableConfig,
    RunnableLambda,
    RunnablePassthrough,
)
from langchain_core.runnables.utils import AddableDict
from pydantic import BaseModel, Field

from ragchains.chains.answer import PROMPTS as ANSWER_PROMPTS
from ragchains.chains.answer import Answerer, AnswerState, Citation, create_answer_chain
from ragchains.chains.llm import LLM, ChatHistory, as_llm
from ragchains.chains.options import AnswerStyle, Choices, Options
from ragchains.chains.retrieve import (
    Compressed,
    Kept,
    Retrieved,
    Searcher,
    Source,
    acompress,
    checked_parts,
    choices_for,
    compress,
    compress_stage,
    compressor_status,
    create_retrieve_chain,
    retrieve_stage,
    retriever_fields,
    threshold_for,
    to_source,
)
from ragchains.chains.rewrite import PROMPTS as REWRITE_PROMPTS
from ragchains.chains.rewrite import (
    RewriteOutput,
    create_rewrite_chain,
    expand_glossary,
    lines_grammar,
    parse_alternatives,
    rewrite_stage,
)
from ragchains.chains.state import (
    Configured,
    TurnInput,
    agathered,
    answer_stage,
    gathered,
    quick,
    read_input,
)
from ragchains.prompts.registry import CHAIN_PROMPTS, PromptRegistry, default_registry
from ragchains.retrievers.compressors import ScoringCompressor
from ragchains.retrievers.filters import MAX_FILTERS, MetadataFilter

# The prompts each chain chooses versions of, by the chain's (and its route's) name.
PROMPTS_USED: dict[str, tuple[str, ...]] = {
    "chat": CHAIN_PROMPTS,
    "ask": ANSWER_PROMPTS,
    "rewrite": REWRITE_PROMPTS,
    "retrieve": (),
    "answer": ANSWER_PROMPTS,
}

Retriever = Runnable[str, list[Document]]


class ChatInput(BaseModel):
    question: str = Field(min_length=1)
    chat_history: ChatHistory = Field(default_factory=list)


class AskInput(BaseModel):
    question: str = Field(min_length=1)
    filters: list[MetadataFilter] = Field(default_factory=list, max_length=MAX_FILTERS)


class RequeryReport(BaseModel):
    first_query: str
    first_best_score: float | None
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
    answer_style: Literal["quote", "free"] = Field(
        description="quote: sentences copied from the sources; free: free generation"
    )
    answer: str
    citations: list[Citation]
    abstained: bool
    prompts: dict[str, str]
    timings: dict[str, float] = Field(description="seconds per stage, and total")


@dataclass(frozen=True)
class RequeryPolicy:
    """When to re-query, and when the new results are clearly better.

    ``below``: re-query when the best compressor score is under it; None takes the
    compressor's own (``requery_threshold()``), and with a compressor that reports no scores a
    turn re-queries only when nothing was kept.
    """

    enabled: bool = True
    below: float | None = None
    min_ratio: float = 1.1
    min_gain: float = 0.05

    def keeps(self, old: float, new: float) -> bool:
        return new >= max(old * self.min_ratio, old + self.min_gain)


# ----------------------------------------------------------------------------- the stages
class Requeried(Kept):
    """After ``requery``: when it ran, its report (and the new search, retrieved and
    compressed when its results were kept)."""

    requery: NotRequired[RequeryReport]
    requery_prompt: NotRequired[str]
    requery_seconds: NotRequired[float]


def read_chat_input(inputs: Any) -> TurnInput:
    """``{"question", "chat_history"}`` checked, the history as message objects."""
    read = read_input(ChatInput, inputs)
    return TurnInput(
        question=read["question"],
        chat_history=read["chat_history"],
        filters=[],
        started=time.perf_counter(),
    )


def read_ask_input(inputs: Any) -> TurnInput:
    read = read_input(AskInput, inputs)
    return TurnInput(
        question=read["question"],
        chat_history=[],
        filters=read["filters"],
        started=time.perf_counter(),
    )


def as_asked(state: Configured) -> RewriteOutput:
    """Ask mode's search: the question as asked (blanks collapsed, the domain's glossary
    expanded) with the given filters."""
    query = expand_glossary(" ".join(state["question"].split()), state["options"].glossary)
    return RewriteOutput(search_query=query, filters=state["filters"])


class _Requery:
    """Asks the model once for a better query when the best score is low; the new results
    replace the first ones only when clearly better."""

    def __init__(
        self,
        llm: LLM,
        searcher: Searcher,
        compressor: BaseDocumentCompressor | None,
        policy: RequeryPolicy,
    ) -> None:
        self.llm = llm
        self.searcher = searcher
        self.compressor = compressor
        self.policy = policy

    def below(self) -> float | None:
        if self.policy.below is not None:
            return self.policy.below
        if isinstance(self.compressor, ScoringCompressor):
            return self.compressor.requery_threshold()
        return None

    def wanted(self, state: Kept) -> bool:
        compressed: Compressed = state["compressed"]
        if not self.policy.enabled or self.compressor is None:
            return False
        if compressed.best_score is None:
            # No scores to compare: worth a try only when nothing was kept from something.
            return not compressed.documents and bool(state["retrieved"].documents)
        below = self.below()
        return below is not None and compressed.best_score < below

    def better(self, old: Compressed, new: Compressed) -> bool:
        if new.best_score is None or old.best_score is None:
            return bool(new.documents) and not old.documents
        return self.policy.keeps(old.best_score, new.best_score)

    def _ask(self, state: Kept) -> tuple[Runnable[Any, str], dict[str, Any]]:
        prompt = state["options"].prompt("requery")
        chain = self.llm.text(prompt, grammar=lines_grammar(1))
        variables = {"question": state["question"], "previous_query": state["search"].search_query}
        return chain, variables

    @staticmethod
    def _new_query(state: Kept, reply: str) -> str | None:
        """A usable query that differs from the one already searched, or None."""
        search: RewriteOutput = state["search"]
        fresh = parse_alternatives(reply, main=search.search_query, count=1)
        return expand_glossary(fresh[0], state["options"].glossary) if fresh else None

    def _result(
        self,
        state: Kept,
        new_query: str | None,
        found: tuple[Retrieved, Compressed] | None,
        since: float,
    ) -> Requeried:
        search: RewriteOutput = state["search"]
        old: Compressed = state["compressed"]
        report = RequeryReport(
            first_query=search.search_query, first_best_score=old.best_score, query=new_query
        )
        update: dict[str, Any] = {}
        if new_query and found is not None:
            retrieved, new = found
            report.best_score = new.best_score
            if self.better(old, new):
                report.kept = True
                update = {
                    "search": search.model_copy(
                        update={"search_query": new_query, "alternatives": []}
                    ),
                    "retrieved": retrieved,
                    "compressed": new,
                }
        return cast(
            Requeried,
            {
                **state,
                **update,
                "requery": report,
                "requery_prompt": state["options"].prompt("requery").ref,
                "requery_seconds": round(time.perf_counter() - since, 4),
            },
        )

    def __call__(self, state: Kept, config: RunnableConfig) -> Requeried:
        since = time.perf_counter()
        chain, variables = self._ask(state)
        new_query = self._new_query(state, chain.invoke(variables, config))
        found = None
        if new_query:
            options: Options = state["options"]
            retrieved = self.searcher.search(
                new_query, filters=state["search"].filters, k=options.k, config=config
            )
            new = compress(
                self.compressor,
                retrieved.documents,
                new_query,
                threshold=threshold_for(options, self.compressor),
                config=config,
            )
            found = (retrieved, new)
        return self._result(state, new_query, found, since)

    def stage(self) -> Runnable[Any, Requeried]:
        """The ``requery`` stage: a branch that re-queries when the best score is low
        (``wanted``) and passes the state on unchanged otherwise."""
        requery = RunnableLambda(self, afunc=self.acall, name="requery")
        wanted = quick(self.wanted, name="requery_wanted")
        branch: RunnableBranch[Any, Any] = RunnableBranch((wanted, requery), RunnablePassthrough())
        branch.name = "requery"  # its node in get_graph(), its run in astream_events
        return branch

    async def acall(self, state: Kept, config: RunnableConfig) -> Requeried:
        since = time.perf_counter()
        chain, variables = self._ask(state)
        new_query = self._new_query(state, await chain.ainvoke(variables, config))
        found = None
        if new_query:
            options: Options = state["options"]
            retrieved = await self.searcher.asearch(
                new_query, filters=state["search"].filters, k=options.k, config=config
            )
            new = await acompress(
                self.compressor,
                retrieved.documents,
                new_query,
                threshold=threshold_for(options, self.compressor),
                config=config,
            )
            found = (retrieved, new)
        return self._result(state, new_query, found, since)


# The answerer's style and notes are known before it answers: the head event says them.
_SAID_IN_HEAD = ("answer_style", "notes")


class _Respond:
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

    def transform(
        self, states: Iterator[Requeried], config: RunnableConfig
    ) -> Generator[AddableDict, None, None]:
        state: Requeried = gathered(states)
        yield self.head(state)
        since, prompt = time.perf_counter(), None
        with closing(self.answerer.events(self.answer_state(state), config)) as events:
            for event in events:
                prompt = event.pop("prompt", prompt)
                for key in _SAID_IN_HEAD:
                    event.pop(key, None)
                if event:
                    yield event
        yield self.tail(state, since, prompt)

    async def atransform(
        self, states: AsyncIterator[Requeried], config: RunnableConfig
    ) -> AsyncIterator[AddableDict]:
        state: Requeried = await agathered(states)
        yield self.head(state)
        since, prompt = time.perf_counter(), None
        async with aclosing(self.answerer.aevents(self.answer_state(state), config)) as events:
            async for event in events:
                prompt = event.pop("prompt", prompt)
                for key in _SAID_IN_HEAD:
                    event.pop(key, None)
                if event:
                    yield event
        yield self.tail(state, since, prompt)

    def stage(self) -> Runnable[Any, Any]:
        """The ``answer`` stage: a ``RunnableGenerator`` streaming the turn's output."""
        return answer_stage(self.transform, self.atransform)


# ----------------------------------------------------------------------------- builders
@dataclass(frozen=True)
class _Parts:
    llm: LLM
    searcher: Searcher
    compressor: BaseDocumentCompressor | None
    prompts: PromptRegistry

    def choices(self, names: tuple[str, ...]) -> Choices:
        return choices_for(self.prompts, names, self.searcher.retriever, self.compressor)


def _parts(
    llm: LLM | BaseChatModel,
    retriever: Retriever,
    compressor: BaseDocumentCompressor | None,
    prompts: PromptRegistry | None,
) -> _Parts:
    retriever, compressor = checked_parts(retriever, compressor)
    return _Parts(as_llm(llm), Searcher(retriever), compressor, prompts or default_registry())


def create_chat_chain(
    *,
    llm: LLM | BaseChatModel,
    retriever: Retriever,
    compressor: BaseDocumentCompressor | None = None,
    prompts: PromptRegistry | None = None,
    fields: Mapping[str, str] | None = None,
    history_tokens: int = 1024,
    requery: RequeryPolicy | None = None,
    answer_style: AnswerStyle = "auto",
) -> Runnable[ChatInput | dict[str, Any], dict[str, Any]]:
    """A chat turn: history-aware rewrite (with filters), retrieval, compression, a re-query
    when the results are weak, and a cited answer that abstains without sources.

    ``llm``: any LangChain chat model (or an ``LLM`` describing one). ``retriever``: any
    ``BaseRetriever``, or a runnable from a query to documents; filters and ``k`` reach it
    when it takes them by name (ours do), else the turn carries a note. ``compressor``: any
    ``BaseDocumentCompressor``, or None to keep what the retriever returns. ``prompts``: the
    prompt registry (default: the shipped prompts). ``fields``: the metadata fields the model
    may filter on (default: the retriever's own ``fields``, when it filters).
    ``answer_style``: the default answer style, ``auto`` (quote for a model that takes a
    grammar, free for others), ``quote`` or ``free``; a request's or domain's wins over it.
    """
    parts = _parts(llm, retriever, compressor, prompts)
    fields = fields if fields is not None else retriever_fields(parts.searcher.retriever)
    policy = requery or RequeryPolicy()
    requery_step = _Requery(parts.llm, parts.searcher, parts.compressor, policy)
    answerer = Answerer(llm=parts.llm, history_tokens=history_tokens, answer_style=answer_style)
    respond = _Respond(answerer, parts.compressor)
    rewrite = rewrite_stage(llm=parts.llm, fields=fields, history_tokens=history_tokens)
    chain = (
        quick(read_chat_input, name="input")
        | RunnablePassthrough.assign(options=parts.choices(CHAIN_PROMPTS).step())
        | RunnablePassthrough.assign(search=rewrite)
        | RunnablePassthrough.assign(retrieved=retrieve_stage(parts.searcher))
        | RunnablePassthrough.assign(compressed=compress_stage(parts.compressor))
        | requery_step.stage()
        | respond.stage()
    )
    return chain.with_types(input_type=ChatInput, output_type=ChatOutput).with_config(
        run_name="chat"
    )


def create_ask_chain(
    *,
    llm: LLM | BaseChatModel,
    retriever: Retriever,
    compressor: BaseDocumentCompressor | None = None,
    prompts: PromptRegistry | None = None,
    history_tokens: int = 1024,
    answer_style: AnswerStyle = "auto",
) -> Runnable[AskInput | dict[str, Any], dict[str, Any]]:
    """One question, no rewrite: the question (and the filters given with it) is searched as
    asked, compressed, and answered with citations. Same parts and output as
    ``create_chat_chain``."""
    parts = _parts(llm, retriever, compressor, prompts)
    answerer = Answerer(llm=parts.llm, history_tokens=history_tokens, answer_style=answer_style)
    respond = _Respond(answerer, parts.compressor)
    chain = (
        quick(read_ask_input, name="input")
        | RunnablePassthrough.assign(options=parts.choices(ANSWER_PROMPTS).step())
        | RunnablePassthrough.assign(search=quick(as_asked, name="query"))
        | RunnablePassthrough.assign(retrieved=retrieve_stage(parts.searcher))
        | RunnablePassthrough.assign(compressed=compress_stage(parts.compressor))
        | respond.stage()
    )
    return chain.with_types(input_type=AskInput, output_type=ChatOutput).with_config(run_name="ask")


@dataclass
class Chains:
    """Every runnable the server exposes: the two graphs and the stages on their own."""

    chat: Runnable[Any, dict[str, Any]]
    ask: Runnable[Any, dict[str, Any]]
    rewrite: Runnable[Any, RewriteOutput]
    retrieve: Runnable[Any, list[Document]]
    answer: Runnable[Any, dict[str, Any]]

    def __getitem__(self, name: str) -> Runnable[Any, Any]:
        if name not in PROMPTS_USED:
            raise KeyError(name)
        return cast(Runnable[Any, Any], getattr(self, name))


def create_chains(
    *,
    llm: LLM | BaseChatModel,
    retriever: Retriever,
    compressor: BaseDocumentCompressor | None = None,
    prompts: PromptRegistry | None = None,
    fields: Mapping[str, str] | None = None,
    history_tokens: int = 1024,
    requery: RequeryPolicy | None = None,
    answer_style: AnswerStyle = "auto",
) -> Chains:
    """The chat and ask chains and each stage on its own, over the same parts."""
    llm = as_llm(llm)
    prompts = prompts or default_registry()
    fields = fields if fields is not None else retriever_fields(retriever)
    return Chains(
        chat=create_chat_chain(
            llm=llm,
            retriever=retriever,
            compressor=compressor,
            prompts=prompts,
            fields=fields,
            history_tokens=history_tokens,
            requery=requery,
            answer_style=answer_style,
        ),
        ask=create_ask_chain(
            llm=llm,
            retriever=retriever,
            compressor=compressor,
            prompts=prompts,
            history_tokens=history_tokens,
            answer_style=answer_style,
        ),
        rewrite=create_rewrite_chain(
            llm=llm, prompts=prompts, fields=fields, history_tokens=history_tokens
        ),
        retrieve=create_retrieve_chain(retriever=retriever, compressor=compressor, prompts=prompts),
        answer=create_answer_chain(
            llm=llm, prompts=prompts, history_tokens=history_tokens, answer_style=answer_style
        ),
    )
