"""Hybrid retrieval at 10,000 to 1,000,000 chunks: latency, recall@10, build time and peak
memory, ragchains against the stock LangChain pipeline.

Stock = the documented way: BM25Retriever (langchain_community, over rank_bm25),
FAISS.from_embeddings, EnsembleRetriever (langchain_classic). Both pipelines get the same
synthetic corpus, the same precomputed document and query embeddings, the same number of
candidates per retriever, and return Documents for the top 10; each fuses as its code says
(the results name both fusions from the objects that ran). Query encoding is excluded from
both (a lookup) and reported apart.

Each pipeline builds and searches in a process of its own, so each peak RSS is that
pipeline's alone; stock gets ``--stock-timeout`` seconds per size (30 minutes), after which the
table says it did not finish. Also: dense only, exact vs HNSW on slices of the largest corpus,
which sets the HNSW parameters and the default ``hnsw_min_chunks``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings

from bench.common import (
    REPO,
    machine_line,
    median_of,
    peak_rss_mb,
    percentile_ms,
    synthetic_run,
    time_calls,
    write_section,
)
from bench.synthetic import Corpus, cached_embeddings, embeddings_path, make_corpus
from ragchains.retrievers.bm25 import BM25_PARAMS, bm25_search, build_bm25
from ragchains.retrievers.dense import (
    HNSW_EF_CONSTRUCTION,
    HNSW_EF_SEARCH,
    HNSW_M,
    build_faiss,
    dense_search,
)
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.fusion import Candidates
from ragchains.retrievers.hybrid import HybridRetriever, fused_hits
from ragchains.retrievers.indexformat import Chunk
from ragchains.retrievers.indexwriter import IndexContents, write_index
from ragchains.retrievers.searchindex import SearchIndex, load_index

CANDIDATES = 50
K = 10
DENSE_SIZES = (10_000, 25_000, 50_000, 100_000)
DEFAULT_SIZES = "10000,100000,1000000"
STOCK_TIMEOUT_S = 30 * 60
WARM_UP = 10
# The HNSW parameters before issue 28, built once beside the current ones at the largest dense
# size: the build-time ratio is measured in the same run, not quoted.
BEFORE = {"m": 64, "ef_construction": 100, "ef_search": 128}


class PrecomputedQueries(SentenceTransformerEmbedder):
    """Our embedder with query vectors looked up, so timing excludes encoding."""

    def __init__(self, base: SentenceTransformerEmbedder, table: dict[str, np.ndarray]) -> None:
        super().__init__(base.name, backend=base.backend)
        self.table = table

    def encode_query(self, text: str) -> np.ndarray:
        return self.table[text]


class LookupEmbeddings(Embeddings):
    """The stock pipeline's embeddings, with the same precomputed query vectors."""

    def __init__(self, table: dict[str, np.ndarray]) -> None:
        self.table = table

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        raise NotImplementedError("documents are embedded ahead of time")

    def embed_query(self, text: str) -> list[float]:
        return self.table[text].tolist()


def synthetic_fields(groups: int | None = None) -> dict[str, str]:
    """The fields of ``synthetic_chunks``' chunks."""
    fields = {"source": "string", "filename": "string"}
    return {**fields, "group": "string"} if groups else fields


def synthetic_chunks(texts: list[str], groups: int | None = None) -> list[Chunk]:
    """One chunk per synthetic text; with ``groups``, each in one of that many groups (a
    ``group`` field a filter can keep one of)."""
    return [
        Chunk(
            id=f"d{i}",
            text=text,
            metadata={
                "source": "synthetic.txt",
                "filename": "synthetic.txt",
                "citation": f"synthetic.txt#row={i + 1}",
                **({"group": f"g{i % groups}"} if groups else {}),
            },
        )
        for i, text in enumerate(texts)
    ]


