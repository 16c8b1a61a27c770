"""Rerank-and-cut compression: score (query, chunk) pairs, keep ``top_n`` at or above a threshold.

The scorer is a sentence-transformers CrossEncoder, which reorders the chunks by its scores.
When its weights cannot be loaded (our machines have no network and no package ships them) the
compressor falls back to cosine similarity from the embedder, says so in a warning, and reports
it in ``status()`` and in each kept chunk's metadata, so nobody mistakes fallback scores for
cross-encoder scores. The fallback only cuts: the chunks keep the order they were retrieved in.
It measures what the dense half of a hybrid search already ranked by, so reordering by it would
throw away the lexical half's evidence and hand back the dense ranking (on SciFact, 0.645
nDCG@10 against the hybrid's 0.728).

This is the one module that imports langchain_classic's compression pieces.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
from cachetools import LRUCache
from langchain_classic.retrievers import ContextualCompressionRetriever
from langchain_classic.retrievers.document_compressors.cross_encoder import BaseCrossEncoder
from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field, PrivateAttr

from ragchains.retrievers.bm25 import content_terms, tokenize
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.workers import run_off_loop

log = logging.getLogger(__name__)

# Scores are on different scales: the cross-encoder's are sigmoid probabilities, the
# fallback's are cosine similarities. Each scorer brings the threshold that suits it.
# The similarity scorer's come from `ragchains eval abstention` on SciFact's train claims
# (evaluation/baselines/scifact-abstention-train; test only reports) and from the questions
# the samples ship (their QA set, the domains' suggested questions, the README's examples).
# SciFact train alone would cut at 0.59 (the most abstention with at most 10% of answerable
# claims turned away), but everyday questions score lower against the passage that answers
# them than SciFact's claims against their abstracts: at 0.59 "What does the standard plan
# cost?" (0.58) and "How many vacation days do employees get?" (0.535) would abstain. 0.50
# is the highest cut that every one of those questions clears by 0.03 (the most a best score
# moved between the two embedder backends was 0.024); on SciFact train it abstains on 4.7%
# of unanswerable claims and wrongly on 1.9%. A quarter of answerable train claims score
# below 0.66, where a chat turn asks once for a better query. The cross-encoder's are
# uncalibrated first guesses: no cross-encoder weights could be measured here.
CROSS_ENCODER_THRESHOLD = 0.1
SIMILARITY_THRESHOLD = 0.5
# A short query ("vacation days", "standard plan cost") is too little text for the embedding
# to score as it scores a question: on the samples the passages that answer those two
# scored 0.395 and 0.485, under the cut questions are calibrated at, and every chunk was cut.
# A chunk that holds every term of a short query has the evidence BM25 counts, which the
# similarity cannot see: its score is lifted by SHORT_QUERY_LIFT. The unanswerable short
# queries of the samples ("football world cup", "capital of Mongolia") hold no such chunk.
SHORT_QUERY_TERMS = 4
SHORT_QUERY_LIFT = 0.15
# Below these best scores a chat turn asks the LLM once for a better query.
CROSS_ENCODER_REQUERY_BELOW = 0.3
SIMILARITY_REQUERY_BELOW = 0.66


class SentenceTransformerCrossEncoder(BaseCrossEncoder):
    """A sentence-transformers CrossEncoder from a hub id (local cache only) or a local path."""

    kind = "cross-encoder"
    # A cross-encoder reads query and chunk together: its order is worth more than the
    # retriever's, so the compressor reorders by it.
    reorders = True
    default_threshold = CROSS_ENCODER_THRESHOLD
    default_requery_below = CROSS_ENCODER_REQUERY_BELOW

    def __init__(self, model: str, *, device: str = "cpu", batch_size: int = 32) -> None:
        if not model:
            raise ValueError("reranker model name must not be empty")
        self.name = model
        self.device = device
        self.batch_size = batch_size
        self._model: Any = None

    def load(self) -> None:
        if self._model is None:
            local = Path(self.name).expanduser()
            source = str(local) if local.exists() else self.name
            if not local.exists() and not _in_hub_cache(self.name):
                # Said before importing sentence-transformers (seconds, with torch): a
                # machine without reranker weights starts that much sooner.
                raise OSError(
                    f"no weights for {self.name!r} are installed: it is neither a folder nor "
                    "in the Hugging Face cache, and nothing is downloaded at run time"
                )
            from sentence_transformers import CrossEncoder

            # local_files_only: a hub id must already be in the cache; never download.
            self._model = CrossEncoder(source, device=self.device, local_files_only=True)

    def score(self, text_pairs: list[tuple[str, str]]) -> list[float]:
        self.load()
        if not text_pairs:
            return []
        scores = self._model.predict(
            text_pairs, batch_size=self.batch_size, show_progress_bar=False, convert_to_numpy=True
        )
        return np.asarray(scores, dtype=np.float64).reshape(len(text_pairs), -1)[:, 0].tolist()


def _in_hub_cache(model_id: str) -> bool:
    """Whether the Hugging Face cache holds ``model_id``'s config (its weights beside it)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(model_id, "config.json"), str)
    except ValueError:  # not a valid repository id
        return False


