"""The errors a PostgreSQL store raises. Apart from the store (``retrievers.pgstore``) because
its writer (``retrievers.pgwriter``) raises them too, and the store imports the writer: the
writer cannot import the store back."""

from __future__ import annotations

from ragchains.retrievers.indexformat import IndexLoadError


class StoreError(IndexLoadError):
    """The store cannot be used (unreachable, not a ragchains store, another format)."""


class StoreBusyError(StoreError):
    pass