def build_parts(
    corpus: Corpus,
    vectors: np.ndarray,
    name: str,
    folder: Path,
    hnsw_min: int,
    *,
    groups: int | None = None,
    chunks: list[Chunk] | None = None,
    backend: str | None = None,
) -> dict[str, Any]:
    """Write the synthetic index (its chunks: ``chunks`` if made already) as an ingest does,
    from its embeddings (by embedder ``name``, and ``backend`` if given): seconds per part,
    the dense part's CPU seconds and what it built."""
    times: dict[str, Any] = {}
    chunks = chunks if chunks is not None else synthetic_chunks(corpus.texts, groups)
    start = time.perf_counter()  # an ingest has its chunks before it builds
    started = time.process_time()
    bm25 = build_bm25(corpus.texts)
    times["bm25_s"] = time.perf_counter() - start
    mark, cpu = time.perf_counter(), time.process_time()
    dense, dense_info = build_faiss(vectors, hnsw_min_chunks=hnsw_min)
    times["dense_s"] = time.perf_counter() - mark
    times["dense_cpu_s"] = time.process_time() - cpu
    mark = time.perf_counter()
    write_index(
        folder,
        IndexContents(
            chunks=chunks,
            vectors=vectors,
            files=[],
            fields=synthetic_fields(groups),
            embedder={
                "name": name,
                "dimension": int(vectors.shape[1]),
                **({"backend": backend} if backend else {}),
            },
            chunking={},
        ),
        bm25=bm25,
        dense=dense,
        dense_info=dense_info,
        bm25_info=BM25_PARAMS,
    )
    times["write_s"] = time.perf_counter() - mark
    times["build_s"] = time.perf_counter() - start
    times["build_cpu_s"] = time.process_time() - started
    times["dense_info"] = dense_info
    return times


def build_ours(
    corpus: Corpus,
    vectors: np.ndarray,
    name: str,
    folder: Path,
    hnsw_min: int,
    *,
    groups: int | None = None,
    chunks: list[Chunk] | None = None,
    backend: str | None = None,
) -> tuple[SearchIndex, float]:
    """The synthetic index (its chunks: ``chunks`` if made already) and its build seconds."""
    built = build_parts(
        corpus, vectors, name, folder, hnsw_min, groups=groups, chunks=chunks, backend=backend
    )
    return _open(folder), built["build_s"]


def _open(folder: Path) -> SearchIndex:
    index = load_index(folder)
    _ = index.columns  # built at load in the product (factory.open_index), so not timed here
    return index


def build_stock(
    corpus: Corpus, vectors: np.ndarray, table: dict[str, np.ndarray]
) -> tuple[Any, float]:
    from langchain_classic.retrievers import EnsembleRetriever
    from langchain_community.retrievers import BM25Retriever
    from langchain_community.vectorstores import FAISS

    start = time.perf_counter()
    docs = [Document(page_content=t, metadata={"id": f"d{i}"}) for i, t in enumerate(corpus.texts)]
    bm25 = BM25Retriever.from_documents(docs, k=CANDIDATES)
    # Rows of the matrix, not lists of Python floats (FAISS.from_embeddings stacks whatever it
    # gets with np.array): a million .tolist() rows would hold 384 million float objects.
    store = FAISS.from_embeddings(
        list(zip(corpus.texts, vectors, strict=True)),  # type: ignore[arg-type]
        embedding=LookupEmbeddings(table),
        metadatas=[d.metadata for d in docs],
    )
    dense = store.as_retriever(search_kwargs={"k": CANDIDATES})
    ensemble = EnsembleRetriever(retrievers=[bm25, dense], weights=[0.5, 0.5], c=60, id_key="id")
    return ensemble, time.perf_counter() - start


def stock_fusion(ensemble: Any) -> str:
    """How the stock EnsembleRetriever fuses, from its own fields."""
    weights = ":".join(f"{w:g}" for w in ensemble.weights)
    return f"weighted RRF c={ensemble.c} bm25:dense={weights}"


def recall_at_10(results: list[list[Document]], corpus: Corpus, key: Any) -> float:
    hits = sum(
        f"d{rel}" in {key(d) for d in docs[:K]}
        for docs, rel in zip(results, corpus.relevant, strict=True)
    )
    return hits / len(results)


def measure(run_query: Any, queries: list[str], repeats: int) -> tuple[float, float, list[Any]]:
    """p50 and p95 wall ms per query (medians over repeats) and the last repeat's results."""
    times, results = measure_cpu(run_query, queries, repeats)
    return times["p50"], times["p95"], results


