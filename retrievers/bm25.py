"""BM25 over the index's chunks, backed by bm25s (sparse-matrix scoring)."""

from __future__ import annotations

import logging
import math
import re
import threading
from array import array
from collections.abc import Sequence
from typing import Any

import bm25s
import numpy as np
import Stemmer
from bm25s.stopwords import STOPWORDS_EN
from langchain_core.documents import Document

from ragchains.retrievers.access import combined
from ragchains.retrievers.base import IndexRetriever
from ragchains.retrievers.indexformat import StoredBM25
from ragchains.retrievers.searchindex import SearchIndex

# bm25s sets its own logger to DEBUG on import, which floods any application log.
logging.getLogger("bm25s").setLevel(logging.WARNING)

# Runs of two or more word characters: the same tokens as scikit-learn's (?u)\b\w\w+\b
# (a maximal run of \w is bounded by \b on both sides), found in about half the time.
_WORD = re.compile(r"\w{2,}")
STOPWORDS = frozenset(STOPWORDS_EN)
# PyStemmer objects are not thread-safe: one per thread, with each thread's memo of the words
# it has seen (word -> stem, None for a stop word): text repeats its words, and a lookup is
# several times cheaper than the stemmer's call. Bounded so a long-running server does not
# grow it without end.
_local = threading.local()
_MEMO_MAX = 500_000

BM25_PARAMS: dict[str, Any] = {
    "method": "lucene",
    "k1": 1.2,
    "b": 0.75,
    "tokenizer": "regex \\w\\w+, lowercase, English stop words, Snowball English stemmer",
}


def tokenize(text: str) -> list[str]:
    """Lowercased word tokens without English stop words, Snowball-stemmed."""
    memo: dict[str, str | None] | None = getattr(_local, "memo", None)
    if memo is None or len(memo) > _MEMO_MAX:
        memo = _local.memo = {}
        _local.stemmer = Stemmer.Stemmer("english")
    stem = _local.stemmer.stemWord
    out = []
    for word in _WORD.findall(text.lower()):
        try:
            token = memo[word]
        except KeyError:
            token = memo[word] = None if word in STOPWORDS else stem(word)
        if token is not None:
            out.append(token)
    return out


# Words a query may leave out: how a question is asked, not what it asks (BM25's stop words
# are only the shortest function words).
ASKING = frozenset(
    tokenize(
        "what which who whom whose when where why how do does did done can could would should "
        "may might must shall will am i me my we our you your please tell know want need find "
        "show give list any some all more less than most least much many get got about there"
    )
)


def content_terms(text: str) -> set[str]:
    """The terms of ``text`` that say what it asks about (``tokenize``, less ``ASKING``)."""
    return set(tokenize(text)) - ASKING


def build_bm25(texts: Sequence[str]) -> StoredBM25:
    """The BM25 model of ``texts`` (row i = texts[i]), as bm25s's ``index`` builds it.

    bm25s's own builder loops in Python over every document (a Counter and a set each), which
    took longer than tokenising at 100,000 chunks; here the score matrix comes from whole-corpus
    array operations, same scores (tests/test_retrieval.py checks them against bm25s's).
    """
    k1, b = float(BM25_PARAMS["k1"]), float(BM25_PARAMS["b"])
    model = StoredBM25(method=BM25_PARAMS["method"], k1=k1, b=b)
    n = len(texts)
    vocab: dict[str, int] = {}
    add = vocab.setdefault
    flat = array("i")  # every row's token ids, one after another: 4 bytes a token
    lengths = np.zeros(n, dtype=np.int64)
    for row, text in enumerate(texts):
        tokens = tokenize(text)
        lengths[row] = len(tokens)
        flat.extend([add(t, len(vocab)) for t in tokens])
    n_vocab = len(vocab)
    token_ids = np.frombuffer(flat, dtype=np.int32)
    # One key per (word, row), word-major: sorted, the keys are the score matrix's CSC order
    # (column = word, rows ascending), and each repeat is a term frequency.
    keys = token_ids.astype(np.int64) * max(n, 1)
    del flat, token_ids
    keys += np.repeat(np.arange(n, dtype=np.int64), lengths)
    keys, tf = np.unique(keys, return_counts=True)
    words, rows = np.divmod(keys, max(n, 1))
    del keys
    df = np.bincount(words, minlength=n_vocab)
    # As bm25s computes them: Lucene's idf in float32, the term part in float64.
    idf = np.log1p((n - df + 0.5) / (df + 0.5)).astype(np.float32)
    average = lengths.mean() if n else 0.0
    part = tf / (k1 * ((1 - b) + b * lengths[rows] / average) + tf) if rows.size else tf * 0.0
    data = (idf[words] * part).astype(np.float32)
    indptr = np.zeros(n_vocab + 1, dtype=np.int64)
    np.cumsum(df, out=indptr[1:])
    model.scores = {
        "data": data,
        "indices": rows.astype(np.int32),
        "indptr": indptr,
        "num_docs": n,
    }
    # bm25s's index() adds an empty token, for a query with no known word, and these sets.
    vocab.setdefault("", n_vocab)
    model.vocab_dict = vocab
    model.unique_token_ids_set = set(vocab.values())
    model.nonoccurrence_array = None  # lucene needs none (bm25l and bm25+ do)
    model.doc_lengths = lengths.astype(np.float64)
    return model


