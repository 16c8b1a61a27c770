"""The compress stage's work, over LangChain's ``BaseDocumentCompressor`` contract: cut (and,
with a reranker, reorder) the retrieved chunks for a query, and say how (the best score of all
candidates, kept or not, which the re-query compares and the turn abstains under; the
threshold the turn applied; the scorer in use).

The compressor is called through its own ``compress_documents`` (``acompress_documents`` for
async callers) and nothing else. Scores are read where LangChain's rerankers leave them, in
each document's metadata (``rerank_score``, ``relevance_score``).

A compressor that keeps its ``top_n`` best (ours, LangChain's ``CrossEncoderReranker``, most
rerankers) is asked, as a copy, for every candidate it scores: ``top_n`` as many as there are
candidates, and when it says its own threshold (``default_threshold()``, as ours does) its
``threshold`` field lifted. The stage then makes the cut the compressor would have made: the
first ``top_n`` in the compressor's order scoring at least the turn's threshold (the request's,
else the domain's for the scorer's kind, else the compressor's own). So the best score is the
best of all candidates, and a request's threshold needs no method beyond the contract. Ours
reorders only with a cross-encoder: its similarity fallback keeps the retrieved order,
whichever fusion made it.

Any other compressor (``EmbeddingsFilter``, a pipeline, an LLM extractor) cuts by itself; the
best score is then the best its kept chunks carry, if they carry scores.
"""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
from typing_extensions import TypedDict

from ragchains.chains.changelogs import version_entries_last
from ragchains.chains.options import Options
from ragchains.chains.state import Call

# Metadata keys under which compressors leave their score (ours, then LangChain integrations').
SCORE_KEYS = ("rerank_score", "relevance_score")


def compressor_score(doc: Document) -> float | None:
    for key in SCORE_KEYS:
        value = doc.metadata.get(key)
        if value is not None:
            return float(value)
    return None


@dataclass(frozen=True)
class Compressed:
    documents: list[Document]  # kept: a reranker's best first, else in the retrieved order
    best_score: float | None  # best of all candidates (kept or not) where known
    threshold: float | None  # the cut this turn applied; None: the compressor cut by itself


class CompressInput(TypedDict):
    documents: list[Document]
    query: str


def as_runnable(compressor: BaseDocumentCompressor) -> Runnable[CompressInput, list[Document]]:
    """``compressor`` as a runnable: ``{"documents", "query"}`` in, what it keeps out, through
    its ``compress_documents`` (async callers: its ``acompress_documents``, which ours runs
    off the event loop), its callbacks the run's."""

    def compress(request: CompressInput, config: RunnableConfig) -> list[Document]:
        documents, query = request["documents"], request["query"]
        callbacks = config.get("callbacks")
        return list(compressor.compress_documents(documents, query, callbacks=callbacks))

    async def acompress(request: CompressInput, config: RunnableConfig) -> list[Document]:
        documents, query = request["documents"], request["query"]
        callbacks = config.get("callbacks")
        return list(await compressor.acompress_documents(documents, query, callbacks=callbacks))

    return RunnableLambda(compress, afunc=acompress, name=type(compressor).__name__)


def keeps_top_n(compressor: BaseDocumentCompressor | None) -> bool:
    """Whether ``compressor`` keeps its ``top_n`` best (a field of that name says so)."""
    return compressor is not None and "top_n" in type(compressor).model_fields


def own_threshold(compressor: BaseDocumentCompressor | None) -> Callable[[], float] | None:
    """A callable giving the threshold the compressor cuts at by default, when it says one
    (``default_threshold()``, as ours does: known once its scorer has loaded), else None."""
    default = getattr(compressor, "default_threshold", None)
    return default if callable(default) else None


def scoring_all(
    compressor: BaseDocumentCompressor, candidates: int
) -> tuple[BaseDocumentCompressor, int | None]:
    """A copy of ``compressor`` that keeps every one of ``candidates`` it scores, and the
    ``top_n`` it would have kept; the compressor itself (and None) when it has no ``top_n``
    and so cuts by itself."""
    top_n = getattr(compressor, "top_n", None)
    if not keeps_top_n(compressor) or not isinstance(top_n, int):
        return compressor, None
    lifted: dict[str, Any] = {"top_n": max(candidates, 1)}
    if "threshold" in type(compressor).model_fields and own_threshold(compressor) is not None:
        lifted["threshold"] = -math.inf  # the stage cuts, at the turn's threshold
    # Ours loads its scorer on first use; a copy made before would load one of its own.
    warm_up = getattr(compressor, "warm_up", None)
    if callable(warm_up):
        warm_up()
    return compressor.model_copy(update=lifted), top_n