def lifted(score: float, query: str, text: str) -> float:
    """``score``, lifted by ``SHORT_QUERY_LIFT`` when ``query`` is short and ``text`` holds
    every one of its terms (as BM25 reads them: stemmed, without stop or asking words)."""
    terms = content_terms(query)
    if not terms or len(terms) > SHORT_QUERY_TERMS:
        return score
    return score + SHORT_QUERY_LIFT if terms <= set(tokenize(text)) else score


def passage_windows(text: str, words: int, stride: int) -> list[str]:
    """``text`` as windows of ``words`` words, one every ``stride`` words, the last ending at
    the text's end; a text of at most ``words`` words is its own only window."""
    split = text.split()
    if len(split) <= words:
        return [text]
    starts = [*range(0, len(split) - words, stride), len(split) - words]
    return [" ".join(split[i : i + words]) for i in starts]


class EmbeddingSimilarityScorer(BaseCrossEncoder):
    """Cosine similarity of the query with a chunk, or with the closest passage in it.

    Needs only the embedder's weights. A chunk's score is the best of its whole text's
    similarity and each of its passages' (windows of ``window_words`` words, every
    ``window_stride`` words): a page that answers in one sentence among many others is
    diluted as a whole (the samples' travel policy, page 1, 0.41 against "How much is the
    hotel allowance per night in Europe?") but close in that sentence (0.74). This is MaxP, a
    document scored by its best passage (Dai and Callan, SIGIR 2019). It separates answerable
    from unanswerable questions better than the whole chunk does (`ragchains eval abstention`).

    ``stored`` gives the vectors an index already holds for chunk ids; those chunks are not
    embedded again (that was most of a chat turn's CPU time). Passages are embedded at query
    time, for the first ``passage_candidates`` chunks of a call only (the rest are scored
    whole), so a deep list costs a bounded amount; the passages of the last
    ``cache_chunks`` chunks scored are remembered.
    """

    kind = "embedding-similarity"
    # The similarity is what a dense search already ranked by: reordering a hybrid's list
    # by it gives the dense order back. It cuts; the retriever's order stands.
    reorders = False
    default_threshold = SIMILARITY_THRESHOLD
    default_requery_below = SIMILARITY_REQUERY_BELOW

    def __init__(
        self,
        embedder: SentenceTransformerEmbedder,
        stored: Callable[[Sequence[str]], Mapping[str, np.ndarray]] | None = None,
        *,
        window_words: int = 16,
        window_stride: int = 8,
        passage_candidates: int = 10,
        cache_chunks: int = 1024,
    ) -> None:
        if not 1 <= window_stride <= window_words:
            raise ValueError(
                f"window_stride must be between 1 and window_words ({window_words}), "
                f"got {window_stride}"
            )
        if passage_candidates < 0 or cache_chunks < 0:
            raise ValueError("passage_candidates and cache_chunks must not be negative")
        self.embedder = embedder
        self.name = embedder.name
        self.stored = stored
        self.window_words = window_words
        self.window_stride = window_stride
        self.passage_candidates = passage_candidates
        self.cache_chunks = cache_chunks
        # Passage vectors by chunk text. LRUCache is not thread-safe: used under _lock only.
        # It cannot hold 0 items (it refuses any), so cache_chunks=0 skips it instead.
        self._passages: LRUCache[str, np.ndarray] = LRUCache(maxsize=max(cache_chunks, 1))
        self._lock = threading.Lock()

    def load(self) -> None:
        self.embedder.encode(["warm up"])

    def describe(self) -> str:
        return (
            f"the best of the chunk and its {self.window_words}-word passages, lifted by "
            f"{SHORT_QUERY_LIFT} where a query of at most {SHORT_QUERY_TERMS} terms has them all"
        )

    def score(self, text_pairs: list[tuple[str, str]]) -> list[float]:
        if not text_pairs:
            return []
        queries = sorted({q for q, _ in text_pairs})
        q_vecs = dict(zip(queries, self.embedder.encode(queries), strict=True))
        texts = [d for _, d in text_pairs]
        whole = list(self.embedder.encode(texts))
        scores = self._best([q_vecs[q] for q, _ in text_pairs], texts, whole)
        return [lifted(s, q, d) for s, (q, d) in zip(scores, text_pairs, strict=True)]

    def score_documents(self, query: str, documents: Sequence[Document]) -> list[float]:
        known = self.stored([str(d.id) for d in documents if d.id]) if self.stored else {}
        missing = [d.page_content for d in documents if str(d.id) not in known]
        q_vec = self.embedder.encode_query(query)
        fresh = iter(self.embedder.encode(missing) if missing else [])
        vectors = [known[str(d.id)] if str(d.id) in known else next(fresh) for d in documents]
        texts = [d.page_content for d in documents]
        scores = self._best([q_vec] * len(documents), texts, vectors)
        return [lifted(score, query, text) for score, text in zip(scores, texts, strict=True)]

    def _best(
        self, queries: Sequence[np.ndarray], texts: Sequence[str], whole: Sequence[np.ndarray]
    ) -> list[float]:
        """Each chunk's best similarity: its whole text's, or its best passage's."""
        scores = [float(q @ v) for q, v in zip(queries, whole, strict=True)]
        passages = self._passage_vectors(texts[: self.passage_candidates])
        for i, vectors in enumerate(passages):
            if vectors is not None:
                scores[i] = max(scores[i], float((vectors @ queries[i]).max()))
        return scores

    def _passage_vectors(self, texts: Sequence[str]) -> list[np.ndarray | None]:
        """Each text's passage vectors (None for a text short enough to be one passage),
        embedded in one batch for those not remembered."""
        windows = [passage_windows(t, self.window_words, self.window_stride) for t in texts]
        found: list[np.ndarray | None] = [None] * len(texts)
        wanted: dict[str, list[str]] = {}
        with self._lock:
            for i, (text, parts) in enumerate(zip(texts, windows, strict=True)):
                if len(parts) == 1:
                    continue
                remembered = self._passages.get(text)
                if remembered is not None:
                    found[i] = remembered
                else:
                    wanted[text] = parts
        if wanted:
            flat = [w for parts in wanted.values() for w in parts]
            encoded = self.embedder.encode(flat)
            fresh: dict[str, np.ndarray] = {}
            start = 0
            for text, parts in wanted.items():
                fresh[text] = encoded[start : start + len(parts)]
                start += len(parts)
            if self.cache_chunks:
                with self._lock:
                    self._passages.update(fresh)  # the least recently used go when full
            for i, text in enumerate(texts):
                if found[i] is None and text in fresh:
                    found[i] = fresh[text]
        return found


