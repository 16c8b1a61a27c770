"""How fixed fusion settings fare when one side is much weaker than the other: a stress
test of the default on a BEIR folder (SciFact by default), with synthetic weaker sides.

A weaker dense side: each query vector is mixed with a random unit vector (``noise``),
which keeps the embedder's own cosine scale. A weaker BM25 side: each query keeps a random
share of its words (``keep``). Nothing is tuned here: every setting is fixed in advance,
and each row reports nDCG@10 minus the better of BM25 and dense alone (negative = the
hybrid loses to its better half). Uses the `eval retrieval` index (build it first).

    python scripts/fusion_stress.py [../shared/data/scifact]
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ragchains.evaluation.beirindex import default_index_dir
from ragchains.evaluation.datasets import load_beir
from ragchains.evaluation.retrieval import DEPTH, score_ranking
from ragchains.factory import build_embedder, configure_runtime
from ragchains.retrievers.bm25 import bm25_search
from ragchains.retrievers.dense import dense_search
from ragchains.retrievers.fusion import Candidates, FusionConfig, fused_order
from ragchains.retrievers.searchindex import load_index
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
    "RRF k=60 1:1": FusionConfig(fusion="rrf"),
    "convex tmm 0.8 (default)": FusionConfig(fusion="convex", normalization="tmm", alpha=0.8),
    "convex minmax 0.5": FusionConfig(fusion="convex", normalization="minmax", alpha=0.5),
}


def main(folder: Path) -> None:
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    configure_runtime(settings)
    embedder = build_embedder(settings)
    splits = {split: load_beir(folder, split) for split in ("train", "test")}
    index = load_index(
        default_index_dir(splits["test"], embedder.backend), embedder_name=embedder.name
    )
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

    print(f"nDCG@10 minus the better half on {folder.name} (train / test)\n")
    print("| scenario | BM25 | dense | " + " | ".join(SETTINGS) + " |")
    print("|---" * (3 + len(SETTINGS)) + "|")
    for name, change in SCENARIOS.items():
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
        cells = [
            f"{bm25['train']:.3f} / {bm25['test']:.3f}",
            f"{dense['train']:.3f} / {dense['test']:.3f}",
        ]
        for config in SETTINGS.values():
            fused = ndcg(
                found,
                lambda c, config=config: [
                    ids[r] for r in c.rows[fused_order(c, config, DEPTH)[0]].tolist()
                ],
            )
            cells.append(" / ".join(f"{fused[s] - best[s]:+.3f}" for s in splits))
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/scifact"))
