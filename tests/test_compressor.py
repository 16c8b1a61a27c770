"""The rerank compressor: the real CrossEncoder code path, thresholds, and the visible fallback.

No cross-encoder weights exist on these machines. ../shared holds the real config and
tokenizer of ms-marco-MiniLM-L-6-v2; a randomly initialised model of that exact shape runs the
real sentence-transformers code path. Its scores are meaningless, so these tests assert
plumbing (shapes, order, cut-off, metadata), never quality. The similarity fallback runs on
the real embedder: it cuts and keeps the retrieved order, and its scores are asserted.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain_classic.retrievers.document_compressors.cross_encoder import BaseCrossEncoder
from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
from pydantic import Field

from ragchains.chains.compress import best_of
from ragchains.chains.retrieve import create_retrieve_chain
from ragchains.factory import build_compressor, build_retriever, open_index
from ragchains.retrievers.compressors import (
    SHORT_QUERY_LIFT,
    SIMILARITY_THRESHOLD,
    EmbeddingSimilarityScorer,
    RerankCompressor,
    SentenceTransformerCrossEncoder,
    compressing_retriever,
    lifted,
    passage_windows,
)
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.settings import Settings
from tests.conftest import CONFIG_ONLY_CROSS_ENCODER

DOCS = [
    Document(id=f"c{i}", page_content=text, metadata={"citation": f"doc.md#{i}"})
    for i, text in enumerate(
        [
            "The standard plan costs $45.00 per month.",
            "Parental leave lasts 20 weeks for birth parents.",
            "Hotels are reimbursed up to $220 per night.",
            "The premium plan includes dental and vision.",
            "Laptops are replaced every three years.",
        ]
    )
]


@pytest.fixture(scope="module")
def random_cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared config + tokenizer saved with random weights, as a loadable local model."""
    if not CONFIG_ONLY_CROSS_ENCODER.is_dir():
        pytest.fail(f"missing {CONFIG_ONLY_CROSS_ENCODER}: CI needs ../shared beside the repo")
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(CONFIG_ONLY_CROSS_ENCODER)
    model = AutoModelForSequenceClassification.from_config(config)
    tokenizer = AutoTokenizer.from_pretrained(CONFIG_ONLY_CROSS_ENCODER)
    target = tmp_path_factory.mktemp("random-cross-encoder")
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def test_real_cross_encoder_scores_every_pair(random_cross_encoder: Path) -> None:
    scorer = SentenceTransformerCrossEncoder(str(random_cross_encoder))
    pairs = [("what does the standard plan cost", d.page_content) for d in DOCS]
    scores = scorer.score(pairs)
    assert len(scores) == len(DOCS)
    assert all(0.0 <= s <= 1.0 for s in scores)  # one logit through a sigmoid
    assert scorer.score(pairs[:2]) == pytest.approx(scores[:2], abs=1e-5)  # batching-independent
    # Inputs longer than the model's 512 positions are truncated, not an error.
    assert len(scorer.score([("q", "word " * 2000)])) == 1


def test_compressor_keeps_top_n_above_threshold(random_cross_encoder: Path) -> None:
    scorer = SentenceTransformerCrossEncoder(str(random_cross_encoder))
    query = "what does the standard plan cost"
    all_scores = sorted(scorer.score([(query, d.page_content) for d in DOCS]), reverse=True)

    keep_three = RerankCompressor(primary=scorer, top_n=3, threshold=-1.0)
    kept = keep_three.compress_documents(DOCS, query)
    assert [d.metadata["rerank_score"] for d in kept] == pytest.approx(all_scores[:3])
    assert all(d.metadata["reranker"] == "cross-encoder" for d in kept)
    assert not any(d.metadata["reranker_fallback"] for d in kept)
    assert all("rerank_score" not in d.metadata for d in DOCS)  # inputs are not mutated

    cut = (all_scores[1] + all_scores[2]) / 2
    two = RerankCompressor(primary=scorer, top_n=5, threshold=cut).compress_documents(DOCS, query)
    assert len(two) == 2
    none = RerankCompressor(primary=scorer, top_n=5, threshold=2.0).compress_documents(DOCS, query)
    assert list(none) == []
    assert keep_three.status() == {
        "kind": "cross-encoder",
        "model": str(random_cross_encoder),
        "requested_model": str(random_cross_encoder),
        "fallback": False,
        "fallback_reason": None,
        "top_n": 3,
        "threshold": -1.0,
        "reorders": True,
    }


