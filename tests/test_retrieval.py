"""BM25, FAISS, fusion and filters: rankings, the filter contract, and the retrievers' API."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from rank_bm25 import BM25Okapi

from ragchains.factory import build_retriever, open_index
from ragchains.retrievers.bm25 import BM25Retriever, bm25_search, build_bm25, tokenize
from ragchains.retrievers.dense import FaissRetriever, build_faiss, dense_search
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.filters import (
    FilterError,
    MetadataColumns,
    MetadataFilter,
    parse_cli_value,
    validate_filters,
)
from ragchains.retrievers.hybrid import reciprocal_rank_fusion
from ragchains.retrievers.index import SearchIndex
from ragchains.settings import Settings

CORPUS = (Path(__file__).resolve().parent / "fixtures" / "bm25_corpus.txt").read_text().splitlines()


# ----------------------------------------------------------------------------- BM25
@pytest.mark.parametrize(
    "query",
    [
        "tomato staking",
        "compost smelly wet",
        "soil ph blueberries",
        "apple pruning winter",
        "bees honey frames",
        "potatoes light tubers",
        "seedlings germinate heat",
        "slugs lettuce",
    ],
)
def test_bm25s_ranks_like_rank_bm25(query: str) -> None:
    ours = build_bm25(CORPUS)
    reference = BM25Okapi([tokenize(t) for t in CORPUS], k1=1.2, b=0.75)
    ref = reference.get_scores(tokenize(query))
    rows, scores = bm25_search(ours, query, 3)
    assert list(scores) == sorted(scores, reverse=True)
    # Same top 3 as the reference; documents tied with the reference's third may swap.
    third = np.sort(ref)[::-1][2]
    assert {int(i) for i in np.flatnonzero(ref > third)} <= set(rows.tolist())
    assert all(ref[r] >= third for r in rows)
    # And the same order: our scores rise and fall with the reference's.
    ours_all = ours.get_scores_from_ids(ours.get_tokens_ids(tokenize(query)))
    assert np.array_equal(
        np.argsort(-ours_all, kind="stable")[:1], np.argsort(-ref, kind="stable")[:1]
    )
    assert np.corrcoef(ours_all, ref)[0, 1] > 0.95


def test_bm25_mask_and_empty_query() -> None:
    model = build_bm25(CORPUS)
    mask = np.zeros(len(CORPUS), dtype=bool)
    mask[1] = True  # only the cherry-tomato line is allowed
    rows, _ = bm25_search(model, "tomato", 5, mask)
    assert rows.tolist() == [1]
    rows, _ = bm25_search(model, "the and of", 5)  # stop words only
    assert rows.size == 0
    rows, _ = bm25_search(model, "zeppelin", 5)  # unknown word
    assert rows.size == 0


# ----------------------------------------------------------------------------- FAISS
def _unit(rows: int, dim: int = 16, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((rows, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_flat_below_threshold_hnsw_above() -> None:
    vectors = _unit(300)
    flat, flat_info = build_faiss(vectors, hnsw_min_chunks=1000)
    hnsw, hnsw_info = build_faiss(vectors, hnsw_min_chunks=100)
    assert flat_info["kind"] == "flat" and hnsw_info["kind"] == "hnsw"
    for q in (3, 50, 299):
        exact_rows, exact_scores = dense_search(flat, vectors[q], 5)
        assert exact_rows[0] == q and exact_scores[0] == pytest.approx(1.0, abs=1e-5)
        approx_rows, _ = dense_search(hnsw, vectors[q], 5)
        assert approx_rows[0] == q


@pytest.mark.parametrize("allowed_every", [2, 50])
def test_dense_filtered_search_is_exact_within_the_mask(allowed_every: int) -> None:
    vectors = _unit(25_000, seed=1)
    mask = np.zeros(len(vectors), dtype=bool)
    mask[::allowed_every] = True
    query = vectors[7]
    brute = np.flatnonzero(mask)[np.argsort(-(vectors[mask] @ query), kind="stable")[:5]]
    for hnsw_min in (10**9, 1000):  # flat, then HNSW
        index, _ = build_faiss(vectors, hnsw_min_chunks=hnsw_min)
        rows, _ = dense_search(index, query, 5, mask)
        assert mask[rows].all()
        overlap = len(set(rows.tolist()) & set(brute.tolist()))
        assert overlap >= 4 if hnsw_min == 1000 else overlap == 5


# ----------------------------------------------------------------------------- fusion
def test_rrf_matches_hand_computed_scores() -> None:
    fused = dict(reciprocal_rank_fusion([["a", "b", "c"], ["b", "d"]], k=60))
    assert fused["a"] == pytest.approx(1 / 61)
    assert fused["b"] == pytest.approx(1 / 62 + 1 / 61)
    assert fused["c"] == pytest.approx(1 / 63)
    assert fused["d"] == pytest.approx(1 / 62)
    order = [item for item, _ in reciprocal_rank_fusion([["a", "b", "c"], ["b", "d"]], k=60)]
    assert order == ["b", "a", "d", "c"]


def test_rrf_weights_and_duplicates() -> None:
    fused = reciprocal_rank_fusion([["x", "x", "y"], ["y"]], weights=[1.0, 3.0], k=10)
    scores = dict(fused)
    assert scores["x"] == pytest.approx(1 / 11)  # a repeat counts once, at its best rank
    assert scores["y"] == pytest.approx(1 / 13 + 3 / 11)
    assert [item for item, _ in fused] == ["y", "x"]
    with pytest.raises(ValueError, match="2 weights for 1 rankings"):
        reciprocal_rank_fusion([["a"]], weights=[1, 2])


# ----------------------------------------------------------------------------- filters
SCHEMA = {"price": "number", "brand": "string", "in_stock": "boolean", "filename": "string"}


@pytest.mark.parametrize(
    ("flt", "message"),
    [
        ({"field": "pric", "op": "<", "value": 1}, "unknown filter field 'pric'; known fields:"),
        ({"field": "brand", "op": "<", "value": "A"}, "operator '<' does not apply to string"),
        ({"field": "in_stock", "op": ">", "value": True}, "does not apply to boolean"),
        ({"field": "price", "op": "<", "value": "100"}, "expected a number"),
        ({"field": "price", "op": "=", "value": True}, "expected a number"),
        ({"field": "brand", "op": "=", "value": 3}, "expected a string"),
        ({"field": "in_stock", "op": "=", "value": "yes"}, "expected true or false"),
        ({"field": "brand", "op": "in", "value": []}, "non-empty list"),
        ({"field": "brand", "op": "in", "value": "Acme"}, "non-empty list"),
        ({"field": "brand", "op": "=", "value": ["Acme"]}, "only 'in' takes a list"),
        ({"field": "price", "op": "in", "value": [1, "x"]}, "expected a number"),
        ({"field": "price", "op": "~", "value": 1}, "malformed filter"),
        ({"field": "price", "op": "<", "value": 1, "sql": "1=1"}, "malformed filter"),
        ({"field": "price", "value": 1}, "malformed filter"),
    ],
)
def test_invalid_filters_are_rejected_with_the_reason(flt: dict, message: str) -> None:
    with pytest.raises(FilterError, match=message):
        validate_filters([flt], SCHEMA)


def test_masks_follow_sql_semantics() -> None:
    rows = [
        {"price": 10.0, "brand": "Acme", "in_stock": True, "filename": "a.pdf"},
        {"price": 150, "brand": "Globex", "in_stock": False, "filename": "b.csv"},
        {"brand": "Acme", "filename": "c.pdf"},  # no price, no stock flag
        {"price": 99.99, "brand": "Initech", "in_stock": True, "filename": "notes.txt"},
    ]
    columns = MetadataColumns(rows, SCHEMA)

    def mask(*filters: dict) -> list[int]:
        checked = validate_filters(filters, SCHEMA)
        return np.flatnonzero(columns.mask(checked)).tolist()

    assert columns.mask([]) is None
    assert mask({"field": "price", "op": "<", "value": 100}) == [0, 3]
    assert mask({"field": "price", "op": ">=", "value": 99.99}) == [1, 3]
    assert mask({"field": "price", "op": "!=", "value": 10}) == [1, 3]  # missing never matches
    assert mask({"field": "price", "op": "in", "value": [10, 150]}) == [0, 1]
    assert mask({"field": "brand", "op": "=", "value": "Acme"}) == [0, 2]
    assert mask({"field": "brand", "op": "!=", "value": "Acme"}) == [1, 3]
    assert mask({"field": "brand", "op": "in", "value": ["Globex", "Nobody"]}) == [1]
    assert mask({"field": "in_stock", "op": "=", "value": False}) == [1]
    assert mask({"field": "in_stock", "op": "!=", "value": False}) == [0, 3]
    assert mask({"field": "filename", "op": "=", "value": "*.pdf"}) == [0, 2]
    assert mask({"field": "filename", "op": "!=", "value": "*.pdf"}) == [1, 3]
    assert mask({"field": "filename", "op": "=", "value": "notes.txt"}) == [3]
    assert mask(
        {"field": "brand", "op": "=", "value": "Acme"}, {"field": "price", "op": "<", "value": 50}
    ) == [0]
    # Glob characters are literal outside filename/source.
    assert mask({"field": "brand", "op": "=", "value": "Ac*"}) == []


def test_cli_values_are_parsed_by_field_type() -> None:
    assert parse_cli_value("price", "<", "100", SCHEMA) == 100
    assert parse_cli_value("price", "<", "99.5", SCHEMA) == 99.5
    assert parse_cli_value("in_stock", "=", "true", SCHEMA) is True
    assert parse_cli_value("brand", "in", "Acme, Globex", SCHEMA) == ["Acme", "Globex"]
    assert parse_cli_value("price", "in", "[1, 2]", SCHEMA) == [1, 2]
    # Unparseable text stays text, so validation names the field and the expected type.
    with pytest.raises(FilterError, match="expected a number"):
        validate_filters(
            [
                {
                    "field": "price",
                    "op": "<",
                    "value": parse_cli_value("price", "<", "cheap", SCHEMA),
                }
            ],
            SCHEMA,
        )


# ----------------------------------------------------------------------------- retrievers
@pytest.fixture(scope="module")
def samples(sample_index: Path, embedder: SentenceTransformerEmbedder) -> SearchIndex:
    return open_index(sample_index, embedder)


def test_hybrid_finds_the_benefits_table(
    samples: SearchIndex, settings: Settings, embedder: SentenceTransformerEmbedder
) -> None:
    docs = build_retriever(settings, samples, embedder).invoke("what does the standard plan cost")
    top = docs[0]
    assert top.metadata["citation"] == "employee-handbook.md#benefit-plans"
    assert "| Standard | $45.00 |" in top.page_content
    assert top.metadata["bm25_rank"] and top.metadata["dense_rank"]
    scores = [d.metadata["rrf_score"] for d in docs]
    assert scores == sorted(scores, reverse=True)
    assert len({d.id for d in docs}) == len(docs)  # deduplicated by chunk id


@pytest.mark.parametrize("kind", ["bm25", "dense", "hybrid"])
def test_filters_reach_every_retriever(
    kind: str, samples: SearchIndex, settings: Settings, embedder: SentenceTransformerEmbedder
) -> None:
    retriever = {
        "bm25": BM25Retriever(index=samples),
        "dense": FaissRetriever(index=samples, embedder=embedder),
        "hybrid": build_retriever(settings, samples, embedder),
    }[kind]
    cheap = retriever.invoke(
        "sensor for farms", k=20, filters=[{"field": "price", "op": "<", "value": 100}]
    )
    assert cheap and all(d.metadata["price"] < 100 for d in cheap)
    pdfs = retriever.invoke(
        "what must I report",
        k=20,
        filters=[MetadataFilter(field="filename", op="=", value="*.pdf")],
    )
    assert pdfs and all(d.metadata["filename"].endswith(".pdf") for d in pdfs)
    with pytest.raises(FilterError, match="unknown filter field"):
        retriever.invoke("x", filters=[{"field": "colour", "op": "=", "value": "red"}])


def test_retrievers_work_async(
    samples: SearchIndex, settings: Settings, embedder: SentenceTransformerEmbedder
) -> None:
    retriever = build_retriever(settings, samples, embedder)
    docs = asyncio.run(
        retriever.ainvoke(
            "parental leave weeks", filters=[{"field": "format", "op": "=", "value": "markdown"}]
        )
    )
    assert docs[0].metadata["citation"] == "employee-handbook.md#parental-leave"
    assert all(d.metadata["format"] == "markdown" for d in docs)
