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
from ragchains.retrievers.embeddings import (
    UNRECORDED_BACKEND,
    SentenceTransformerEmbedder,
    resolve_model_path,
)

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
    return np.load(embeddings_path(embedder, texts, label), allow_pickle=False)


# Rows embedded, then saved, at a time: a run stopped part way (a million texts take hours
# on 2 cores) resumes from its last saved part.
PART_ROWS = 50_000


def embeddings_path(embedder: SentenceTransformerEmbedder, texts: list[str], label: str) -> Path:
    """The cached ``.npy`` of ``texts``' embeddings (made first if missing); large ones are
    best opened with ``np.load(path, mmap_mode="r")``."""
    # The backend that embeds is part of the key: their vectors differ. Files made before
    # embedders had backends are torch's (UNRECORDED_BACKEND): their key is kept.
    backend = embedder.backend
    name = embedder.name if backend == UNRECORDED_BACKEND else f"{embedder.name}\x00{backend}"
    digest = hashlib.sha256((name + "\x00" + "\x00".join(texts)).encode("utf-8")).hexdigest()[:16]
    path = cache_dir("embeddings") / f"{label}-{len(texts)}-{digest}.npy"
    if path.exists():
        return path
    if not texts:
        raise ValueError("no texts to embed")
    parts_dir = path.with_suffix(".parts")
    parts_dir.mkdir(exist_ok=True)
    starts = range(0, len(texts), PART_ROWS)
    batch = 512
    with tqdm(total=len(texts), desc=f"Embedding {label}", unit="text") as bar:
        for start in starts:
            part = parts_dir / f"{start:09d}.npy"
            rows = texts[start : start + PART_ROWS]
            if part.exists():
                bar.update(len(rows))
                continue
            vectors = []
            for i in range(0, len(rows), batch):
                vectors.append(embedder.encode(rows[i : i + batch]))
                bar.update(len(vectors[-1]))
            _save_atomically(part, np.concatenate(vectors))
    # Copied part by part into the final file: never the whole matrix twice in memory.
    first = np.load(parts_dir / f"{0:09d}.npy", mmap_mode="r")
    tmp = path.with_suffix(".tmp.npy")
    out = np.lib.format.open_memmap(
        tmp, mode="w+", dtype=first.dtype, shape=(len(texts), first.shape[1])
    )
    for start in starts:
        out[start : start + PART_ROWS] = np.load(parts_dir / f"{start:09d}.npy")
    out.flush()
    del out
    tmp.rename(path)
    for part in parts_dir.iterdir():
        part.unlink()
    parts_dir.rmdir()
    return path


def _save_atomically(path: Path, array: np.ndarray) -> None:
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, array, allow_pickle=False)
    tmp.rename(path)
