"""Retrieval evaluation on BEIR data, through the product's own index and retrievers.

The corpus becomes a regular ragchains index with one chunk per document (title + text),
as BEIR evaluates: chunk id = document id, so a ranked list of chunks is a ranked list of
documents. The index is built once and reused while the corpus and the embedder are the same.
"""

from __future__ import annotations

import os
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
from ragchains.evaluation.datasets import BeirDataset
from ragchains.evaluation.metrics import mrr_at_k, ndcg_at_k, recall_at_k
from ragchains.ingest.chunking import sha256_text
from ragchains.ingest.pipeline import build_and_write, embed_texts
from ragchains.retrievers.bm25 import BM25_PARAMS, BM25Retriever
from ragchains.retrievers.compressors import RerankCompressor
from ragchains.retrievers.dense import FaissRetriever
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.hybrid import HybridRetriever
from ragchains.retrievers.indexformat import Chunk, FileRecord, IndexLoadError, IndexNotFoundError
from ragchains.retrievers.indexwriter import IndexContents, writer_lock
from ragchains.retrievers.pgsearch import LEXICAL_RANK, PostgresRetriever
from ragchains.retrievers.pgstore import PostgresStore
from ragchains.retrievers.pgwriter import StoreDelta
from ragchains.retrievers.searchindex import SearchIndex, load_index

DEPTH = 100  # recall@100 needs 100 results
RETRIEVAL_METRICS = ("ndcg@10", "recall@10", "recall@100", "mrr@10")
BEIR_CHUNKING = {"beir": "one chunk per document: title + newline + text"}


# How the store ranks the lexical half (its BM25 is PostgreSQL's full-text ranking).
STORE_LEXICAL = f"postgresql full-text: {LEXICAL_RANK} over an OR of the query's words"


def default_index_dir(dataset: BeirDataset) -> Path:
    """A cache folder per corpus content, outside the dataset (which may be read-only)."""
    root = Path(
        os.environ.get("RAGCHAINS_EVAL_CACHE", Path.home() / ".cache" / "ragchains" / "eval")
    )
    return root / f"{dataset.name}-{dataset.corpus_sha256[:12]}"


def beir_chunks(dataset: BeirDataset) -> list[Chunk]:
    """One chunk per document (title + text), its id the document's id."""
    corpus = dataset.corpus_path
    chunks = []
    for row, doc_id in enumerate(dataset.doc_ids):
        text = dataset.document_text(row)
        chunks.append(
            Chunk(
                id=doc_id,
                text=text,
                metadata={
                    "source": corpus.name,
                    "filename": corpus.name,
                    "format": "beir",
                    "title": dataset.titles[row],
                    "citation": doc_id,
                    "content_hash": sha256_text(text),
                    "chunk_index": row,
                },
            )
        )
    return chunks


def _corpus_record(dataset: BeirDataset, chunks: int) -> FileRecord:
    corpus = dataset.corpus_path
    return FileRecord(corpus.name, dataset.corpus_sha256, corpus.stat().st_size, chunks, "beir")


def beir_index(
    dataset: BeirDataset,
    index_dir: Path,
    embedder: SentenceTransformerEmbedder,
    *,
    hnsw_min_chunks: int,
    progress: bool = True,
    say: Callable[[str], None] = print,
) -> SearchIndex:
    """Open the index of ``dataset`` at ``index_dir``, building it first if it is missing
    or was built from another corpus, embedder or chunking."""
    corpus, sha = dataset.corpus_path, dataset.corpus_sha256
    existing, reason = _open_if_current(index_dir, embedder, corpus.name, sha)
    if existing is not None:
        say(f"reusing the index at {index_dir}")
        return existing
    say(f"building the index at {index_dir} ({reason})")
    chunks = beir_chunks(dataset)
    embedder.count_tokens("")  # load the model before the progress bar starts
    vectors = embed_texts(embedder, [c.text for c in chunks], progress)
    contents = IndexContents(
        chunks=chunks,
        vectors=vectors,
        files=[_corpus_record(dataset, len(chunks))],
        fields={},
        embedder={"name": embedder.name, "dimension": embedder.dimension},
        chunking=BEIR_CHUNKING,
    )
    with writer_lock(index_dir):
        build_and_write(index_dir, contents, hnsw_min_chunks=hnsw_min_chunks, progress=progress)
    return load_index(index_dir, embedder_name=embedder.name)


def beir_store(
    dataset: BeirDataset,
    url: str,
    embedder: SentenceTransformerEmbedder,
    *,
    progress: bool = True,
    say: Callable[[str], None] = print,
) -> PostgresStore:
    """The PostgreSQL store at ``url`` holding ``dataset``'s corpus, written first (in one
    transaction) unless it already holds this corpus with this embedder. Vectors come from
    the dataset's on-disk evaluation index when it has them (the same embedder gives the
    same vectors), so both stores are measured on identical embeddings."""
    store = PostgresStore(url)
    meta = store.meta(fresh=True)
    record = store.files().get(dataset.corpus_path.name) if meta else None
    if (
        meta.get("chunking") == BEIR_CHUNKING
        and (meta.get("embedder") or {}).get("name") == embedder.name
        and record is not None
        and record.sha256 == dataset.corpus_sha256
    ):
        say(f"reusing the store at {store.location}")
        return store
    say(f"writing the corpus to the store at {store.location}")
    chunks = beir_chunks(dataset)
    stored: dict[str, np.ndarray] = {}
    try:
        on_disk = load_index(default_index_dir(dataset), embedder_name=embedder.name)
    except IndexLoadError:
        pass
    else:
        try:
            stored = on_disk.stored_vectors([c.id for c in chunks])
        finally:
            on_disk.close()
    embedder.count_tokens("")
    missing = [c for c in chunks if c.id not in stored]
    fresh = embed_texts(embedder, [c.text for c in missing], progress)
    stored.update(zip((c.id for c in missing), fresh, strict=True))
    store.write(
        StoreDelta(
            remove_sources=[],
            chunks=chunks,
            vectors=np.stack([stored[c.id] for c in chunks]).astype(np.float32),
            files=[_corpus_record(dataset, len(chunks))],
            embedder={"name": embedder.name, "dimension": embedder.dimension},
            chunking=BEIR_CHUNKING,
            rebuild=True,
        )
    )
    return store


def _open_if_current(
    index_dir: Path, embedder: SentenceTransformerEmbedder, corpus: str, sha: str
) -> tuple[SearchIndex | None, str]:
    """The index at ``index_dir`` if it was built from this corpus with this embedder;
    otherwise None and why it must be built."""
    try:
        index = load_index(index_dir, embedder_name=embedder.name)
    except IndexNotFoundError:
        return None, "none there yet"
    except IndexLoadError as exc:
        return None, str(exc).split(";")[0]
    record = index.store.files().get(corpus)
    if index.manifest.get("chunking") == BEIR_CHUNKING and record is not None:
        if record.sha256 == sha:
            return index, ""
        reason = "the corpus changed"
    else:
        reason = "it is not a BEIR evaluation index"
    index.close()
    return None, reason


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
        # The store's own halves: PostgreSQL full-text ranking, and pgvector.
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
