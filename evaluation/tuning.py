"""Tuning the hybrid retriever's fusion on judged queries: sweep on one split, report on
another.

Each query's BM25 and dense candidate lists are computed once (as the hybrid retriever
computes them); every fusion setting is then fused in memory from those lists with the
retriever's own ``fuse``, so a setting's figures here are the figures ``ragchains eval
retrieval`` gives it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ragchains.evaluation import SetupError
from ragchains.evaluation.beirindex import load_queries, open_corpus
from ragchains.evaluation.datasets import BeirDataset
from ragchains.evaluation.plots import plot_fusion_sweep
from ragchains.evaluation.retrieval import DEPTH, RETRIEVAL_METRICS, hybrid_params, score_ranking
from ragchains.evaluation.runs import RunWriter, run_dir
from ragchains.factory import build_embedder, build_retriever
from ragchains.retrievers.fusion import (
    DEFAULT_FUSION,
    NORMALIZATIONS,
    Candidates,
    FusionConfig,
    fused_order,
)
from ragchains.retrievers.fusionfile import fusion_json, write_fusion
from ragchains.retrievers.hybrid import HybridRetriever, search_candidates
from ragchains.retrievers.searchindex import SearchIndex
from ragchains.settings import Settings

HEADLINE = "ndcg@10"
SIDES = ("bm25", "dense")
# A setting within this much nDCG@10 of the best on the tuning split counts as on the
# optimum's plateau: the sweep reports how wide it is, so a reader can tell a sharp,
# split-specific optimum from a flat, safe one.
PLATEAU = 0.005
ALPHAS = tuple(round(0.05 * i, 2) for i in range(21))
RRF_KS = (5, 10, 20, 40, 60, 100)
# (bm25_weight, dense_weight): from BM25 alone to dense alone, 1:1 in the middle.
RRF_WEIGHTS = (
    (1.0, 0.0),
    (1.0, 0.25),
    (1.0, 0.5),
    (1.0, 0.75),
    (1.0, 1.0),
    (0.75, 1.0),
    (0.5, 1.0),
    (0.25, 1.0),
    (0.0, 1.0),
)


def default_grid(base: FusionConfig = DEFAULT_FUSION) -> list[FusionConfig]:
    """The settings swept: convex (zscore, tmm and minmax) over alpha 0-1 by 0.05, and RRF over
    ``RRF_KS`` x ``RRF_WEIGHTS``. ``base`` (the setting in use) comes first, so it wins ties."""
    grid = [base]
    for normalization in NORMALIZATIONS:
        grid += [
            FusionConfig(fusion="convex", normalization=normalization, alpha=a) for a in ALPHAS
        ]
    for rrf_k in RRF_KS:
        grid += [
            FusionConfig(fusion="rrf", rrf_k=rrf_k, bm25_weight=b, dense_weight=d)
            for b, d in RRF_WEIGHTS
        ]
    return _unique(grid)


def _unique(configs: Iterable[FusionConfig]) -> list[FusionConfig]:
    """First of each group of settings that rank identically (unused fields ignored)."""
    seen: set[str] = set()
    out = []
    for config in configs:
        key = repr(sorted(config.effective().items()))
        if key not in seen:
            seen.add(key)
            out.append(config)
    return out


@dataclass
class Split:
    """One judged split's queries with their candidate lists, ready to fuse."""

    name: str
    qrels: dict[str, dict[str, float]]
    candidates: dict[str, Candidates]
    ids: list[str]  # chunk id of each index row (= document id in a BEIR index)

    def ranking(self, qid: str, config: FusionConfig, depth: int = DEPTH) -> list[str]:
        found = self.candidates[qid]
        order, _ = fused_order(found, config, depth)
        return [self.ids[row] for row in found.rows[order].tolist()]

    def side_ranking(self, qid: str, side: str, depth: int = DEPTH) -> list[str]:
        """BM25's or dense's own ranking, as its retriever alone returns it."""
        found = self.candidates[qid]
        ranks = found.bm25_rank if side == "bm25" else found.dense_rank
        present = ranks > 0
        rows = found.rows[present][ranks[present].argsort(kind="stable")][:depth]
        return [self.ids[row] for row in rows.tolist()]

    def mean_metrics(self, rank: Callable[[str], list[str]]) -> dict[str, float]:
        totals = dict.fromkeys(RETRIEVAL_METRICS, 0.0)
        for qid in self.candidates:
            for name, value in score_ranking(rank(qid), self.qrels[qid]).items():
                totals[name] += value
        n = max(len(self.candidates), 1)
        return {name: total / n for name, total in totals.items()}

    def evaluate(self, config: FusionConfig) -> dict[str, float]:
        return self.mean_metrics(lambda qid: self.ranking(qid, config))

    def evaluate_side(self, side: str) -> dict[str, float]:
        return self.mean_metrics(lambda qid: self.side_ranking(qid, side))


