"""The bounded caches of query and passage vectors (cachetools' LRUCache): they keep the most
recently used, evict the least, and a size of 0 keeps nothing rather than failing."""

from __future__ import annotations

import numpy as np
import pytest

from ragchains.retrievers.compressors import EmbeddingSimilarityScorer
from ragchains.retrievers.embeddings import QUERY_CACHE_SIZE, SentenceTransformerEmbedder


class CountingEmbedder(SentenceTransformerEmbedder):
    """No model: each text's vector is a one-hot of its length, and each text encoded is
    counted."""

    def __init__(self) -> None:
        super().__init__("counting", backend="torch")
        self.encoded: list[str] = []

    def encode(self, texts: list[str], *, show_progress: bool = False) -> np.ndarray:
        self.encoded.extend(texts)
        vectors = np.zeros((len(texts), 64), dtype=np.float32)
        for row, text in enumerate(texts):
            vectors[row, len(text) % 64] = 1.0
        return vectors


def test_query_vectors_are_remembered_least_recently_used_first() -> None:
    embedder = CountingEmbedder()
    first = embedder.encode_query("first")
    assert not first.flags.writeable  # shared by every caller
    for n in range(QUERY_CACHE_SIZE - 1):
        embedder.encode_query(f"query {n}")
    embedder.encode_query("first")  # used again: now the most recent
    embedder.encode_query("one more")  # evicts "query 0", the least recently used
    embedder.encoded.clear()
    embedder.encode_query("first")
    embedder.encode_query("query 1")
    assert embedder.encoded == []
    embedder.encode_query("query 0")
    assert embedder.encoded == ["query 0"]


LONG = " ".join(f"word{i}" for i in range(40))  # more than one 16-word passage


@pytest.mark.parametrize("cache_chunks", [0, 1, 4])
def test_passage_vectors_are_remembered_up_to_cache_chunks(cache_chunks: int) -> None:
    embedder = CountingEmbedder()
    scorer = EmbeddingSimilarityScorer(embedder, cache_chunks=cache_chunks)
    texts = [f"{LONG} a", f"{LONG} b"]
    scores = scorer.score([("query", text) for text in texts])
    embedder.encoded.clear()
    assert scorer.score([("query", text) for text in texts]) == scores
    passages = [w for w in embedder.encoded if len(w.split()) == scorer.window_words]
    embedded_again = {text for text in texts if any(w.endswith(f" {text[-1]}") for w in passages)}
    # 0 remembers nothing, 1 the last chunk scored, 4 both.
    assert len(embedded_again) == {0: 2, 1: 1, 4: 0}[cache_chunks]
