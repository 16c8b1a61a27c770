"""BM25 over the index's chunks, backed by bm25s (sparse-matrix scoring)."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from typing import Any

import bm25s
import numpy as np
import Stemmer
from bm25s.stopwords import STOPWORDS_EN
from langchain_core.documents import Document

from ragchains.retrievers.base import IndexRetriever, readable
from ragchains.retrievers.filters import MetadataFilter
from ragchains.retrievers.index import SearchIndex

# bm25s sets its own logger to DEBUG on import, which floods any application log.
logging.getLogger("bm25s").setLevel(logging.WARNING)

_WORD = re.compile(r"(?u)\b\w\w+\b")
STOPWORDS = frozenset(STOPWORDS_EN)
# PyStemmer objects are not thread-safe: one per thread.
_local = threading.local()

BM25_PARAMS: dict[str, Any] = {
    "method": "lucene",
    "k1": 1.2,
    "b": 0.75,
    "tokenizer": "regex \\w\\w+, lowercase, English stop words, Snowball English stemmer",
}


def tokenize(text: str) -> list[str]:
    """Lowercased word tokens without English stop words, Snowball-stemmed."""
    stemmer = getattr(_local, "stemmer", None)
    if stemmer is None:
        stemmer = _local.stemmer = Stemmer.Stemmer("english")
    words = [w for w in _WORD.findall(text.lower()) if w not in STOPWORDS]
    return stemmer.stemWords(words)


def build_bm25(texts: Sequence[str]) -> bm25s.BM25:
    model = bm25s.BM25(method=BM25_PARAMS["method"], k1=BM25_PARAMS["k1"], b=BM25_PARAMS["b"])
    model.index([tokenize(t) for t in texts], show_progress=False)
    return model


def bm25_search(
    model: bm25s.BM25, query: str, k: int, mask: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k (rows, scores) with score > 0, best first, among rows where ``mask`` is true."""
    ids = model.get_tokens_ids(tokenize(query))
    if not ids or k <= 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    scores = model.get_scores_from_ids(ids)
    if mask is not None:
        scores = np.where(mask, scores, 0.0)
    hits = np.flatnonzero(scores > 0)
    if hits.size > k:
        hits = hits[np.argpartition(-scores[hits], k - 1)[:k]]
    order = hits[np.argsort(-scores[hits], kind="stable")]
    return order.astype(np.int64), scores[order].astype(np.float32)


class BM25Retriever(IndexRetriever):
    """Keyword retrieval over a loaded index, with metadata filters applied before ranking."""

    def _search(
        self, index: SearchIndex, query: str, *, k: int, filters: list[MetadataFilter]
    ) -> list[Document]:
        rows, scores = bm25_search(index.bm25, query, k, readable(index, filters))
        return self._ranked_documents(index, rows, scores, "bm25")