@dataclass
class Reranked:
    documents: list[Document]  # kept, in the compressor's order, each with its ``rerank_score``
    best_score: float | None  # best of all scored chunks, None when there were none
    threshold: float


@runtime_checkable
class ScoringCompressor(Protocol):
    """What the chains use of a compressor beyond LangChain's ``compress_documents``, when it
    offers it: a per-call threshold, the best score of all candidates (kept or not) for the
    re-query to compare, and the thresholds that suit its scores.

    Async callers use its ``arerank`` (same arguments, awaitable) when it has one, else run
    ``rerank`` in the event loop's default pool."""

    def rerank(
        self,
        documents: Sequence[Document],
        query: str,
        *,
        top_n: int | None = None,
        threshold: float | None = None,
    ) -> Reranked: ...

    def default_threshold(self) -> float: ...

    def requery_threshold(self) -> float: ...


class RerankCompressor(BaseDocumentCompressor):
    """Keep the first ``top_n`` chunks scoring at least ``threshold``; scores go into metadata.

    A scorer that ``reorders`` (a cross-encoder; any scorer without the attribute) ranks the
    chunks by its scores first; one that does not (the similarity fallback) keeps the order
    the chunks came in, whichever fusion made it, and only cuts.

    ``primary`` is tried first (on ``warm_up()`` or first use); if it cannot load, ``fallback``
    takes over and ``status()`` says so.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    primary: Any
    fallback: Any = None
    top_n: int = Field(4, ge=1)
    threshold: float | None = None
    executor: Any = Field(
        None,
        exclude=True,
        description="where async calls score (CPU work): a concurrent.futures.Executor; "
        "None: the event loop's default pool",
    )

    _active: Any = PrivateAttr(default=None)
    _fallback_reason: str | None = PrivateAttr(default=None)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def warm_up(self) -> None:
        if self._active is not None:
            return
        with self._lock:
            if self._active is not None:
                return
            try:
                self.primary.load()
                self._active = self.primary
            except Exception as exc:
                if self.fallback is None:
                    raise
                self._fallback_reason = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                log.warning(
                    "reranker %r could not be loaded (%s); falling back to %s scoring with %r",
                    getattr(self.primary, "name", self.primary),
                    self._fallback_reason,
                    self.fallback.kind,
                    self.fallback.name,
                )
                self.fallback.load()
                self._active = self.fallback

    @property
    def effective_threshold(self) -> float:
        self.warm_up()
        return self.threshold if self.threshold is not None else self._active.default_threshold

    @property
    def reorders(self) -> bool:
        """Whether the active scorer's order replaces the order the chunks came in."""
        self.warm_up()
        return bool(getattr(self._active, "reorders", True))

    def status(self) -> dict[str, Any]:
        """What is actually scoring, for health checks and response metadata."""
        self.warm_up()
        status = {
            "kind": self._active.kind,
            "model": self._active.name,
            "requested_model": getattr(self.primary, "name", None),
            "fallback": self._active is not self.primary,
            "fallback_reason": self._fallback_reason,
            "top_n": self.top_n,
            "threshold": self.effective_threshold,
            "reorders": self.reorders,
        }
        describe = getattr(self._active, "describe", None)
        if callable(describe):
            status["scoring"] = describe()
        return status

    def default_threshold(self) -> float:
        return self.effective_threshold

    def requery_threshold(self) -> float:
        """The active scorer's default best score under which a re-query is worth a try."""
        self.warm_up()
        return float(self._active.default_requery_below)

    def rerank(
        self,
        documents: Sequence[Document],
        query: str,
        *,
        top_n: int | None = None,
        threshold: float | None = None,
    ) -> Reranked:
        """Score every chunk; keep the first ``top_n`` at or above the threshold, in the
        scorer's order when it ``reorders``, else in the order given.

        ``best_score`` is the best score of all, kept or not: a re-query compares it, and the
        turn abstains when it is under the threshold.
        """
        cut = self.effective_threshold if threshold is None else threshold
        if not documents:
            return Reranked(documents=[], best_score=None, threshold=cut)
        self.warm_up()
        if hasattr(self._active, "score_documents"):
            scores = self._active.score_documents(query, documents)
        else:
            scores = self._active.score([(query, d.page_content) for d in documents])
        ranked = list(zip(documents, scores, strict=True))
        if self.reorders:
            ranked.sort(key=lambda p: p[1], reverse=True)  # stable: ties keep the given order
        kept: list[Document] = []
        for doc, score in ranked:
            if len(kept) == (top_n or self.top_n):
                break
            if score < cut:
                continue
            doc = Document(id=doc.id, page_content=doc.page_content, metadata=dict(doc.metadata))
            doc.metadata["rerank_score"] = float(score)
            doc.metadata["reranker"] = self._active.kind
            doc.metadata["reranker_fallback"] = self._active is not self.primary
            kept.append(doc)
        return Reranked(documents=kept, best_score=float(max(scores)), threshold=cut)

    async def arerank(
        self,
        documents: Sequence[Document],
        query: str,
        *,
        top_n: int | None = None,
        threshold: float | None = None,
    ) -> Reranked:
        """``rerank`` for async callers: the scoring runs in ``executor``, off the loop."""
        return await run_off_loop(
            self.executor, self.rerank, documents, query, top_n=top_n, threshold=threshold
        )

    def compress_documents(
        self,
        documents: Sequence[Document],
        query: str,
        callbacks: Callbacks | None = None,
    ) -> Sequence[Document]:
        return self.rerank(documents, query).documents

    async def acompress_documents(
        self,
        documents: Sequence[Document],
        query: str,
        callbacks: Callbacks | None = None,
    ) -> Sequence[Document]:
        return (await self.arerank(documents, query)).documents


def compressing_retriever(
    retriever: BaseRetriever, compressor: RerankCompressor
) -> ContextualCompressionRetriever:
    """Retrieve, then compress; per-call kwargs (k, filters) reach the base retriever."""
    return ContextualCompressionRetriever(base_compressor=compressor, base_retriever=retriever)
