"""The retrieve and compress stages, over LangChain's own contracts.

**Retrieve** takes any ``BaseRetriever``, or any runnable from a query string to documents.
Metadata filters and a per-request ``k`` reach a retriever whose ``_get_relevant_documents``
takes ``filters`` / ``k`` keywords (ours do); any other retriever gets the query alone and the
turn carries a note saying what was not applied. Several phrasings of a query (multi-query)
are searched as one batch of the retriever's and fused by reciprocal rank fusion on the chunk
id.

**Compress** takes any ``BaseDocumentCompressor``: the stage is here, its work in
``chains.compress``.

Each stage is one ``Call`` (``chains.state``): the pure work around it is shared, and only
calling the retriever (``batch`` / ``abatch``) or the compressor (``compress_documents`` /
``acompress_documents``) differs between sync and async callers.

The retrieve chain (``create_retrieve_chain``) runs both stages as the chat and ask chains do.
"""

import inspect
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda, RunnablePassthrough
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from ragchains.chains.changelogs import version_entries_last
from ragchains.chains.compress import (
    Compressed,
    compression,
    compressor_score,
    kept_all,
    threshold_default,
    threshold_for,
)
from ragchains.chains.options import Choices, Options
from ragchains.chains.rewrite import RewriteOutput, expand_glossary
from ragchains.chains.state import Call, Configured, calling, quick, read_input
from ragchains.prompts.registry import PromptRegistry, default_registry
from ragchains.retrievers.filters import MAX_FILTERS, LiveFields, MetadataFilter
from ragchains.retrievers.formats import format_names
from ragchains.retrievers.hybrid import reciprocal_rank_fusion
from ragchains.retrievers.location import Location, location_of
from ragchains.retrievers.scope import EVERY_DOCUMENT, DocumentScope

log = logging.getLogger(__name__)

# Phrasings one request may have searched besides its query: each is a search of its own.
MAX_ALTERNATIVES = 8


class Source(BaseModel):
    """A kept chunk as the caller sees it."""

    id: str
    label: str
    source: str
    page: int | None = None
    section: str | None = None
    score: float | None = Field(None, description="the compressor's score")
    text: str
    location: Location | None = Field(None, description="where in the file the text is")
    file_id: str | None = Field(
        None,
        description="the sha256 of the file the chunk is from: GET /files/{file_id} serves the "
        "original, /files/{file_id}/view what a viewer shows of it (None: not recorded)",
    )
    format: str | None = Field(
        None,
        description="the file's format as ingest read it: " + ", ".join(format_names()),
    )


class RetrieveInput(BaseModel):
    query: str = Field(min_length=1)
    filters: list[MetadataFilter] = Field(default_factory=list, max_length=MAX_FILTERS)
    alternatives: list[str] = Field(
        default_factory=list,
        max_length=MAX_ALTERNATIVES,
        description="more phrasings, fused with the query by RRF",
    )


def citation_label(doc: Document) -> str:
    """The label a chunk is shown and cited with, e.g. ``handbook.pdf#page=3``; for chunks
    from other retrievers their source, else their id, else the start of their text."""
    label = doc.metadata.get("citation") or doc.metadata.get("source") or doc.id
    return str(label) if label else " ".join(doc.page_content.split()[:6])


def doc_key(doc: Document) -> str:
    """What identifies a chunk across result lists: its id, else its text."""
    return str(doc.id or doc.metadata.get("chunk_id") or doc.metadata.get("id") or doc.page_content)


def _page(value: Any) -> int | None:
    """A page number, when the metadata holds one (other loaders write "ii" or "3-4")."""
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def to_source(doc: Document) -> Source:
    section = doc.metadata.get("section")
    return Source(
        id=doc_key(doc),
        label=citation_label(doc),
        source=str(doc.metadata.get("source", "")),
        page=_page(doc.metadata.get("page")),
        section=str(section) if section is not None else None,
        score=compressor_score(doc),
        text=doc.page_content,
        location=location_of(doc.metadata),
        file_id=_text(doc.metadata.get("file_id")),
        format=_text(doc.metadata.get("format")),
    )


def _text(value: Any) -> str | None:
    return str(value) if value is not None else None


# ----------------------------------------------------------------------------- retrieve
def search_keywords(retriever: Any) -> frozenset[str]:
    """The per-call keywords (``k``, ``filters``) a retriever takes by name.

    Only parameters it names count: a ``**kwargs`` catch-all (a vector store retriever's)
    would hand our filter objects to a store that reads filters of its own format.
    """
    if not isinstance(retriever, BaseRetriever):
        return frozenset()
    params = inspect.signature(retriever._get_relevant_documents).parameters
    return frozenset(name for name in ("k", "filters", "scope") if name in params)


def default_k(retriever: Any) -> int | None:
    """The retriever's own depth when it takes ``k`` per call, else None."""
    if "k" not in search_keywords(retriever):
        return None
    return int(getattr(retriever, "k", 10))


