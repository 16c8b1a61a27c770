"""The BEIR corpus as a ragchains index folder or PostgreSQL store, built once and reused.

The corpus becomes a regular ragchains index with one chunk per document (title + text),
as BEIR evaluates: chunk id = document id, so a ranked list of chunks is a ranked list of
documents. The index is built once and reused while the corpus and the embedder are the same.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ragchains.evaluation import SetupError
from ragchains.evaluation.datasets import BeirDataset, load_beir
from ragchains.ingest.chunking import sha256_text
from ragchains.ingest.embedding import embed_texts
from ragchains.ingest.indexrun import build_and_write
from ragchains.retrievers.embeddings import UNRECORDED_BACKEND, SentenceTransformerEmbedder
from ragchains.retrievers.indexformat import Chunk, FileRecord, IndexLoadError, IndexNotFoundError
from ragchains.retrievers.indexwriter import IndexContents, writer_lock
from ragchains.retrievers.pgstore import PostgresStore
from ragchains.retrievers.pgwriter import StoreDelta
from ragchains.retrievers.searchindex import SearchIndex, load_index

BEIR_CHUNKING = {"beir": "one chunk per document: title + newline + text"}


def load_queries(folder: Path, split: str, limit: int | None) -> BeirDataset:
    """A BEIR folder with only its first ``limit`` judged queries of ``split`` (all if None)."""
    data = load_beir(folder, split)
    if limit:
        data.queries = dict(list(data.queries.items())[:limit])
    return data


def open_corpus(
    data: BeirDataset,
    index: Path | str | None,
    embedder: SentenceTransformerEmbedder,
    *,
    hnsw_min_chunks: int,
    progress: bool = True,
    say: Callable[[str], None] = print,
) -> tuple[SearchIndex | PostgresStore, Path | str]:
    """``data``'s corpus searchable, and where it is: the PostgreSQL store at ``index`` (a
    URL), or the index folder ``index`` (default: a cache folder per corpus), each written
    first unless it holds this corpus already."""
    try:
        if isinstance(index, str):
            store = beir_store(data, index, embedder, progress=progress, say=say)
            return store, store.location
        index_dir = index or default_index_dir(data, embedder.backend)
        found = beir_index(
            data, index_dir, embedder, hnsw_min_chunks=hnsw_min_chunks, progress=progress, say=say
        )
    except ValueError as exc:  # an index folder or store that is not ours, or busy
        raise SetupError(str(exc)) from None
    return found, index_dir


def default_index_dir(dataset: BeirDataset, backend: str = UNRECORDED_BACKEND) -> Path:
    """A cache folder per corpus content and embedder backend, outside the dataset (which
    may be read-only): measuring one backend after the other embeds each corpus once."""
    root = Path(
        os.environ.get("RAGCHAINS_EVAL_CACHE", Path.home() / ".cache" / "ragchains" / "eval")
    )
    suffix = "" if backend == UNRECORDED_BACKEND else f"-{backend}"
    return root / f"{dataset.name}-{dataset.corpus_sha256[:12]}{suffix}"


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
        embedder=embedder.record(),
        chunking=BEIR_CHUNKING,
    )
    with writer_lock(index_dir):
        build_and_write(index_dir, contents, hnsw_min_chunks=hnsw_min_chunks, progress=progress)
    return load_index(index_dir, embedder_name=embedder.name, embedder_backend=embedder.backend)


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
        and ((meta.get("embedder") or {}).get("backend") or UNRECORDED_BACKEND) == embedder.backend
        and record is not None
        and record.sha256 == dataset.corpus_sha256
    ):
        say(f"reusing the store at {store.location}")
        return store
    say(f"writing the corpus to the store at {store.location}")
    chunks = beir_chunks(dataset)
    stored: dict[str, np.ndarray] = {}
    try:
        on_disk = load_index(
            default_index_dir(dataset, embedder.backend),
            embedder_name=embedder.name,
            embedder_backend=embedder.backend,
        )
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
            embedder=embedder.record(),
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
        index = load_index(
            index_dir, embedder_name=embedder.name, embedder_backend=embedder.backend
        )
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
