"""Retrieval evaluation on BEIR data, through the product's own index and retrievers.

Each retriever setting ranks every judged query over the dataset's index (see
``evaluation.beirindex``); a ranked list of chunks is a ranked list of documents there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from langchain_core.documents import Document
from langchain_core.runnables import Runnable
from tqdm import tqdm

from ragchains.chains.retrieve import Searcher
from ragchains.chains.rewrite import RewriteOutput
from ragchains.evaluation import RETRIEVERS
from ragchains.evaluation.beirindex import load_queries, open_corpus
from ragchains.evaluation.datasets import BeirDataset
from ragchains.evaluation.metrics import mrr_at_k, ndcg_at_k, recall_at_k
from ragchains.evaluation.runs import RunWriter, run_dir
from ragchains.factory import build_compressor, build_embedder, build_retriever
from ragchains.retrievers.bm25 import BM25_PARAMS, BM25Retriever
from ragchains.retrievers.compressors import RerankCompressor
from ragchains.retrievers.dense import FaissRetriever
from ragchains.retrievers.hybrid import HybridRetriever
from ragchains.retrievers.pgsearch import LEXICAL_RANK, PostgresRetriever
from ragchains.settings import Settings

DEPTH = 100  # recall@100 needs 100 results
RETRIEVAL_METRICS = ("ndcg@10", "recall@10", "recall@100", "mrr@10")
DEFAULT_RETRIEVERS = ("bm25", "dense", "hybrid")


# How the store ranks the lexical half: BM25 from the postings it keeps (the "fulltext"
# search mode; schema version 2 ranked with PostgreSQL's ts_rank).
STORE_LEXICAL = f"postgresql: {LEXICAL_RANK}"


@dataclass
class RetrieverSetup:
    """One retriever setting, ready to rank queries, and the parameters that define it."""

    name: str
    params: dict[str, Any]
    rank: Callable[[str], list[str]]  # query -> document ids, best first
    # What the setting searched for the last query, when it is not the query (a rewrite).
    searched: Callable[[], dict[str, Any]] | None = None


def build_setup(
    name: str,
    hybrid: HybridRetriever | PostgresRetriever,
    *,
    compressor: RerankCompressor | None = None,
    rewrite: Runnable[dict[str, Any], RewriteOutput] | None = None,
    depth: int = DEPTH,
) -> RetrieverSetup:
    """The product's retriever for ``name`` (one of ``RETRIEVERS``), returning ``depth`` ids.

    ``hybrid`` is the configured retriever (``factory.build_retriever``); the BM25 and dense
    settings search its index on their own. ``rewrite`` is the chat graph's rewrite chain,
    for "rewrite+hybrid": each query is one first turn of a chat, searched as the chat graph
    searches it (the rewrite's query, filters and phrasings, fused by RRF).
    """
    if name not in RETRIEVERS:
        raise ValueError(f"unknown retriever {name!r}; choose from {', '.join(RETRIEVERS)}")
    embedder = hybrid.embedder
    params: dict[str, Any] = {"depth": depth}

    def ids(docs: Sequence[Document]) -> list[str]:
        return [str(d.id) for d in docs]

    if isinstance(hybrid, PostgresRetriever) and name in ("bm25", "dense"):
        # The store's own halves: BM25 from its postings, and pgvector.
        half = hybrid.model_copy(
            update={"search": "fulltext" if name == "bm25" else "dense", "k": depth}
        )
        params["store"] = "postgresql"
        if name == "bm25":
            params["lexical"] = STORE_LEXICAL
        else:
            params.update(embedder=embedder.name, dense="pgvector hnsw (cosine)")
        return RetrieverSetup(name, params, lambda q: ids(half.invoke(q)))
    if name == "bm25":
        assert isinstance(hybrid, HybridRetriever)
        bm25 = BM25Retriever(index=hybrid.index, k=depth)
        params["bm25"] = BM25_PARAMS
        return RetrieverSetup(name, params, lambda q: ids(bm25.invoke(q)))
    if name == "dense":
        assert isinstance(hybrid, HybridRetriever)
        index = hybrid.index
        dense = FaissRetriever(index=index, embedder=embedder, k=depth)
        params["embedder"] = embedder.name
        params["dense"] = index.pinned().manifest.get("dense")
        return RetrieverSetup(name, params, lambda q: ids(dense.invoke(q)))
    deep = hybrid.model_copy(update={"k": depth, "candidates": max(hybrid.candidates, depth)})
    if isinstance(hybrid, PostgresRetriever):
        params.update(store="postgresql", lexical=STORE_LEXICAL)
    else:
        params["bm25"] = BM25_PARAMS
    params.update(embedder=embedder.name, **hybrid_params(deep))
    if name == "hybrid":
        return RetrieverSetup(name, params, lambda q: ids(deep.invoke(q)))
    if name == "rewrite+hybrid":
        if rewrite is None:
            raise ValueError("rewrite+hybrid needs the rewrite chain")
        return _rewritten(name, params, deep, rewrite, depth)
    if compressor is None:
        raise ValueError("hybrid+compress needs a compressor")
    params["compressor"] = compressor.status()
    params["compressor"]["note"] = (
        "the hybrid's top results reranked, all kept: the threshold is "
        "`ragchains eval abstention`'s subject"
    )

    def reranked(query: str) -> list[str]:
        found = deep.invoke(query)
        return ids(compressor.rerank(found, query, top_n=depth, threshold=-np.inf).documents)

    return RetrieverSetup(name, params, reranked)


def _rewritten(
    name: str,
    params: dict[str, Any],
    retriever: HybridRetriever | PostgresRetriever,
    rewrite: Runnable[dict[str, Any], RewriteOutput],
    depth: int,
) -> RetrieverSetup:
    searcher = Searcher(retriever)
    last: dict[str, Any] = {}

    def rank(query: str) -> list[str]:
        out = rewrite.invoke({"question": query})
        last.clear()
        last.update(
            search_query=out.search_query,
            filters=[str(f) for f in out.filters],
            alternatives=out.alternatives,
            rewrite_notes=out.notes,
        )
        found = searcher.search(
            out.search_query, filters=out.filters, alternatives=out.alternatives, k=depth
        )
        return [str(d.id) for d in found.documents]

    return RetrieverSetup(name, params, rank, searched=lambda: dict(last))


def hybrid_params(retriever: HybridRetriever | PostgresRetriever) -> dict[str, Any]:
    """What defines a hybrid retriever's ranking, for a run's config: the fusion in use and
    where it came from (fields set by settings, the index's fusion.json, the defaults)."""
    fusion = retriever.fusion_config
    return {
        "k": retriever.k,
        "candidates_per_retriever": retriever.candidates,
        "fusion": fusion.model_dump(),
        "fusion_label": fusion.describe(),
        "fusion_from": {
            "settings": sorted(retriever.fusion_set),
            "index_fusion_json": retriever.base_fusion() is not None,
        },
    }


def score_ranking(ranked: Sequence[str], relevant: dict[str, float]) -> dict[str, float]:
    return {
        "ndcg@10": ndcg_at_k(ranked, relevant, 10),
        "recall@10": recall_at_k(ranked, relevant, 10),
        "recall@100": recall_at_k(ranked, relevant, 100),
        "mrr@10": mrr_at_k(ranked, relevant, 10),
    }


def evaluate_setup(
    setup: RetrieverSetup,
    dataset: BeirDataset,
    *,
    on_item: Callable[[dict[str, Any]], None],
    progress: bool = True,
) -> dict[str, float]:
    """Rank every judged query; hand each item to ``on_item``; return the mean metrics."""
    totals = dict.fromkeys(RETRIEVAL_METRICS, 0.0)
    for qid, query in tqdm(
        dataset.queries.items(), desc=setup.name, unit="query", disable=not progress
    ):
        ranked = setup.rank(query)
        relevant = dataset.qrels[qid]
        scores = score_ranking(ranked, relevant)
        for name, value in scores.items():
            totals[name] += value
        first = next((n for n, d in enumerate(ranked, 1) if relevant.get(d, 0) > 0), None)
        on_item(
            {
                "id": qid,
                "query": query,
                **(setup.searched() if setup.searched else {}),
                **scores,
                "first_relevant_rank": first,
                "relevant": sorted(d for d, g in relevant.items() if g > 0),
                "top10": ranked[:10],
            }
        )
    n = len(dataset.queries)
    return {name: total / n for name, total in totals.items()}


def run_retrieval(
    settings: Settings,
    dataset: Path,
    *,
    split: str,
    index: Path | str | None,
    retrievers: Sequence[str],
    out: Path | None,
    limit: int | None,
    rewrite_chain: Callable[[dict[str, str]], Runnable[dict[str, Any], RewriteOutput]],
    progress: bool = True,
    say: Callable[[str], None] = print,
) -> list[Path]:
    """Measure each of ``retrievers`` (default: ``DEFAULT_RETRIEVERS``) on the first
    ``limit`` judged queries of ``dataset``'s ``split``; one run folder each under ``out``.

    The dataset's index is built or reused first (``index``: a folder or a store URL).
    ``rewrite_chain`` makes the chat graph's rewrite chain for the index's fields; it is
    called only when "rewrite+hybrid" is measured, so the other settings need no chat model.
    """
    data = load_queries(dataset, split, limit)
    out = run_dir(out, "retrieval", data.name)
    embedder = build_embedder(settings)
    search_index, location = open_corpus(
        data,
        index,
        embedder,
        hnsw_min_chunks=settings.hnsw_min_chunks,
        progress=progress,
        say=say,
    )
    hybrid = build_retriever(settings, search_index, embedder)
    runs = []
    for name in retrievers or DEFAULT_RETRIEVERS:
        compressor = (
            build_compressor(settings, embedder, search_index)
            if name == "hybrid+compress"
            else None
        )
        rewrite = rewrite_chain(dict(search_index.fields)) if name == "rewrite+hybrid" else None
        setup = build_setup(name, hybrid, compressor=compressor, rewrite=rewrite)
        config = {
            "kind": "retrieval",
            # Hybrid settings name their fusion: runs of two fusions read apart in tables.
            "label": f"{data.name}/{name}"
            + (f" ({setup.params['fusion_label']})" if "fusion_label" in setup.params else ""),
            "dataset": str(dataset),
            "split": split,
            "queries": len(data.queries),
            "documents": len(data.doc_ids),
            "index": str(location),
            "retriever": name,
            **setup.params,
        }
        with RunWriter(out / name.replace("+", "-"), config) as writer:
            metrics = evaluate_setup(setup, data, on_item=writer.add, progress=progress)
            summary = {
                "count": writer.count,
                "metrics": metrics,
                "item_metrics": list(metrics),
                "item_outputs": ["first_relevant_rank"],
            }
            runs.append(writer.finish(summary))
    return runs
