"""The answer stage: cited answers from compressed chunks, abstaining without an LLM call.

Kept chunks are shown to the model as ``[label] text`` blocks. The model cites with those labels
in square brackets; ``parse_citations`` maps the markers back to chunks, in order of first use,
and drops markers that name no chunk it was given.

The stage streams: ``{"answer": token}`` events, then one event with the citations. It is
written once, as a ``Reply`` (what comes before the model's reply, each piece of it, a break,
the ending); ``replying`` streams the model for sync callers or async ones, the only
difference between the two.

A reply cut short is kept and marked ``incomplete``, with a note saying why: the model said
its token limit stopped it (``finish_reason`` "length" in its message's ``response_metadata``,
as OpenAI-compatible servers and llama.cpp say it), or its stream failed after it had
started to answer (a LangChain ``ModelError`` mid-stream: the server broke off, the
connection dropped). By then the answer's first tokens may already be with the caller: an
error could not take them back, and a clean ending would pass a fragment off as the answer.
A model that fails before it says anything fails the turn, as before.

Two answer styles:

- ``free``: the model writes its own sentences from the domain's ``answer`` prompt. For a
  model that takes a GBNF grammar (the embedded llama.cpp one) decoding is constrained so
  that every sentence ends with the label of a given chunk, or the reply is exactly the
  don't-know sentence: small models otherwise forget to cite.
- ``quote``: the model may only copy. The kept chunks are cut into sentences, the ones that
  share most of the question's words are shown to it (the ``quote`` prompt), and a grammar
  built from them lets it write one or two of them verbatim, each followed by its chunk's
  label, or exactly the don't-know sentence (``chains.quote``). Decoding is greedy. The
  answer shows the quotes for a reader (``QuoteWriter``): a table row under its table's
  header, a CSV/JSON/Excel record as ``**field:** value`` lines, each citation where it
  keeps the Markdown valid; sentences stream token by token as the model writes them.

The style is chosen per request (``answer_style`` in ``configurable``), else by the domain
(``answer_style`` in ``domain.yaml``), else by the chain's default (the server's setting);
``auto`` at every level means quote for a model that takes a grammar and free otherwise. A
model that takes no grammar asked to quote answers freely, and the turn says so in a note
and in ``answer_style``: the style may come from a domain file or a server setting the
caller does not control, and an answer with a note serves them better than an error.
"""

import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import aclosing, closing
from dataclasses import dataclass, field
from functools import partial
from typing import Annotated, Any, Literal
from uuid import UUID

from langchain_core.callbacks import AsyncCallbackManagerForChainRun, CallbackManagerForChainRun
from langchain_core.documents import Document
from langchain_core.exceptions import ModelError
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.runnables import (
    Runnable,
    RunnableConfig,
    RunnableGenerator,
    RunnablePassthrough,
)
from langchain_core.runnables.utils import AddableDict
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from ragchains.chains.compress import compressor_score
from ragchains.chains.llm import ANSWER_TAG, LLM, ChatHistory, as_llm
from ragchains.chains.options import ANSWER_STYLES, AUTO, AnswerStyle, Choices, Options
from ragchains.chains.quote import (
    QUOTE_SENTENCES,
    Quote,
    QuoteWriter,
    format_quotes,
    quote_grammar,
    quotes,
    shortlist,
)
from ragchains.chains.retrieve import citation_label, to_source
from ragchains.chains.state import agathered, gathered, quick, read_input
from ragchains.prompts.registry import Prompt, PromptRegistry, default_registry

log = logging.getLogger(__name__)

DONT_KNOW = "I don't know based on the available documents."
# A citation marker, [label] or [label; label], and what separates its labels.
CITATION_MARKER = re.compile(r"\[([^\[\]\n]{1,300})\]")
LABEL_SEPARATOR = re.compile(r"\s*[;,]\s*")


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


# Said by the answer stage's output and by every turn's that carries it.
IncompleteFlag = Annotated[
    bool,
    Field(
        description="the model's reply was cut short (its stream broke off, or it reached its "
        "token limit): the answer is what arrived, not a finished one; a note says why"
    ),
]


class AnswerOutput(BaseModel):
    """What ``invoke`` returns (as a dict): the stream's events merged."""

    answer: str
    citations: list[Citation]
    abstained: bool
    uncited: bool = Field(
        False, description="the model answered without citing any of the sources: not grounded"
    )
    incomplete: IncompleteFlag = False
    answer_style: Literal["quote", "free"] = Field(description="the style that answered")
    notes: list[str] = Field(default_factory=list)
    prompt: str | None = None  # "domain/answer@vN", None when no LLM was called


