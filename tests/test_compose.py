"""Our chains over other people's parts: stock LangChain retrievers and compressors, a fake
chat model for the logic, and the examples/ scripts run as a user runs them."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from types import ModuleType

import pytest
from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableLambda

from ragchains import create_ask_chain, create_chat_chain, create_retrieve_chain
from ragchains.chains.llm import LLM
from ragchains.retrievers.compressors import RerankCompressor
from tests.conftest import CONFIG_ONLY_CROSS_ENCODER, REPO
from tests.fakes import RecordingModel
from tests.postgres import free_port
from tests.test_graph import ScriptedScorer

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # langchain-community is being sunset
    from langchain_community.retrievers import BM25Retriever

EXAMPLES = REPO / "examples"
HANDBOOK = REPO / "samples" / "handbook"


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_llm(*replies: str) -> LLM:
    return LLM.of(RecordingModel(responses=list(replies)), count_tokens=len)


@pytest.fixture(scope="module")
def stock_retriever() -> BM25Retriever:
    """LangChain's BM25Retriever: takes no filters, no per-call k."""
    compose = load_example("compose_with_langchain")
    return BM25Retriever.from_documents(compose.load_documents(HANDBOOK), k=4)


class KeepMentioning(BaseDocumentCompressor):
    """A compressor that reports no scores: keeps the chunks that mention a word."""

    word: str

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        return [d for d in documents if self.word in query and self.word in d.page_content]


# ----------------------------------------------------------------------------- stock parts
@pytest.mark.slow
def test_chat_chain_from_stock_langchain_parts_cites_its_sources() -> None:
    """EnsembleRetriever(BM25Retriever, FAISS) + CrossEncoderReranker, as examples/ builds
    it, with a fake chat model: a cited answer."""
    if not CONFIG_ONLY_CROSS_ENCODER.is_dir():
        pytest.fail(f"missing {CONFIG_ONLY_CROSS_ENCODER}: the tests need ../shared")
    compose = load_example("compose_with_langchain")
    model = RecordingModel(
        responses=[
            "search_sources(search_query='standard plan monthly cost')",
            "The Standard plan costs $45.00 a month [employee-handbook.md].",
        ]
    )
    chain = compose.build_chat_chain(model, reranker=CONFIG_ONLY_CROSS_ENCODER)
    out = chain.invoke({"question": "What does the standard plan cost?"})
    # A first turn's rewrite brings in nothing the user did not say: their words are searched.
    assert out["search_query"] == "What does the standard plan cost?"
    assert len(out["sources"]) == 3  # the reranker's top_n
    assert {s["label"] for s in out["sources"]} <= {"employee-handbook.md", "perks-policy.md"}
    assert [c["label"] for c in out["citations"]] == ["employee-handbook.md"]
    assert not out["abstained"]
    assert out["notes"] == [
        "the rewrite 'standard plan monthly cost' brings in nothing from the conversation; "
        "searching your words"
    ]
    assert out["compressor"]["kind"] == "CrossEncoderReranker"


def test_a_retriever_without_filters_gets_the_query_and_the_turn_a_note(
    stock_retriever: BM25Retriever,
) -> None:
    chain = create_ask_chain(
        llm=fake_llm("Fine [employee-handbook.md]."), retriever=stock_retriever
    )
    out = chain.invoke(
        {
            "question": "standard plan cost",
            "filters": [{"field": "price", "op": "<", "value": 50}],
        }
    )
    assert out["sources"] and out["citations"]
    assert out["notes"] == ["the retriever takes no metadata filters; searched without price < 50"]


def test_a_filter_the_model_asks_for_becomes_a_note_with_such_a_retriever(
    stock_retriever: BM25Retriever,
) -> None:
    llm = fake_llm(
        "search_sources(search_query='vacation days'); add_filter(field='price', op='<', value=5)",
        "search_by_filename(filename='perks-policy.md')",
        "Fine.",
    )
    # The model may filter on a field the caller names; this retriever cannot apply it.
    chain = create_chat_chain(llm=llm, retriever=stock_retriever, fields={"price": "number"})
    out = chain.invoke({"question": "vacation days under 5?"})
    assert out["filters"] == [{"field": "price", "op": "<", "value": 5}]
    assert any("takes no metadata filters" in note for note in out["notes"]), out["notes"]
    assert out["sources"]