def measure_cpu(
    run_query: Callable[[Any], Any], queries: Sequence[Any], repeats: int
) -> tuple[dict[str, float], list[Any]]:
    """p50 and p95 of each query's wall time and of the process's CPU time (medians over
    repeats of each percentile), and the last repeat's results: on a shared machine a query waits for a core, and the
    CPU time shows what it costs apart from that wait."""
    runs: dict[str, list[float]] = {"p50": [], "p95": [], "cpu_p50": [], "cpu_p95": []}
    results: list[Any] = []
    for _ in range(repeats):
        wall, cpu, results = [], [], []
        for query in queries:
            start, used = time.perf_counter(), time.process_time()
            results.append(run_query(query))
            cpu.append(time.process_time() - used)
            wall.append(time.perf_counter() - start)
        for name, samples in (("p", wall), ("cpu_p", cpu)):
            runs[f"{name}50"].append(percentile_ms(samples, 50))
            runs[f"{name}95"].append(percentile_ms(samples, 95))
    return {name: median_of(values) for name, values in runs.items()}, results


def _load_average() -> float:
    return os.getloadavg()[0]


# ----------------------------------------------------------------------------- workers
def _load_data(
    data: Path, *, texts: bool = True
) -> tuple[Corpus, np.ndarray, dict[str, np.ndarray]]:
    """The corpus (without its texts unless ``texts``), its embeddings (mapped from the
    cache file, read as used) and the query vectors by query."""
    spec = json.loads((data / "spec.json").read_text(encoding="utf-8"))
    rows = (data / "texts.txt").read_text(encoding="utf-8").split("\n") if texts else []
    corpus = Corpus(texts=rows, queries=spec["queries"], relevant=spec["relevant"])
    vectors = np.load(spec["vectors"], mmap_mode="r", allow_pickle=False)
    q_vectors = np.load(data / "queries.npy", allow_pickle=False)
    return corpus, vectors, dict(zip(corpus.queries, q_vectors, strict=True))


def _report(**fields: Any) -> None:
    """One JSON line on stdout for the parent (it keeps the last; progress lines too)."""
    print(json.dumps(fields), flush=True)


def run_build(data: Path, name: str, backend: str, hnsw_min: int) -> None:
    """Write the index into ``data``/index, as an ingest's last step does."""
    corpus, vectors, _ = _load_data(data)
    load = [_load_average()]
    built = build_parts(corpus, vectors, name, data / "index", hnsw_min, backend=backend)
    load.append(_load_average())
    _report(done=True, build_rss_mb=peak_rss_mb(), build_load=load, **built)


def run_search(data: Path, repeats: int, name: str, backend: str) -> None:
    """Open the index ``run_build`` wrote, as ``ragchains serve`` does, and search it."""
    corpus, _, table = _load_data(data, texts=False)
    index = _open(data / "index")
    retriever = HybridRetriever(
        index=index,
        embedder=PrecomputedQueries(
            SentenceTransformerEmbedder(name, backend=backend),  # type: ignore[arg-type]
            table,
        ),
        k=K,
        candidates=CANDIDATES,
    )
    _warm_up(retriever.invoke, corpus.queries)
    load = [_load_average()]
    timed, results = measure_cpu(retriever.invoke, corpus.queries, repeats)
    load.append(_load_average())
    stages = _stages(index, corpus.queries, table, retriever)
    index.close()
    _report(
        done=True,
        **timed,
        load=load,
        recall=recall_at_10(results, corpus, lambda d: d.id),
        fusion=retriever.fusion_config.describe(),
        stages=stages,
        search_rss_mb=peak_rss_mb(),
        repeats=repeats,
    )


def _stages(
    index: SearchIndex,
    queries: list[str],
    table: dict[str, np.ndarray],
    retriever: HybridRetriever,
) -> dict[str, float]:
    """Median milliseconds of each part of a hybrid search, one query at a time, through
    the functions the retriever calls."""
    fusion = retriever.fusion_config
    parts: dict[str, list[float]] = {"bm25": [], "dense": [], "fusion": [], "documents": []}
    for query in queries:
        marks = [time.perf_counter()]
        b_rows, b_scores = bm25_search(index.bm25, query, CANDIDATES)
        marks.append(time.perf_counter())
        d_rows, d_scores = dense_search(index.dense, table[query], CANDIDATES)
        marks.append(time.perf_counter())
        hits = fused_hits(Candidates.from_lists(b_rows, b_scores, d_rows, d_scores), fusion, K)
        marks.append(time.perf_counter())
        index.store.documents([h.row for h in hits])
        marks.append(time.perf_counter())
        for name, start, end in zip(parts, marks, marks[1:], strict=False):
            parts[name].append(end - start)
    return {name: percentile_ms(samples, 50) for name, samples in parts.items()}