def test_a_cross_encoder_reorders_whatever_order_the_chunks_came_in(
    random_cross_encoder: Path,
) -> None:
    scorer = SentenceTransformerCrossEncoder(str(random_cross_encoder))
    query = "how much are hotels reimbursed per night"
    compressor = RerankCompressor(primary=scorer, top_n=5, threshold=-1.0)
    forward = compressor.rerank(DOCS, query)
    backward = compressor.rerank(DOCS[::-1], query)
    assert [d.id for d in forward.documents] == [d.id for d in backward.documents]
    scores = [d.metadata["rerank_score"] for d in forward.documents]
    assert scores == sorted(scores, reverse=True) and forward.best_score == scores[0]
    # The random model's order is its own: not the one the chunks came in.
    assert [d.id for d in forward.documents] != [d.id for d in DOCS]


def test_missing_weights_fall_back_visibly(
    embedder: SentenceTransformerEmbedder, caplog: pytest.LogCaptureFixture
) -> None:
    compressor = RerankCompressor(
        primary=SentenceTransformerCrossEncoder(str(CONFIG_ONLY_CROSS_ENCODER)),
        fallback=EmbeddingSimilarityScorer(embedder),
        top_n=2,
    )
    with caplog.at_level(logging.WARNING, logger="ragchains.retrievers.compressors"):
        kept = compressor.compress_documents(DOCS, "how much is the standard health plan")
    assert "could not be loaded" in caplog.text and "falling back" in caplog.text
    status = compressor.status()
    assert status["fallback"] is True
    assert status["kind"] == "embedding-similarity"
    assert "model.safetensors" in status["fallback_reason"]
    assert status["threshold"] == SIMILARITY_THRESHOLD  # the similarity scorer's own default
    assert status["reorders"] is False and "passages" in status["scoring"]
    assert kept[0].id == "c0"  # real embeddings: the plan-cost sentence passes the cut
    assert all(d.metadata["reranker_fallback"] is True for d in kept)


def test_the_similarity_fallback_cuts_but_keeps_the_order_given(
    embedder: SentenceTransformerEmbedder,
) -> None:
    compressor = RerankCompressor(
        primary=SentenceTransformerCrossEncoder(str(CONFIG_ONLY_CROSS_ENCODER)),
        fallback=EmbeddingSimilarityScorer(embedder),
        top_n=5,
    )
    query = "how much are hotels reimbursed per night"
    everything = compressor.rerank(DOCS, query, threshold=-1.0)
    assert [d.id for d in everything.documents] == [d.id for d in DOCS]
    scores = {d.id: d.metadata["rerank_score"] for d in everything.documents}
    assert max(scores, key=scores.__getitem__) == "c2"  # the hotel sentence scores best
    assert everything.best_score == scores["c2"]
    backward = compressor.rerank(DOCS[::-1], query, threshold=-1.0)
    assert [d.id for d in backward.documents] == [d.id for d in DOCS[::-1]]

    # The cut drops chunks wherever they stand; the rest keep their places, up to top_n.
    cut = sorted(scores.values())[2]
    kept = compressor.rerank(DOCS, query, threshold=cut).documents
    assert [d.id for d in kept] == [d.id for d in DOCS if scores[d.id] >= cut]
    first_two = compressor.rerank(DOCS, query, threshold=-1.0, top_n=2).documents
    assert [d.id for d in first_two] == ["c0", "c1"]
    # Nothing passes: the best score says why.
    none = compressor.rerank(DOCS, query, threshold=scores["c2"] + 0.01)
    assert none.documents == [] and none.best_score == scores["c2"]


def test_passage_windows_cover_the_text() -> None:
    assert passage_windows("one two three", 4, 2) == ["one two three"]
    words = [f"w{i}" for i in range(10)]
    windows = passage_windows(" ".join(words), 4, 3)
    assert windows == ["w0 w1 w2 w3", "w3 w4 w5 w6", "w6 w7 w8 w9"]
    uneven = passage_windows(" ".join(words[:9]), 4, 3)
    assert uneven == ["w0 w1 w2 w3", "w3 w4 w5 w6", "w5 w6 w7 w8"]  # the last ends at the end
    with pytest.raises(ValueError, match="window_stride"):
        EmbeddingSimilarityScorer(None, window_words=4, window_stride=5)  # type: ignore[arg-type]