def collect_split(
    dataset: BeirDataset,
    retriever: HybridRetriever,
    *,
    depth: int = DEPTH,
    ids: list[str] | None = None,
    progress: bool = True,
) -> Split:
    """Every judged query's BM25 and dense lists, fetched as ``eval retrieval`` fetches them
    (``max(candidates, depth)`` from each retriever)."""
    index = retriever.index.pinned()
    fetch = max(retriever.candidates, depth)
    candidates = {}
    for qid, query in tqdm(
        dataset.queries.items(),
        desc=f"searching {dataset.split}",
        unit="query",
        disable=not progress,
    ):
        vector = retriever.embedder.encode_query(query)
        candidates[qid] = search_candidates(index, query, vector, fetch=fetch)
    return Split(dataset.split, dataset.qrels, candidates, ids or index.store.ids())


@dataclass
class SweepPoint:
    config: FusionConfig
    metrics: dict[str, dict[str, float]]  # split name -> metric -> mean

    def item(self) -> dict[str, Any]:
        """One line of the run's items.jsonl."""
        flat = {
            f"{metric}_{split}": value
            for split, values in self.metrics.items()
            for metric, value in values.items()
        }
        return {"id": self.config.describe(), **self.config.effective(), **flat}


@dataclass
class TuneResult:
    tune: str  # split names
    report: str
    points: list[SweepPoint]
    best: SweepPoint
    current: SweepPoint  # the setting in use before tuning
    sides: dict[str, dict[str, dict[str, float]]]  # bm25 / dense -> split -> metrics
    plateau: dict[str, Any] = field(default_factory=dict)

    def headline(self) -> dict[str, float]:
        """nDCG@10 of the tuned and current settings and of each retriever alone, per split."""
        out = {}
        for who, point_metrics in (
            ("tuned", self.best.metrics),
            ("current", self.current.metrics),
            *((side, self.sides[side]) for side in SIDES),
        ):
            for split in (self.tune, self.report):
                out[f"{who}@{split}"] = point_metrics[split][HEADLINE]
        return out


def sweep(
    tune: Split,
    report: Split,
    configs: Sequence[FusionConfig],
    *,
    current: FusionConfig,
    progress: bool = True,
) -> TuneResult:
    """Every setting on both splits; the best on ``tune`` by nDCG@10 (the earliest of equals)."""
    points = []
    for config in tqdm(configs, desc="fusion settings", unit="setting", disable=not progress):
        points.append(SweepPoint(config, {s.name: s.evaluate(config) for s in (tune, report)}))
    best = max(points, key=lambda p: p.metrics[tune.name][HEADLINE])  # max keeps the first
    now = next((p for p in points if p.config == current), None)
    if now is None:
        now = SweepPoint(current, {s.name: s.evaluate(current) for s in (tune, report)})
    sides = {side: {s.name: s.evaluate_side(side) for s in (tune, report)} for side in SIDES}
    return TuneResult(
        tune.name, report.name, points, best, now, sides, plateau_of(points, best, tune.name)
    )


def plateau_of(points: Sequence[SweepPoint], best: SweepPoint, split: str) -> dict[str, Any]:
    """For a convex optimum: the alphas of the same normalisation within ``PLATEAU`` of it."""
    if best.config.fusion != "convex":
        return {}
    top = best.metrics[split][HEADLINE]
    near = sorted(
        p.config.alpha
        for p in points
        if p.config.fusion == "convex"
        and p.config.normalization == best.config.normalization
        and p.metrics[split][HEADLINE] >= top - PLATEAU
    )
    return {"normalization": best.config.normalization, "alphas": near, "within": PLATEAU}


