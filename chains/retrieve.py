"""The retrieve stage: hybrid search (one query, or several fused by RRF), then compression.

Per request, ``configurable`` may set ``k`` (chunks handed to the compressor) and
``threshold`` (the compressor's minimum score); both are validated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.documents import Document
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
from pydantic import BaseModel, Field, ValidationError

from retrievers.base import IndexRetriever
from retrievers.compressors import RerankCompressor
from retrievers.filters import MetadataFilter
from retrievers.hybrid import reciprocal_rank_fusion

MAX_K = 200


class RetrievalOptions(BaseModel):
    """The retrieval knobs a request may turn through ``configurable``."""

    k: int | None = Field(None, ge=1, le=MAX_K, description="chunks handed to the compressor")
    threshold: float | None = Field(None, description="minimum compressor score to keep a chunk")

    @classmethod
    def from_configurable(cls, configurable: Mapping[str, Any] | None) -> RetrievalOptions:
        configurable = configurable or {}
        try:
            return cls.model_validate({key: configurable.get(key) for key in ("k", "threshold")})
        except ValidationError as exc:
            problems = "; ".join(f"{err['loc'][0]}: {err['msg']}" for err in exc.errors())
            raise ValueError(f"invalid configurable value: {problems}") from exc


class Source(BaseModel):
    """A kept chunk as the caller sees it."""

    id: str
    label: str
    source: str
    page: int | None = None
    section: str | None = None
    score: float | None = Field(None, description="the compressor's score")
    text: str


class RetrieveInput(BaseModel):
    query: str = Field(min_length=1)
    filters: list[MetadataFilter] = Field(default_factory=list)
    alternatives: list[str] = Field(
        default_factory=list, description="more phrasings, fused with the query by RRF"
    )


class RetrieveOutput(BaseModel):
    query: str
    filters: list[MetadataFilter]
    sources: list[Source]
    best_score: float | None = Field(None, description="best compressor score, kept or not")
    threshold: float
    compressor: dict[str, Any]


@dataclass
class Retrieval:
    query: str
    documents: list[Document]  # kept after compression, best first
    best_score: float | None
    threshold: float


def citation_label(doc: Document) -> str:
    """The label a chunk is shown and cited with, e.g. ``handbook.pdf#page=3``."""
    return str(doc.metadata.get("citation", doc.id))


def to_source(doc: Document) -> Source:
    page = doc.metadata.get("page")
    return Source(
        id=str(doc.id or doc.metadata.get("chunk_id")),
        label=citation_label(doc),
        source=str(doc.metadata.get("source", "")),
        page=int(page) if page is not None else None,
        section=doc.metadata.get("section"),
        score=doc.metadata.get("rerank_score"),
        text=doc.page_content,
    )


class Searcher:
    """Retrieve and compress; shared by the retrieve stage and the chat and ask graphs."""

    def __init__(self, retriever: IndexRetriever, compressor: RerankCompressor) -> None:
        self.retriever = retriever
        self.compressor = compressor

    def search(
        self,
        query: str,
        *,
        filters: Sequence[MetadataFilter] = (),
        alternatives: Sequence[str] = (),
        config: RunnableConfig | None = None,
    ) -> Retrieval:
        options = RetrievalOptions.from_configurable((config or {}).get("configurable"))
        k = options.k or self.retriever.k
        lists = [
            self.retriever.invoke(q, config, k=k, filters=list(filters))
            for q in [query, *alternatives]
        ]
        candidates = lists[0] if len(lists) == 1 else _fuse(lists, k=k)
        reranked = self.compressor.rerank(candidates, query, threshold=options.threshold)
        return Retrieval(query, reranked.documents, reranked.best_score, reranked.threshold)


def _fuse(lists: Sequence[Sequence[Document]], *, k: int) -> list[Document]:
    by_id: dict[str, Document] = {}
    for docs in lists:
        for doc in docs:
            by_id.setdefault(str(doc.id), doc)
    fused = reciprocal_rank_fusion([[str(d.id) for d in docs] for docs in lists])
    return [by_id[str(doc_id)] for doc_id, _ in fused[:k]]


def build_retrieve_chain(
    searcher: Searcher,
) -> Runnable[RetrieveInput | dict[str, Any], RetrieveOutput]:
    """The retrieve stage on its own: a query (and filters) in, compressed sources out."""

    def retrieve(
        inputs: RetrieveInput | Mapping[str, Any], config: RunnableConfig
    ) -> RetrieveOutput:
        data = inputs if isinstance(inputs, RetrieveInput) else RetrieveInput.model_validate(inputs)
        found = searcher.search(
            data.query, filters=data.filters, alternatives=data.alternatives, config=config
        )
        return RetrieveOutput(
            query=data.query,
            filters=data.filters,
            sources=[to_source(d) for d in found.documents],
            best_score=found.best_score,
            threshold=found.threshold,
            compressor=searcher.compressor.status(),
        )

    return (
        RunnableLambda(retrieve)
        .with_types(input_type=RetrieveInput, output_type=RetrieveOutput)
        .with_config(run_name="retrieve")
    )
