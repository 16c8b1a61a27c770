"""Hybrid retrieval: BM25 and dense results fused by weighted reciprocal rank fusion.

langchain_classic's EnsembleRetriever does RRF too, but discards the fused score and each
retriever's rank; callers (the compressor, the CLI, evaluation) need both, and fusing row
numbers before fetching text means each chunk is read from the store once.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
from langchain_core.documents import Document
from pydantic import Field, model_validator

from ragchains.retrievers.base import IndexRetriever
from ragchains.retrievers.bm25 import bm25_search
from ragchains.retrievers.dense import dense_search
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.filters import MetadataFilter
from ragchains.retrievers.index import SearchIndex


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[Hashable]],
    *,
    weights: Sequence[float] | None = None,
    k: int = 60,
) -> list[tuple[Hashable, float]]:
    """Fuse ranked lists: score(d) = sum_i w_i / (k + rank_i(d)), rank from 1.

    An id repeated within one list counts at its best rank only. Ties keep first-seen order.
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


@dataclass
class HybridHit:
    row: int
    score: float
    bm25_rank: int | None
    bm25_score: float | None
    dense_rank: int | None
    dense_score: float | None


def hybrid_search(
    index: SearchIndex,
    query: str,
    query_vector: np.ndarray,
    *,
    k: int,
    candidates: int,
    bm25_weight: float = 1.0,
    dense_weight: float = 1.0,
    rrf_k: int = 60,
    mask: np.ndarray | None = None,
) -> list[HybridHit]:
    """Fused top-k rows; each retriever fetches ``candidates`` rows among those ``mask`` allows."""
    fetch = max(candidates, k)
    b_rows, b_scores = bm25_search(index.bm25, query, fetch, mask)
    d_rows, d_scores = dense_search(index.dense, query_vector, fetch, mask)
    fused = reciprocal_rank_fusion(
        [b_rows.tolist(), d_rows.tolist()], weights=[bm25_weight, dense_weight], k=rrf_k
    )[:k]
    b_info = {
        int(r): (i + 1, float(s)) for i, (r, s) in enumerate(zip(b_rows, b_scores, strict=True))
    }
    d_info = {
        int(r): (i + 1, float(s)) for i, (r, s) in enumerate(zip(d_rows, d_scores, strict=True))
    }
    hits = []
    for row, score in fused:
        row = int(row)  # type: ignore[call-overload]
        b = b_info.get(row, (None, None))
        d = d_info.get(row, (None, None))
        hits.append(HybridHit(row, score, b[0], b[1], d[0], d[1]))
    return hits


class HybridRetriever(IndexRetriever):
    """BM25 + FAISS fused by RRF; filters are validated once and applied inside both.

    Each document's metadata carries ``rrf_score`` and the rank and score it had in each
    retriever (None where that retriever did not return it).
    """

    embedder: SentenceTransformerEmbedder
    candidates: int = Field(50, ge=1)
    bm25_weight: float = Field(1.0, ge=0)
    dense_weight: float = Field(1.0, ge=0)
    rrf_k: int = Field(60, ge=1)

    @model_validator(mode="after")
    def _some_weight(self) -> HybridRetriever:
        if self.bm25_weight == 0 and self.dense_weight == 0:
            raise ValueError("at least one of bm25_weight and dense_weight must be above 0")
        return self

    def _search(self, query: str, *, k: int, filters: list[MetadataFilter]) -> list[Document]:
        hits = hybrid_search(
            self.index,
            query,
            self.embedder.encode_query(query),
            k=k,
            candidates=self.candidates,
            bm25_weight=self.bm25_weight,
            dense_weight=self.dense_weight,
            rrf_k=self.rrf_k,
            mask=self.index.columns.mask(filters),
        )
        docs = self.index.store.documents([h.row for h in hits])
        for doc, hit in zip(docs, hits, strict=True):
            doc.metadata.update(
                rrf_score=hit.score,
                bm25_rank=hit.bm25_rank,
                bm25_score=hit.bm25_score,
                dense_rank=hit.dense_rank,
                dense_score=hit.dense_score,
            )
        return docs