def test_multi_query_fuses_the_phrasings_with_any_retriever(
    stock_retriever: BM25Retriever,
) -> None:
    searched: list[str] = []

    def spy(query: str) -> list[Document]:
        searched.append(query)
        return stock_retriever.invoke(query)

    llm = fake_llm("search_sources(search_query='health plans')", "insurance plans", "Fine.")
    # A retriever-like runnable (query in, documents out) is a retriever too.
    chain = create_chat_chain(llm=llm, retriever=RunnableLambda(spy))
    history = [HumanMessage("which health benefits are there?"), AIMessage("Several.")]
    out = chain.invoke(
        {"question": "and plans?", "chat_history": history}, {"configurable": {"domain": "catalog"}}
    )
    # The user's words, the subject of the follow-up filled in, are searched; the follow-up
    # as asked, the rewrite, which brings in "health" from the conversation, and the
    # phrasing are fused with them.
    own = "and plans health benefits?"
    also = ["and plans?", "health plans", "insurance plans"]
    assert searched == [own, *also]
    assert out["alternatives"] == also and out["sources"]


def test_requery_with_any_retriever(stock_retriever: BM25Retriever) -> None:
    llm = fake_llm("search_sources(search_query='bad query')", "better query", "Fine.")
    compressor = RerankCompressor(primary=ScriptedScorer({"bad query": 0.1, "better query": 0.6}))
    chain = create_chat_chain(llm=llm, retriever=stock_retriever, compressor=compressor)
    out = chain.invoke({"question": "bad query"})
    assert out["requery"]["kept"] and out["search_query"] == "better query"


def test_requery_with_a_compressor_that_reports_no_scores(stock_retriever: BM25Retriever) -> None:
    """Without scores to compare, a turn re-queries when nothing was kept, and takes the new
    results when they keep something."""
    llm = fake_llm("search_sources(search_query='leave')", "parental leave weeks", "Fine.")
    compressor = KeepMentioning(word="parental")
    chain = create_chat_chain(llm=llm, retriever=stock_retriever, compressor=compressor)
    out = chain.invoke({"question": "how long is leave?"})
    assert out["requery"] == {
        "first_query": "how long is leave?",  # "leave" adds nothing: the question is searched
        "first_best_score": None,
        "query": "parental leave weeks",
        "refused": None,
        "best_score": None,
        "kept": True,
    }
    assert out["sources"] and all("parental" in s["text"] for s in out["sources"])


# ----------------------------------------------------------------------------- the scripts
def script(name: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        check=False,
    )


@pytest.mark.slow
@pytest.mark.e2e
def test_compose_example_answers_with_the_embedded_model() -> None:
    result = script(
        "compose_with_langchain",
        "--reranker",
        str(CONFIG_ONLY_CROSS_ENCODER),
        "--question",
        "What does the standard plan cost?",
    )
    assert result.returncode == 0, result.stderr
    answer, *citations = result.stdout.strip().splitlines()
    assert answer.strip()
    assert citations and all(c.strip().startswith("[") for c in citations)
    assert "random" in result.stderr  # said loudly: the config-only reranker has no weights