def retriever_fields(retriever: Any) -> Mapping[str, str]:
    """The metadata fields (name -> type) a filtering retriever can filter on, as they are
    whenever read (an index that follows ingests gains fields)."""
    if "filters" not in search_keywords(retriever):
        return {}
    fields = getattr(retriever, "fields", None)
    if isinstance(fields, LiveFields):  # ours already follow the index (and the caller)
        return fields
    return LiveFields(lambda: getattr(retriever, "fields", None) or {})


@dataclass(frozen=True)
class Retrieved:
    documents: list[Document]
    notes: list[str] = field(default_factory=list)


def checked_parts(
    retriever: Any, compressor: Any
) -> tuple[Runnable[str, list[Document]], BaseDocumentCompressor | None]:
    """The retriever (a plain function from a query to documents becomes a runnable) and the
    compressor, or a ValueError when the builder was given something else."""
    if not isinstance(retriever, Runnable):
        if not callable(retriever):
            raise ValueError(
                "retriever must be a BaseRetriever or a runnable from a query to documents, "
                f"not {type(retriever).__name__}"
            )
        retriever = RunnableLambda(retriever)
    if compressor is not None and not isinstance(compressor, BaseDocumentCompressor):
        raise ValueError(
            f"compressor must be a BaseDocumentCompressor or None, not {type(compressor).__name__}"
        )
    return retriever, compressor


class Searcher:
    """Searches one retriever with a query, its alternatives and filters, as far as the
    retriever takes them."""

    def __init__(self, retriever: Runnable[str, list[Document]]) -> None:
        self.retriever = retriever
        self.keywords = search_keywords(retriever)
        self._told: set[str] = set()

    def _kwargs(
        self, filters: Sequence[MetadataFilter], k: int | None, scope: DocumentScope
    ) -> tuple[dict[str, Any], list[str]]:
        """What the retriever takes of ``filters``, ``k`` and the domain's ``scope``, and a
        note for what it does not."""
        kwargs: dict[str, Any] = {}
        notes: list[str] = []
        if k is not None and "k" in self.keywords:
            kwargs["k"] = k
        if not scope.everything:
            if "scope" in self.keywords:
                kwargs["scope"] = scope
            else:
                notes.append(
                    "the retriever takes no document scope; searched every document, not "
                    f"only the domain's ({scope.describe()})"
                )
                if scope.key not in self._told:  # once per scope: every turn would repeat it
                    self._told.add(scope.key)
                    log.warning("domain scope not applied (retriever takes none): %s", scope.key)
        if filters:
            if "filters" in self.keywords:
                kwargs["filters"] = list(filters)
            else:
                unused = "; ".join(str(f) for f in filters)
                notes.append(f"the retriever takes no metadata filters; searched without {unused}")
                log.info("filters not applied (retriever takes none): %s", unused)
        return kwargs, notes

    def call(
        self,
        query: str,
        *,
        filters: Sequence[MetadataFilter] = (),
        alternatives: Sequence[str] = (),
        k: int | None = None,
        scope: DocumentScope = EVERY_DOCUMENT,
    ) -> Call:
        """The search as one call: the query and each alternative through the retriever's
        ``batch`` (async callers: ``abatch``, every phrasing at once), with the ``k``,
        filters and scope it takes, fused by RRF."""
        kwargs, notes = self._kwargs(filters, k, scope)
        phrasings = self.retriever.bind(**kwargs).map()
        reading = partial(fused, k=k, notes=notes, queries=[query, *alternatives])
        return Call(phrasings, [query, *alternatives], reading)

    def search(
        self,
        query: str,
        *,
        filters: Sequence[MetadataFilter] = (),
        alternatives: Sequence[str] = (),
        k: int | None = None,
        scope: DocumentScope = EVERY_DOCUMENT,
        config: RunnableConfig | None = None,
    ) -> Retrieved:
        """``call`` made at once, for in-process callers (evaluation)."""
        call = self.call(query, filters=filters, alternatives=alternatives, k=k, scope=scope)
        found: Retrieved = call.invoke(config)
        return found


def fused(
    lists: Sequence[list[Document]],
    *,
    k: int | None,
    notes: list[str],
    queries: Sequence[str] = (),
) -> Retrieved:
    """One result list per phrasing, fused (a single list stands as it is); changelog
    entries after the rest unless a phrasing asks about versions (``chains.changelogs``)."""
    depth = k or max(len(found) for found in lists)  # a retriever without k: its own depth
    docs = lists[0] if len(lists) == 1 else fuse(lists, k=depth)
    return Retrieved(version_entries_last(docs, queries), notes)


def fuse(lists: Sequence[Sequence[Document]], *, k: int) -> list[Document]:
    """The top ``k`` of several result lists fused by reciprocal rank fusion on chunk ids."""
    by_key: dict[str, Document] = {}
    for docs in lists:
        for doc in docs:
            by_key.setdefault(doc_key(doc), doc)
    fused = reciprocal_rank_fusion([[doc_key(d) for d in docs] for docs in lists])
    return [by_key[str(key)] for key, _ in fused[: max(k, 1)]]


