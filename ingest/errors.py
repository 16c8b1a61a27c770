"""Why an ingest run cannot go ahead: the errors the CLI turns into a message and exit code."""

from __future__ import annotations


class IngestError(ValueError):
    """The run cannot go ahead (bad arguments, unreadable existing index, nothing to ingest)."""


class NothingIngestedError(IngestError):
    """Every input was skipped (or there was none): the index would be empty."""
