"""BM25, FAISS, fusion and filters: rankings, the filter contract, and the retrievers' API."""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from rank_bm25 import BM25Okapi

from ragchains.evaluation.metrics import ndcg_at_k
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
from ragchains.retrievers.fusion import (
    DEFAULT_ALPHAS,
    DEFAULT_FUSION,
    ZSCORE_DEPTH,
    Candidates,
    FusionConfig,
    FusionFields,
    fuse,
    fused_order,
    normalize,
)
from ragchains.retrievers.fusionfile import FUSION_FILE, FusionFileError, write_fusion
from ragchains.retrievers.hybrid import HybridRetriever, reciprocal_rank_fusion
from ragchains.retrievers.searchindex import SearchIndex, load_index
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


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("lengths_kept", [True, False])
def test_bm25_over_a_callers_rows_scores_as_an_index_of_only_them(
    seed: int, lengths_kept: bool
) -> None:
    # What a caller may read is scored as if nothing else were indexed: a hidden row's words
    # and length change neither a score nor the order (they would tell it exists).
    rng = np.random.default_rng(seed)
    corpus = CORPUS + [" ".join(rng.choice(CORPUS, 3)) for _ in range(8)]  # long rows too
    readers = rng.random(len(corpus)) < 0.5
    whole = build_bm25(corpus)
    if not lengths_kept:  # a generation written before lengths were kept: idf only
        whole.doc_lengths = None
    alone = build_bm25([t for t, r in zip(corpus, readers, strict=True) if r])
    rows_of = np.flatnonzero(readers)
    told_apart = 0
    for query in ["tomato staking", "compost smelly wet", "bees honey frames", "slugs lettuce"]:
        rows, scores = bm25_search(whole, query, len(corpus), readers, readers)
        a_rows, a_scores = bm25_search(alone, query, len(corpus))
        assert set(rows.tolist()) <= set(rows_of.tolist())
        expected = dict(zip(rows_of[a_rows].tolist(), a_scores.tolist(), strict=True))
        got = dict(zip(rows.tolist(), scores.tolist(), strict=True))
        assert got.keys() == expected.keys()
        # The whole index's statistics give other scores: the test can tell them apart.
        p_rows, plain = bm25_search(whole, query, len(corpus), readers)
        if lengths_kept:
            assert got == pytest.approx(expected, rel=1e-4)
            told_apart += sorted(plain.tolist()) != pytest.approx(sorted(expected.values()))
        else:  # the readers' idf at least: not the whole index's scores
            unmasked = dict(zip(p_rows.tolist(), plain.tolist(), strict=True))
            told_apart += got != pytest.approx(unmasked, rel=1e-4)
    assert told_apart >= 2


def test_bm25_over_no_readable_row_finds_nothing() -> None:
    model = build_bm25(CORPUS)
    none = np.zeros(len(CORPUS), dtype=bool)
    assert bm25_search(model, "tomato", 5, None, none)[0].size == 0  # readers alone


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


