"""What every retriever over a loaded index shares: defaults, per-call overrides, async."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from typing import Any

import numpy as np
from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field

from ragchains.retrievers.access import combined
from ragchains.retrievers.filters import LiveFields, MetadataFilter, validate_filters
from ragchains.retrievers.live import LiveIndex
from ragchains.retrievers.scope import DocumentScope
from ragchains.retrievers.searchindex import SearchIndex
from ragchains.retrievers.workers import run_off_loop

FilterArg = Sequence[MetadataFilter | dict[str, Any]] | None


class IndexRetriever(BaseRetriever):
    """Base for retrievers over a ``SearchIndex``.

    ``invoke(query, k=..., filters=[...])`` overrides the defaults for one call; filters are
    validated against the index's field types before any search runs.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    # A LiveIndex follows ingests; each search keeps to one generation (``pin``).
    index: SearchIndex | LiveIndex
    k: int = Field(10, ge=1)
    filters: list[MetadataFilter] = Field(default_factory=list)
    executor: Executor | None = Field(
        None,
        exclude=True,
        description="where async calls run the search (CPU work): a small pool of its own "
        "keeps it from queueing behind blocked threads; None: the event loop's default pool",
    )

    @property
    def fields(self) -> Mapping[str, str]:
        """The metadata fields (name -> type) ``filters`` may name."""
        return LiveFields(self.index.visible_fields)  # the caller's, as each request reads

    def _search(
        self, index: SearchIndex, query: str, *, k: int, mask: np.ndarray | None
    ) -> list[Document]:
        """The search itself, over ``index`` (the one generation this call keeps to), among
        the rows ``mask`` keeps (None: every row); the caller's access applies within."""
        raise NotImplementedError

    async def _aprepare(self, query: str) -> None:
        """Work an async search does before its CPU-bound part (a dense search embeds its
        query here, batched with concurrent turns' queries)."""
        embedder = getattr(self, "embedder", None)
        if embedder is not None:
            await embedder.aencode_query(query, self.executor)

    @staticmethod
    def _ranked_documents(
        index: SearchIndex, rows: np.ndarray, scores: np.ndarray, name: str
    ) -> list[Document]:
        """Documents for ranked rows, each tagged with ``<name>_score`` and ``<name>_rank``."""
        docs = index.store.documents(rows.tolist())
        for rank, (doc, score) in enumerate(zip(docs, scores, strict=True), start=1):
            doc.metadata[f"{name}_score"] = float(score)
            doc.metadata[f"{name}_rank"] = rank
        return docs

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        k: int | None = None,
        filters: FilterArg = None,
        scope: DocumentScope | None = None,
    ) -> list[Document]:
        with self.index.pin() as index:  # the filters' fields and the search: one generation
            checked = validate_filters(
                self.filters if filters is None else filters, index.visible_fields()
            )
            mask = combined(index.columns.mask(checked), index.scope_rows(scope))
            return self._search(index, query, k=k or self.k, mask=mask)

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        k: int | None = None,
        filters: FilterArg = None,
        scope: DocumentScope | None = None,
    ) -> list[Document]:
        await self._aprepare(query)
        # The searches are CPU-bound numpy/FAISS calls: run them off the event loop.
        return await run_off_loop(
            self.executor,
            self._get_relevant_documents,
            query,
            run_manager=run_manager.get_sync(),
            k=k,
            filters=filters,
            scope=scope,
        )


def readable(index: SearchIndex, mask: np.ndarray | None) -> np.ndarray | None:
    """The rows a search may return: those ``mask`` keeps (filters, a domain's scope) that
    this request's caller may read (see ``retrievers.access``); None: every row."""
    return combined(mask, index.readable_rows())
