"""Ingest throughput with each embedder backend, the embedder's raw batch throughput, query
encoding latency, index build time, peak RSS.

A synthetic folder of Markdown files is ingested with the real pipeline (loading, chunking,
embedding, BM25 + FAISS, atomic write), once per repeat with each backend: torch (fp32, the
baseline: what ingest ran before the int8 backend) and openvino-int8 (the default), their
order alternating. The same chunk texts are then encoded directly in batches: the ratio
shows what the pipeline costs on top of the embedder. Query encoding is one query per call,
each new (no cache answers it). Re-runs with no change and with one changed file show what
incremental ingestion saves. SciFact nDCG@10 of each backend comes from the committed
`ragchains eval retrieval` baselines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import REPO, machine_line, peak_rss_mb, write_section
from bench.synthetic import make_corpus
from ragchains.factory import configure_runtime, run_ingest
from ragchains.ingest.embedding import EMBED_BATCH
from ragchains.retrievers.bm25 import build_bm25
from ragchains.retrievers.dense import build_faiss
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.searchindex import load_index
from ragchains.settings import Settings

BASELINE, DEFAULT = "torch", "openvino-int8"
QUERIES = 100
# `ragchains eval retrieval` runs on SciFact test with each backend (evaluation/baselines/).
SCIFACT_RUNS = {
    DEFAULT: REPO / "evaluation" / "baselines" / "scifact-retrieval",
    BASELINE: REPO / "evaluation" / "baselines" / "scifact-retrieval-torch",
}
PARAGRAPHS_PER_FILE = 6
WORDS_PER_PARAGRAPH_SOURCES = 4  # synthetic documents joined into one paragraph


def write_corpus(folder: Path, files: int) -> None:
    corpus = make_corpus(
        files * PARAGRAPHS_PER_FILE * WORDS_PER_PARAGRAPH_SOURCES,
        1,
        model="all-MiniLM-L6-v2",
        seed=11,
    )
    texts = iter(corpus.texts)
    for i in range(files):
        sections = []
        for p in range(PARAGRAPHS_PER_FILE):
            body = ". ".join(next(texts).capitalize() for _ in range(WORDS_PER_PARAGRAPH_SOURCES))
            sections.append(f"## Section {p + 1}\n\n{body}.\n")
        (folder / f"doc-{i:05d}.md").write_text(
            f"# Document {i}\n\n" + "\n".join(sections), encoding="utf-8"
        )


def embedders(settings: Settings) -> dict[str, SentenceTransformerEmbedder]:
    out = {}
    for backend in (BASELINE, DEFAULT):
        embedder = SentenceTransformerEmbedder(
            settings.embedding_model, batch_size=settings.embedding_batch_size, backend=backend
        )
        embedder.encode(["warm up"])
        out[backend] = embedder
    return out


def query_encoding_ms(embedder: SentenceTransformerEmbedder, queries: list[str]) -> float:
    """p50 of one new query per call (``encode``, not the remembered ``encode_query``)."""
    times = []
    for query in queries:
        start = time.perf_counter()
        embedder.encode([query])
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000.0


def scifact_ndcg(backend: str) -> dict[str, float]:
    """nDCG@10 of dense and hybrid in the committed SciFact run of ``backend``, if any."""
    found = {}
    for retriever in ("dense", "hybrid"):
        summary = SCIFACT_RUNS[backend] / retriever / "summary.json"
        if summary.exists():
            found[retriever] = json.loads(summary.read_text())["metrics"]["ndcg@10"]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    configure_runtime(settings)
    backends = embedders(settings)
    embedder = backends[DEFAULT]
    ingest_runs: dict[str, list[float]] = {b: [] for b in backends}
    raw_runs: dict[str, list[float]] = {b: [] for b in backends}
    query_runs: dict[str, list[float]] = {b: [] for b in backends}
    with tempfile.TemporaryDirectory() as tmp:
        docs = Path(tmp) / "docs"
        docs.mkdir()
        write_corpus(docs, args.files)
        queries = make_corpus(QUERIES * 10, QUERIES, model="all-MiniLM-L6-v2", seed=5).queries
        chunks = 0
        texts: list[str] = []
        for repeat in range(args.repeats):
            order = list(backends) if repeat % 2 == 0 else list(reversed(backends))
            for backend in order:
                index_dir = Path(tmp) / f"index-{backend}-{repeat}"
                start = time.perf_counter()
                report = run_ingest(
                    settings, [docs], index_dir, embedder=backends[backend], progress=False
                )
                ingest_runs[backend].append(time.perf_counter() - start)
                chunks = report.chunks_total
                if not texts:
                    index = load_index(index_dir)
                    texts = [c.text for c in index.store.iter_chunks()]
                    index.close()
                start = time.perf_counter()
                for i in range(0, len(texts), EMBED_BATCH):
                    backends[backend].encode(texts[i : i + EMBED_BATCH])
                raw_runs[backend].append(time.perf_counter() - start)
                fresh = [f"{q} {repeat}" for q in queries]  # new to the embedder each repeat
                query_runs[backend].append(query_encoding_ms(backends[backend], fresh))
        index_dir = Path(tmp) / f"index-{DEFAULT}-0"
        vectors = embedder.encode(texts)

        start = time.perf_counter()
        build_bm25(texts)
        bm25_s = time.perf_counter() - start
        start = time.perf_counter()
        build_faiss(vectors, hnsw_min_chunks=settings.hnsw_min_chunks)
        faiss_s = time.perf_counter() - start

        start = time.perf_counter()
        again = run_ingest(settings, [docs], index_dir, embedder=embedder, progress=False)
        noop_s = time.perf_counter() - start
        assert not again.changed

        target = docs / "doc-00000.md"
        target.write_text(
            target.read_text(encoding="utf-8") + "\n## Added\n\nOne more paragraph.\n",
            encoding="utf-8",
        )
        start = time.perf_counter()
        one = run_ingest(settings, [docs], index_dir, embedder=embedder, progress=False)
        one_s = time.perf_counter() - start

    ingest_s = {b: statistics.median(runs) for b, runs in ingest_runs.items()}
    raw_s = {b: statistics.median(runs) for b, runs in raw_runs.items()}
    query_ms = {b: statistics.median(runs) for b, runs in query_runs.items()}
    speedup = ingest_s[BASELINE] / ingest_s[DEFAULT]
    query_ratio = query_ms[DEFAULT] / query_ms[BASELINE]
    quality = {b: scifact_ndcg(b) for b in backends}

    def runs(values: list[float]) -> str:
        return ", ".join(f"{v:.1f}" for v in values)

    rows = [
        f"| full ingest (load, chunk, embed, BM25 + FAISS, atomic write), {b} | "
        f"{ingest_s[b]:.1f} s = {chunks / ingest_s[b]:.0f} chunks/s | {runs(ingest_runs[b])} |"
        for b in backends
    ]
    rows += [
        f"| raw embedder, same chunk texts, batches of {EMBED_BATCH}, {b} | "
        f"{raw_s[b]:.1f} s = {chunks / raw_s[b]:.0f} chunks/s | {runs(raw_runs[b])} |"
        for b in backends
    ]
    rows += [
        f"| query encoding p50 (one new query per call, {QUERIES} queries), {b} | "
        f"{query_ms[b]:.2f} ms | {', '.join(f'{v:.2f}' for v in query_runs[b])} |"
        for b in backends
    ]
    quality_rows = [
        f"| {retriever} | {quality[BASELINE].get(retriever, float('nan')):.3f} | "
        f"{quality[DEFAULT].get(retriever, float('nan')):.3f} | "
        f"{quality[DEFAULT].get(retriever, float('nan')) - quality[BASELINE].get(retriever, float('nan')):+.3f} |"
        for retriever in ("dense", "hybrid")
    ]
    body = "\n".join(
        [
            "## Ingest throughput (`python -m bench.ingest_throughput`)",
            "",
            machine_line(),
            "",
            f"{args.files} synthetic Markdown files → {chunks:,} chunks of ≤ {settings.chunk_size} "
            f"tokens; medians of {args.repeats} repeats, the two backends alternating in each.",
            "",
            "| measure | median | runs |",
            "|---|---:|---|",
            *rows,
            "",
            f"- Ingest with `{DEFAULT}` (the default) runs at **{speedup:.2f}×** the throughput of "
            f"`{BASELINE}` (fp32; target ≥ 2.5×); ingest / raw embedder throughput "
            f"{(chunks / ingest_s[DEFAULT]) / (chunks / raw_s[DEFAULT]):.2f}.",
            f"- Query encoding p50 with `{DEFAULT}` is **{query_ratio:.2f}** of `{BASELINE}`'s "
            "(target ≤ 0.5).",
            "",
            "SciFact test, nDCG@10 (`ragchains eval retrieval`, committed in "
            "`evaluation/baselines/scifact-retrieval-torch` and `scifact-retrieval`; target: "
            "int8 no more than 0.005 below fp32):",
            "",
            f"| retriever | {BASELINE} (fp32) | {DEFAULT} | difference |",
            "|---|---:|---:|---:|",
            *quality_rows,
            "",
            f"With `{DEFAULT}`:",
            "",
            "| measure | value |",
            "|---|---:|",
            f"| BM25 build / FAISS build ({chunks:,} chunks) | {bm25_s:.2f} s / {faiss_s:.2f} s |",
            f"| re-run, nothing changed | {noop_s:.1f} s (0 embedded) |",
            f"| re-run, one file changed | {one_s:.1f} s ({one.chunks_embedded} embedded) |",
            f"| peak RSS of the process (both backends loaded) | {peak_rss_mb():,.0f} MB |",
        ]
    )
    write_section("ingest_throughput", body)


if __name__ == "__main__":
    main()
