"""Hybrid retrieval: BM25 and dense results fused by a convex combination of normalised
scores or by weighted reciprocal rank fusion (see ``retrievers.fusion``).

langchain_classic's EnsembleRetriever does RRF too, but discards the fused score and each
retriever's rank; callers (the compressor, the CLI, evaluation) need both, and fusing row
numbers before fetching text means each chunk is read from the store once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from langchain_core.documents import Document
from pydantic import Field

from ragchains.retrievers.access import combined
from ragchains.retrievers.base import IndexRetriever
from ragchains.retrievers.bm25 import bm25_search
from ragchains.retrievers.dense import dense_search
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.fusion import (
    DEFAULT_FUSION,
    Candidates,
    FusionConfig,
    FusionFields,
    fused_order,
    reciprocal_rank_fusion,
)
from ragchains.retrievers.searchindex import SearchIndex

__all__ = [
    "HybridHit",
    "HybridRetriever",
    "hybrid_search",
    "reciprocal_rank_fusion",
    "search_candidates",
]


@dataclass
class HybridHit:
    row: int
    score: float
    bm25_rank: int | None
    bm25_score: float | None
    dense_rank: int | None
    dense_score: float | None

    def metadata(self, fusion: FusionConfig) -> dict[str, Any]:
        """What a fused document carries: the fusion's label (the fused score's scale is its
        fusion's: z-scores for the default), the fused score and each side's rank and score."""
        return {
            "fusion": fusion.describe(),
            f"{fusion.fusion}_score": self.score,
            "bm25_rank": self.bm25_rank,
            "bm25_score": self.bm25_score,
            "dense_rank": self.dense_rank,
            "dense_score": self.dense_score,
        }


def search_candidates(
    index: SearchIndex,
    query: str,
    query_vector: np.ndarray,
    *,
    fetch: int,
    mask: np.ndarray | None = None,
) -> Candidates:
    """Both retrievers' top ``fetch`` rows among those ``mask`` allows and this request's
    caller may read, ready to fuse."""
    readers = index.readable_rows()
    allowed = combined(mask, readers)
    b_rows, b_scores = bm25_search(index.bm25, query, fetch, allowed, readers)
    d_rows, d_scores = dense_search(index.dense, query_vector, fetch, allowed)
    return Candidates.from_lists(b_rows, b_scores, d_rows, d_scores)


def fused_hits(candidates: Candidates, fusion: FusionConfig, k: int) -> list[HybridHit]:
    """The fused top ``k`` of one query's candidates, with each side's rank and score."""
    order, scores = fused_order(candidates, fusion, k)
    c = candidates
    columns = zip(
        c.rows[order].tolist(),
        scores.tolist(),
        c.bm25_rank[order].tolist(),
        c.bm25_score[order].tolist(),
        c.dense_rank[order].tolist(),
        c.dense_score[order].tolist(),
        strict=True,
    )
    return [
        HybridHit(
            row,
            score,
            b_rank or None,
            None if b_rank == 0 else b_score,
            d_rank or None,
            None if d_rank == 0 else d_score,
        )
        for row, score, b_rank, b_score, d_rank, d_score in columns
    ]


def hybrid_search(
    index: SearchIndex,
    query: str,
    query_vector: np.ndarray,
    *,
    k: int,
    candidates: int,
    fusion: FusionConfig = DEFAULT_FUSION,
    mask: np.ndarray | None = None,
) -> list[HybridHit]:
    """Fused top-k rows; each retriever fetches ``candidates`` rows among those ``mask`` allows
    (and this request's caller may read)."""
    found = search_candidates(index, query, query_vector, fetch=max(candidates, k), mask=mask)
    return fused_hits(found, fusion, k)


class HybridRetriever(IndexRetriever, FusionFields):
    """BM25 + FAISS, fused; filters are validated once and applied inside both.

    The fusion fields left unset (None) take their value from the index folder's
    ``fusion.json`` (written by ``ragchains eval tune --apply``) if it has one, else from
    ``DEFAULT_FUSION``: a convex combination of each list's scores as z-scores of its own top
    50 for this query (``retrievers.fusion``). ``fusion_config`` is the result, and
    ``fusion_config.describe()`` names it.

    Each document's metadata carries the fusion's label (``fusion``, as ``describe()`` gives
    it), the fused score (``convex_score`` or ``rrf_score``, after the method) and the rank and
    score it had in each retriever (None where that retriever did not return it).
    """

    embedder: SentenceTransformerEmbedder
    candidates: int = Field(50, ge=1)

    def base_fusion(self) -> FusionConfig | None:
        return self.index.fusion

    def _search(
        self, index: SearchIndex, query: str, *, k: int, mask: np.ndarray | None
    ) -> list[Document]:
        fusion = self.fusion_config
        hits = hybrid_search(
            index,
            query,
            self.embedder.encode_query(query),
            k=k,
            candidates=self.candidates,
            fusion=fusion,
            mask=mask,
        )
        docs = index.store.documents([h.row for h in hits])
        for doc, hit in zip(docs, hits, strict=True):
            doc.metadata.update(hit.metadata(fusion))
        return docs