def counting_encoder(
    embedder: SentenceTransformerEmbedder,
) -> tuple[SentenceTransformerEmbedder, list[int]]:
    """``embedder`` behind a wrapper that records how many texts each ``encode`` call got."""
    encoded: list[int] = []

    class Counting(SentenceTransformerEmbedder):
        def encode(self, texts: list[str], **kwargs: Any) -> Any:
            encoded.append(len(texts))
            return embedder.encode(texts, **kwargs)

    return Counting(embedder.name), encoded


def test_a_chunk_scores_as_its_closest_passage(embedder: SentenceTransformerEmbedder) -> None:
    """A long chunk that answers in one sentence is diluted as a whole: its score is the best
    of the whole and its passages. Passages are embedded once and remembered."""
    filler = (
        "Book all flights, trains and rental cars through the travel desk at least 14 days "
        "ahead. Economy class is the default for trips under six hours. Rental cars must "
        "be compact unless four or more colleagues travel together. Keep every receipt. "
    )
    answer = "Hotel costs are reimbursed up to EUR 180 per night in Europe."
    page = Document(id="p1", page_content=filler * 3 + answer + " " + filler)
    query = "How much is the hotel allowance per night in Europe?"
    counting, encoded = counting_encoder(embedder)
    scorer = EmbeddingSimilarityScorer(counting)
    whole = float(embedder.encode_query(query) @ embedder.encode([page.page_content])[0])
    (score,) = scorer.score_documents(query, [page])
    assert score > whole + 0.15
    assert scorer.score([(query, page.page_content)]) == pytest.approx([score], abs=1e-5)
    windows = len(passage_windows(page.page_content, scorer.window_words, scorer.window_stride))
    assert windows > 1 and windows in encoded
    encoded.clear()
    scorer.score_documents("another question about hotels", [page])
    assert windows not in encoded  # the page's passages were remembered

    # Past passage_candidates, a chunk is scored whole: a deep list costs a bounded amount.
    shallow = EmbeddingSimilarityScorer(embedder, passage_candidates=0)
    assert shallow.score_documents(query, [page]) == pytest.approx([whole], abs=1e-5)


def test_hub_id_not_in_cache_falls_back(embedder: SentenceTransformerEmbedder) -> None:
    compressor = RerankCompressor(
        primary=SentenceTransformerCrossEncoder("cross-encoder/not-in-any-cache"),
        fallback=EmbeddingSimilarityScorer(embedder),
    )
    assert compressor.status()["fallback"] is True


def test_without_fallback_the_load_error_surfaces() -> None:
    compressor = RerankCompressor(
        primary=SentenceTransformerCrossEncoder(str(CONFIG_ONLY_CROSS_ENCODER))
    )
    with pytest.raises(OSError):
        compressor.compress_documents(DOCS, "q")


def test_compression_retriever_passes_filters_through(
    sample_index: Path, settings: Settings, embedder: SentenceTransformerEmbedder
) -> None:
    index = open_index(sample_index, embedder)
    compressor = build_compressor(settings, embedder)  # default id: not cached here
    retriever = compressing_retriever(build_retriever(settings, index, embedder), compressor)
    docs = retriever.invoke(
        "what does the standard plan cost",
        filters=[{"field": "format", "op": "=", "value": "markdown"}],
    )
    assert docs and len(docs) <= settings.rerank_top_n
    assert docs[0].metadata["citation"] == "employee-handbook.md#benefit-plans"
    assert all(d.metadata["format"] == "markdown" for d in docs)
    assert min(d.metadata["rerank_score"] for d in docs) >= SIMILARITY_THRESHOLD
    assert compressor.status()["fallback"] is True


