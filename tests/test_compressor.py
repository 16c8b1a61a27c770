"""The rerank compressor: the real CrossEncoder code path, thresholds, and the visible fallback.

No cross-encoder weights exist on these machines. ../shared holds the real config and
tokenizer of ms-marco-MiniLM-L-6-v2; a randomly initialised model of that exact shape runs the
real sentence-transformers code path. Its scores are meaningless, so these tests assert
plumbing (shapes, order, cut-off, metadata), never quality.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from langchain_core.documents import Document

from ragchains.factory import build_compressor, build_retriever, open_index
from ragchains.retrievers.compressors import (
    EmbeddingSimilarityScorer,
    RerankCompressor,
    SentenceTransformerCrossEncoder,
    compressing_retriever,
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
    }


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
    assert status["threshold"] == 0.46  # the similarity scorer's own default
    assert kept[0].id == "c0"  # real embeddings: the plan-cost sentence wins
    assert all(d.metadata["reranker_fallback"] is True for d in kept)


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
    scores = [d.metadata["rerank_score"] for d in docs]
    assert scores == sorted(scores, reverse=True) and min(scores) >= 0.46
    assert compressor.status()["fallback"] is True


def test_similarity_fallback_scores_from_the_index_vectors(
    sample_index: Path, settings: Settings, embedder: SentenceTransformerEmbedder
) -> None:
    index = open_index(sample_index, embedder)
    docs = build_retriever(settings, index, embedder).invoke("what does the standard plan cost")
    query = "what does the standard plan cost"
    from_text = EmbeddingSimilarityScorer(embedder).score_documents(query, docs)

    encoded: list[int] = []

    class Counting(SentenceTransformerEmbedder):
        def encode(self, texts: list[str], **kwargs: Any) -> Any:
            encoded.append(len(texts))
            return embedder.encode(texts, **kwargs)

    counting = Counting(embedder.name)
    from_index = EmbeddingSimilarityScorer(counting, stored=index.stored_vectors)
    assert from_index.score_documents(query, docs) == pytest.approx(from_text, abs=1e-5)
    assert encoded == [1]  # the query only: every chunk's vector came from the index
    unknown = Document(id="not-in-index", page_content="The standard plan costs $45.00.")
    scores = from_index.score_documents(query, [*docs[:1], unknown])
    assert encoded == [1, 1] and scores[1] > 0.5  # the new chunk; the query was remembered
