"""A synthetic corpus with known answers, and its embeddings cached outside the repository.

Documents mix words of one of many topics with general words; each query takes a few of one
document's words, so exactly one document is relevant. Words come from the embedder's own
vocabulary, so the dense model sees real English words.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from bench.common import cache_dir
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder, resolve_model_path

N_TOPICS_PER_10K = 200
TOPIC_WORDS = 40
DOC_TOPIC_WORDS = 18
DOC_GENERAL_WORDS = 12
QUERY_DOC_WORDS = 4


@dataclass
class Corpus:
    texts: list[str]
    queries: list[str]
    relevant: list[int]  # relevant[i] = the one document that answers queries[i]


def _vocabulary(model: str) -> list[str]:
    vocab = Path(resolve_model_path(model)) / "vocab.txt"
    words = vocab.read_text(encoding="utf-8").splitlines()
    return sorted({w for w in words if re.fullmatch(r"[a-z]{4,12}", w)})


def make_corpus(n_docs: int, n_queries: int, *, model: str, seed: int = 7) -> Corpus:
    rng = np.random.default_rng(seed)
    vocab = np.array(_vocabulary(model))
    words = vocab.tolist()
    n_topics = max(10, n_docs * N_TOPICS_PER_10K // 10_000)
    topics = [rng.choice(len(vocab), TOPIC_WORDS, replace=False) for _ in range(n_topics)]
    # General words follow a Zipf-like law, as in real text.
    weights = 1.0 / np.arange(1, len(vocab) + 1)
    weights /= weights.sum()
    general_order = rng.permutation(len(vocab))
    # rng.choice(len(vocab), size, p=weights) draws rng.random(size) and looks each up in the
    # cumulative weights; doing that here gives the same corpus without re-summing 20,000
    # weights per document (a million documents in seconds, not a quarter of an hour).
    cumulative = weights.cumsum()
    cumulative /= cumulative[-1]
    texts = []
    doc_words = np.empty((n_docs, DOC_TOPIC_WORDS), dtype=np.int64)
    for i in range(n_docs):
        topic = topics[rng.integers(n_topics)]
        own = rng.choice(topic, DOC_TOPIC_WORDS, replace=False)
        general = general_order[
            cumulative.searchsorted(rng.random(DOC_GENERAL_WORDS), side="right")
        ]
        drawn = np.concatenate([own, general])
        rng.shuffle(drawn)
        texts.append(" ".join([words[w] for w in drawn.tolist()]))
        doc_words[i] = own
    relevant = rng.choice(n_docs, n_queries, replace=False).tolist()
    queries = [
        " ".join(vocab[rng.choice(doc_words[d], QUERY_DOC_WORDS, replace=False)]) for d in relevant
    ]
    return Corpus(texts=texts, queries=queries, relevant=relevant)


def cached_embeddings(
    embedder: SentenceTransformerEmbedder, texts: list[str], label: str
) -> np.ndarray:
    """Embeddings of ``texts``, computed once and kept in the bench cache (not the repo)."""
    digest = hashlib.sha256(
        (embedder.name + "\x00" + "\x00".join(texts)).encode("utf-8")
    ).hexdigest()[:16]
    path = cache_dir("embeddings") / f"{label}-{len(texts)}-{digest}.npy"
    if path.exists():
        return np.load(path, allow_pickle=False)
    parts = []
    batch = 512
    for start in tqdm(range(0, len(texts), batch), desc=f"Embedding {label}", unit="batch"):
        parts.append(embedder.encode(texts[start : start + batch]))
    vectors = np.concatenate(parts)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, vectors, allow_pickle=False)
    tmp.rename(path)
    return vectors