def test_normalisations_and_their_bounds() -> None:
    nan = float("nan")
    bm25 = np.array([10.0, 5.0, nan, 2.5])
    # tmm: BM25's lower bound is 0, the observed max maps to 1; absent counts as the bound.
    assert normalize(bm25, "tmm", 0.0).tolist() == [1.0, 0.5, 0.0, 0.25]
    # Cosine's lower bound is -1: 0.5 -> 1, -0.25 -> 0.5, -1 -> 0.
    cosine = np.array([0.5, -0.25, -1.0, nan])
    assert normalize(cosine, "tmm", -1.0).tolist() == [1.0, 0.5, 0.0, 0.0]
    # minmax: the list's own min and max.
    assert normalize(bm25, "minmax", 0.0).tolist() == [1.0, 0.3333333333333333, 0.0, 0.0]
    # One score (or all equal): it is the list's best, 1; tmm still measures it from the bound.
    assert normalize(np.array([3.0, nan]), "minmax", 0.0).tolist() == [1.0, 0.0]
    assert normalize(np.array([0.2, 0.2]), "tmm", -1.0).tolist() == [1.0, 1.0]
    # Nothing returned, or a maximum at the bound: no signal.
    assert normalize(np.array([nan, nan]), "tmm", 0.0).tolist() == [0.0, 0.0]
    assert normalize(np.array([-1.0]), "tmm", -1.0).tolist() == [0.0]
    # Float noise below a theoretical bound does not go negative.
    assert normalize(np.array([0.5, -1.0000001]), "tmm", -1.0).min() == 0.0
    # zscore: in standard deviations of the list (here 3.0), from its lowest score.
    zscores = normalize(np.array([8.0, 2.0, nan, 2.0, 0.0]), "zscore", 0.0)
    assert zscores.tolist() == pytest.approx([8 / 3, 2 / 3, 0.0, 2 / 3, 0.0])
    # Only the top `depth` scores count: the rest clip to 0, as if absent.
    window = normalize(np.array([10.0, 4.0, 1.0, 0.5]), "zscore", 0.0, depth=2)
    assert window.tolist() == [2.0, 0.0, 0.0, 0.0]
    # One score, or equal ones: no spread to measure, but each was found.
    assert normalize(np.array([3.0, nan]), "zscore", 0.0).tolist() == [1.0, 0.0]
    assert normalize(np.array([nan, nan]), "zscore", 0.0).tolist() == [0.0, 0.0]


def test_zscore_ranks_alike_however_a_retriever_scales_its_scores() -> None:
    """What makes zscore the default: a list's weight comes from its spread for this query,
    not from its retriever's raw range. Stretching or shifting one side's scores (another
    collection, another embedder, longer queries) leaves the fused order as it is; with tmm
    it changes."""
    rng = np.random.default_rng(3)
    bm25_rows, dense_rows = rng.permutation(80)[:50], rng.permutation(80)[:50]
    bm25 = np.sort(rng.gamma(2.0, 3.0, 50))[::-1]
    dense = np.sort(rng.uniform(0.2, 0.7, 50))[::-1]

    def order(normalization: str, b: np.ndarray, d: np.ndarray) -> list[int]:
        c = Candidates.from_lists(bm25_rows, b, dense_rows, d)
        config = FusionConfig(normalization=normalization)  # type: ignore[arg-type]
        return c.rows[fused_order(c, config, 20)[0]].tolist()

    for normalization, invariant in (("zscore", True), ("tmm", False)):
        base = order(normalization, bm25, dense)
        moved = order(normalization, bm25 * 3.0, dense * 0.5 + 0.45)
        assert (moved == base) is invariant, normalization


def test_zscore_ranks_its_top_alike_however_deep_each_side_fetched() -> None:
    """Evaluation fetches 100 per side where the chat fetches 50: the fused top is the same."""
    rng = np.random.default_rng(5)
    rows_b, rows_d = rng.permutation(300)[:100], rng.permutation(300)[:100]
    b = np.sort(rng.gamma(2.0, 3.0, 100))[::-1]
    d = np.sort(rng.uniform(0.2, 0.7, 100))[::-1]
    deep = Candidates.from_lists(rows_b, b, rows_d, d)
    n = ZSCORE_DEPTH
    shallow = Candidates.from_lists(rows_b[:n], b[:n], rows_d[:n], d[:n])
    top = [c.rows[fused_order(c, DEFAULT_FUSION, 30)[0]].tolist() for c in (deep, shallow)]
    assert top[0] == top[1]


def test_an_empty_side_leaves_the_other_sides_order() -> None:
    # A query of stop words only: BM25 returns nothing, the default keeps dense's order.
    c = Candidates.from_lists([], [], [5, 3, 8, 1], [0.7, 0.5, 0.45, 0.1])
    order, _ = fused_order(c, DEFAULT_FUSION, 4)
    assert c.rows[order].tolist() == [5, 3, 8, 1]