def run_stock(data: Path, repeats: int, deadline: float) -> None:
    """Stock's build, then repeats while another one fits before ``deadline`` (monotonic)."""
    corpus, vectors, table = _load_data(data)
    stock, build = build_stock(corpus, vectors, table)
    del vectors
    gc.collect()
    fusion = stock_fusion(stock)
    _report(built=True, build_s=build, fusion=fusion, rss_mb=peak_rss_mb())
    runs: list[dict[str, float]] = []
    results: list[Any] = []
    _warm_up(stock.invoke, corpus.queries)
    load = [_load_average()]
    for _ in range(repeats):
        start = time.monotonic()
        timed, results = measure_cpu(lambda q: stock.invoke(q)[:K], corpus.queries, 1)
        runs.append(timed)
        if time.monotonic() + (time.monotonic() - start) > deadline:
            break
    load.append(_load_average())
    _report(
        done=True,
        build_s=build,
        **{name: median_of([r[name] for r in runs]) for name in runs[0]},
        load=load,
        recall=recall_at_10(results, corpus, lambda d: d.metadata["id"]),
        fusion=fusion,
        rss_mb=peak_rss_mb(),
        repeats=len(runs),
    )


def _warm_up(run_query: Callable[[str], object], queries: list[str]) -> None:
    """A few queries first, as a serving process has had (first-call costs out of p95)."""
    for query in queries[:WARM_UP]:
        run_query(query)


def _worker(args: argparse.Namespace) -> None:
    if args.worker == "build":
        run_build(args.data, args.embedder, args.backend, args.hnsw_min_chunks)
    elif args.worker == "search":
        run_search(args.data, args.repeats, args.embedder, args.backend)
    else:
        run_stock(args.data, args.repeats, time.monotonic() + args.timeout)


def spawn(
    kind: str, data: Path, repeats: int, *, timeout: float | None, extra: list[str]
) -> dict[str, Any]:
    """Run a worker (its stderr, progress and errors, goes to ours); its last JSON line,
    with ``timed_out`` and (if it did not finish) the last progress it reported. A stock
    worker that fails is reported as such (``failed``: its exit code); ours raises."""
    command = [
        sys.executable,
        "-m",
        "bench.retrieval_latency",
        "--worker",
        kind,
        "--data",
        str(data),
        "--repeats",
        str(repeats),
        *extra,
    ]
    if timeout is not None:
        command += ["--timeout", str(timeout)]
    failed = None
    try:
        done = subprocess.run(
            command, cwd=REPO, stdout=subprocess.PIPE, text=True, timeout=timeout, check=False
        )
        out, timed_out = done.stdout, False
        if done.returncode != 0:
            if kind != "stock":
                raise RuntimeError(f"{kind} worker failed (exit code {done.returncode})")
            failed = done.returncode
    except subprocess.TimeoutExpired as exc:
        raw = exc.stdout or b""
        out, timed_out = raw.decode() if isinstance(raw, bytes) else raw, True
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    result: dict[str, Any] = lines[-1] if lines else {}
    result["timed_out"] = timed_out
    if failed is not None:
        result["failed"] = failed
        result.pop("done", None)
    return result


# ----------------------------------------------------------------------------- dense table
def dense_table(
    vectors: np.ndarray, q_vectors: list[np.ndarray], repeats: int
) -> list[dict[str, Any]]:
    """Exact vs HNSW on the first N vectors: search time (wall and CPU), recall of the exact
    top 10 and top 50, build time (wall and CPU); at the largest size, the parameters before
    issue 28 as well."""
    rows = []
    sizes = [s for s in DENSE_SIZES if s <= len(vectors)]
    for size in sizes:
        sub = np.ascontiguousarray(vectors[:size])
        flat, _ = build_faiss(sub, hnsw_min_chunks=10**12)
        exact, f_res = measure_cpu(
            lambda v, index=flat: dense_search(index, v, CANDIDATES), q_vectors, repeats
        )
        variants: list[tuple[str, bool, Callable[[], Any]]] = [
            (
                f"M={HNSW_M}, efC={HNSW_EF_CONSTRUCTION}, ef={HNSW_EF_SEARCH}",
                False,
                lambda sub=sub: build_faiss(sub, hnsw_min_chunks=1)[0],
            )
        ]
        if size == sizes[-1]:
            variants.append(
                (
                    f"M={BEFORE['m']}, efC={BEFORE['ef_construction']}, "
                    f"ef={BEFORE['ef_search']} (before)",
                    True,
                    lambda sub=sub: _hnsw_before(sub),
                )
            )
        for label, is_before, build in variants:
            start, cpu = time.perf_counter(), time.process_time()
            hnsw = build()
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            approximate, h_res = measure_cpu(
                lambda v, index=hnsw: dense_search(index, v, CANDIDATES), q_vectors, repeats
            )
            rows.append(
                {
                    "size": size,
                    "label": label,
                    "before": is_before,
                    "flat": exact,
                    "hnsw": approximate,
                    "top10": _overlap(f_res, h_res, K),
                    "top50": _overlap(f_res, h_res, CANDIDATES),
                    "build_s": wall,
                    "build_cpu_s": cpu,
                }
            )
            print(_dense_row(rows[-1]), flush=True)
            del hnsw
            gc.collect()
        del flat, sub
        gc.collect()
    return rows


