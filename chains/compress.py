"""The compress stage's work, over LangChain's ``BaseDocumentCompressor`` contract: cut (and,
with a reranker, reorder) the retrieved chunks for a query, and say how (the best score of all
candidates, kept or not, which the re-query compares and the turn abstains under; the
threshold the turn applied; the scorer in use). Ours reorders only with a cross-encoder: its
similarity fallback keeps the retrieved order, whichever fusion made it.

A compressor that also ``rerank``s with a threshold (``retrievers.compressors.
ScoringCompressor``, as ours does) reports the best score of all candidates; for any other
compressor the best score is read from the kept chunks' ``rerank_score`` /
``relevance_score`` metadata, if any.
"""

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import run_in_executor

from ragchains.chains.options import Options
from ragchains.retrievers.compressors import Reranked, ScoringCompressor

# Metadata keys under which compressors leave their score (ours, then LangChain integrations').
SCORE_KEYS = ("rerank_score", "relevance_score")


def compressor_score(doc: Document) -> float | None:
    for key in SCORE_KEYS:
        value = doc.metadata.get(key)
        if value is not None:
            return float(value)
    return None


# ----------------------------------------------------------------------------- compress
@dataclass(frozen=True)
class Compressed:
    documents: list[Document]  # kept: a reranker's best first, else in the retrieved order
    best_score: float | None  # best of all candidates (kept or not) where known
    threshold: float | None
    seconds: float = 0.0


def compress(
    compressor: BaseDocumentCompressor | None,
    documents: Sequence[Document],
    query: str,
    *,
    threshold: float | None = None,
    config: RunnableConfig | None = None,
) -> Compressed:
    """Cut (and rerank) ``documents`` for ``query``; without a compressor, keep them all."""
    since = time.perf_counter()
    if compressor is None:
        return _kept_all(documents, since)
    if isinstance(compressor, ScoringCompressor):
        return _reranked(compressor.rerank(documents, query, threshold=threshold), since)
    callbacks = (config or {}).get("callbacks")
    return _kept_by(
        list(compressor.compress_documents(documents, query, callbacks=callbacks)), since
    )


async def acompress(
    compressor: BaseDocumentCompressor | None,
    documents: Sequence[Document],
    query: str,
    *,
    threshold: float | None = None,
    config: RunnableConfig | None = None,
) -> Compressed:
    """``compress`` for async callers, never scoring on the event loop: a reranker through
    its ``arerank`` (ours scores in its own pool) or else in a worker thread, any other
    compressor through its own ``acompress_documents``."""
    since = time.perf_counter()
    if compressor is None:
        return _kept_all(documents, since)
    if isinstance(compressor, ScoringCompressor):
        arerank = getattr(compressor, "arerank", None)
        if callable(arerank):
            reranked = await arerank(documents, query, threshold=threshold)
        else:
            reranked = await run_in_executor(
                config, compressor.rerank, documents, query, threshold=threshold
            )
        return _reranked(reranked, since)
    callbacks = (config or {}).get("callbacks")
    kept = await compressor.acompress_documents(documents, query, callbacks=callbacks)
    return _kept_by(list(kept), since)


def _kept_all(documents: Sequence[Document], since: float) -> Compressed:
    return Compressed(list(documents), None, None, round(time.perf_counter() - since, 4))


def _reranked(reranked: Reranked, since: float) -> Compressed:
    return Compressed(
        reranked.documents,
        reranked.best_score,
        reranked.threshold,
        round(time.perf_counter() - since, 4),
    )


def _kept_by(kept: list[Document], since: float) -> Compressed:
    """What a compressor without ``rerank`` kept; its best score is the kept chunks' best."""
    scores = [s for s in map(compressor_score, kept) if s is not None]
    best = max(scores) if scores else None
    return Compressed(kept, best, None, round(time.perf_counter() - since, 4))


def compressor_status(compressor: BaseDocumentCompressor | None) -> dict[str, Any]:
    """What compresses, for response metadata: ours reports its scorer and any fallback."""
    if compressor is None:
        return {"kind": "none"}
    status = getattr(compressor, "status", None)
    if callable(status):
        return dict(status())
    return {"kind": type(compressor).__name__, "top_n": getattr(compressor, "top_n", None)}


def threshold_for(options: Options, compressor: BaseDocumentCompressor | None) -> float | None:
    """The cut for this turn: the request's threshold, else the domain's for the compressor's
    scorer kind, else None (the compressor's own default)."""
    if options.threshold is not None or not options.thresholds:
        return options.threshold
    return options.thresholds.get(str(compressor_status(compressor).get("kind")))


def threshold_default(compressor: BaseDocumentCompressor | None) -> Any:
    """A callable giving the compressor's threshold when it takes one per request, else None."""
    if isinstance(compressor, ScoringCompressor):
        return compressor.default_threshold
    return None