def _candidates() -> Candidates:
    # BM25 returned a (12.0), b (6.0); dense returned b (0.6), c (0.2).
    return Candidates.from_lists([0, 1], [12.0, 6.0], [1, 2], [0.6, 0.2])


def test_candidates_align_both_lists_and_mark_what_is_missing() -> None:
    c = Candidates.from_lists([7, 3, 7], [9.0, 4.0, 1.0], [3, 5], [0.5, 0.4])
    assert c.rows.tolist() == [7, 3, 5]  # BM25's order, then dense-only rows
    assert c.bm25_rank.tolist() == [1, 2, 0]  # the repeat of 7 counts at its best rank
    assert c.dense_rank.tolist() == [0, 1, 2]
    assert np.isnan(c.bm25_score[2]) and np.isnan(c.dense_score[0])


def test_convex_counts_a_missing_score_as_the_lower_bound() -> None:
    c = _candidates()
    fused = fuse(c, FusionConfig(fusion="convex", normalization="tmm", alpha=0.5))
    # a: BM25 1.0, dense missing -> 0. b: BM25 0.5, dense 1. c: BM25 missing, dense 1.2/1.6.
    assert fused.tolist() == pytest.approx([0.5, 0.75, 0.375])
    minmax = fuse(c, FusionConfig(fusion="convex", normalization="minmax", alpha=0.25))
    # minmax: a 1, b 0 on BM25; b 1, c 0 on dense.
    assert minmax.tolist() == pytest.approx([0.75, 0.25, 0.0])


def test_array_rrf_matches_the_list_rrf() -> None:
    c = _candidates()
    config = FusionConfig(fusion="rrf", rrf_k=10, bm25_weight=2.0, dense_weight=0.5)
    by_list = dict(reciprocal_rank_fusion([[0, 1], [1, 2]], weights=[2.0, 0.5], k=10))
    assert fuse(c, config).tolist() == [by_list[0], by_list[1], by_list[2]]


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (FusionConfig(fusion="convex", alpha=0.0), [0, 1, 2]),  # BM25's order, dense-only last
        (FusionConfig(fusion="convex", normalization="tmm", alpha=0.0), [0, 1, 2]),
        (FusionConfig(fusion="convex", normalization="tmm", alpha=1.0), [1, 2, 0]),  # dense's
        # zscore counts each list's lowest score as absent: c (dense's last) ties with a.
        (FusionConfig(fusion="convex", alpha=1.0), [1, 0, 2]),
        (FusionConfig(fusion="convex", normalization="minmax", alpha=1.0), [1, 0, 2]),
        (FusionConfig(fusion="rrf", dense_weight=0.0), [0, 1, 2]),
        (FusionConfig(fusion="rrf", bm25_weight=0.0), [1, 2, 0]),
    ],
)
def test_a_zero_weight_leaves_one_side(config: FusionConfig, expected: list[int]) -> None:
    c = _candidates()
    order, _ = fused_order(c, config, 3)
    assert c.rows[order].tolist() == expected


def test_ties_keep_the_candidates_order() -> None:
    # Mirror images: each row is first on one side and second on the other.
    c = Candidates.from_lists([4, 9], [2.0, 1.0], [9, 4], [0.5, 0.0])
    for config in (
        FusionConfig(fusion="rrf"),
        FusionConfig(fusion="convex", normalization="minmax", alpha=0.5),
        FusionConfig(fusion="convex", normalization="zscore", alpha=0.5),
    ):
        order, scores = fused_order(c, config, 2)
        assert scores[0] == scores[1] and c.rows[order].tolist() == [4, 9]


