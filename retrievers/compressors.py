"""Rerank-and-cut compression: score (query, chunk) pairs, keep ``top_n`` at or above a threshold.

The scorer is a sentence-transformers CrossEncoder. When its weights cannot be loaded (our
machines have no network and no package ships them) the compressor falls back to cosine
similarity from the embedder, says so in a warning, and reports it in ``status()`` and in each
kept chunk's metadata, so nobody mistakes fallback scores for cross-encoder scores.

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
from langchain_classic.retrievers import ContextualCompressionRetriever
from langchain_classic.retrievers.document_compressors.cross_encoder import BaseCrossEncoder
from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field, PrivateAttr

from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.workers import run_off_loop

log = logging.getLogger(__name__)

# Scores are on different scales: the cross-encoder's are sigmoid probabilities, the
# fallback's are cosine similarities. Each scorer brings the threshold that suits it.
# The similarity scorer's come from `ragchains eval abstention` on SciFact (committed in
# evaluation/baselines/scifact-abstention): 0.46 abstains most while wrongly abstaining on at
# most 10% of answerable questions, and a quarter of answerable questions score below 0.54,
# where a chat turn asks once for a better query. The cross-encoder's are uncalibrated first
# guesses: no cross-encoder weights could be measured here.
CROSS_ENCODER_THRESHOLD = 0.1
SIMILARITY_THRESHOLD = 0.46
# Below these best scores a chat turn asks the LLM once for a better query.
CROSS_ENCODER_REQUERY_BELOW = 0.3
SIMILARITY_REQUERY_BELOW = 0.54


class SentenceTransformerCrossEncoder(BaseCrossEncoder):
    """A sentence-transformers CrossEncoder from a hub id (local cache only) or a local path."""

    kind = "cross-encoder"
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
            from sentence_transformers import CrossEncoder

            local = Path(self.name).expanduser()
            source = str(local) if local.exists() else self.name
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


class EmbeddingSimilarityScorer(BaseCrossEncoder):
    """Cosine similarity of query and chunk embeddings: needs only the embedder's weights.

    ``stored`` gives the vectors an index already holds for chunk ids; those chunks are not
    embedded again (that was most of a chat turn's CPU time).
    """

    kind = "embedding-similarity"
    default_threshold = SIMILARITY_THRESHOLD
    default_requery_below = SIMILARITY_REQUERY_BELOW

    def __init__(
        self,
        embedder: SentenceTransformerEmbedder,
        stored: Callable[[Sequence[str]], Mapping[str, np.ndarray]] | None = None,
    ) -> None:
        self.embedder = embedder
        self.name = embedder.name
        self.stored = stored

    def load(self) -> None:
        self.embedder.encode(["warm up"])

    def score(self, text_pairs: list[tuple[str, str]]) -> list[float]:
        if not text_pairs:
            return []
        queries = sorted({q for q, _ in text_pairs})
        q_vecs = dict(zip(queries, self.embedder.encode(queries), strict=True))
        d_vecs = self.embedder.encode([d for _, d in text_pairs])
        return [float(q_vecs[q] @ d) for (q, _), d in zip(text_pairs, d_vecs, strict=True)]

    def score_documents(self, query: str, documents: Sequence[Document]) -> list[float]:
        known = self.stored([str(d.id) for d in documents if d.id]) if self.stored else {}
        missing = [d.page_content for d in documents if str(d.id) not in known]
        q_vec = self.embedder.encode_query(query)
        fresh = iter(self.embedder.encode(missing) if missing else [])
        vectors = [known[str(d.id)] if str(d.id) in known else next(fresh) for d in documents]
        return [float(q_vec @ v) for v in vectors]


@dataclass
class Reranked:
    documents: list[Document]  # kept, best first, each with its ``rerank_score``
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
    """Keep the ``top_n`` best chunks scoring at least ``threshold``; scores go into metadata.

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

    def status(self) -> dict[str, Any]:
        """What is actually scoring, for health checks and response metadata."""
        self.warm_up()
        return {
            "kind": self._active.kind,
            "model": self._active.name,
            "requested_model": getattr(self.primary, "name", None),
            "fallback": self._active is not self.primary,
            "fallback_reason": self._fallback_reason,
            "top_n": self.top_n,
            "threshold": self.effective_threshold,
        }

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
        """Score every chunk, keep the best ``top_n`` at or above the threshold.

        ``best_score`` is the best score of all, kept or not: a re-query compares it.
        """
        cut = self.effective_threshold if threshold is None else threshold
        if not documents:
            return Reranked(documents=[], best_score=None, threshold=cut)
        self.warm_up()
        if hasattr(self._active, "score_documents"):
            scores = self._active.score_documents(query, documents)
        else:
            scores = self._active.score([(query, d.page_content) for d in documents])
        ranked = sorted(zip(documents, scores, strict=True), key=lambda p: p[1], reverse=True)
        kept = []
        for doc, score in ranked[: top_n or self.top_n]:
            if score < cut:
                break
            doc = Document(id=doc.id, page_content=doc.page_content, metadata=dict(doc.metadata))
            doc.metadata["rerank_score"] = float(score)
            doc.metadata["reranker"] = self._active.kind
            doc.metadata["reranker_fallback"] = self._active is not self.primary
            kept.append(doc)
        return Reranked(documents=kept, best_score=float(ranked[0][1]), threshold=cut)

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
