"""The chat and ask graphs with fake chat models over the real sample index.

The retriever is the real hybrid one (spied on); the compressor's scorer is scripted per
query so that re-query decisions and abstention can be set up exactly.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage
from pydantic import Field

from ragchains.chains.answer import DONT_KNOW
from ragchains.chains.compress import threshold_for
from ragchains.chains.graph import (
    PROMPTS_USED,
    Chains,
    ChatOutput,
    RequeryPolicy,
    create_chains,
)
from ragchains.chains.llm import LLM
from ragchains.chains.options import Choices, Options
from ragchains.chains.retrieve import citation_label
from ragchains.factory import build_compressor, open_index
from ragchains.prompts.registry import CHAIN_PROMPTS, PromptRegistry, PromptSelectionError
from ragchains.retrievers.compressors import RerankCompressor
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.filters import MetadataFilter
from ragchains.retrievers.hybrid import HybridRetriever
from ragchains.retrievers.searchindex import SearchIndex
from ragchains.settings import Settings
from tests.fakes import NoCallModel, RecordingModel

PROMPTS = PromptRegistry(required=CHAIN_PROMPTS)


class SpyRetriever(HybridRetriever):
    """The real hybrid retriever, recording each search it is asked for."""

    calls: list = Field(default_factory=list)

    def _get_relevant_documents(
        self, query: str, *, run_manager: Any, k: Any = None, filters: Any = None, scope: Any = None
    ) -> Any:
        given = [MetadataFilter.model_validate(f).model_dump() for f in filters or []]
        self.calls.append((query, k or self.k, given))
        return super()._get_relevant_documents(
            query, run_manager=run_manager, k=k, filters=filters, scope=scope
        )


class ScriptedScorer:
    """Gives every chunk the score set for its query (``default`` otherwise)."""

    kind = "scripted"
    name = "scripted"
    default_threshold = 0.25
    default_requery_below = 0.35

    def __init__(self, by_query: dict[str, float] | None = None, default: float = 0.6) -> None:
        self.by_query = by_query or {}
        self.default = default

    def load(self) -> None:
        pass

    def score(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        return [self.by_query.get(query, self.default) for query, _ in pairs]


class ToolModel(FakeMessagesListChatModel):
    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self.bind(tools=tools, **kwargs)


@pytest.fixture(scope="module")
def index(sample_index: Path, embedder: SentenceTransformerEmbedder) -> SearchIndex:
    return open_index(sample_index, embedder)


def build(
    index: SearchIndex,
    embedder: SentenceTransformerEmbedder,
    model: Any,
    *,
    scores: dict[str, float] | None = None,
    default: float = 0.6,
    policy: RequeryPolicy | None = None,
    grammar: bool = False,
) -> tuple[Chains, SpyRetriever]:
    retriever = SpyRetriever(index=index, embedder=embedder, k=10)
    compressor = RerankCompressor(primary=ScriptedScorer(scores, default), top_n=4)
    graphs = create_chains(
        llm=LLM.of(model, count_tokens=len, grammar=grammar),
        retriever=retriever,
        compressor=compressor,
        prompts=PROMPTS,
        requery=policy,
    )
    return graphs, retriever


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "args": args, "id": f"call-{name}", "type": "tool_call"}


def price(text: str) -> float:
    match = re.search(r"^price: ([\d.]+)$", text, re.M)
    assert match, text
    return float(match.group(1))


# ----------------------------------------------------------------------------- filters
def test_numeric_and_filename_filters_reach_the_retriever(
    index: SearchIndex, embedder: SentenceTransformerEmbedder
) -> None:
    model = ToolModel(
        responses=[
            AIMessage(
                content="",
                tool_calls=[
                    call("search_sources", search_query="soil sensor"),
                    call("add_filter", field="price", op="<", value=50),
                    call("search_by_filename", filename="products.csv"),
                ],
            ),
            AIMessage(content="The Soil Probe Lite is cheap [products.csv#row=2]."),
        ]
    )
    graphs, retriever = build(index, embedder, model)
    question = "soil sensors in products.csv under 50?"
    out = graphs.chat.invoke({"question": question})
    wanted = [
        {"field": "price", "op": "<", "value": 50},
        {"field": "filename", "op": "=", "value": "products.csv"},
    ]
    # "soil sensor" adds nothing to the question: the user's words are searched, filtered.
    assert retriever.calls == [(question, 10, wanted)]
    assert out["filters"] == wanted
    assert out["sources"], "the filtered search found nothing"
    for source in out["sources"]:
        assert source["label"].startswith("products.csv#row=")
        assert price(source["text"]) < 50


def test_ask_takes_filters_and_skips_the_rewrite(
    index: SearchIndex, embedder: SentenceTransformerEmbedder
) -> None:
    model = RecordingModel(responses=["Cheap [accessories.jsonl#row=3]."])
    graphs, retriever = build(index, embedder, model)
    out = graphs.ask.invoke(
        {
            "question": "  sensor   brackets ",
            "filters": [{"field": "price", "op": "<=", "value": 20}],
        }
    )
    assert retriever.calls == [
        ("sensor brackets", 10, [{"field": "price", "op": "<=", "value": 20}])
    ]
    assert len(model.seen) == 1  # the answer only
    assert "rewrite" not in out["prompts"] and out["prompts"]["answer"] == "default/answer@v2"


# ----------------------------------------------------------------------------- re-query
def plain_model(*replies: str) -> RecordingModel:
    return RecordingModel(responses=list(replies))


def test_requery_kept_when_clearly_better(
    index: SearchIndex, embedder: SentenceTransformerEmbedder
) -> None:
    model = plain_model("search_sources(search_query='bad query')", "better query", "Fine.")
    graphs, retriever = build(
        index, embedder, model, scores={"bad query": 0.1, "better query": 0.5}
    )
    out = graphs.chat.invoke({"question": "bad query"})
    assert [c[0] for c in retriever.calls] == ["bad query", "better query"]
    assert out["requeried"] is True
    assert out["requery"] == {
        "first_query": "bad query",
        "first_best_score": 0.1,
        "query": "better query",
        "refused": None,
        "best_score": 0.5,
        "kept": True,
    }
    assert out["search_query"] == "better query"
    assert len(out["sources"]) == 4 and all(s["score"] == 0.5 for s in out["sources"])
    assert out["prompts"]["requery"] == "default/requery@v2"
    assert "requery" in out["timings"]


def test_requery_discarded_when_not_better_by_the_margin(
    index: SearchIndex, embedder: SentenceTransformerEmbedder
) -> None:
    # 0.32 beats 0.30, but not by max(1.1 x 0.30, 0.30 + 0.05) = 0.35.
    model = plain_model("search_sources(search_query='bad query')", "other query", "Fine.")
    graphs, _ = build(index, embedder, model, scores={"bad query": 0.30, "other query": 0.32})
    out = graphs.chat.invoke({"question": "bad query"})
    assert out["requeried"] is True and out["requery"]["kept"] is False
    assert out["requery"]["best_score"] == 0.32
    assert out["search_query"] == "bad query"
    assert all(s["score"] == 0.30 for s in out["sources"])


def test_requery_repeating_the_first_query_searches_nothing_more(
    index: SearchIndex, embedder: SentenceTransformerEmbedder
) -> None:
    model = plain_model("search_sources(search_query='bad query')", "Bad Query", "Fine.")
    graphs, retriever = build(index, embedder, model, scores={"bad query": 0.1})
    out = graphs.chat.invoke({"question": "bad query"})
    assert [c[0] for c in retriever.calls] == ["bad query"]
    assert out["requery"] == {
        "first_query": "bad query",
        "first_best_score": 0.1,
        "query": None,
        "refused": None,
        "best_score": None,
        "kept": False,
    }


def test_requery_margin_is_the_larger_of_ratio_and_gain() -> None:
    policy = RequeryPolicy()
    assert policy.keeps(0.2, 0.26) and not policy.keeps(0.2, 0.24)  # gain 0.05 decides
    assert policy.keeps(1.0, 1.11) and not policy.keeps(1.0, 1.09)  # ratio 1.1 decides
    assert RequeryPolicy(min_ratio=1.0, min_gain=0.0).keeps(0.3, 0.3)


def test_no_requery_when_the_first_results_are_good(
    index: SearchIndex, embedder: SentenceTransformerEmbedder
) -> None:
    model = plain_model("search_sources(search_query='good query')", "Fine.")
    graphs, retriever = build(index, embedder, model, default=0.6)
    out = graphs.chat.invoke({"question": "good query"})
    assert len(retriever.calls) == 1 and len(model.seen) == 2  # the rewrite and the answer
    assert out["requeried"] is False and out["requery"] is None
    assert "requery" not in out["prompts"]


# ----------------------------------------------------------------------------- abstention
def test_ask_abstains_without_calling_the_llm(
    index: SearchIndex, embedder: SentenceTransformerEmbedder
) -> None:
    graphs, _ = build(index, embedder, NoCallModel(), default=0.1)
    out = graphs.ask.invoke({"question": "what is the capital of France?"})
    assert out["abstained"] is True and out["sources"] == [] and out["citations"] == []
    assert out["answer"] == "I don't know based on the available documents."
    assert out["prompts"] == {}
    # Why: the best score of the chunks retrieved, under the threshold that cut them all.
    assert out["best_score"] == pytest.approx(0.1) and out["compressor"]["threshold"] == 0.25


def test_best_score_is_the_best_before_the_cut_and_none_without_chunks(
    index: SearchIndex, embedder: SentenceTransformerEmbedder
) -> None:
    graphs, _ = build(index, embedder, RecordingModel(responses=[DONT_KNOW]), default=0.7)
    out = graphs.ask.invoke({"question": "benefit plans"})
    assert out["sources"] and out["best_score"] == pytest.approx(0.7)
    head = next(iter(graphs.ask.stream({"question": "benefit plans"})))
    assert "sources" in head and head["best_score"] == pytest.approx(0.7)  # said up front
    nothing = {"question": "x", "filters": [{"field": "source", "op": "=", "value": "nowhere.md"}]}
    assert graphs.ask.invoke(nothing)["best_score"] is None  # nothing retrieved


def test_the_similarity_fallback_keeps_the_fused_order_and_says_its_cut(
    index: SearchIndex, settings: Settings, embedder: SentenceTransformerEmbedder
) -> None:
    """The real compressor without cross-encoder weights: the hotel allowance in Europe is on
    the travel policy's first page, BM25's top hit; the turn keeps the retrieved order and
    answers from it, and its output says the best score and the cut it passed."""
    retriever = SpyRetriever(index=index, embedder=embedder, k=10)
    compressor = build_compressor(settings, embedder, index)
    graphs = create_chains(
        llm=LLM.of(
            RecordingModel(responses=["EUR 180 [travel-policy.pdf#page=1]."]), count_tokens=len
        ),
        retriever=retriever,
        compressor=compressor,
        prompts=PROMPTS,
    )
    question = "How much is the hotel allowance per night in Europe?"
    out = graphs.ask.invoke({"question": question})
    assert out["abstained"] is False
    assert out["sources"][0]["label"] == "travel-policy.pdf#page=1"
    assert out["citations"][0]["label"] == "travel-policy.pdf#page=1"
    retrieved = [d.id for d in retriever.invoke(question)]
    positions = [retrieved.index(s["id"]) for s in out["sources"]]
    assert positions == sorted(positions)  # the fused order, not the similarity order
    status = out["compressor"]
    assert status["kind"] == "embedding-similarity" and status["reorders"] is False
    assert out["best_score"] >= status["threshold"] == compressor.effective_threshold
    assert out["best_score"] >= max(s["score"] for s in out["sources"])  # of all, kept or not


def test_chat_abstains_without_an_answer_call(
    index: SearchIndex, embedder: SentenceTransformerEmbedder
) -> None:
    model = plain_model("search_sources(search_query='capital of France')")
    graphs, _ = build(index, embedder, model, default=0.1, policy=RequeryPolicy(enabled=False))
    out = graphs.chat.invoke({"question": "what is the capital of France?"})
    assert out["abstained"] is True
    assert len(model.seen) == 1  # the rewrite; no answer call
    assert set(out["prompts"]) == {"rewrite"}


# ----------------------------------------------------------------------------- streaming
def check_stream(events: list[dict[str, Any]]) -> None:
    first, *middle, last = events
    assert "sources" in first and "answer" not in first
    # The user's words are searched, with the rewrite that brings in "benefit" beside them.
    assert first["sources"] and first["search_query"] == FOLLOW_UP["question"]
    assert first["alternatives"] == ["benefit plans"]
    assert middle and all(set(e) == {"answer"} for e in middle[:-1])
    assert set(middle[-1]) == {"citations", "abstained", "uncited", "incomplete"}
    assert set(last) == {"prompts", "timings"}
    text = "".join(e["answer"] for e in middle[:-1])
    assert text == "Standard costs $45.00 [employee-handbook.md#benefit-plans]."
    assert [c["label"] for c in middle[-1]["citations"]] == ["employee-handbook.md#benefit-plans"]
    assert set(last["timings"]) == {"rewrite", "retrieve", "compress", "answer", "total"}


REPLIES = (
    "search_sources(search_query='benefit plans')",
    "Standard costs $45.00 [employee-handbook.md#benefit-plans].",
)


# A follow-up whose rewrite brings in the conversation's "benefit": the rewrite is searched.
FOLLOW_UP = {
    "question": "what do the plans cost?",
    "chat_history": [HumanMessage("which benefit plans are there?"), AIMessage("Two.")],
}


def test_stream_sends_sources_first_then_tokens_then_citations(
    index: SearchIndex, embedder: SentenceTransformerEmbedder
) -> None:
    graphs, _ = build(index, embedder, plain_model(*REPLIES))
    check_stream(list(graphs.chat.stream(FOLLOW_UP)))


def test_async_stream_has_the_same_order(
    index: SearchIndex, embedder: SentenceTransformerEmbedder
) -> None:
    graphs, _ = build(index, embedder, plain_model(*REPLIES))

    async def collect() -> list[dict[str, Any]]:
        return [e async for e in graphs.chat.astream(FOLLOW_UP)]

    check_stream(asyncio.run(collect()))


def test_invoke_returns_the_documented_output(
    index: SearchIndex, embedder: SentenceTransformerEmbedder
) -> None:
    graphs, _ = build(index, embedder, plain_model(*REPLIES))
    history = [HumanMessage("hi"), AIMessage("Hello.")]
    out = graphs.chat.invoke(
        {"question": "what do plans cost?", "chat_history": history},
        {"configurable": {"domain": "hr", "rewrite_version": "v1"}},
    )
    parsed = ChatOutput.model_validate(out)
    assert parsed.prompts == {"rewrite": "hr/rewrite@v1", "answer": "hr/answer@v2"}
    cited = parsed.citations[0]
    assert cited.label == "employee-handbook.md#benefit-plans"
    assert cited.source == "samples/handbook/employee-handbook.md" and cited.score == 0.6
    assert cited.id in {s.id for s in parsed.sources}
    assert parsed.compressor["kind"] == "scripted"


def test_multi_query_searches_each_phrasing(
    index: SearchIndex, embedder: SentenceTransformerEmbedder
) -> None:
    model = plain_model(
        "search_sources(search_query='soil sensor')", "soil moisture probe", "Fine."
    )
    graphs, retriever = build(index, embedder, model)
    out = graphs.chat.invoke({"question": "soil sensors?"}, {"configurable": {"domain": "catalog"}})
    # "soil sensor" adds nothing to "soil sensors?": the question itself is searched.
    assert [c[0] for c in retriever.calls] == ["soil sensors?", "soil moisture probe"]
    assert out["alternatives"] == ["soil moisture probe"]
    assert out["prompts"]["multi_query"] == "default/multi_query@v2"


def test_per_request_k_reaches_the_retriever(
    index: SearchIndex, embedder: SentenceTransformerEmbedder
) -> None:
    graphs, retriever = build(index, embedder, plain_model("Fine."))
    graphs.ask.invoke({"question": "plans"}, {"configurable": {"k": 3}})
    assert retriever.calls[0][1] == 3


# ----------------------------------------------------------------------------- configurable
def chat_choices() -> Choices:
    return Choices(PROMPTS, PROMPTS_USED["chat"], k=lambda: 10, threshold=lambda: 0.25)


@pytest.mark.parametrize(
    ("configurable", "error", "message"),
    [
        ({"domain": "legal"}, PromptSelectionError, "unknown domain 'legal'"),
        ({"domain": "default", "rewrite_version": "v2"}, PromptSelectionError, "has no version"),
        (
            {"answer_version": 9},
            PromptSelectionError,
            "prompt default/answer has no version 'v9'; available: v1, v2",
        ),
        ({"prompt_version": 2}, ValueError, "prompt_version is replaced by one key per prompt"),
        ({"answer_version": "newest"}, PromptSelectionError, "has no version 'newest'"),
        ({"k": 0}, ValueError, "k: Input should be greater than or equal to 1"),
        ({"k": "ten"}, ValueError, "k: must be a number"),
        ({"threshold": "high"}, ValueError, "threshold: must be a number"),
    ],
)
def test_bad_configurable_values_fail_before_any_work(
    configurable: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=re.escape(message)):
        chat_choices().resolve(configurable)


def test_good_configurable_values_resolve_once_into_options() -> None:
    options = chat_choices().resolve({"domain": "hr", "rewrite_version": "v1", "k": 5})
    # A threshold the request does not set is None: the domain's or the compressor's applies.
    assert options.domain == "hr" and options.k == 5 and options.threshold is None
    assert chat_choices().resolve({"threshold": 0.3}).threshold == 0.3
    # LangServe sends every declared key, with its default when the caller set none.
    assert chat_choices().resolve({"threshold": 0.25}).threshold is None
    assert options.prompts == {
        "rewrite": "hr/rewrite@v1",
        "multi_query": "default/multi_query@v2",
        "requery": "default/requery@v2",
        "answer": "hr/answer@v2",
        "quote": "hr/quote@v1",
    }
    # Versions as numbers, and a None domain (the default), as callers write them.
    options = chat_choices().resolve({"domain": None, "answer_version": 1, "rewrite_version": "V1"})
    assert options.domain == "default" and options.prompts["answer"] == "default/answer@v1"
    # Keys the chain does not declare belong to other parts of a composed chain: left alone.
    options = chat_choices().resolve(
        {"domain": "catalog", "temperature": 2, "answer_version": "v1"}
    )
    assert options.prompt("answer").ref == "catalog/answer@v1"


def test_config_specs_are_enumerations_the_playground_can_render(
    index: SearchIndex, embedder: SentenceTransformerEmbedder
) -> None:
    graphs, _ = build(index, embedder, plain_model("x"))
    schema = graphs.chat.get_config_jsonschema()["$defs"]["Configurable"]["properties"]
    assert schema["domain"]["enum"] == ["catalog", "default", "hr"]
    assert schema["domain"]["default"] == "default"
    assert schema["rewrite_version"]["enum"] == ["latest", "v1", "v2", "v3"]
    assert schema["k"] == {
        "default": 10,
        "description": "chunks retrieved and handed to the compressor (1-200)",
        "maximum": 200,
        "minimum": 1,
        "title": "k",
        "type": "integer",
    }
    assert schema["threshold"]["default"] == 0.25 and schema["threshold"]["type"] == "number"
    # No Optional anywhere: LangServe's playground cannot render anyOf with null.
    assert "anyOf" not in str(schema) and "null" not in str(schema)
    assert set(graphs.ask.get_config_jsonschema()["$defs"]["Configurable"]["properties"]) == {
        "domain",
        "answer_version",
        "quote_version",
        "answer_style",
        "k",
        "threshold",
    }
    assert schema["answer_style"]["enum"] == ["auto", "quote", "free"]
    assert schema["answer_style"]["default"] == "auto"
    assert set(graphs.retrieve.get_config_jsonschema()["$defs"]["Configurable"]["properties"]) == {
        "domain",
        "k",
        "threshold",
    }


def test_every_stage_stands_alone_with_types_and_names(
    index: SearchIndex, embedder: SentenceTransformerEmbedder
) -> None:
    graphs, _ = build(index, embedder, plain_model("search_sources(search_query='plans')"))
    expected = {
        "chat": ({"question", "chat_history"}, "ChatOutput"),
        "ask": ({"question", "filters"}, "ChatOutput"),
        "rewrite": ({"question", "chat_history"}, "RewriteOutput"),
        "answer": ({"question", "chat_history", "documents"}, "AnswerOutput"),
    }
    for name, (inputs, output) in expected.items():
        runnable = getattr(graphs, name)
        assert set(runnable.get_input_jsonschema()["properties"]) == inputs, name
        assert runnable.get_output_jsonschema()["title"] == output, name
        # The name its run is reported under: a run_name, or the runnable's own name.
        config = getattr(runnable, "config", {})
        assert (config.get("run_name") or runnable.get_name()) == name
    assert graphs.rewrite.invoke({"question": "plans?"}).search_query == "plans?"


def test_a_domain_sets_the_cut_for_its_scorer_and_a_request_overrides_it() -> None:
    compressor = RerankCompressor(primary=ScriptedScorer())
    own = Options(domain="catalog", thresholds={"scripted": 0.3})
    assert threshold_for(own, compressor) == 0.3
    assert threshold_for(own.model_copy(update={"threshold": 0.5}), compressor) == 0.5
    other = Options(domain="catalog", thresholds={"cross-encoder": 0.2})
    assert threshold_for(other, compressor) is None  # the compressor's own default
    # The shipped catalog cuts lower for the similarity fallback: product rows are short.
    assert PROMPTS.domain("catalog").thresholds == {"embedding-similarity": 0.3}


def test_retrieve_is_retriever_like(
    index: SearchIndex, embedder: SentenceTransformerEmbedder
) -> None:
    """A query in, the kept documents out, best first (as a retriever answers)."""
    graphs, retriever = build(index, embedder, plain_model("x"))
    props = graphs.retrieve.get_input_jsonschema()["properties"]
    assert set(props) == {"query", "filters", "alternatives"}
    assert graphs.retrieve.get_output_jsonschema()["type"] == "array"
    docs = graphs.retrieve.invoke("benefit plans", {"configurable": {"k": 6}})
    assert retriever.calls == [("benefit plans", 6, [])]
    assert 0 < len(docs) <= 4 and all(isinstance(d, Document) for d in docs)
    assert citation_label(docs[0]).startswith("employee-handbook.md#")
    assert all(d.metadata["rerank_score"] == 0.6 for d in docs)
    graphs.retrieve.invoke("PTO carry over", {"configurable": {"domain": "hr"}})
    assert retriever.calls[-1][0] == "PTO (paid time off) carry over"  # the domain's glossary
    filtered = graphs.retrieve.invoke(
        {"query": "sensor", "filters": [{"field": "price", "op": "<", "value": 50}]}
    )
    assert filtered and all(d.metadata["price"] < 50 for d in filtered)


# ----------------------------------------------------------------------------- LCEL graph
def test_get_graph_shows_the_stages_in_order(
    index: SearchIndex, embedder: SentenceTransformerEmbedder
) -> None:
    graphs, _ = build(index, embedder, plain_model("x"))
    names = [node.name for node in graphs.chat.get_graph().nodes.values()]
    stages = [
        n
        for n in names
        if n in {"configure", "rewrite", "retrieve", "compress", "requery", "answer"}
    ]
    assert stages == ["configure", "rewrite", "retrieve", "compress", "requery", "answer"]
    drawn = graphs.chat.get_graph().draw_ascii()
    assert all(f"| {stage} |" in drawn for stage in stages), drawn


def test_astream_events_report_each_stage_by_name(
    index: SearchIndex, embedder: SentenceTransformerEmbedder
) -> None:
    model = plain_model("search_sources(search_query='bad query')", "better query", "Fine.")
    graphs, _ = build(index, embedder, model, scores={"bad query": 0.1, "better query": 0.5})

    async def ended() -> list[str]:
        return [
            event["name"]
            async for event in graphs.chat.astream_events({"question": "q?"}, version="v2")
            if event["event"] == "on_chain_end"
        ]

    names = asyncio.run(ended())
    for stage in ("configure", "rewrite", "retrieve", "compress", "requery", "answer", "chat"):
        assert stage in names, (stage, names)
    order = [names.index(s) for s in ("rewrite", "retrieve", "compress", "requery", "answer")]
    assert order == sorted(order)


def test_every_step_output_serialises_as_langserve_streams_it(
    index: SearchIndex, embedder: SentenceTransformerEmbedder
) -> None:
    """The playground calls stream_log, which sends every step's output as JSON."""
    from langserve.serialization import WellKnownLCSerializer

    model = plain_model("search_sources(search_query='bad query')", "better query", "Fine.")
    graphs, _ = build(index, embedder, model, scores={"bad query": 0.1, "better query": 0.5})
    serializer = WellKnownLCSerializer()

    async def patches() -> int:
        count = 0
        async for patch in graphs.chat.astream_log({"question": "q?"}):
            serializer.dumps(patch.ops)
            count += 1
        return count

    assert asyncio.run(patches()) > 10