def test_convex_keeps_a_confident_side_where_rrf_loses_to_it() -> None:
    """Dense is sure of the relevant row r (cosine 0.85, the rest about 0.3); BM25 ranks
    four keyword matches first and r fifth. RRF sees only ranks: the keyword match that
    dense ranks second overtakes r. The convex combination sees dense's margin and keeps r
    first, as dense alone does."""
    r, junk = 100, [1, 2, 3, 4]
    c = Candidates.from_lists(
        [*junk, r], [9.0, 8.5, 8.0, 7.5, 7.0], [r, *junk], [0.85, 0.31, 0.30, 0.29, 0.28]
    )
    qrels = {str(r): 1.0}

    def ndcg(config: FusionConfig) -> float:
        order, _ = fused_order(c, config, 10)
        return ndcg_at_k([str(x) for x in c.rows[order].tolist()], qrels, 10)

    dense_alone = ndcg(FusionConfig(fusion="convex", alpha=1.0))
    bm25_alone = ndcg(FusionConfig(fusion="convex", alpha=0.0))
    better_half = max(dense_alone, bm25_alone)
    assert dense_alone == 1.0 and bm25_alone < 1.0
    assert ndcg(FusionConfig(fusion="rrf")) < better_half
    assert ndcg(FusionConfig(normalization="tmm")) == better_half
    assert ndcg(FusionConfig()) == better_half  # the default: convex, zscore


def test_fusion_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="at least one of bm25_weight and dense_weight"):
        FusionConfig(fusion="rrf", bm25_weight=0, dense_weight=0)
    with pytest.raises(ValueError, match="less than or equal to 1"):
        FusionConfig(alpha=1.5)
    with pytest.raises(ValueError, match="Input should be 'rrf' or 'convex'"):
        FusionConfig(fusion="borda")  # type: ignore[arg-type]
    assert FusionConfig().describe() == "convex zscore alpha=0.55"
    assert FusionConfig(fusion="rrf").describe() == "rrf k=60 bm25:dense=1:1"
    # Alpha goes with its normalisation unless given.
    assert FusionConfig(normalization="tmm").alpha == DEFAULT_ALPHAS["tmm"] == 0.8
    assert FusionConfig(normalization="minmax", alpha=0.3).alpha == 0.3
    with pytest.raises(ValueError, match="Input should be 'zscore', 'tmm' or 'minmax'"):
        FusionConfig(normalization="l2")  # type: ignore[arg-type]


class _Fields(FusionFields):
    base: FusionConfig | None = None

    def base_fusion(self) -> FusionConfig | None:
        return self.base


def test_fusion_fields_override_the_base_and_alpha_follows_the_normalisation() -> None:
    tuned = FusionConfig(normalization="tmm", alpha=0.75)  # a fusion.json, say
    assert _Fields().fusion_config == DEFAULT_FUSION
    assert _Fields(base=tuned).fusion_config == tuned
    assert _Fields(base=tuned, alpha=0.6).fusion_config.describe() == "convex tmm alpha=0.6"
    # The same normalisation set again keeps the base's alpha; another one brings its own.
    assert _Fields(base=tuned, normalization="tmm").fusion_config.alpha == 0.75
    assert _Fields(base=tuned, normalization="zscore").fusion_config == DEFAULT_FUSION
    assert _Fields(normalization="tmm").fusion_config.describe() == "convex tmm alpha=0.8"


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
    scores = [d.metadata["convex_score"] for d in docs]
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


@pytest.mark.parametrize("side", ["bm25", "dense"])
def test_hybrid_with_one_side_weighted_out_ranks_as_that_retriever(
    side: str, samples: SearchIndex, embedder: SentenceTransformerEmbedder
) -> None:
    query = "which sensor measures soil moisture"
    alone = (
        BM25Retriever(index=samples, k=5)
        if side == "bm25"
        else FaissRetriever(index=samples, embedder=embedder, k=5)
    )
    expected = [d.id for d in alone.invoke(query)]
    assert len(expected) == 5
    for fusion in (
        {"fusion": "convex", "alpha": 0.0 if side == "bm25" else 1.0},
        {"fusion": "rrf", "dense_weight" if side == "bm25" else "bm25_weight": 0.0},
    ):
        hybrid = HybridRetriever(index=samples, embedder=embedder, k=5, **fusion)
        assert [d.id for d in hybrid.invoke(query)] == expected, fusion