@pytest.mark.slow
@pytest.mark.e2e
def test_served_example_is_called_with_remote_runnable_across_domains() -> None:
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            str(EXAMPLES / "compose_with_langchain.py"),
            "--serve",
            "--port",
            str(port),
            "--reranker",
            str(CONFIG_ONLY_CROSS_ENCODER),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    try:
        deadline = time.monotonic() + 300
        while not _listening(port):
            assert server.poll() is None, server.stdout.read() if server.stdout else ""
            assert time.monotonic() < deadline, "the example server did not start"
            time.sleep(0.5)
        result = script("call_remote_runnable", "--url", f"http://127.0.0.1:{port}")
        assert result.returncode == 0, result.stderr
        out = result.stdout
        assert "domains: catalog, default, hr" in out
        assert "prompts: default/rewrite@v1" in out and "prompts: hr/rewrite@v3" in out
        assert "answer styles: auto, quote, free" in out
        assert "default/quote@v1" in out  # the embedded model quotes unless told otherwise
        assert "hr/answer@v1" in out  # the streamed call chose free and the v1 answer prompt
    finally:
        server.terminate()
        server.wait(timeout=30)


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_phrasings_fuse_to_the_retriever_depth_without_k() -> None:
    """A retriever that takes no k: fusion keeps as many chunks as the longest list."""
    docs = {q: [Document(id=f"{q}{n}", page_content=f"{q} {n}") for n in range(4)] for q in "ab"}
    hits = {"main": [], "alt": docs["a"], "alt2": docs["b"][:2]}
    chain = create_retrieve_chain(retriever=RunnableLambda(lambda q: hits[q]))
    found = chain.invoke({"query": "main", "alternatives": ["alt", "alt2"]})
    assert [d.id for d in found] == ["a0", "b0", "a1", "b1"]


def test_other_retrievers_metadata_is_read_leniently() -> None:
    odd = Document(page_content="Roman numerals", metadata={"page": "ii", "section": 3})
    llm = fake_llm("Numerals [ii].")
    out = create_ask_chain(llm=llm, retriever=RunnableLambda(lambda q: [odd])).invoke(
        {"question": "numerals?"}
    )
    (source,) = out["sources"]
    assert source["page"] is None and source["section"] == "3"
    assert source["label"] == "Roman numerals"  # no citation, source or id: the text's start


def test_the_turn_reports_the_threshold_it_applied(stock_retriever: BM25Retriever) -> None:
    compressor = RerankCompressor(primary=ScriptedScorer(default=0.6))
    chain = create_ask_chain(
        llm=fake_llm("Fine."), retriever=stock_retriever, compressor=compressor
    )
    out = chain.invoke({"question": "plans"}, {"configurable": {"threshold": 0.9}})
    assert out["compressor"]["threshold"] == 0.9 and out["abstained"] and not out["sources"]


def test_async_callers_use_the_async_paths_of_the_parts() -> None:
    """Under ainvoke the retriever's and compressor's async paths run: an async-only
    retriever works, for the ask chain and for a re-query."""
    import asyncio

    async def search(query: str) -> list[Document]:
        return [Document(id=query, page_content=f"parental leave for {query}")]

    class AsyncOnly(KeepMentioning):
        def compress_documents(self, *args: object, **kwargs: object) -> Sequence[Document]:
            raise AssertionError("the sync path ran")

        async def acompress_documents(
            self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
        ) -> Sequence[Document]:
            return [d for d in documents if self.word in query]

    llm = fake_llm("search_sources(search_query='leave')", "parental leave weeks", "Fine.")
    chain = create_chat_chain(
        llm=llm, retriever=RunnableLambda(search), compressor=AsyncOnly(word="parental")
    )
    out = asyncio.run(chain.ainvoke({"question": "how long is leave?"}))
    assert out["requery"]["kept"] and [s["id"] for s in out["sources"]] == ["parental leave weeks"]


def test_builders_refuse_parts_that_are_not_langchain_parts() -> None:
    with pytest.raises(ValueError, match="retriever must be a BaseRetriever"):
        create_ask_chain(llm=fake_llm("x"), retriever="bm25")
    with pytest.raises(ValueError, match="compressor must be a BaseDocumentCompressor"):
        create_ask_chain(llm=fake_llm("x"), retriever=lambda q: [], compressor=object())
    with pytest.raises(ValueError, match="llm must be a LangChain chat model"):
        create_chat_chain(llm="gpt-4o", retriever=lambda q: [])
    # A plain function from a query to documents is a retriever too.
    out = create_ask_chain(llm=fake_llm("x"), retriever=lambda q: []).invoke({"question": "q"})
    assert out["abstained"] and out["sources"] == []
