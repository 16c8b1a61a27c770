"""The one place that turns Settings into models, indexes, retrievers and compressors.

chains/, retrievers/ and ingest/ take their collaborators as arguments; only this module
(and the CLI / server that call it) reads settings or touches the process environment.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import overload

from ragchains.chains.graph import Chains, create_chains
from ragchains.chains.llm import LLM
from ragchains.chains.requery import RequeryPolicy
from ragchains.ingest.edits import CollectionEdit
from ragchains.ingest.indexrun import ingest
from ragchains.ingest.parsing import ParseBudget
from ragchains.ingest.parts import LoadOptions
from ragchains.ingest.report import IngestReport
from ragchains.ingest.storerun import check_store_embedder, ingest_to_store
from ragchains.ingestjobs import IngestJobs
from ragchains.prompts.live import LiveRegistry
from ragchains.prompts.registry import CHAIN_PROMPTS, PromptRegistry, default_registry
from ragchains.retrievers.access import AccessRule
from ragchains.retrievers.compressors import (
    EmbeddingSimilarityScorer,
    RerankCompressor,
    SentenceTransformerCrossEncoder,
)
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.filters import LiveFields
from ragchains.retrievers.hybrid import HybridRetriever
from ragchains.retrievers.indexformat import recorded_embedder
from ragchains.retrievers.live import LiveIndex
from ragchains.retrievers.pgsearch import PostgresRetriever
from ragchains.retrievers.pgstore import PostgresStore
from ragchains.retrievers.searchindex import SearchIndex, load_index
from ragchains.retrievers.storeurl import is_store_url
from ragchains.retrievers.workers import cpu_pool
from ragchains.settings import Settings


def configure_runtime(settings: Settings) -> None:
    """Keep model libraries offline and quiet; called once by each entry point."""
    if settings.offline:
        # Nothing may download at run time: models come from packages, paths or the cache.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Read by huggingface_hub and by transformers when it is imported (if it is: importing it
    # here to call its setters would cost every process 0.4 s).
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for name in ("sentence_transformers", "faiss"):
        logging.getLogger(name).setLevel(logging.WARNING)


def build_embedder(settings: Settings) -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder(
        settings.embedding_model,
        device=settings.device,
        batch_size=settings.embedding_batch_size,
        backend=settings.embedding_backend,
    )


# Where chunks live: an index folder on disk, or a PostgreSQL store (its URL).
Target = str | Path
Store = SearchIndex | LiveIndex | PostgresStore


def open_index(
    index_dir: Target, embedder: SentenceTransformerEmbedder, *, live: bool = False
) -> Store:
    """Load an index folder or connect to a PostgreSQL store (a ``postgresql://`` URL),
    refusing one built with another embedder. ``live``: the folder as a ``LiveIndex``, which
    can serve each generation an ingest commits (a store always serves what is committed)."""
    if is_store_url(str(index_dir)):
        store = PostgresStore(str(index_dir))
        check_store_embedder(store, embedder)
        return store
    embedder.follow(recorded_embedder(index_dir))
    if live:
        return LiveIndex(index_dir, embedder_name=embedder.name, embedder_backend=embedder.backend)
    index = load_index(index_dir, embedder_name=embedder.name, embedder_backend=embedder.backend)
    _ = index.columns  # build the filter columns now, not during the first query
    return index


def filterable_fields(index: Store) -> Mapping[str, str]:
    """The fields a request may filter on, as each request reads them: those its caller may
    see."""
    return LiveFields(index.visible_fields)


@overload
def build_retriever(
    settings: Settings,
    index: SearchIndex | LiveIndex,
    embedder: SentenceTransformerEmbedder,
    *,
    executor: Executor | None = None,
) -> HybridRetriever: ...


@overload
def build_retriever(
    settings: Settings,
    index: PostgresStore,
    embedder: SentenceTransformerEmbedder,
    *,
    executor: Executor | None = None,
) -> PostgresRetriever: ...


@overload
def build_retriever(
    settings: Settings,
    index: Store,
    embedder: SentenceTransformerEmbedder,
    *,
    executor: Executor | None = None,
) -> HybridRetriever | PostgresRetriever: ...


def build_retriever(
    settings: Settings,
    index: Store,
    embedder: SentenceTransformerEmbedder,
    *,
    executor: Executor | None = None,
) -> HybridRetriever | PostgresRetriever:
    """The hybrid retriever over ``index``; ``executor`` runs its CPU work on async calls
    (see ``retrievers.workers``)."""
    # Unset (None) fusion fields come from the index's fusion.json, else the default.
    fusion = {
        "fusion": settings.fusion,
        "normalization": settings.fusion_normalization,
        "alpha": settings.fusion_alpha,
        "bm25_weight": settings.bm25_weight,
        "dense_weight": settings.dense_weight,
        "rrf_k": settings.rrf_k,
    }
    common = {
        "embedder": embedder,
        "k": settings.k,
        "candidates": settings.candidates_per_retriever,
        "executor": executor,
        **fusion,
    }
    if isinstance(index, PostgresStore):
        return PostgresRetriever(store=index, **common)
    return HybridRetriever(index=index, **common)


def build_compressor(
    settings: Settings,
    embedder: SentenceTransformerEmbedder,
    index: Store | None = None,
    *,
    executor: Executor | None = None,
) -> RerankCompressor:
    """The cross-encoder, falling back to embedding similarity (from ``index``'s stored
    vectors when given) if it cannot load; ``executor`` runs its scoring on async calls."""
    stored = index.stored_vectors if index is not None else None
    return RerankCompressor(
        primary=SentenceTransformerCrossEncoder(settings.reranker_model, device=settings.device),
        fallback=EmbeddingSimilarityScorer(embedder, stored=stored),
        top_n=settings.rerank_top_n,
        threshold=settings.rerank_threshold,
        executor=executor,
    )


def build_prompts(settings: Settings, *, live: bool = False) -> PromptRegistry:
    """The prompt registry of ``settings``: the shipped domains, or with ``settings.domains``
    the team's folder over them; ``live``: one that follows the folder's edits (a server's,
    started with ``watch``). PromptFileError names each file that does not load."""
    if settings.domains is None:
        return default_registry()
    folder = settings.domains.expanduser()

    def load() -> PromptRegistry:
        return PromptRegistry(team=folder, required=CHAIN_PROMPTS)

    return LiveRegistry(load, folder) if live else load()


def build_llm(settings: Settings) -> LLM:
    """The configured chat model; ``LLMConfigError`` says what is missing."""
    # Imported here: llama.cpp and the OpenAI client load only when a model is wanted.
    if settings.llm_provider == "embedded":
        from ragchains.models.embedded import embedded_llm

        return embedded_llm(
            settings.llm_model_path,
            context_tokens=settings.llm_context_tokens,
            threads=settings.llm_threads,
            seed=settings.llm_seed,
            prompt_cache_mb=settings.llm_prompt_cache_mb,
        )
    from ragchains.models.providers import openai_llm

    return openai_llm(
        model=settings.openai_model,
        base_url=settings.openai_base_url,
        api_key=settings.openai_api_key,
        timeout=settings.llm_timeout,
        max_retries=settings.llm_max_retries,
        fallback_model=settings.openai_fallback_model,
        grammar=settings.openai_grammar,
        offline=settings.offline,
        concurrency=settings.model_concurrency,
    )


@dataclass
class Service:
    """Everything a chat turn needs, loaded once: models, index, prompts and the chains."""

    settings: Settings
    embedder: SentenceTransformerEmbedder
    index: Store
    compressor: RerankCompressor
    llm: LLM
    prompts: PromptRegistry
    chains: Chains


def build_service(
    settings: Settings,
    index_dir: Target,
    *,
    llm: LLM | None = None,
    embedder: SentenceTransformerEmbedder | None = None,
    prompts: PromptRegistry | None = None,
    live: bool = False,
) -> Service:
    """Load the index and every model, check the prompt files, and build the chains.
    ``live``: an index folder is served as a ``LiveIndex`` (the server: ingests are served
    without a restart).

    Fails early (IndexLoadError, PromptFileError, LLMConfigError) rather than at the first
    request. ``prompts``: default ``build_prompts(settings, live=live)``.
    """
    prompts = prompts or build_prompts(settings, live=live)
    llm = llm or build_llm(settings)  # first: a missing model or key is the quickest failure
    embedder = embedder or build_embedder(settings)
    index = open_index(index_dir, embedder, live=live)
    # Retrieval's CPU work gets a pool of its own, one thread per core: on async calls it
    # then never waits behind threads blocked on something else, nor adds to the GIL's
    # contention with more threads than cores.
    cpu = cpu_pool(settings.cpu_threads)
    compressor = build_compressor(settings, embedder, index, executor=cpu)
    compressor.warm_up()
    chains = create_chains(
        llm=llm,
        retriever=build_retriever(settings, index, embedder, executor=cpu),
        compressor=compressor,
        prompts=prompts,
        fields=filterable_fields(index),
        history_tokens=settings.history_tokens,
        requery=RequeryPolicy(
            enabled=settings.requery,
            below=settings.requery_threshold,
            min_ratio=settings.requery_min_ratio,
            min_gain=settings.requery_min_gain,
        ),
        answer_style=settings.answer_style,
    )
    return Service(settings, embedder, index, compressor, llm, prompts, chains)


def run_ingest(
    settings: Settings,
    paths: Sequence[str | Path],
    index_dir: Target,
    *,
    embedder: SentenceTransformerEmbedder | None = None,
    text_columns: Sequence[str] | None = None,
    include_notes: bool = False,
    rebuild: bool = False,
    progress: bool = True,
    access: Sequence[AccessRule] | None = None,
    originals: bool = True,
    edit: CollectionEdit | None = None,
    report: IngestReport | None = None,
) -> IngestReport:
    """Ingest ``paths`` into an index folder or a PostgreSQL store (a URL), or make ``edit``
    to it instead (the documents API; see ``ingest.edits``); ``report``: the one to fill
    (whoever passes it can watch its ``progress``); ``access``: who
    may read which files (see ``retrievers.access``; None: the last run's rules);
    ``originals``: keep each file's bytes (False: keep none, and delete those kept).
    ``text_columns``: the table columns that form a row's text (default: all);
    ``include_notes``: read Word footnotes and comments too."""
    budget = ParseBudget(
        memory_mb=settings.ingest_file_memory_mb,
        seconds=settings.ingest_file_timeout,
        workers=settings.ingest_workers,
    )
    load_options = LoadOptions(
        text_columns=list(text_columns) if text_columns else None,
        include_notes=include_notes,
        max_sheet_rows=settings.max_sheet_rows,
        ocr_page_timeout=settings.ocr_page_timeout,
    )
    if is_store_url(str(index_dir)):
        store = PostgresStore(str(index_dir))
        try:
            return ingest_to_store(
                paths,
                store,
                embedder=embedder or build_embedder(settings),
                chunk_size=settings.chunk_size,
                chunk_overlap=settings.chunk_overlap,
                load_options=load_options,
                budget=budget,
                rebuild=rebuild,
                progress=progress,
                access=access,
                originals=originals,
                edit=edit,
                report=report,
            )
        finally:
            store.close()
    return ingest(
        paths,
        index_dir,
        embedder=embedder or build_embedder(settings),
        chunk_size=settings.chunk_size,
        chunk_overlap=settings.chunk_overlap,
        hnsw_min_chunks=settings.hnsw_min_chunks,
        load_options=load_options,
        budget=budget,
        rebuild=rebuild,
        progress=progress,
        access=access,
        originals=originals,
        edit=edit,
        report=report,
    )


def jobs_folder(settings: Settings, index: Store) -> Path:
    """Where the documents API keeps its jobs: RAGCHAINS_JOBS_DIR, else ``jobs/`` in the index
    folder beside its generations (which an ingest replaces, never this), else (a store) a
    folder of that store's own in the user's state folder (``platformdirs``: e.g.
    ``~/.local/state/ragchains/jobs/<store>``): a job is re-run at start only by a server of
    the store it was made for."""
    if settings.jobs_dir is not None:
        return settings.jobs_dir.expanduser()
    folder = index.folder
    if folder is not None:
        return Path(folder) / "jobs"
    import platformdirs

    named = hashlib.sha256(index.location.encode()).hexdigest()[:16]
    return Path(platformdirs.user_state_dir("ragchains")) / "jobs" / f"store-{named}"


def ingest_jobs(settings: Settings, service: Service) -> IngestJobs:
    """The documents API's jobs over the index folder or store ``service`` serves: each an
    edit made by ``run_ingest``, with an embedder of its own (loaded at the first job: a
    long embedding never holds up a question's) and served once committed."""
    target: Target = settings.store or service.index.location
    embedders: list[SentenceTransformerEmbedder] = []
    # Half the cores parse a job's files (unless set): the other half keep answering.
    if not settings.ingest_workers:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        settings = settings.model_copy(update={"ingest_workers": max(1, (cores or 2) // 2)})

    def run(edit: CollectionEdit, report: IngestReport) -> IngestReport:
        if not embedders:
            embedders.append(build_embedder(settings))
        report.index = service.index.location
        return run_ingest(
            settings, (), target, embedder=embedders[0], progress=False, edit=edit, report=report
        )

    def committed() -> None:
        index = service.index
        if isinstance(index, LiveIndex):
            index.refresh()
        elif isinstance(index, PostgresStore):
            index.meta(fresh=True)

    return IngestJobs(jobs_folder(settings, service.index), run, committed)
