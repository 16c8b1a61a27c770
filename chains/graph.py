"""The chat and ask chains: rewrite → retrieve → compress → (re-query) → answer.

Each is one LCEL sequence over the turn's state, a dict that each stage extends with one key
(``RunnablePassthrough.assign``); nothing is changed in place:

    input       question, chat_history (ask: question, filters)
    configure   options   the request's domain, prompts, k and threshold, resolved once
    rewrite     search    query, filters, alternatives, notes (ask: the question as asked)
    retrieve    retrieved documents from the retriever (all phrasings fused), notes
    compress    compressed documents kept by the compressor, best score, threshold
    requery     a ``RunnableBranch``: only when the best score is low, a new query from the
                model, searched and compressed; adopted only when clearly better
    answer      a ``RunnableGenerator`` that streams the sources (and the answer style)
                first, then the answer's tokens, then its citations, prompt refs and timings

No stage measures its own time: each chain carries a ``StageClock``, a callback handler that
times the stages' runs, and the answer stage reads the turn's timings from it.

``get_graph()`` draws these stages and ``astream_events`` reports each by name. Streamed
chunks are ``AddableDict``s, so ``invoke``, ``RemoteRunnable.stream``, ``astream_log`` and
LangServe's playground merge them into one dict (``ChatOutput``).

The parts are LangChain's contracts: any chat model, any ``BaseRetriever`` (or runnable from a
query to documents), any ``BaseDocumentCompressor``; see ``chains.retrieve`` for what each
must offer for filters, ``k``, thresholds and the re-query to reach it.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import (
    Runnable,
    RunnablePassthrough,
)
from pydantic import BaseModel, Field

from ragchains.chains.answer import PROMPTS as ANSWER_PROMPTS
from ragchains.chains.answer import Answerer, Citation, IncompleteFlag, create_answer_chain
from ragchains.chains.compress import Compressed
from ragchains.chains.llm import LLM, ChatHistory, as_llm
from ragchains.chains.options import AnswerStyle, Choices
from ragchains.chains.requery import Requery, RequeryPolicy, RequeryReport
from ragchains.chains.respond import Respond
from ragchains.chains.retrieve import (
    Retrieved,
    Searcher,
    Source,
    checked_parts,
    choices_for,
    compress_stage,
    create_retrieve_chain,
    retrieve_stage,
    retriever_fields,
)
from ragchains.chains.rewrite import PROMPTS as REWRITE_PROMPTS
from ragchains.chains.rewrite import (
    RewriteOutput,
    create_rewrite_chain,
    expand_glossary,
    rewrite_stage,
)
from ragchains.chains.state import (
    Configured,
    TurnInput,
    quick,
    read_input,
)
from ragchains.observability.stages import StageClock
from ragchains.prompts.registry import CHAIN_PROMPTS, PromptRegistry, default_registry
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


class ChatOutput(BaseModel):
    """The merged stream of a chat or ask turn."""

    sources: list[Source]
    search_query: str
    filters: list[MetadataFilter]
    alternatives: list[str] = Field(default_factory=list)
    requeried: bool = Field(False, description="a re-query was asked (see requery)")
    requery: RequeryReport | None = None
    notes: list[str] = Field(default_factory=list)
    compressor: dict[str, Any] = Field(
        default_factory=dict,
        description="what compressed: its kind and model, the threshold this turn cut at, "
        "top_n, reorders (false: the retrieved order was kept, only cut), scoring (what a "
        "score measures), and the fallback in use with its reason",
    )
    best_score: float | None = Field(
        None,
        description="the best compressor score of the retrieved chunks before the threshold "
        "cut (compare compressor.threshold: a turn abstains when it is lower); null when "
        "nothing was retrieved or the compressor gives no scores",
    )
    answer_style: Literal["quote", "free"] = Field(
        description="quote: sentences copied from the sources; free: free generation"
    )
    answer: str
    citations: list[Citation]
    abstained: bool
    uncited: bool = Field(
        False,
        description="the answer cites none of the sources (the model ignored the instruction "
        "to cite): shown, but not as a grounded answer",
    )
    incomplete: IncompleteFlag = False
    prompts: dict[str, str]
    timings: dict[str, float] = Field(
        description="seconds per stage (a re-query's only when one was asked), and total, as "
        "the stages' runs reported them"
    )


def read_chat_input(inputs: Any) -> TurnInput:
    """``{"question", "chat_history"}`` checked, the history as message objects."""
    read = read_input(ChatInput, inputs)
    return TurnInput(question=read["question"], chat_history=read["chat_history"], filters=[])


def read_ask_input(inputs: Any) -> TurnInput:
    read = read_input(AskInput, inputs)
    return TurnInput(question=read["question"], chat_history=[], filters=read["filters"])


def as_asked(state: Configured) -> RewriteOutput:
    """Ask mode's search: the question as asked (blanks collapsed, the domain's glossary
    expanded) with the given filters."""
    query = expand_glossary(" ".join(state["question"].split()), state["options"].glossary)
    return RewriteOutput(search_query=query, filters=state["filters"])


# ----------------------------------------------------------------------------- builders
@dataclass(frozen=True)
class _Parts:
    llm: LLM
    retriever: Retriever
    compressor: BaseDocumentCompressor | None
    prompts: PromptRegistry
    retrieve: Runnable[Any, Retrieved]  # the stages over them, shared with the re-query
    compress: Runnable[Any, Compressed]

    def choices(self, names: tuple[str, ...]) -> Choices:
        return choices_for(self.prompts, names, self.retriever, self.compressor)


def _parts(
    llm: LLM | BaseChatModel,
    retriever: Retriever,
    compressor: BaseDocumentCompressor | None,
    prompts: PromptRegistry | None,
) -> _Parts:
    retriever, compressor = checked_parts(retriever, compressor)
    return _Parts(
        as_llm(llm),
        retriever,
        compressor,
        prompts or default_registry(),
        retrieve_stage(Searcher(retriever)),
        compress_stage(compressor),
    )


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
    fields = fields if fields is not None else retriever_fields(parts.retriever)
    policy = requery or RequeryPolicy()
    requery_step = Requery(parts.llm, parts.retrieve, parts.compress, parts.compressor, policy)
    answerer = Answerer(llm=parts.llm, history_tokens=history_tokens, answer_style=answer_style)
    clock = StageClock()
    respond = Respond(answerer, parts.compressor, clock)
    rewrite = rewrite_stage(llm=parts.llm, fields=fields, history_tokens=history_tokens)
    chain = (
        quick(read_chat_input, name="input")
        | RunnablePassthrough.assign(options=parts.choices(CHAIN_PROMPTS).step())
        | RunnablePassthrough.assign(search=rewrite)
        | RunnablePassthrough.assign(retrieved=parts.retrieve)
        | RunnablePassthrough.assign(compressed=parts.compress)
        | requery_step.stage()
        | respond.stage()
    )
    return chain.with_types(input_type=ChatInput, output_type=ChatOutput).with_config(
        run_name="chat", callbacks=[clock]
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
    clock = StageClock()
    respond = Respond(answerer, parts.compressor, clock)
    chain = (
        quick(read_ask_input, name="input")
        | RunnablePassthrough.assign(options=parts.choices(ANSWER_PROMPTS).step())
        | RunnablePassthrough.assign(search=quick(as_asked, name="query"))
        | RunnablePassthrough.assign(retrieved=parts.retrieve)
        | RunnablePassthrough.assign(compressed=parts.compress)
        | respond.stage()
    )
    return chain.with_types(input_type=AskInput, output_type=ChatOutput).with_config(
        run_name="ask", callbacks=[clock]
    )


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