def test_fusion_json_is_the_index_default_and_settings_override_it(
    sample_index: Path,
    tmp_path: Path,
    settings: Settings,
    embedder: SentenceTransformerEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    index_dir = tmp_path / "idx"
    shutil.copytree(sample_index, index_dir)
    query = "what does the standard plan cost"

    plain = build_retriever(settings, open_index(index_dir, embedder), embedder)
    assert plain.fusion_config == FusionConfig()  # no fusion.json: the built-in default
    first = plain.invoke(query)[0].metadata
    assert "convex_score" in first and first["fusion"] == "convex zscore alpha=0.55"

    written = write_fusion(index_dir, FusionConfig(fusion="rrf", rrf_k=10), {"by": "a test"})
    assert written == index_dir / FUSION_FILE
    tuned = open_index(index_dir, embedder)
    assert tuned.fusion == FusionConfig(fusion="rrf", rrf_k=10)
    retriever = build_retriever(settings, tuned, embedder)
    assert retriever.fusion_config.describe() == "rrf k=10 bm25:dense=1:1"
    top = retriever.invoke(query)[0]
    assert top.metadata["rrf_score"] == pytest.approx(
        1 / (10 + top.metadata["bm25_rank"]) + 1 / (10 + top.metadata["dense_rank"])
    )
    # A LangChain user's retriever over the same index takes the file as its default too.
    assert HybridRetriever(index=tuned, embedder=embedder).fusion_config.rrf_k == 10

    # Settings (here from the environment) win over the file, field by field.
    monkeypatch.setenv("RAGCHAINS_FUSION", "convex")
    monkeypatch.setenv("RAGCHAINS_FUSION_ALPHA", "0.6")
    overridden = build_retriever(Settings(_env_file=None), tuned, embedder)  # type: ignore[call-arg]
    assert overridden.fusion_config.describe() == "convex zscore alpha=0.6"
    assert overridden.fusion_config.rrf_k == 10  # unset in settings: still the file's
    assert "convex_score" in overridden.invoke(query)[0].metadata

    # A re-ingest keeps it: it sits beside the generations.
    assert (index_dir / FUSION_FILE).is_file() and FUSION_FILE not in {
        p.name for p in tuned.path.iterdir()
    }


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("{not json", "is not valid JSON"),
        ('{"fusion": "rrf"}', "is not a ragchains-fusion file"),
        (
            '{"format": "ragchains-fusion", "format_version": 9, "fusion": "rrf"}',
            "has format version 9; this ragchains reads version 1 only",
        ),
        (
            '{"format": "ragchains-fusion", "format_version": 1, "alpha": 2}',
            "alpha: Input should be less than or equal to 1; fix or delete it",
        ),
        (
            '{"format": "ragchains-fusion", "format_version": 1, "fusion": "rrf", '
            '"bm25_weight": 0, "dense_weight": 0}',
            "at least one of bm25_weight and dense_weight must be above 0; fix or delete it",
        ),
    ],
)
def test_a_bad_fusion_json_fails_loading_with_the_reason(
    body: str, message: str, sample_index: Path, tmp_path: Path
) -> None:
    index_dir = tmp_path / "idx"
    shutil.copytree(sample_index, index_dir)
    (index_dir / FUSION_FILE).write_text(body, encoding="utf-8")
    with pytest.raises(FusionFileError, match=re.escape(message)):
        load_index(index_dir)


def test_a_bad_fusion_setting_fails_building_the_retriever(
    samples: SearchIndex, embedder: SentenceTransformerEmbedder
) -> None:
    with pytest.raises(ValueError, match="at least one of bm25_weight and dense_weight"):
        HybridRetriever(
            index=samples, embedder=embedder, fusion="rrf", bm25_weight=0, dense_weight=0
        )
    with pytest.raises(ValueError, match="Input should be 'zscore', 'tmm' or 'minmax'"):
        HybridRetriever(index=samples, embedder=embedder, normalization="l2")  # type: ignore[arg-type]
