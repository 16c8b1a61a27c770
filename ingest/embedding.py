"""Vectors for a run's chunks: the stored vector where a chunk id has one, the rest embedded
in batches behind a progress bar."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from opentelemetry import trace
from tqdm import tqdm

from ragchains.ingest.progress import IngestProgress
from ragchains.ingest.report import IngestReport
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.indexformat import Chunk

EMBED_BATCH = 256

# Spans for `ragchains ingest` when it exports traces (the API's global provider; without
# one they record nothing).
_tracer = trace.get_tracer(__name__)


def embed_texts(
    embedder: SentenceTransformerEmbedder,
    texts: list[str],
    progress: bool,
    tracker: IngestProgress | None = None,
) -> np.ndarray:
    if not texts:
        return np.zeros((0, embedder.dimension), dtype=np.float32)
    out = []
    with tqdm(total=len(texts), desc="Embedding", unit="chunk", disable=not progress) as bar:
        for start in range(0, len(texts), EMBED_BATCH):
            batch = texts[start : start + EMBED_BATCH]
            out.append(embedder.encode(batch))
            bar.update(len(batch))
            if tracker is not None:
                tracker.embedded(len(batch))
    return np.concatenate(out)


@_tracer.start_as_current_span("embed")
def chunk_vectors(
    embedder: SentenceTransformerEmbedder,
    chunks: Sequence[Chunk],
    stored: dict[str, np.ndarray],
    report: IngestReport,
    progress: bool,
) -> np.ndarray:
    """Row-aligned vectors of ``chunks``: the stored one where a chunk id has one, the rest
    embedded now."""
    missing = [i for i, c in enumerate(chunks) if c.id not in stored]
    report.chunks_embedded = len(missing)
    trace.get_current_span().set_attributes(
        {"ragchains.chunks": len(chunks), "ragchains.chunks.embedded": len(missing)}
    )
    vectors = np.zeros((len(chunks), embedder.dimension), dtype=np.float32)
    for row, chunk in enumerate(chunks):
        if chunk.id in stored:
            vectors[row] = stored[chunk.id]
    report.progress.embedding(len(missing))
    if missing:
        vectors[np.array(missing)] = embed_texts(
            embedder, [chunks[i].text for i in missing], progress, report.progress
        )
    return vectors
