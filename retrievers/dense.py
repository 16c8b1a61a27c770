"""Dense retrieval with FAISS: exact inner product for small indexes, HNSW for large ones."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import faiss
import numpy as np
from langchain_core.documents import Document

from ragchains.retrievers.base import IndexRetriever, readable
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.searchindex import SearchIndex

# Chosen with bench/retrieval_latency.py (see bench/RESULTS.md): on 100k chunks, M=32 with
# efConstruction=40 builds with about a quarter of the CPU time of M=64, efConstruction=100
# (37 s against 140 s), and a wider search beam (efSearch=384 instead of 128) gives back the
# recall the sparser graph loses: 0.943 of the exact top 10 and 0.894 of the top 50 against
# 0.945 and 0.894, at about 3 ms of CPU per search (512 finds 0.959 and 0.926 for 20% more).
# A build happens at every ingest; the beam costs per query, a small part of a turn. IVF lists
# (IndexIVFFlat) build in seconds but found half the exact top 50 at nprobe 32 of 1,024 on the
# synthetic corpus, whose embeddings form no clusters; 8-bit codes built no faster.
HNSW_M = 32
HNSW_EF_CONSTRUCTION = 40
HNSW_EF_SEARCH = 384
# The HNSW index keeps its vectors as float16: half the memory and file (a million chunks:
# 0.77 GB instead of 1.5 GB), the same build time, recall and latency at 100k. A vector read
# back (an ingest carries unchanged chunks' vectors over) is within 2.5e-4 of the original per
# component; rounding it again changes nothing.
HNSW_STORAGE = "fp16"
# Below this many allowed rows a filtered search scores the subset exactly: cheaper than a
# graph walk that must skip most nodes, and it never loses recall to the filter.
EXACT_SUBSET_MAX = 20_000


def build_faiss(vectors: np.ndarray, *, hnsw_min_chunks: int) -> tuple[faiss.Index, dict[str, Any]]:
    """Index normalised vectors by inner product; HNSW once there are ``hnsw_min_chunks``."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    n, dim = vectors.shape
    index: faiss.Index
    if n >= hnsw_min_chunks:
        # faiss's bundled stubs lag its SWIG API (QT_fp16 is an int there), hence the ignore.
        index = faiss.IndexHNSWSQ(
            dim,
            faiss.ScalarQuantizer.QT_fp16,  # type: ignore[arg-type]
            HNSW_M,
            faiss.METRIC_INNER_PRODUCT,
        )
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        index.hnsw.efSearch = HNSW_EF_SEARCH
        info = {
            "kind": "hnsw",
            "metric": "inner_product",
            "storage": HNSW_STORAGE,
            "m": HNSW_M,
            "ef_construction": HNSW_EF_CONSTRUCTION,
            "ef_search": HNSW_EF_SEARCH,
        }
    else:
        index = faiss.IndexFlatIP(dim)
        info = {"kind": "flat", "metric": "inner_product"}
    if n:
        index.add(vectors)
    return index, info


@contextmanager
def _one_thread() -> Iterator[None]:
    """FAISS on the calling thread alone (OpenMP's thread count is per thread: others keep
    theirs, and a build elsewhere keeps its team).

    A search is one query: a server runs concurrent requests side by side, and an OpenMP
    team per query waits at its barriers for a second core that those requests, or other
    processes, hold. On the 2-core machine under load, one exact search over 10,000 vectors
    took 100 ms with two threads and 0.66 ms with one; an HNSW search runs on one anyway.
    """
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def dense_search(
    index: faiss.Index, query: np.ndarray, k: int, mask: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k (rows, inner-product scores), best first, among rows where ``mask`` is true."""
    with _one_thread():
        return _search(index, query, k, mask)


def _search(
    index: faiss.Index, query: np.ndarray, k: int, mask: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    n = index.ntotal
    k = min(k, n)
    if k <= 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    q = np.ascontiguousarray(query, dtype=np.float32).reshape(1, -1)
    if mask is None:
        scores, rows = index.search(q, k)
    else:
        allowed = np.flatnonzero(mask)
        if allowed.size == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        hnsw = index if isinstance(index, faiss.IndexHNSW) else None
        # A filter skips nodes; an HNSW walk widens its beam in proportion so that k allowed
        # ones are found (the index's own beam: one built with other parameters keeps its own).
        ef = int(hnsw.hnsw.efSearch * n / allowed.size) + k if hnsw is not None else 0
        # Scoring the allowed rows exactly never loses recall, and is the cheaper search while
        # they are few: a walk computes distances to several nodes per beam slot, in random
        # order (at 100k chunks, 10% allowed, the two cost about the same).
        if allowed.size <= max(EXACT_SUBSET_MAX, 2 * ef):
            sub = index.reconstruct_batch(allowed.astype(np.int64)) @ q[0]
            top = np.argsort(-sub, kind="stable")[:k]
            return allowed[top].astype(np.int64), sub[top].astype(np.float32)
        bits = np.packbits(mask.astype(np.uint8), bitorder="little")
        selector = faiss.IDSelectorBitmap(n, faiss.swig_ptr(bits))
        if hnsw is not None:
            # faiss's bundled stubs lag its SWIG API, hence the ignores.
            params: Any = faiss.SearchParametersHNSW(sel=selector, efSearch=ef)  # type: ignore[attr-defined]
        else:
            params = faiss.SearchParameters(sel=selector)  # type: ignore[call-arg]
        scores, rows = index.search(q, k, params=params)
    keep = rows[0] >= 0
    return rows[0][keep].astype(np.int64), scores[0][keep].astype(np.float32)


class FaissRetriever(IndexRetriever):
    """Semantic retrieval over a loaded index, with metadata filters applied before ranking."""

    embedder: SentenceTransformerEmbedder

    def _search(
        self, index: SearchIndex, query: str, *, k: int, mask: np.ndarray | None
    ) -> list[Document]:
        rows, scores = dense_search(
            index.dense, self.embedder.encode_query(query), k, readable(index, mask)
        )
        return self._ranked_documents(index, rows, scores, "dense")