# ----------------------------------------------------------------------------- answer style
def test_requery_searches_again_through_the_turns_own_stages(
    index: SearchIndex, embedder: SentenceTransformerEmbedder
) -> None:
    """The new query runs the same retrieve and compress stages as the first, inside the
    requery stage's run."""
    model = plain_model("search_sources(search_query='bad query')", "better query", "Fine.")
    graphs, _ = build(index, embedder, model, scores={"bad query": 0.1, "better query": 0.5})
    asked = {"question": "bad query"}

    async def events() -> list[dict[str, Any]]:
        return [e async for e in graphs.chat.astream_events(asked, version="v2")]

    seen = asyncio.run(events())
    (requery,) = [
        e["run_id"] for e in seen if e["event"] == "on_chain_start" and e["name"] == "requery"
    ]
    for stage in ("retrieve", "compress"):
        ended = [e for e in seen if e["event"] == "on_chain_end" and e["name"] == stage]
        assert [requery in e["parent_ids"] for e in ended] == [False, True], stage


class SlowRetriever(SpyRetriever):
    """The spy, a quarter of a second slower at every search."""

    def _get_relevant_documents(
        self, query: str, *, run_manager: Any, k: Any = None, filters: Any = None, scope: Any = None
    ) -> Any:
        time.sleep(0.25)
        return super()._get_relevant_documents(
            query, run_manager=run_manager, k=k, filters=filters, scope=scope
        )


