"""How fusion settings fare against the better of their two halves, on BEIR folders and
with one side made weaker on purpose: the evidence behind the default (README, *Where the
default comes from*).

A weaker dense side: each query vector is mixed with a random unit vector (``noise``),
which keeps the embedder's own cosine scale. A weaker BM25 side: each query keeps a random
share of its words (``keep``). Nothing is tuned here: every setting is fixed in advance,
and each cell is nDCG@10 minus the better of BM25 and dense alone on that row (negative =
the hybrid loses to its better half), on the folder's train and test queries. Candidates
are fetched as ``ragchains eval retrieval`` fetches them (100 per side) from its index
(built first if missing, as that command builds it).

    python scripts/fusion_stress.py [FOLDER ...] [--as-is-only] [--synthetic N]

With no folder (and no --synthetic), ../shared/data/scifact; the judged sets of
``ragchains.evaluation.judgedsets`` are folders too. ``--synthetic N`` adds recall@10 on the
latency benchmark's synthetic corpus of N chunks (``bench.synthetic``: each query is 4 words
of one chunk; its embeddings cached as the benchmark caches them), with 50 candidates per
side as the benchmark fetches, and exact dense search.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ragchains.evaluation.beirindex import open_corpus
from ragchains.evaluation.datasets import BeirDataset, DatasetError, load_beir
from ragchains.evaluation.retrieval import DEPTH, score_ranking
from ragchains.factory import build_embedder, configure_runtime
from ragchains.retrievers.bm25 import bm25_search
from ragchains.retrievers.dense import dense_search
from ragchains.retrievers.fusion import DEFAULT_FUSION, Candidates, FusionConfig, fused_order
from ragchains.retrievers.searchindex import SearchIndex
from ragchains.settings import Settings

SCENARIOS: dict[str, dict[str, float]] = {
    "as is": {},
    "dense weaker (noise 1.0)": {"noise": 1.0},
    "dense weaker (noise 1.5)": {"noise": 1.5},
    "BM25 weaker (half the words)": {"keep": 0.5},
    "BM25 weaker (a third of the words)": {"keep": 0.35},
    "both weaker (noise 1.0, half the words)": {"noise": 1.0, "keep": 0.5},
}
SETTINGS = {
    f"{DEFAULT_FUSION.describe()} (default)": DEFAULT_FUSION,
    "convex tmm alpha=0.8 (the default before)": FusionConfig(normalization="tmm", alpha=0.8),
    "convex minmax alpha=0.5": FusionConfig(normalization="minmax", alpha=0.5),
    "rrf k=60 1:1": FusionConfig(fusion="rrf"),
}
SPLITS = ("train", "test")


def load_splits(folder: Path) -> dict[str, BeirDataset]:
    """The folder's train and test queries (those it has)."""
    splits = {}
    for split in SPLITS:
        try:
            splits[split] = load_beir(folder, split)
        except DatasetError:
            continue
    if not splits:
        raise SystemExit(f"{folder}: no qrels/train.tsv or qrels/test.tsv")
    return splits


