"""BM25 for a caller with an access view (issue 15): what scoring with the statistics of the
rows the caller may read costs, against the whole index's precomputed scores.

A keyed caller's BM25 scores are those of an index of only the rows it may read (so neither a
score nor the order tells of a hidden row). bm25s stores finished scores over the whole
index; the caller's are recomputed per query word from them (``bm25._scores_among``). Over the
synthetic corpus, half its rows readable, the top 50 rows per query:

- ``whole``: the whole index's scores, no mask (the baseline, measured in the same run);
- ``masked``: the whole index's scores, then the caller's mask (what ran before: it leaks);
- ``caller``: the caller's own statistics, then the mask (what runs now).

    python -m bench.access_scoring            # writes its section of bench/RESULTS.md
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from bench.common import (
    machine_line,
    median_of,
    percentile_ms,
    synthetic_run,
    time_calls,
    write_section,
)
from bench.synthetic import make_corpus
from ragchains.retrievers.bm25 import bm25_search, build_bm25

FETCH = 50
READABLE = 0.5


def _cases(model: Any, queries: list[str], readers: np.ndarray) -> dict[str, Callable[[int], Any]]:
    return {
        "whole": lambda i: bm25_search(model, queries[i], FETCH),
        "masked": lambda i: bm25_search(model, queries[i], FETCH, readers),
        "caller": lambda i: bm25_search(model, queries[i], FETCH, readers, readers),
    }


def main() -> None:
    args, _, embedder = synthetic_run(__doc__)
    lines = [
        "## BM25 for a caller with an access view",
        "",
        f"{machine_line()}. Top {FETCH} rows per query, {READABLE:.0%} of rows readable, "
        f"{args.queries} queries, median of {args.repeats} repeats.",
        "",
        "| chunks | whole p50 / p95 ms | masked p50 ms | caller p50 / p95 ms | caller / whole |",
        "|---:|---:|---:|---:|---:|",
    ]
    for n in (int(s) for s in args.sizes.split(",")):
        corpus = make_corpus(n, args.queries, model=embedder.name)
        model = build_bm25(corpus.texts)
        readers = np.random.default_rng(3).random(n) < READABLE
        cases = _cases(model, corpus.queries, readers)
        p50: dict[str, list[float]] = {name: [] for name in cases}
        p95: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.repeats):
            for name, run in cases.items():  # interleaved: the same machine load for each
                samples = time_calls(run, len(corpus.queries))
                p50[name].append(percentile_ms(samples, 50))
                p95[name].append(percentile_ms(samples, 95))
        med = {name: median_of(v) for name, v in p50.items()}
        med95 = {name: median_of(v) for name, v in p95.items()}
        lines.append(
            f"| {n:,} | {med['whole']:.2f} / {med95['whole']:.2f} | {med['masked']:.2f} | "
            f"{med['caller']:.2f} / {med95['caller']:.2f} | {med['caller'] / med['whole']:.2f}x |"
        )
        print(lines[-1], flush=True)
    write_section("access_scoring", "\n".join(lines))


if __name__ == "__main__":
    main()
