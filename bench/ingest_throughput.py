"""Ingest throughput against the embedder's raw batch throughput, index build time, peak RSS.

A synthetic folder of Markdown files is ingested with the real pipeline (loading, chunking,
embedding, BM25 + FAISS, atomic write). The same chunk texts are then encoded directly in
batches: the ratio shows what the pipeline costs on top of the embedder. Re-runs with no
change and with one changed file show what incremental ingestion saves.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import machine_line, peak_rss_mb, write_section
from bench.synthetic import make_corpus
from ragchains.factory import build_embedder, configure_runtime, run_ingest
from ragchains.ingest.embedding import EMBED_BATCH
from ragchains.retrievers.bm25 import build_bm25
from ragchains.retrievers.dense import build_faiss
from ragchains.retrievers.searchindex import load_index
from ragchains.settings import Settings

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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=500)
    args = parser.parse_args()

    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    configure_runtime(settings)
    embedder = build_embedder(settings)
    embedder.encode(["warm up"])
    with tempfile.TemporaryDirectory() as tmp:
        docs = Path(tmp) / "docs"
        docs.mkdir()
        write_corpus(docs, args.files)
        index_dir = Path(tmp) / "index"

        start = time.perf_counter()
        report = run_ingest(settings, [docs], index_dir, embedder=embedder, progress=False)
        ingest_s = time.perf_counter() - start
        chunks = report.chunks_total

        index = load_index(index_dir)
        texts = [c.text for c in index.store.iter_chunks()]
        index.close()
        start = time.perf_counter()
        vectors = np.concatenate(
            [embedder.encode(texts[i : i + EMBED_BATCH]) for i in range(0, len(texts), EMBED_BATCH)]
        )
        raw_s = time.perf_counter() - start

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

    ingest_rate, raw_rate = chunks / ingest_s, chunks / raw_s
    body = "\n".join(
        [
            "## Ingest throughput (`python -m bench.ingest_throughput`)",
            "",
            machine_line(),
            "",
            f"{args.files} synthetic Markdown files → {chunks:,} chunks of ≤ {settings.chunk_size} tokens.",
            "",
            "| measure | value |",
            "|---|---:|",
            f"| full ingest (load, chunk, embed, BM25 + FAISS, atomic write) | {ingest_s:.1f} s = {ingest_rate:.0f} chunks/s |",
            f"| raw embedder, same chunk texts, batches of {EMBED_BATCH} | {raw_s:.1f} s = {raw_rate:.0f} chunks/s |",
            f"| ingest throughput / raw embedder throughput | {ingest_rate / raw_rate:.2f} |",
            f"| BM25 build / FAISS build ({chunks:,} chunks) | {bm25_s:.2f} s / {faiss_s:.2f} s |",
            f"| re-run, nothing changed | {noop_s:.1f} s (0 embedded) |",
            f"| re-run, one file changed | {one_s:.1f} s ({one.chunks_embedded} embedded) |",
            f"| peak RSS of the process | {peak_rss_mb():,.0f} MB |",
        ]
    )
    write_section("ingest_throughput", body)


if __name__ == "__main__":
    main()
