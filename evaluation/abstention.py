"""Abstention: does the compressor's threshold let through answerable questions only?

A chat turn abstains, without asking the LLM, when no retrieved chunk scores at least the
compressor threshold. So per question only the best compressor score matters: at threshold
t it abstains iff best < t. Each judged BEIR query is asked twice:

* answerable: over the whole corpus;
* unanswerable: with its relevant documents taken out of the search (a mask over the index,
  the same mechanism as metadata filters; BM25's corpus statistics still count them, which
  moves scores negligibly on a corpus of thousands).

Sweeping t gives the abstain rate on unanswerable questions (want high) and the
false-abstain rate on answerable ones (want low).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm import tqdm

from ragchains.evaluation.datasets import BeirDataset
from ragchains.retrievers.compressors import RerankCompressor
from ragchains.retrievers.hybrid import HybridRetriever, hybrid_search


@dataclass(frozen=True)
class SweepPoint:
    threshold: float
    abstain_rate: float  # on unanswerable questions
    false_abstain_rate: float  # on answerable questions

    def as_dict(self) -> dict[str, float]:
        return {
            "threshold": self.threshold,
            "abstain_rate": self.abstain_rate,
            "false_abstain_rate": self.false_abstain_rate,
        }


def best_scores(
    dataset: BeirDataset,
    retriever: HybridRetriever,
    compressor: RerankCompressor,
    *,
    on_item: Callable[[dict[str, Any]], None],
    progress: bool = True,
) -> tuple[list[float], list[float]]:
    """The best compressor score over the retriever's top k for each query, with and without
    its relevant documents (-inf when nothing is retrieved)."""
    index = retriever.index.pinned()
    rows = index.store.rows(dataset.doc_ids)
    answerable: list[float] = []
    unanswerable: list[float] = []
    for qid, query in tqdm(
        dataset.queries.items(), desc="queries", unit="query", disable=not progress
    ):
        removed = [rows[d] for d, grade in dataset.qrels[qid].items() if grade > 0 and d in rows]
        mask = np.ones(len(index), dtype=bool)
        mask[removed] = False
        vector = retriever.embedder.encode_query(query)
        pair = []
        for allowed in (None, mask):
            hits = hybrid_search(
                index,
                query,
                vector,
                k=retriever.k,
                candidates=retriever.candidates,
                fusion=retriever.fusion_config,
                mask=allowed,
            )
            docs = index.store.documents([h.row for h in hits])
            best = compressor.rerank(docs, query, top_n=1, threshold=-np.inf).best_score
            pair.append(float("-inf") if best is None else best)
        answerable.append(pair[0])
        unanswerable.append(pair[1])
        on_item(
            {
                "id": qid,
                "query": query,
                "best_score_answerable": pair[0],
                "best_score_unanswerable": pair[1],
                "removed_documents": len(removed),
            }
        )
    return answerable, unanswerable


def sweep(
    answerable: Sequence[float], unanswerable: Sequence[float], thresholds: Sequence[float]
) -> list[SweepPoint]:
    """Abstain and false-abstain rates at each threshold (abstain iff best score < t)."""
    a = np.asarray(answerable, dtype=np.float64)
    u = np.asarray(unanswerable, dtype=np.float64)
    return [
        SweepPoint(
            float(t),
            float(np.mean(u < t)) if u.size else float("nan"),
            float(np.mean(a < t)) if a.size else float("nan"),
        )
        for t in thresholds
    ]


def default_thresholds(scores: Sequence[float], step: float = 0.01) -> list[float]:
    """A grid over the observed scores, on round numbers."""
    finite = [s for s in scores if np.isfinite(s)]
    if not finite:
        return [0.0]
    low = np.floor(min(finite) / step) * step
    high = np.ceil(max(finite) / step) * step + step
    return [round(float(t), 6) for t in np.arange(low, high + step / 2, step)]


def recommend(points: Sequence[SweepPoint], max_false_abstain: float) -> SweepPoint:
    """The threshold that abstains most on unanswerable questions while wrongly abstaining
    on at most ``max_false_abstain`` of the answerable ones (ties: the lowest threshold)."""
    allowed = [p for p in points if p.false_abstain_rate <= max_false_abstain]
    if not allowed:  # cannot happen with a grid starting below every score; be safe
        return min(points, key=lambda p: p.false_abstain_rate)
    return max(allowed, key=lambda p: (p.abstain_rate, -p.threshold))


def requery_threshold(answerable: Sequence[float], share: float, step: float = 0.01) -> float:
    """The score below which ``share`` of the answerable questions' best scores fall, on the
    sweep's grid: a chat turn scoring lower asks once for a better query, so about that share
    of answerable turns pay for one more LLM call."""
    finite = np.asarray([s for s in answerable if np.isfinite(s)], dtype=np.float64)
    if not finite.size:
        return 0.0
    # The epsilon keeps a quantile that lies on the grid (0.35 / 0.01 = 34.999…) on it.
    return round(float(np.floor(np.quantile(finite, share) / step + 1e-9) * step), 6)