def stress(folder: Path, settings: Settings, scenarios: dict[str, dict[str, float]]) -> list[str]:
    """The folder's table, as Markdown lines."""
    embedder = build_embedder(settings)
    splits = load_splits(folder)
    first = next(iter(splits.values()))
    index, _ = open_corpus(first, None, embedder, hnsw_min_chunks=settings.hnsw_min_chunks)
    assert isinstance(index, SearchIndex)
    ids = index.store.ids()
    queries = [(split, qid, text) for split, d in splits.items() for qid, text in d.queries.items()]
    vectors = [embedder.encode_query(text) for _, _, text in queries]

    def ndcg(
        found: dict[tuple[str, str], Candidates], rank: Callable[[Candidates], list[str]]
    ) -> dict[str, float]:
        return {
            split: float(
                np.mean(
                    [
                        score_ranking(rank(found[(split, q)]), d.qrels[q])["ndcg@10"]
                        for q in d.queries
                    ]
                )
            )
            for split, d in splits.items()
        }

    def side(c: Candidates, ranks: np.ndarray) -> list[str]:
        present = ranks > 0
        return [ids[r] for r in c.rows[present][ranks[present].argsort(kind="stable")].tolist()]

    def pair(values: dict[str, float], signed: bool = False) -> str:
        return " / ".join(f"{values[s]:+.3f}" if signed else f"{values[s]:.3f}" for s in splits)

    counts = ", ".join(f"{len(d.queries)} {s}" for s, d in splits.items())
    lines = [
        f"{folder.name} ({len(ids)} documents; queries: {counts}): nDCG@10 of each half, and of "
        f"each setting minus the better half ({' / '.join(splits)})",
        "",
        "| scenario | BM25 | dense | " + " | ".join(SETTINGS) + " |",
        "|---" * (3 + len(SETTINGS)) + "|",
    ]
    for name, change in scenarios.items():
        words = random.Random(0)
        found = {}
        for n, (split, qid, text) in enumerate(queries):
            if "keep" in change:
                kept = [w for w in text.split() if words.random() < change["keep"]]
                text = " ".join(kept) or text.split()[0]
            vector = vectors[n]
            if "noise" in change:
                g = np.random.default_rng(n).standard_normal(vector.shape[0]).astype(np.float32)
                vector = vector + change["noise"] * g / np.linalg.norm(g)
                vector = vector / np.linalg.norm(vector)
            b = bm25_search(index.bm25, text, DEPTH)
            d = dense_search(index.dense, vector, DEPTH)
            found[(split, qid)] = Candidates.from_lists(b[0], b[1], d[0], d[1])
        bm25 = ndcg(found, lambda c: side(c, c.bm25_rank))
        dense = ndcg(found, lambda c: side(c, c.dense_rank))
        best = {s: max(bm25[s], dense[s]) for s in splits}
        cells = [pair(bm25), pair(dense)]
        for config in SETTINGS.values():
            fused = ndcg(
                found,
                lambda c, config=config: [
                    ids[r] for r in c.rows[fused_order(c, config, DEPTH)[0]].tolist()
                ],
            )
            cells.append(pair({s: fused[s] - best[s] for s in splits}, signed=True))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    return lines


def synthetic(n_docs: int, settings: Settings, queries: int = 200) -> list[str]:
    """Recall@10 on the benchmark's synthetic corpus, as Markdown lines."""
    import faiss

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ is not installed
    from bench.synthetic import embeddings_path, make_corpus
    from ragchains.retrievers.bm25 import build_bm25

    fetch, k = 50, 10  # as bench.retrieval_latency
    embedder = build_embedder(settings)
    corpus = make_corpus(n_docs, queries, model=embedder.name)
    vectors = np.load(embeddings_path(embedder, corpus.texts, "synthetic-docs"), mmap_mode="r")
    dense = faiss.IndexFlatIP(vectors.shape[1])
    dense.add(np.ascontiguousarray(vectors, dtype=np.float32))
    bm25 = build_bm25(corpus.texts)
    found = []
    for query, relevant in zip(corpus.queries, corpus.relevant, strict=True):
        b = bm25_search(bm25, query, fetch)
        d = dense_search(dense, embedder.encode_query(query), fetch)
        found.append((Candidates.from_lists(b[0], b[1], d[0], d[1]), relevant))

    def recall(rank: Callable[[Candidates], list[int]]) -> float:
        return float(np.mean([relevant in rank(c)[:k] for c, relevant in found]))

    def side(c: Candidates, ranks: np.ndarray) -> list[int]:
        present = ranks > 0
        return c.rows[present][ranks[present].argsort(kind="stable")].tolist()

    cells = [
        f"{recall(lambda c: side(c, c.bm25_rank)):.3f}",
        f"{recall(lambda c: side(c, c.dense_rank)):.3f}",
    ]
    for config in SETTINGS.values():
        cells.append(
            f"{recall(lambda c, config=config: c.rows[fused_order(c, config, k)[0]].tolist()):.3f}"
        )
    return [
        f"synthetic ({n_docs:,} chunks, {queries} queries, {fetch} candidates per side): recall@10",
        "",
        "| corpus | BM25 | dense | " + " | ".join(SETTINGS) + " |",
        "|---" * (3 + len(SETTINGS)) + "|",
        f"| synthetic {n_docs:,} | " + " | ".join(cells) + " |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*", type=Path)
    parser.add_argument("--as-is-only", action="store_true", help="no weakened scenarios")
    parser.add_argument("--synthetic", type=int, metavar="N", help="the benchmark's corpus too")
    args = parser.parse_args()
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    configure_runtime(settings)
    scenarios = {"as is": {}} if args.as_is_only else SCENARIOS
    folders = args.folders or ([] if args.synthetic else [Path("../shared/data/scifact")])
    tables = [stress(folder, settings, scenarios) for folder in folders]
    if args.synthetic:
        tables.append(synthetic(args.synthetic, settings))
    print()
    for table in tables:
        print("\n".join(table) + "\n")


if __name__ == "__main__":
    main()