@pytest.mark.parametrize("run", ["invoke", "ainvoke"])
def test_timings_are_the_stages_runs_as_callbacks_saw_them(
    index: SearchIndex, embedder: SentenceTransformerEmbedder, run: str
) -> None:
    """No stage times itself: the chain's clock (a callback handler) saw each stage's run."""
    graphs = create_chains(
        llm=LLM.of(plain_model(*REPLIES), count_tokens=len),
        retriever=SlowRetriever(index=index, embedder=embedder, k=10),
        compressor=RerankCompressor(primary=ScriptedScorer(), top_n=4),
        prompts=PROMPTS,
    )
    chat = graphs.chat
    out = chat.invoke(FOLLOW_UP) if run == "invoke" else asyncio.run(chat.ainvoke(FOLLOW_UP))
    timings = out["timings"]
    assert list(timings) == ["rewrite", "retrieve", "compress", "answer", "total"]  # no requery
    assert timings["retrieve"] >= 0.25  # two phrasings, searched at once
    assert sum(v for k, v in timings.items() if k != "total") <= timings["total"]


def test_the_answer_style_comes_first_and_a_model_without_grammar_answers_freely(
    index: SearchIndex, embedder: SentenceTransformerEmbedder
) -> None:
    model = RecordingModel(responses=["Hotels cost up to $220 [travel-policy.pdf#page=1]."])
    graphs, _ = build(index, embedder, model)
    events = list(
        graphs.ask.stream(
            {"question": "hotel costs per night"}, {"configurable": {"answer_style": "quote"}}
        )
    )
    head = events[0]
    assert head["answer_style"] == "free"  # said before the answer streams
    assert head["notes"][-1].startswith("answer_style quote needs a model that takes a grammar")
    assert not any({"answer_style", "notes"} & set(e) for e in events[1:])  # said once
    out = graphs.ask.invoke({"question": "hotel costs per night"})
    assert ChatOutput.model_validate(out).answer_style == "free"
    assert out["notes"] == [] and out["prompts"]["answer"] == "default/answer@v2"

    quoting = RecordingModel(responses=["x"])
    graphs, _ = build(index, embedder, quoting, grammar=True)
    out = graphs.ask.invoke({"question": "hotel costs per night"})
    assert out["answer_style"] == "quote" and out["prompts"]["answer"] == "default/quote@v1"
    assert quoting.grammars[0].startswith("root ::= dontknow | r\n")
