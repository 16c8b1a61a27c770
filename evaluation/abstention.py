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
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from ragchains.evaluation.beirindex import load_queries, open_corpus
from ragchains.evaluation.datasets import BeirDataset
from ragchains.evaluation.plots import plot_sweep
from ragchains.evaluation.retrieval import hybrid_params
from ragchains.evaluation.runs import RunWriter, run_dir
from ragchains.factory import build_compressor, build_embedder, build_retriever
from ragchains.retrievers.compressors import RerankCompressor
from ragchains.retrievers.hybrid import HybridRetriever, hybrid_search
from ragchains.settings import Settings


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


@dataclass
class AbstentionRun:
    """A finished `eval abstention`: its run folder and what it recommends."""

    path: Path
    scorer: str  # the compressor's kind (cross-encoder, embedding-similarity)
    current: float  # the threshold in use
    now: SweepPoint  # the rates at ``current``
    chosen: SweepPoint  # the recommended threshold and its rates
    requery_below: float  # the recommended re-query threshold
    requery_share: float


def run_abstention(
    settings: Settings,
    dataset: Path,
    *,
    split: str,
    index: Path | str | None,
    max_false_abstain: float,
    requery_share: float,
    step: float,
    out: Path | None,
    limit: int | None,
    progress: bool = True,
    say: Callable[[str], None] = print,
) -> AbstentionRun:
    """Sweep the configured compressor's threshold over the first ``limit`` judged queries
    of ``dataset``'s ``split`` (its index built or reused first); recommend a threshold
    (``recommend``) and a re-query threshold no lower. Writes the run folder and sweep.png."""
    data = load_queries(dataset, split, limit)
    out = run_dir(out, "abstention", data.name)
    embedder = build_embedder(settings)
    search_index, location = open_corpus(
        data,
        index,
        embedder,
        hnsw_min_chunks=settings.hnsw_min_chunks,
        progress=progress,
        say=say,
    )
    retriever = build_retriever(settings, search_index, embedder)
    compressor = build_compressor(settings, embedder, search_index)
    status = compressor.status()
    current = status["threshold"]
    config = {
        "kind": "abstention",
        "label": f"{data.name}/{status['kind']}",
        "dataset": str(dataset),
        "split": split,
        "queries": len(data.queries),
        "index": str(location),
        "retriever": {"kind": "hybrid", **hybrid_params(retriever)},
        "compressor": status,
        "max_false_abstain": max_false_abstain,
        "requery_share": requery_share,
    }
    with RunWriter(out, config) as writer:
        answerable, unanswerable = best_scores(
            data,
            # A store's retriever cannot mask documents: --store fails here, as it always has.
            retriever,  # type: ignore[arg-type]
            compressor,
            on_item=writer.add,
            progress=progress,
        )
        points = sweep(
            answerable, unanswerable, default_thresholds([*answerable, *unanswerable], step)
        )
        chosen = recommend(points, max_false_abstain)
        requery_below = max(requery_threshold(answerable, requery_share, step), chosen.threshold)
        (now,) = sweep(answerable, unanswerable, [current])
        plot_sweep(
            points,
            chosen,
            current,
            writer.extra_file("sweep.png"),
            f"{data.name}: {status['kind']} ({status['model']})",
        )
        metrics = {
            "threshold": current,
            "abstain_rate": now.abstain_rate,
            "false_abstain_rate": now.false_abstain_rate,
            "recommended_threshold": chosen.threshold,
            "recommended_abstain_rate": chosen.abstain_rate,
            "recommended_false_abstain_rate": chosen.false_abstain_rate,
            "recommended_requery_threshold": requery_below,
        }
        path = writer.finish(
            {
                "count": writer.count,
                "metrics": metrics,
                "sweep": [p.as_dict() for p in points],
                "item_metrics": ["best_score_answerable", "best_score_unanswerable"],
                "item_outputs": [],
            }
        )
    return AbstentionRun(path, status["kind"], current, now, chosen, requery_below, requery_share)