def cut(scored: Sequence[Document], *, top_n: int | None, threshold: float | None) -> Compressed:
    """The first ``top_n`` of ``scored`` (in the compressor's order) scoring at least
    ``threshold``; a chunk without a score cannot be judged by it and stays. The best score
    is the best of all ``scored``."""
    scores = [compressor_score(doc) for doc in scored]
    known = [score for score in scores if score is not None]
    kept = [
        doc
        for doc, score in zip(scored, scores, strict=True)
        if threshold is None or score is None or score >= threshold
    ]
    return Compressed(kept[:top_n], max(known) if known else None, threshold)


def best_of(
    lists: Sequence[Sequence[Document]], *, reorders: bool, key: Callable[[Document], str]
) -> list[Document]:
    """One scored list from the lists of several queries: each chunk with the best score any
    query gave it, in the first list's order (a compressor that keeps the given order), or
    best first (one that ``reorders``; ties keep the order of first appearance)."""
    best: dict[str, Document] = {}
    for docs in lists:
        for doc in docs:
            held = best.get(key(doc))
            if held is None or _better(doc, held):
                best[key(doc)] = doc  # a dict keeps a key's first place
    merged = list(best.values())
    if reorders:
        merged.sort(key=lambda d: -(compressor_score(d) or -math.inf))
    return merged


def _better(doc: Document, held: Document) -> bool:
    score, was = compressor_score(doc), compressor_score(held)
    return score is not None and (was is None or score > was)


def compression(
    compressor: BaseDocumentCompressor,
    documents: Sequence[Document],
    query: str,
    *,
    threshold: float | None = None,
    also: Sequence[str] = (),
    key: Callable[[Document], str],
) -> Call:
    """The compress stage's call: ``documents`` scored for ``query`` by ``compressor`` (every
    one, where it keeps a ``top_n``), then cut at ``threshold`` (None: the compressor's
    own, if it says one).

    ``also``: the other queries the documents were searched for (the user's own words
    beside a rewrite, more phrasings). Each chunk (the same in every list by ``key``) is
    then judged by the query it answers best, so that no query's find is cut for not
    answering another: a follow-up's rewrite cannot lose what the user's words found."""
    scorer, top_n = scoring_all(compressor, len(documents))
    if threshold is None and top_n is not None and (own := own_threshold(compressor)):
        threshold = float(own())
    queries = list(dict.fromkeys([query, *also]))

    def finish(scored: Sequence[Document]) -> Compressed:
        # A reranker orders by its own score: changelog entries go after the rest again
        # before the cut keeps its top_n (chains.changelogs).
        return cut(version_entries_last(scored, queries), top_n=top_n, threshold=threshold)

    if len(queries) == 1:
        request = CompressInput(documents=list(documents), query=query)
        return Call(as_runnable(scorer), request, finish)
    requests = [CompressInput(documents=list(documents), query=q) for q in queries]
    reorders = bool(getattr(compressor, "reorders", True))

    def merged(lists: list[list[Document]]) -> Compressed:
        return finish(best_of(lists, reorders=reorders, key=key))

    # One query after another: a chunk's passages, embedded for the first, are remembered
    # for the next (side by side, each would embed them again).
    return Call(as_runnable(scorer).map().with_config(max_concurrency=1), requests, merged)


def kept_all(documents: Sequence[Document]) -> Compressed:
    """Without a compressor: every document, in the retrieved order."""
    return Compressed(list(documents), None, None)


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
    """A callable giving the compressor's threshold when it takes one per request, else None:
    the stage cuts at a request's threshold where the compressor scores every candidate for
    it (it keeps a ``top_n``) and says its own."""
    return own_threshold(compressor) if keeps_top_n(compressor) else None