def bm25_search(
    model: bm25s.BM25,
    query: str,
    k: int,
    mask: np.ndarray | None = None,
    readers: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k (rows, scores) with score > 0, best first, among rows where ``mask`` is true.

    ``readers``: the rows the caller may read (no others are returned). The scores then
    use those rows' statistics alone (their number, each word's document frequency, their
    average length), as an index of only them would: a row the caller may not read changes
    neither a score nor the order, so neither tells that it exists.
    """
    ids = model.get_tokens_ids(tokenize(query))
    if not ids or k <= 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    if readers is None:
        scores = model.get_scores_from_ids(ids)
    else:
        scores = _scores_among(model, ids, readers)
    mask = combined(mask, readers)
    hits = None if mask is None else _posting_rows(model, ids)
    if hits is not None:
        assert mask is not None  # the postings are gathered for a mask only
        hits = hits[mask[hits] & (scores[hits] > 0)]
    else:
        if mask is not None:
            scores = np.where(mask, scores, 0.0)
        hits = np.flatnonzero(scores > 0)
    if hits.size > k:
        hits = hits[np.argpartition(-scores[hits], k - 1)[:k]]
    order = hits[np.argsort(-scores[hits], kind="stable")]
    return order.astype(np.int64), scores[order].astype(np.float32)


# Postings (query words' entries) under 1/32 of the rows are gathered and sorted; more, and
# masking every row's score is the cheaper way to find the allowed rows that have one.
_GATHER_BELOW = 1 / 32


def _posting_rows(model: bm25s.BM25, ids: Sequence[int]) -> np.ndarray | None:
    """The rows in the postings of the words ``ids``, ascending, each once; None when they
    are too many to gather (see ``_GATHER_BELOW``).

    Only those rows can score. With a filter (or a caller's readers), looking the mask up at
    them beats masking every row: at a million rows, 1.1 ms against 8.4 ms per query. Without
    one, comparing every score with 0 stays cheaper (0.8 ms against 1.1 ms).
    """
    indptr, indices = model.scores["indptr"], model.scores["indices"]
    spans = [(int(indptr[i]), int(indptr[i + 1])) for i in ids]
    if sum(end - start for start, end in spans) >= _GATHER_BELOW * int(model.scores["num_docs"]):
        return None
    return np.unique(np.concatenate([indices[start:end] for start, end in spans]))


def idf(df: int, n: int) -> float:
    """Lucene's IDF, as bm25s computes it for ``method="lucene"``."""
    return math.log(1 + (n - df + 0.5) / (df + 0.5))


def term_frequency_part(
    tf: np.ndarray, length: np.ndarray, average: float, k1: float, b: float
) -> np.ndarray:
    """BM25's saturated, length-normalised term frequency (a score is idf times this)."""
    return tf / (tf + k1 * (1 - b + b * length / average))


def _scores_among(model: bm25s.BM25, ids: Sequence[int], readers: np.ndarray) -> np.ndarray:
    """Each row's BM25 score for the query words ``ids`` in an index of the ``readers`` rows
    only (0 elsewhere), from the whole index's stored scores.

    A stored score is idf(word) * tf / (tf + k1 * (1 - b + b * length / average length)), all
    over the whole index. Dividing out the idf leaves the term-frequency part; with the row's
    length that gives back tf (an integer), which is then scored again with the readers'
    idf and average length. Without stored lengths (an index written before they were kept)
    only the idf is the readers'.
    """
    if model.method != "lucene":
        raise ValueError(f"scoring over a subset of rows needs method lucene, not {model.method}")
    data, indices, indptr = (model.scores[a] for a in ("data", "indices", "indptr"))
    n_all = int(model.scores["num_docs"])
    n = int(np.count_nonzero(readers))
    scores = np.zeros(n_all, dtype=np.float64)
    if n == 0:
        return scores
    k1, b = float(model.k1), float(model.b)
    lengths = getattr(model, "doc_lengths", None)
    if lengths is not None:
        # Averages by a dot product (float64: no overflow), norms only at the rows a word is
        # in: no per-row arrays.
        # An index whose rows are all empty has no words: ids is empty, nothing divides by 0.
        lengths = np.asarray(lengths, dtype=np.float64)  # a no-op for StoredBM25's
        average_all = float(lengths.sum()) / n_all
        average = max(float(np.dot(lengths, readers)) / n, 1e-9)
    for word in ids:
        start, end = int(indptr[word]), int(indptr[word + 1])
        rows = indices[start:end]
        keep = readers[rows]
        if not keep.any():
            continue
        rows = rows[keep]
        part = data[start:end][keep].astype(np.float64) / idf(end - start, n_all)
        if lengths is not None:
            length = lengths[rows]
            norm_all = k1 * (1 - b + b * length / average_all)
            tf = np.rint(part * norm_all / np.maximum(1 - part, 1e-12))
            part = term_frequency_part(tf, length, average, k1, b)
        scores[rows] += idf(rows.size, n) * part
    return scores


class BM25Retriever(IndexRetriever):
    """Keyword retrieval over a loaded index, with metadata filters applied before ranking."""

    def _search(
        self, index: SearchIndex, query: str, *, k: int, mask: np.ndarray | None
    ) -> list[Document]:
        readers = index.readable_rows()
        rows, scores = bm25_search(index.bm25, query, k, mask, readers)
        return self._ranked_documents(index, rows, scores, "bm25")