def test_the_hotel_allowance_in_europe_is_kept_from_the_travel_policy(
    sample_index: Path, settings: Settings, embedder: SentenceTransformerEmbedder
) -> None:
    """BM25's top hit says "EUR 180 per night in Europe" on a page about much else: the
    fused order keeps it first and its passage passes the default cut."""
    index = open_index(sample_index, embedder)
    retriever = build_retriever(settings, index, embedder)
    query = "How much is the hotel allowance per night in Europe?"
    found = retriever.invoke(query)
    kept = create_retrieve_chain(
        retriever=retriever, compressor=build_compressor(settings, embedder, index)
    ).invoke(query)
    assert kept[0].metadata["citation"] == "travel-policy.pdf#page=1"
    assert kept[0].metadata["rerank_score"] >= SIMILARITY_THRESHOLD
    assert "EUR 180 per night in Europe" in " ".join(kept[0].page_content.split())
    # Kept in the order retrieved (the fused order), not by similarity.
    order = [d.id for d in found]
    assert [order.index(d.id) for d in kept] == sorted(order.index(d.id) for d in kept)


def test_similarity_fallback_scores_from_the_index_vectors(
    sample_index: Path, settings: Settings, embedder: SentenceTransformerEmbedder
) -> None:
    index = open_index(sample_index, embedder)
    docs = build_retriever(settings, index, embedder).invoke("what does the standard plan cost")
    query = "what does the standard plan cost"
    # Whole chunks only (no passages): the vectors the index holds.
    from_text = EmbeddingSimilarityScorer(embedder, passage_candidates=0).score_documents(
        query, docs
    )
    counting, encoded = counting_encoder(embedder)
    from_index = EmbeddingSimilarityScorer(
        counting, stored=index.stored_vectors, passage_candidates=0
    )
    assert from_index.score_documents(query, docs) == pytest.approx(from_text, abs=1e-5)
    assert encoded == [1]  # the query only: every chunk's vector came from the index
    unknown = Document(id="not-in-index", page_content="The standard plan costs $45.00.")
    scores = from_index.score_documents(query, [*docs[:1], unknown])
    assert encoded == [1, 1] and scores[1] > 0.5  # the new chunk; the query was remembered


# ----------------------------------------------------------------------------- the contract
class WordOverlap(BaseCrossEncoder):
    """A cross-encoder for LangChain's ``CrossEncoderReranker``: the share of the query's
    words in the chunk."""

    def score(self, text_pairs: list[tuple[str, str]]) -> list[float]:
        def overlap(query: str, text: str) -> float:
            words = set(query.lower().split())
            return len(words & set(text.lower().rstrip(".").split())) / len(words)

        return [overlap(query, text) for query, text in text_pairs]


class ContractOnly(BaseDocumentCompressor):
    """A reranker with nothing beyond LangChain's contract (no ``rerank``): it scores into
    ``relevance_score`` and keeps its ``top_n`` best at or above its ``threshold``."""

    top_n: int = 2
    threshold: float | None = None
    calls: list = Field(default_factory=list)

    def default_threshold(self) -> float:
        return 0.3 if self.threshold is None else self.threshold

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        self.calls.append((self.top_n, self.threshold))
        scores = WordOverlap().score([(query, d.page_content) for d in documents])
        ranked = sorted(zip(documents, scores, strict=True), key=lambda p: p[1], reverse=True)
        return [
            d.model_copy(update={"metadata": {**d.metadata, "relevance_score": s}})
            for d, s in ranked
            if s >= self.default_threshold()
        ][: self.top_n]


def fixed(documents: list[Document]) -> Runnable[str, list[Document]]:
    return RunnableLambda(lambda _query: list(documents))


@pytest.mark.filterwarnings("ignore:`langchain-community` is being sunset:DeprecationWarning")
@pytest.mark.parametrize("run", ["invoke", "ainvoke"])
def test_any_compressor_compresses_through_its_contract(run: str) -> None:
    """LangChain's own compressors, which say no threshold and (CrossEncoderReranker) leave
    no scores, work as they are, sync and async: their order and their cut."""
    from langchain_classic.retrievers.document_compressors import (
        CrossEncoderReranker,
        EmbeddingsFilter,
    )
    from langchain_core.embeddings import DeterministicFakeEmbedding

    def kept(compressor: BaseDocumentCompressor, query: str) -> list[str | None]:
        chain = create_retrieve_chain(retriever=fixed(DOCS), compressor=compressor)
        found = chain.invoke(query) if run == "invoke" else asyncio.run(chain.ainvoke(query))
        return [d.id for d in found]

    reranker = CrossEncoderReranker(model=WordOverlap(), top_n=2)
    assert kept(reranker, "premium plan dental") == ["c3", "c0"]
    similar = EmbeddingsFilter(embeddings=DeterministicFakeEmbedding(size=16), k=3)
    assert kept(similar, "plan") == [d.id for d in similar.compress_documents(DOCS, "plan")]