def _dense_row(r: dict[str, Any]) -> str:
    flat, hnsw = r["flat"], r["hnsw"]
    return (
        f"| {r['size']:,} | {r['label']} | {flat['p50']:.2f} ({flat['cpu_p50']:.2f}) | "
        f"{hnsw['p50']:.2f} ({hnsw['cpu_p50']:.2f}) | {flat['cpu_p50'] / hnsw['cpu_p50']:.1f}× | "
        f"{r['top10']:.3f} | {r['top50']:.3f} | {r['build_s']:.1f} s | {r['build_cpu_s']:.1f} s |"
    )


def _hnsw_before(vectors: np.ndarray) -> Any:
    import faiss

    index = faiss.IndexHNSWFlat(vectors.shape[1], BEFORE["m"], faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = BEFORE["ef_construction"]
    index.hnsw.efSearch = BEFORE["ef_search"]
    index.add(vectors)
    return index


def _overlap(exact: list[Any], approximate: list[Any], k: int) -> float:
    return float(
        np.mean(
            [
                len(set(a[0][:k].tolist()) & set(b[0][:k].tolist())) / k
                for a, b in zip(exact, approximate, strict=True)
            ]
        )
    )


# ----------------------------------------------------------------------------- main
def _options() -> argparse.Namespace | None:
    """A worker's options, or None in the parent (whose options synthetic_run reads)."""
    if "--worker" not in sys.argv:
        return None
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", choices=("build", "search", "stock"), required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--repeats", type=int, required=True)
    parser.add_argument("--embedder", default="")
    parser.add_argument("--backend", default="")
    parser.add_argument("--hnsw-min-chunks", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=float(STOCK_TIMEOUT_S))
    return parser.parse_args()


def _seconds(value: float) -> str:
    return f"{value / 60:.1f} min" if value >= 600 else f"{value:.1f} s"