class AnswerState(TypedDict):
    """What the answer stage reads: the question and history, the chunks to answer from and
    the request's resolved choices."""

    question: str
    chat_history: list[BaseMessage]
    documents: list[Document]
    options: Options


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
    for key in ("convex_score", "rrf_score", "dense_score", "bm25_score"):
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
    for marker in CITATION_MARKER.findall(answer):
        for label in LABEL_SEPARATOR.split(marker.strip()):
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


PROMPTS = ("answer", "quote")
UNCITED_NOTE = (
    "the model's answer cites none of the sources, so nothing shows it is grounded in them: "
    "check it against the sources, or ask with answer_style quote where the model takes a "
    "grammar"
)
BROKE_OFF_NOTE = (
    "the model's reply broke off before it was finished: this answer is incomplete, only the "
    "part that arrived"
)
TOKEN_LIMIT_NOTE = (
    "the model's reply reached its token limit (the prompt's max_tokens) before it was "
    "finished: this answer is incomplete"
)
# How models say their token limit stopped them, in ``response_metadata`` (each provider's own
# key and word): OpenAI-compatible servers and llama.cpp finish_reason "length", Ollama
# done_reason "length", Anthropic stop_reason "max_tokens", Google finish_reason "MAX_TOKENS".
_STOP_KEYS = ("finish_reason", "done_reason", "stop_reason")
_TOKEN_LIMIT = frozenset(("length", "max_tokens"))
QUOTE_FALLBACK_NOTE = (
    "answer_style quote needs a model that takes a grammar ({model} does not); "
    "this answer is freely generated"
)


def resolve_style(
    chosen: str, default: str, *, grammar: bool, model: str = "this model"
) -> tuple[Literal["quote", "free"], str | None]:
    """The style that answers, and a note when it is not the one asked for.

    ``chosen``: the request's style, else the domain's (``Options.answer_style``);
    ``default``: the chain's own. The first that is not ``auto`` wins; ``auto`` throughout
    means quote for a model that takes a grammar, free for any other.
    """
    wanted = chosen if chosen != AUTO else default
    if wanted == AUTO:
        return ("quote" if grammar else "free"), None
    if wanted == "quote" and not grammar:
        return "free", QUOTE_FALLBACK_NOTE.format(model=model)
    return ("quote" if wanted == "quote" else "free"), None


@dataclass
class AnswerPlan:
    """How one answer is made: the model's call and its input, the chunks it answers from,
    the prompt's ref, the style, notes, and the quotes it may copy."""

    # ``prompt | model``: the reply's message chunks (their metadata say why it stopped).
    chain: Runnable[dict[str, Any], Any] | None  # None: abstain without calling the LLM
    variables: dict[str, Any]
    documents: list[Document]
    prompt: str | None
    style: Literal["quote", "free"] = "free"
    notes: list[str] = field(default_factory=list)
    offered: list[Quote] = field(default_factory=list)  # the quotes the model may copy

    def shown(self) -> QuoteWriter | None:
        """What turns the model's quotes into the answer shown (None: shown as written)."""
        return QuoteWriter(self.offered, (DONT_KNOW,)) if self.offered else None


def _token_limited(piece: Any) -> bool:
    """``piece`` (a message chunk) says the model's token limit stopped its reply."""
    metadata = getattr(piece, "response_metadata", None) or {}
    return any(str(metadata.get(key, "")).lower() in _TOKEN_LIMIT for key in _STOP_KEYS)


class _Written:
    """The answer as it streams: the model's reply read piece by piece (its message chunks'
    text), shown as ``shown`` renders it (None: as written), leading blanks
    dropped, the whole text kept for citations; and why the reply was cut short, if it was
    (``cut``: the note that says so)."""

    def __init__(self, shown: QuoteWriter | None = None) -> None:
        self.shown = shown
        self.parts: list[str] = []
        self.said = False  # the model has written something
        self.cut: str | None = None

    def read(self, piece: Any) -> AddableDict | None:
        """One piece of the model's reply: the part of the answer it adds, if any."""
        if _token_limited(piece):
            self.cut = TOKEN_LIMIT_NOTE
        said = piece.text
        self.said = self.said or bool(said.strip())
        return self.add(self.shown.add(said) if self.shown else said)

    def broke_off(self, error: ModelError) -> None:
        """The model's stream failed: the answer so far is kept, marked incomplete, once the
        model had started it; before that, the failure is the turn's (raised again)."""
        if not self.said:
            raise error
        # The type only: an upstream's own words may echo a credential.
        log.warning("the model's reply broke off (%s); answered incomplete", type(error).__name__)
        self.cut = BROKE_OFF_NOTE

    def close(self) -> AddableDict | None:
        """The rest of the answer once the reply has ended (a quote's table, a cut tail)."""
        return self.add(self.shown.close()) if self.shown else None

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