@pytest.mark.parametrize("run", ["invoke", "ainvoke"])
def test_the_stage_cuts_a_top_n_compressor_at_the_turns_threshold(run: str) -> None:
    """A compressor that keeps a ``top_n`` is asked for every candidate it scores: the turn
    learns the best score of all and cuts at the request's threshold, with nothing but
    ``compress_documents``."""
    compressor = ContractOnly()
    chain = create_retrieve_chain(retriever=fixed(DOCS), compressor=compressor)
    schema = chain.get_config_jsonschema()["$defs"]["Configurable"]["properties"]
    assert schema["threshold"]["default"] == 0.3  # the compressor's own

    def kept(query: str, **configurable: Any) -> list[tuple[str | None, float]]:
        config = RunnableConfig(configurable=configurable)
        go = chain.invoke if run == "invoke" else lambda q, c: asyncio.run(chain.ainvoke(q, c))
        return [(d.id, d.metadata["relevance_score"]) for d in go(query, config)]

    query = "the standard plan costs per month"
    assert kept(query) == [("c0", 1.0), ("c3", pytest.approx(1 / 3))]  # its top_n at 0.3
    assert compressor.calls[-1] == (len(DOCS), -math.inf)  # every candidate scored
    assert kept(query, threshold=0.5) == [("c0", 1.0)]
    assert compressor.threshold is None and compressor.top_n == 2  # a copy was asked


@pytest.mark.parametrize("run", ["invoke", "ainvoke"])
def test_each_chunk_is_judged_by_the_phrasing_it_answers_best(run: str) -> None:
    """Issue 45: a follow-up is searched as asked and as rewritten. A chunk one phrasing
    finds is not cut for not answering the other: each keeps its best score of all."""
    chain = create_retrieve_chain(retriever=fixed(DOCS), compressor=ContractOnly(top_n=5))
    search = {"query": "the standard plan costs", "alternatives": ["parental leave weeks"]}
    found = chain.invoke(search) if run == "invoke" else asyncio.run(chain.ainvoke(search))
    scores = {d.id: d.metadata["relevance_score"] for d in found}
    assert scores == {"c0": 1.0, "c1": 1.0, "c3": 0.5}  # "the", "plan"
    alone = chain.invoke({"query": "the standard plan costs"})
    assert "c1" not in {d.id for d in alone}


def test_best_of_keeps_each_chunks_best_score_in_the_order_it_should() -> None:
    def scored(doc: Document, score: float | None) -> Document:
        metadata = {**doc.metadata, **({} if score is None else {"relevance_score": score})}
        return doc.model_copy(update={"metadata": metadata})

    first = [scored(DOCS[0], 0.2), scored(DOCS[1], None), scored(DOCS[2], 0.9)]
    second = [scored(DOCS[1], 0.5), scored(DOCS[0], 0.8), scored(DOCS[3], 0.1)]
    key = lambda d: str(d.id)  # noqa: E731
    kept = best_of([first, second], reorders=False, key=key)
    assert [(d.id, d.metadata["relevance_score"]) for d in kept] == [
        ("c0", 0.8),
        ("c1", 0.5),
        ("c2", 0.9),
        ("c3", 0.1),
    ]
    ranked = best_of([first, second], reorders=True, key=key)
    assert [d.id for d in ranked] == ["c2", "c0", "c1", "c3"]


@pytest.mark.parametrize(
    ("query", "text", "lift"),
    [
        ("standard plan cost", "| Standard | $45 | ... the plan costs", SHORT_QUERY_LIFT),
        ("What does the standard plan cost?", "The standard plan costs $45.", SHORT_QUERY_LIFT),
        ("sensor battery life", "The sensor's battery lasts two years.", 0.0),  # no "life"
        (
            "What does the standard health plan cost per month?",
            "standard health plan cost per month",
            0.0,
        ),  # a question of more terms is scored as it is
        ("what?", "what", 0.0),  # no term at all
    ],
)
def test_a_short_query_is_lifted_where_a_chunk_holds_all_its_terms(
    query: str, text: str, lift: float
) -> None:
    assert lifted(0.4, query, text) == pytest.approx(0.4 + lift)