def env_lines(config: FusionConfig) -> list[str]:
    """The settings that select ``config`` (what ``factory.build_retriever`` reads)."""
    if config.fusion == "convex":
        return [
            "RAGCHAINS_FUSION=convex",
            f"RAGCHAINS_FUSION_NORMALIZATION={config.normalization}",
            f"RAGCHAINS_FUSION_ALPHA={config.alpha:g}",
        ]
    return [
        "RAGCHAINS_FUSION=rrf",
        f"RAGCHAINS_RRF_K={config.rrf_k}",
        f"RAGCHAINS_BM25_WEIGHT={config.bm25_weight:g}",
        f"RAGCHAINS_DENSE_WEIGHT={config.dense_weight:g}",
    ]


@dataclass
class TuneRun:
    """A finished `eval tune`: its run folder, the sweep, and the recommendation's origin."""

    path: Path
    result: TuneResult
    current: FusionConfig  # the setting in use before tuning
    provenance: dict[str, Any]  # stored beside the recommendation in fusion.json

    @property
    def best(self) -> FusionConfig:
        return self.result.best.config

    def apply(self, index_dir: Path) -> Path:
        """Write the recommendation as ``index_dir``'s fusion.json (its retriever's default)."""
        return write_fusion(index_dir, self.best, self.provenance)


def run_tune(
    settings: Settings,
    dataset: Path,
    *,
    split: str,
    tune_split: str,
    index: Path | str | None,
    out: Path | None,
    limit: int | None,
    progress: bool = True,
    say: Callable[[str], None] = print,
) -> TuneRun:
    """Sweep ``default_grid`` on ``tune_split`` and report on ``split`` (the first ``limit``
    queries of each), over the dataset's index folder (built or reused first). The run
    folder holds the sweep (an item per setting), sweep.png and fusion.json."""
    tune_data = load_queries(dataset, tune_split, limit)
    data = load_queries(dataset, split, limit)
    out = run_dir(out, "tune", data.name)
    embedder = build_embedder(settings)
    if isinstance(index, str):
        raise SetupError("eval tune reads an index folder; pass --index DIR, not a store")
    search_index, location = open_corpus(
        data,
        index,
        embedder,
        hnsw_min_chunks=settings.hnsw_min_chunks,
        progress=progress,
        say=say,
    )
    assert isinstance(search_index, SearchIndex)  # a folder, never a store (refused above)
    retriever = build_retriever(settings, search_index, embedder)
    current = retriever.fusion_config
    ids = search_index.store.ids()
    tune = collect_split(tune_data, retriever, ids=ids, progress=progress)
    report = collect_split(data, retriever, ids=ids, progress=progress)
    config = {
        "kind": "tune",
        "label": f"{data.name}/fusion",
        "dataset": str(dataset),
        "tune_split": tune_split,
        "split": split,
        "queries": {tune_split: len(tune_data.queries), split: len(data.queries)},
        "documents": len(data.doc_ids),
        "index": str(location),
        "embedder": embedder.name,
        "retriever": {"kind": "hybrid", **hybrid_params(retriever)},
        "metric": "ndcg@10 (the others are in items.jsonl)",
    }
    with RunWriter(out, config) as writer:
        result = sweep(tune, report, default_grid(current), current=current, progress=progress)
        for point in result.points:
            writer.add(point.item())
        best = result.best.config
        provenance = {
            "dataset": str(dataset),
            "tuned_on": tune_split,
            "reported_on": split,
            "ndcg@10": result.best.metrics,
            "replaces": current.describe(),
        }
        writer.extra_file("fusion.json").write_text(fusion_json(best, provenance), "utf-8")
        plot_fusion_sweep(
            result,
            writer.extra_file("sweep.png"),
            f"{data.name}: nDCG@10 by fusion setting ({tune_split} solid, {split} dashed)",
        )
        path = writer.finish(
            {
                "count": writer.count,
                "metrics": result.headline(),
                "recommended": best.model_dump(),
                "recommended_label": best.describe(),
                "current": current.describe(),
                "plateau": result.plateau,
                "item_metrics": [f"ndcg@10_{tune_split}", f"ndcg@10_{split}"],
                "item_outputs": [],
            }
        )
    return TuneRun(path, result, current, provenance)