def _ending(written: _Written, plan: AnswerPlan) -> AddableDict:
    """The stream's last event: citations parsed from the whole answer."""
    text = written.text
    citations = parse_citations(text, plan.documents)
    abstained = plan.chain is None or (
        not citations and DONT_KNOW.lower().rstrip(".") in text.lower()
    )
    # A model that cites nothing valid has not grounded its answer in the sources, whatever
    # it says: the answer is shown, marked so, never as a grounded one.
    uncited = not abstained and not citations
    notes = [*plan.notes, *([UNCITED_NOTE] if uncited else [])]
    if written.cut is not None:
        notes.append(written.cut)
    return AddableDict(
        citations=[c.model_dump() for c in citations],
        abstained=abstained,
        uncited=uncited,
        incomplete=written.cut is not None,
        answer_style=plan.style,
        notes=notes,
        prompt=plan.prompt,
    )


class Answerer:
    """The answer step over a turn's state (``question``, ``chat_history``, ``documents``
    and the resolved ``options``): streams ``{"answer": token}`` events, then one event with
    ``citations``, ``abstained``, ``uncited``, ``incomplete``, ``answer_style``, ``notes``
    and the ``prompt`` ref. With no documents it abstains without calling the model.

    ``answer_style``: the chain's default style (``auto``, ``quote`` or ``free``), used when
    neither the request nor the domain chooses one."""

    def __init__(
        self, *, llm: LLM, history_tokens: int = 1024, answer_style: AnswerStyle = "auto"
    ) -> None:
        if answer_style not in ANSWER_STYLES:
            raise ValueError(f"answer_style must be auto, quote or free, not {answer_style!r}")
        self.llm = llm
        self.history_tokens = history_tokens
        self.answer_style = answer_style

    def style(self, options: Options) -> tuple[Literal["quote", "free"], str | None]:
        """The style a turn with these choices answers in, and a note when it is not the one
        asked for."""
        return resolve_style(
            options.answer_style, self.answer_style, grammar=self.llm.grammar, model=self.llm.name
        )

    def plan(self, state: AnswerState) -> AnswerPlan:
        style, note = self.style(state["options"])
        notes = [note] if note else []
        documents: list[Document] = list(state.get("documents") or [])
        if not documents:
            return AnswerPlan(None, {}, [], None, style, notes)
        options: Options = state["options"]
        history = self.llm.trim_history(state.get("chat_history") or [], self.history_tokens)
        labels = [citation_label(d) for d in documents]
        variables = {"question": state["question"], "chat_history": history}
        if style == "quote":
            prompt = options.prompt("quote")
            offered = shortlist(quotes(documents, labels), state["question"])
            if not offered:  # nothing quotable (headings only): nothing to answer from
                return AnswerPlan(None, {}, documents, None, style, notes)
            # Greedy decoding whatever the prompt file says: a quote is copied, not sampled.
            chain = self._prompted(
                prompt,
                grammar=quote_grammar(offered, DONT_KNOW, sentences=QUOTE_SENTENCES),
                temperature=0.0,
            )
            # Best last, next to the question, where small models look most.
            variables["context"] = format_quotes(offered[::-1])
            return AnswerPlan(chain, variables, documents, prompt.ref, style, notes, offered)
        prompt = options.prompt("answer")
        chain = self._prompted(prompt, grammar=citation_grammar(labels))
        variables["context"] = format_context(documents)
        return AnswerPlan(chain, variables, documents, prompt.ref, style, notes)

    def _prompted(self, prompt: Prompt, **options: Any) -> Runnable[dict[str, Any], Any]:
        """``prompt | model``, its run tagged as the one that writes the answer: so traces
        show it, and a model that orders its calls may serve answers in their requests'
        order (the tag is handed down to the model's run)."""
        return self.llm.prompted(prompt, **options).with_config(tags=[ANSWER_TAG])

    def reply(self, state: AnswerState, run: UUID) -> "Reply":
        """The answer to one state, to be written (``replying``). ``run``, the stage's run,
        is not read: an answer on its own reports no timings (``chains.respond``)."""
        return Reply(self.plan(state))

    def stage(self) -> Runnable[Any, Any]:
        """The answer stage: a ``RunnableGenerator`` streaming the answer's events."""
        return replying(self.reply)