class Searched(Configured):
    """After the rewrite (or the question as asked): what to search for."""

    search: RewriteOutput


class Found(Searched):
    """After ``retrieve``: the retriever's documents for every phrasing, fused."""

    retrieved: Retrieved


class Kept(Found):
    """After ``compress``: the documents kept (a reranker's best first, else in the retrieved
    order) and the best score."""

    compressed: Compressed


# ----------------------------------------------------------------------------- the chain
def read_retrieve_input(inputs: Any) -> dict[str, Any]:
    """A query string, or ``{"query", "filters", "alternatives"}``, as a plain dict."""
    return read_input(RetrieveInput, {"query": inputs} if isinstance(inputs, str) else inputs)


def choices_for(
    prompts: PromptRegistry,
    prompt_names: Sequence[str],
    retriever: Runnable[str, list[Document]],
    compressor: BaseDocumentCompressor | None,
) -> Choices:
    """What a request may choose of a chain over these parts: the domain and the versions of
    ``prompt_names``, ``k`` when the retriever takes it, ``threshold`` when the compressor does."""
    k = default_k(retriever)
    return Choices(
        prompts,
        prompt_names,
        k=(lambda: k) if k is not None else None,
        threshold=threshold_default(compressor),
    )


def retrieve_stage(searcher: Searcher) -> Runnable[Any, Retrieved]:
    """The retrieve stage over a turn's state: its ``search`` (query, filters, phrasings)
    and ``options`` (k) in, ``Retrieved`` out. The retriever's runs are its children."""

    def search(state: Searched) -> Call:
        request = state["search"]
        return searcher.call(
            request.search_query,
            filters=request.filters,
            alternatives=request.alternatives,
            k=state["options"].k,
            scope=state["options"].scope,
        )

    return calling(search, name="retrieve", needs=("search", "options"))


def compress_stage(compressor: BaseDocumentCompressor | None) -> Runnable[Any, Compressed]:
    """The compress stage over a turn's state: ``retrieved`` documents, the ``search`` query
    and ``options`` (threshold) in, ``Compressed`` out. The compressor's run is its child."""
    needs = ("retrieved", "search", "options")
    if compressor is None:
        return quick(_kept_all, name="compress", needs=needs)

    def compress(state: Found) -> Call:
        search = state["search"]
        return compression(
            compressor,
            state["retrieved"].documents,
            search.search_query,
            threshold=threshold_for(state["options"], compressor),
            also=search.alternatives,
            key=doc_key,
        )

    return calling(compress, name="compress", needs=needs)


def _kept_all(state: Found) -> Compressed:
    return kept_all(state["retrieved"].documents)


class RetrieveState(TypedDict):
    """The retrieve chain's own input, checked, with the request's choices."""

    query: str
    filters: list[MetadataFilter]
    alternatives: list[str]
    options: Options


def as_search(state: RetrieveState) -> RewriteOutput:
    """The query and phrasings as given, the domain's glossary expanded, with the filters."""
    glossary = state["options"].glossary
    return RewriteOutput(
        search_query=expand_glossary(state["query"], glossary),
        filters=state["filters"],
        alternatives=[expand_glossary(q, glossary) for q in state["alternatives"]],
    )


def kept_documents(state: Kept) -> list[Document]:
    for note in state["retrieved"].notes:
        log.warning("%s", note)
    return list(state["compressed"].documents)


def create_retrieve_chain(
    *,
    retriever: Runnable[str, list[Document]],
    compressor: BaseDocumentCompressor | None = None,
    prompts: PromptRegistry | None = None,
) -> Runnable[RetrieveInput | dict[str, Any] | str, list[Document]]:
    """Retrieval (and compression, when a compressor is given) as a retriever-like chain:
    a query, or ``{"query", "filters", "alternatives"}``, in; the kept documents out, best
    first, each with its scores in ``metadata``. The same retrieve and compress steps as the
    chat and ask chains.

    Per request, through ``configurable``: the domain (whose glossary expands abbreviations
    in the query), ``k`` (when the retriever takes it) and ``threshold`` (when the compressor
    does).
    """
    retriever, compressor = checked_parts(retriever, compressor)
    choices = choices_for(prompts or default_registry(), (), retriever, compressor)
    chain = (
        quick(read_retrieve_input, name="input")
        | RunnablePassthrough.assign(options=choices.step())
        | RunnablePassthrough.assign(search=quick(as_search, name="query"))
        | RunnablePassthrough.assign(retrieved=retrieve_stage(Searcher(retriever)))
        | RunnablePassthrough.assign(compressed=compress_stage(compressor))
        | quick(kept_documents, name="documents")
    )
    return chain.with_types(input_type=RetrieveInput, output_type=list[Document]).with_config(
        run_name="retrieve"
    )
