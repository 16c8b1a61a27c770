"""Fusion of BM25 and dense candidate lists: weighted RRF, or a convex combination of
normalised scores.

Both work on one query's ``Candidates``: the union of the two retrievers' lists, with each
row's rank and score on either side (or none). The hybrid retriever and ``ragchains eval
tune`` fuse through the same functions, so a tuned setting ranks exactly as it was measured.

Convex combination follows Bruch, Gai and Ingber, "An Analysis of Fusion Functions for
Hybrid Retrieval" (ACM TOIS 42(1), 2023): ``(1 - alpha) * phi(bm25) + alpha * phi(dense)``,
where ``phi`` normalises each list's scores. ``zscore`` (the default) measures each score in
standard deviations of the list's own top ``ZSCORE_DEPTH`` scores, from the lowest of them;
``tmm`` (theoretical min-max) maps to [0, 1] from the lowest score the function can give (0
for BM25, -1 for cosine) to the list's observed maximum; ``minmax`` from the list's observed
minimum to its maximum. A row one retriever did not return counts as 0 on that side.

Why ``zscore`` is the default: it puts each list on the scale of its own spread for this
query, so the weight a list carries does not depend on how its retriever's raw scores happen
to range on a collection. With ``tmm`` it does (cosines run higher on one collection than
on another; BM25's maximum grows with the query's words), so tmm's alpha is a guess, made
once, about which half is better, and where it guesses wrong the hybrid loses to the better
half: recall@10 0.47 on the benchmark's synthetic corpus where BM25 alone finds 1.00, and
0.044 nDCG@10 below dense alone on SciFact when BM25 is the weak side (README, *Where the
default comes from*, has these and the other collections measured).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

FusionMethod = Literal["rrf", "convex"]
Normalization = Literal["zscore", "tmm", "minmax"]
NORMALIZATIONS: tuple[Normalization, ...] = ("zscore", "tmm", "minmax")
# Each normalisation's alpha when none is given: a normalisation sets the scale alpha weighs,
# so alpha goes with it. zscore's was chosen on development data only (SciFact train, weakened
# sides, other judged sets, the benchmark's synthetic corpus): the low end of the range where
# the hybrid stays within 0.005 of its better half, the end that costs BM25-strong data least
# (README, *Where the default comes from*); tmm's is the previous default (its SciFact train
# optimum); minmax's is 1:1.
DEFAULT_ALPHAS: dict[str, float] = {"zscore": 0.55, "tmm": 0.8, "minmax": 0.5}
# zscore's statistics come from each list's top this many scores (the default candidates per
# retriever): a search that fetches more (evaluation fetches 100) ranks its top exactly as one
# that fetches this many, because rows below the window count as absent.
ZSCORE_DEPTH = 50
# The lowest score each retriever can give: BM25 is a sum of non-negative term weights; the
# dense index holds unit vectors, so its inner product is a cosine.
BM25_LOWER_BOUND = 0.0
COSINE_LOWER_BOUND = -1.0


class FusionConfig(BaseModel):
    """How the hybrid retriever fuses its two lists (field names as ``HybridRetriever``'s).

    ``alpha`` applies to ``convex`` (the dense side's weight; BM25 gets ``1 - alpha``; left
    out, the normalisation's own, ``DEFAULT_ALPHAS``); ``bm25_weight``, ``dense_weight`` and
    ``rrf_k`` to ``rrf``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    fusion: FusionMethod = "convex"
    normalization: Normalization = "zscore"
    alpha: float = Field(DEFAULT_ALPHAS["zscore"], ge=0, le=1)
    bm25_weight: float = Field(1.0, ge=0)
    dense_weight: float = Field(1.0, ge=0)
    rrf_k: int = Field(60, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _alpha_of_the_normalization(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("alpha") is None:
            normalization = data.get("normalization", "zscore")
            if normalization in DEFAULT_ALPHAS:  # else the field's own check says why
                data = {**data, "alpha": DEFAULT_ALPHAS[normalization]}
        return data

    @model_validator(mode="after")
    def _some_weight(self) -> FusionConfig:
        if self.bm25_weight == 0 and self.dense_weight == 0:
            raise ValueError("at least one of bm25_weight and dense_weight must be above 0")
        for name in ("alpha", "bm25_weight", "dense_weight"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number")
        return self

    def describe(self) -> str:
        """A short label, e.g. ``convex zscore alpha=0.55`` or ``rrf k=60 bm25:dense=1:1``."""
        if self.fusion == "convex":
            return f"convex {self.normalization} alpha={self.alpha:g}"
        return f"rrf k={self.rrf_k} bm25:dense={self.bm25_weight:g}:{self.dense_weight:g}"

    def effective(self) -> dict[str, object]:
        """The fields that decide this method's ranking (the others are carried, unused)."""
        if self.fusion == "convex":
            return {"fusion": "convex", "normalization": self.normalization, "alpha": self.alpha}
        return {
            "fusion": "rrf",
            "rrf_k": self.rrf_k,
            "bm25_weight": self.bm25_weight,
            "dense_weight": self.dense_weight,
        }


FUSION_FIELDS = tuple(FusionConfig.model_fields)
DEFAULT_FUSION = FusionConfig()


class FusionFields(BaseModel):
    """A hybrid retriever's fusion settings: each field left unset (None) takes its value
    from ``base_fusion()`` (what the index or store records, else ``DEFAULT_FUSION``).
    ``fusion_config`` is the result."""

    fusion: FusionMethod | None = Field(None, description="rrf or convex")
    normalization: Normalization | None = Field(
        None,
        description="convex: zscore (per-query z-scores), tmm (theoretical min-max) or minmax",
    )
    alpha: float | None = Field(
        None,
        ge=0,
        le=1,
        description="convex: the dense side's weight (unset: the normalisation's own)",
    )
    bm25_weight: float | None = Field(None, ge=0, description="rrf: BM25's weight")
    dense_weight: float | None = Field(None, ge=0, description="rrf: dense's weight")
    rrf_k: int | None = Field(None, ge=1, description="rrf: the rank constant")

    @model_validator(mode="after")
    def _valid_fusion(self) -> FusionFields:
        _ = self.fusion_config  # a bad combination (both RRF weights 0) fails here, not later
        return self

    def base_fusion(self) -> FusionConfig | None:
        """The fusion the searched data records (an index's fusion.json), if any."""
        return None

    @property
    def fusion_set(self) -> dict[str, object]:
        """The fusion fields set on this retriever (they override ``base_fusion()``)."""
        return {
            name: getattr(self, name) for name in FUSION_FIELDS if getattr(self, name) is not None
        }

    @property
    def fusion_config(self) -> FusionConfig:
        """The fusion in use: this retriever's fields over the base, over the defaults.

        An alpha belongs to its normalisation: a normalisation set here other than the
        base's, with no alpha set here, takes its own default alpha, not the base's."""
        base = self.base_fusion() or DEFAULT_FUSION
        overrides = self.fusion_set
        if not overrides:
            return base
        merged = {**base.model_dump(), **overrides}
        if "alpha" not in overrides and merged["normalization"] != base.normalization:
            del merged["alpha"]
        return FusionConfig(**merged)


@dataclass
class Candidates:
    """One query's fusion input: the union of both lists and each row's place in each.

    ``rows`` holds BM25's rows in its order, then the rows only dense returned, in dense's
    order; ties in the fused score keep this order. A rank of 0 and a NaN score mean "not
    returned by that retriever".
    """

    rows: np.ndarray  # int64
    bm25_rank: np.ndarray  # int64, 1-based, 0 = absent
    bm25_score: np.ndarray  # float64, NaN = absent
    dense_rank: np.ndarray
    dense_score: np.ndarray

    @classmethod
    def from_lists(
        cls,
        bm25_rows: Sequence[int] | np.ndarray,
        bm25_scores: Sequence[float] | np.ndarray,
        dense_rows: Sequence[int] | np.ndarray,
        dense_scores: Sequence[float] | np.ndarray,
    ) -> Candidates:
        """From each retriever's (rows, scores), best first; a repeated row counts once, at
        its best rank."""
        b_rows, b_scores, b_ranks = _ranked(bm25_rows, bm25_scores)
        d_rows, d_scores, d_ranks = _ranked(dense_rows, dense_scores)
        # A dict, not numpy set operations: the lists are short, where numpy's per-call cost
        # would dominate a query's fusion time.
        place = {row: i for i, row in enumerate(b_rows.tolist())}
        d_at = [place.setdefault(row, len(place)) for row in d_rows.tolist()]
        n = len(place)
        out = cls(
            rows=np.fromiter(place, dtype=np.int64, count=n),
            bm25_rank=np.zeros(n, dtype=np.int64),
            bm25_score=np.full(n, np.nan),
            dense_rank=np.zeros(n, dtype=np.int64),
            dense_score=np.full(n, np.nan),
        )
        out.bm25_rank[: b_rows.size] = b_ranks
        out.bm25_score[: b_rows.size] = b_scores
        out.dense_rank[d_at] = d_ranks
        out.dense_score[d_at] = d_scores
        return out

    def __len__(self) -> int:
        return int(self.rows.size)


def _ranked(
    rows: Sequence[int] | np.ndarray, scores: Sequence[float] | np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, scores, 1-based ranks) of a ranked list, a repeated row at its first place only."""
    row_array = np.asarray(rows, dtype=np.int64)
    score_array = np.asarray(scores, dtype=np.float64)
    if row_array.shape != score_array.shape:
        raise ValueError(f"{row_array.size} rows but {score_array.size} scores")
    ranks = np.arange(1, row_array.size + 1)
    row_list = row_array.tolist()
    if len(set(row_list)) != len(row_list):  # never from our searches; kept for callers
        first = sorted({row: i for i, row in reversed(list(enumerate(row_list)))}.values())
        return row_array[first], score_array[first], ranks[first]
    return row_array, score_array, ranks


def normalize(
    scores: np.ndarray, method: Normalization, lower_bound: float, depth: int = ZSCORE_DEPTH
) -> np.ndarray:
    """Each present (non-NaN) score normalised; absent ones get 0. Higher is better.

    ``zscore``: (s - low) / sd, where sd is the standard deviation of the list's top
    ``depth`` scores and low the lowest of them; scores below the window clip to 0, as if
    absent. (A z-score shifted by a constant per list, which leaves every convex ranking as
    it is and puts an absent row at 0.) A list of one score, or of equal ones: 1 each.
    ``tmm``: (s - lower_bound) / (max - lower_bound), in [0, 1]. ``minmax``: (s - min) /
    (max - min), in [0, 1], and 1 for every present score when they are all equal (a list of
    one). For tmm, a list whose maximum is at the lower bound carries no signal: all 0.
    """
    out = np.zeros(scores.shape, dtype=np.float64)
    present = ~np.isnan(scores)
    if not present.any():
        return out
    values = scores[present]
    if method == "zscore":
        window = values
        if values.size > depth:
            window = np.partition(values, values.size - depth)[values.size - depth :]
        spread = float(window.std())
        if spread > 0:
            out[present] = np.maximum((values - float(window.min())) / spread, 0.0)
        else:
            out[present] = 1.0
        return out
    top = float(values.max())
    low = lower_bound if method == "tmm" else float(values.min())
    if top > low:
        # Scores below a theoretical bound (float noise) clip to it.
        out[present] = np.clip((values - low) / (top - low), 0.0, 1.0)
    elif method == "minmax":
        out[present] = 1.0
    return out


def fuse(candidates: Candidates, config: FusionConfig) -> np.ndarray:
    """Each candidate's fused score (aligned with ``candidates.rows``); higher is better."""
    c = candidates
    if config.fusion == "rrf":
        # w / (k + rank) where a retriever returned the row, nothing where it did not.
        fused = np.zeros(len(c), dtype=np.float64)
        for ranks, weight in (
            (c.bm25_rank, config.bm25_weight),
            (c.dense_rank, config.dense_weight),
        ):
            fused += np.where(ranks > 0, weight / (config.rrf_k + ranks), 0.0)
        return fused
    lexical = normalize(c.bm25_score, config.normalization, BM25_LOWER_BOUND)
    semantic = normalize(c.dense_score, config.normalization, COSINE_LOWER_BOUND)
    result: np.ndarray = (1.0 - config.alpha) * lexical + config.alpha * semantic
    return result


def fused_order(
    candidates: Candidates, config: FusionConfig, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Indices into ``candidates`` of the fused top ``k`` and their scores, best first; ties
    keep the candidates' order."""
    scores = fuse(candidates, config)
    order = np.argsort(-scores, kind="stable")[:k]
    return order, scores[order]


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[Hashable]],
    *,
    weights: Sequence[float] | None = None,
    k: int = 60,
) -> list[tuple[Hashable, float]]:
    """Fuse ranked lists of any ids: score(d) = sum_i w_i / (k + rank_i(d)), rank from 1.

    An id repeated within one list counts at its best rank only. Ties keep first-seen order.
    (The multi-query search fuses its phrasings' lists of chunk ids with this.)
    """
    if weights is None:
        weights = [1.0] * len(rankings)
    if len(weights) != len(rankings):
        raise ValueError(f"{len(weights)} weights for {len(rankings)} rankings")
    fused: dict[Hashable, float] = {}
    for ranking, weight in zip(rankings, weights, strict=True):
        seen: set[Hashable] = set()
        for rank, item in enumerate(ranking, start=1):
            if item in seen:
                continue
            seen.add(item)
            fused[item] = fused.get(item, 0.0) + weight / (k + rank)
    return sorted(fused.items(), key=lambda kv: kv[1], reverse=True)