class Reply:
    """One answer as it is written: what comes before the model's reply (the don't-know
    sentence when there is nothing to answer from), each piece of the reply, a break in it,
    the ending (citations and the rest). ``chain`` and ``variables``: the model's call, None
    when it is not called."""

    def __init__(self, plan: AnswerPlan) -> None:
        self.plan = plan
        self.written = _Written(plan.shown())

    @property
    def chain(self) -> Runnable[dict[str, Any], Any] | None:
        return self.plan.chain

    @property
    def variables(self) -> dict[str, Any]:
        return self.plan.variables

    def opening(self) -> list[AddableDict]:
        return _events(self.written.add(DONT_KNOW) if self.chain is None else None)

    def read(self, piece: Any) -> list[AddableDict]:
        return _events(self.written.read(piece))

    def broke_off(self, error: ModelError) -> None:
        self.written.broke_off(error)

    def ending(self) -> list[AddableDict]:
        return [*_events(self.written.close()), _ending(self.written, self.plan)]


def _events(event: AddableDict | None) -> list[AddableDict]:
    return [] if event is None else [event]


def replying(start: Callable[[Any, UUID], Reply]) -> Runnable[Any, Any]:
    """The ``answer`` stage: a ``RunnableGenerator`` over the state streamed in (gathered),
    whose ``AddableDict`` chunks ``invoke`` (and LangServe, ``astream_log``) add up into one.
    ``start`` makes the ``Reply`` of a state, given the stage's run id. The model's stream is
    closed with the stage's: a consumer that stops early stops the model at once."""

    def transform(
        states: Iterator[Any], config: RunnableConfig, run_manager: CallbackManagerForChainRun
    ) -> Iterator[AddableDict]:
        reply = start(gathered(states), run_manager.run_id)
        yield from reply.opening()
        if reply.chain is not None:
            with closing(reply.chain.stream(reply.variables, config)) as pieces:  # type: ignore[type-var]
                try:
                    for piece in pieces:
                        yield from reply.read(piece)
                except ModelError as error:
                    reply.broke_off(error)
        yield from reply.ending()

    async def atransform(
        states: AsyncIterator[Any],
        config: RunnableConfig,
        run_manager: AsyncCallbackManagerForChainRun,
    ) -> AsyncIterator[AddableDict]:
        reply = start(await agathered(states), run_manager.run_id)
        for event in reply.opening():
            yield event
        if reply.chain is not None:
            async with aclosing(reply.chain.astream(reply.variables, config)) as pieces:  # type: ignore[type-var]
                try:
                    async for piece in pieces:
                        for event in reply.read(piece):
                            yield event
                except ModelError as error:
                    reply.broke_off(error)
        for event in reply.ending():
            yield event

    # RunnableGenerator hands the run's config and run manager to a transform that takes
    # them; its type hints name the input only.
    return RunnableGenerator(transform, atransform, name="answer")  # type: ignore[arg-type]


def create_answer_chain(
    *,
    llm: LLM | BaseChatModel,
    prompts: PromptRegistry | None = None,
    history_tokens: int = 1024,
    answer_style: AnswerStyle = "auto",
) -> Runnable[AnswerInput | dict[str, Any], dict[str, Any]]:
    """Answer from the given chunks only, with citations; abstain without calling the LLM
    when there are none. Streams ``answer`` tokens, then ``citations``.

    ``answer_style``: the default style (``auto``: quote for a model that takes a grammar,
    free for others); a request's or domain's ``answer_style`` wins over it."""
    answerer = Answerer(llm=as_llm(llm), history_tokens=history_tokens, answer_style=answer_style)
    choices = Choices(prompts or default_registry(), PROMPTS)
    chain = (
        quick(partial(read_input, AnswerInput), name="input")
        | RunnablePassthrough.assign(options=choices.step())
        | answerer.stage()
    )
    return chain.with_types(input_type=AnswerInput, output_type=AnswerOutput).with_config(
        run_name="answer"
    )