def main() -> None:
    worker = _options()
    if worker is not None:
        _worker(worker)
        return
    args, settings, embedder = synthetic_run(
        __doc__,
        sizes=DEFAULT_SIZES,
        extra=[
            (
                "--stock-timeout",
                {
                    "type": float,
                    "default": STOCK_TIMEOUT_S,
                    "help": "seconds stock LangChain gets per size (build and searches)",
                },
            )
        ],
    )
    rows, notes = [], []
    loads: list[float] = []
    fusions: dict[str, set[str]] = {"ragchains": set(), "stock LangChain": set()}
    sizes = sorted(int(s) for s in args.sizes.split(","))
    # The dense table slices the largest corpus of at most its largest size (else the
    # smallest): the one the HNSW parameters were chosen on.
    sliced = max([n for n in sizes if n <= max(DENSE_SIZES)], default=sizes[0])
    slices: tuple[np.ndarray, list[np.ndarray]] | None = None
    for n in sizes:
        corpus = make_corpus(n, args.queries, model=embedder.name)
        vectors_file = embeddings_path(embedder, corpus.texts, "synthetic-docs")
        q_vectors = cached_embeddings(embedder, corpus.queries, "synthetic-queries")
        encode_samples = time_calls(
            lambda i, queries=corpus.queries: embedder.encode_query(queries[i]), len(corpus.queries)
        )
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp)
            (data / "texts.txt").write_text("\n".join(corpus.texts), encoding="utf-8")
            np.save(data / "queries.npy", q_vectors, allow_pickle=False)
            spec = {
                "queries": corpus.queries,
                "relevant": corpus.relevant,
                "vectors": str(vectors_file),
            }
            (data / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
            named = ["--embedder", embedder.name, "--backend", embedder.backend]
            ours = spawn(
                "build",
                data,
                args.repeats,
                timeout=None,
                extra=[*named, "--hnsw-min-chunks", str(settings.hnsw_min_chunks)],
            )
            ours |= spawn("search", data, args.repeats, timeout=None, extra=named)
            stock = spawn("stock", data, args.repeats, timeout=args.stock_timeout, extra=[])
        loads += [*ours["build_load"], *ours["load"], *stock.get("load", [])]
        fusions["ragchains"].add(ours["fusion"])
        if "fusion" in stock:
            fusions["stock LangChain"].add(stock["fusion"])
        rows += [_stock_row(n, stock, args.stock_timeout), _ours_row(n, ours)]
        notes.append(_note(n, ours, stock, percentile_ms(encode_samples, 50)))
        print(rows[-2], rows[-1], notes[-1], sep="\n", flush=True)
        if n == sliced:
            head = np.load(vectors_file, mmap_mode="r")[: max(DENSE_SIZES)]
            slices = (np.array(head), list(q_vectors))
        del corpus
        gc.collect()

    assert slices is not None
    dense = dense_table(slices[0], slices[1], args.repeats)
    body = "\n".join(
        [
            "## Hybrid retrieval latency (`python -m bench.retrieval_latency`)",
            "",
            machine_line(),
            "",
            f"Synthetic corpus (one relevant document per query), {args.queries} queries, "
            f"median of {args.repeats} repeats; both pipelines fetch {CANDIDATES} candidates per "
            f"retriever and return the top {K} as Documents. Fusion (as each pipeline's objects "
            f"report it): ragchains {_names(fusions['ragchains'])} "
            "(`HybridRetriever.fusion_config`, the default: no fusion setting, no `fusion.json`); "
            f"stock LangChain {_names(fusions['stock LangChain'])} (`EnsembleRetriever`). Same "
            "precomputed embeddings; query encoding excluded. Build = index construction from "
            "embeddings (ragchains: BM25, FAISS and the index folder written). Each pipeline "
            "runs in processes of its own, so a peak RSS is that pipeline's alone, corpus and "
            "embeddings (mapped from the cache file) included: stock builds and searches in "
            "one; ragchains builds in one, as an ingest writes its index, and searches in "
            "another that opens the index as `ragchains serve` does (peak RSS = that one's; "
            "the build's beside it). Stock gets "
            f"{_seconds(args.stock_timeout)} per size.",
            "",
            "| chunks | pipeline | p50 ms | p95 ms | CPU p50 ms | CPU p95 ms | recall@10 | build "
            "| peak RSS |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
            *notes,
            f"- Load average (1 min) at the start and end of each build and search phase: "
            f"{min(loads):.1f} to {max(loads):.1f} on {os.cpu_count()} cores (other jobs share "
            "the machine). Wall times include waiting for a core; the CPU columns (the "
            "process's CPU time per query, all its threads) do not.",
            "",
            f"### Dense only: exact (flat) vs HNSW (M={HNSW_M}, efConstruction="
            f"{HNSW_EF_CONSTRUCTION}, efSearch={HNSW_EF_SEARCH})",
            "",
            f"First N vectors of the {sliced:,}-chunk corpus, top {CANDIDATES} per query (the fusion "
            f"candidates); builds use the machine's {_threads()} OpenMP threads (CPU = user + "
            "system time of the process). Indexes with at least `hnsw_min_chunks` = "
            f"{settings.hnsw_min_chunks:,} chunks use HNSW.",
            "",
            f"| chunks | HNSW | flat p50 ms (CPU) | HNSW p50 ms (CPU) | CPU speed-up | recall of "
            f"exact top-{K} | of exact top-{CANDIDATES} | HNSW build | build CPU |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
            *[_dense_row(r) for r in dense],
            "",
            *_dense_notes(dense, settings.hnsw_min_chunks),
        ]
    )
    write_section("retrieval_latency", body)


def _names(found: set[str]) -> str:
    return " / ".join(f"**{f}**" for f in sorted(found)) or "(not measured)"


def _threads() -> int:
    import faiss

    return int(faiss.omp_get_max_threads())


def _dense_notes(dense: list[dict[str, Any]], hnsw_min: int) -> list[str]:
    """What the dense table shows, from its numbers: the build against the parameters
    before, and where exact search stops being cheap."""
    if not dense:
        return []
    notes = []
    now = [r for r in dense if not r["before"]]
    before = [r for r in dense if r["before"]]
    if before:
        b, a = before[-1], next(r for r in now if r["size"] == before[-1]["size"])
        notes.append(
            f"- At {a['size']:,} chunks the HNSW build takes {a['build_cpu_s']:.1f} s of CPU "
            f"({a['build_s']:.1f} s wall) against {b['build_cpu_s']:.1f} s ({b['build_s']:.1f} "
            f"s) with the parameters before, **{b['build_cpu_s'] / a['build_cpu_s']:.1f}× "
            f"less CPU**; it finds {a['top10']:.3f} of the exact top {K} and {a['top50']:.3f} of "
            f"the exact top {CANDIDATES} against {b['top10']:.3f} and {b['top50']:.3f}, at "
            f"{a['hnsw']['cpu_p50']:.2f} ms of CPU per search against {b['hnsw']['cpu_p50']:.2f}."
        )
    flat = ", ".join(f"{r['flat']['cpu_p50']:.2f} ms at {r['size']:,}" for r in now)
    notes.append(
        f"- Why `hnsw_min_chunks` = {hnsw_min:,}: exact search costs CPU in proportion to the "
        f"chunks ({flat}) and loses nothing; HNSW costs "
        + ", ".join(f"{r['hnsw']['cpu_p50']:.2f} ms" for r in now)
        + " at the same sizes and a build, and fusion with BM25 makes up for most candidates "
        "it misses."
    )
    return notes


def _ours_row(n: int, r: dict[str, Any]) -> str:
    return (
        f"| {n:,} | ragchains | {r['p50']:.2f} | {r['p95']:.2f} | {r['cpu_p50']:.2f} | "
        f"{r['cpu_p95']:.2f} | {r['recall']:.3f} | {_seconds(r['build_s'])} "
        f"({_seconds(r['build_cpu_s'])} CPU) | {r['search_rss_mb']:,.0f} MB (build: "
        f"{r['build_rss_mb']:,.0f} MB) |"
    )


def _stock_row(n: int, r: dict[str, Any], timeout: float) -> str:
    if r.get("done"):
        return (
            f"| {n:,} | stock LangChain | {r['p50']:.2f} | {r['p95']:.2f} | {r['cpu_p50']:.2f} | "
            f"{r['cpu_p95']:.2f} | {r['recall']:.3f} | {_seconds(r['build_s'])} | "
            f"{r['rss_mb']:,.0f} MB |"
        )
    # Killed at the timeout, or failed: what it reported before (its build, if it finished).
    built = _seconds(r["build_s"]) if r.get("built") else "unfinished"
    rss = f"{r['rss_mb']:,.0f} MB after the build" if r.get("built") else ""
    what = (
        f"failed (exit code {r['failed']})"
        if "failed" in r
        else f"did not finish within {_seconds(timeout)}"
    )
    return f"| {n:,} | stock LangChain | {what} | | | | | {built} | {rss} |"


def _note(n: int, ours: dict[str, Any], stock: dict[str, Any], encode_p50: float) -> str:
    s = ours["stages"]
    info = ours["dense_info"]
    kind = info["kind"] if info["kind"] == "flat" else f"{info['kind']} M={info['m']}"
    parts = [
        f"- {n:,} chunks: ragchains build = BM25 {ours['bm25_s']:.1f} s + FAISS ({kind}) "
        f"{ours['dense_s']:.1f} s ({ours['dense_cpu_s']:.1f} s CPU) + writing "
        f"{ours['write_s']:.1f} s; a search's median parts: BM25 {s['bm25']:.2f} ms, dense "
        f"{s['dense']:.2f} ms, fusion {s['fusion']:.2f} ms, documents {s['documents']:.2f} ms."
    ]
    if stock.get("done"):
        parts.append(
            f"p50 = **1/{stock['p50'] / ours['p50']:.0f}** of stock; recall@10 "
            f"{ours['recall']:.3f} vs {stock['recall']:.3f}"
            + (
                f" (stock: {stock['repeats']} repeat)."
                if stock["repeats"] < ours["repeats"]
                else "."
            )
        )
    parts.append(f"Query encoding (excluded above): p50 {encode_p50:.1f} ms.")
    return " ".join(parts)


if __name__ == "__main__":
    main()
