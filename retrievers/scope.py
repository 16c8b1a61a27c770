"""A domain's documents: the part of the collection one domain answers from.

A scope is data from a domain's ``domain.yaml`` (``documents:``), never from a request:

    documents:
      paths: [legal/**, contracts/*.pdf]     # any of these paths
      filters:                               # and every one of these, as --filter takes them
        - {field: format, op: "=", value: pdf}

**Paths** are globs over a file's path inside the folder that was ingested, as people write
them for a tree of files: ``*`` and ``?`` stay within one folder, ``**`` crosses any number
of them, and a pattern that names a folder takes everything under it (``legal`` or
``legal/`` is ``legal/**``). ``ragchains ingest docs`` records ``docs/legal/nda.pdf``: the
pattern may name it from inside the ingested folder (``legal/**``) or with the folder's own
name first (``docs/legal/**``). A file is in scope when any path matches; no paths: every
file.

**Filters** are metadata filters in the syntax of a request's (``retrievers.filters``),
combined with AND. A filter on a field the index does not have keeps nothing (as a missing
value never matches a filter), and ``ragchains domains check --index`` says so.

A scope restricts a search the way access groups do: the rows it keeps are intersected with
the filters of the request and with what the caller may read (``retrievers.access``), in an
index folder (a mask kept per generation: ``SearchIndex.scope_rows``) and in a PostgreSQL
store (``retrievers.pgfilters.scope_sql``) alike.
"""

from __future__ import annotations

import json
import re
from functools import cached_property
from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from ragchains.retrievers.filters import (
    MAX_FILTERS,
    MAX_GLOB_CHARS,
    OPERATORS_BY_TYPE,
    FilterError,
    MetadataColumns,
    MetadataFilter,
    bracket_ranges,
    regex_escape,
    validate_filters,
)

_GLOB_CHARS = frozenset("*?[")
# A domain's scope is the team's configuration, not a request's, but it is matched on every
# search: a bound on its size keeps that quick.
MAX_SCOPE_PATHS = 64
Pattern = Annotated[str, StringConstraints(min_length=1, max_length=MAX_GLOB_CHARS)]


class DocumentScope(BaseModel):
    """The files a domain answers from (see the module docstring); empty: every file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    paths: tuple[Pattern, ...] = Field(
        (),
        max_length=MAX_SCOPE_PATHS,
        description="globs over a file's path in the ingested folder (* within a folder, "
        "** across folders); a file matching any is in scope",
    )
    filters: tuple[MetadataFilter, ...] = Field(
        (),
        max_length=MAX_FILTERS,
        description="metadata filters as a request gives them, all of which a chunk passes",
    )

    @field_validator("paths")
    @classmethod
    def _paths(cls, paths: tuple[str, ...]) -> tuple[str, ...]:
        for path in paths:
            if path.startswith("/") or "\\" in path or "\x00" in path:
                raise ValueError(
                    f"{path!r}: a path inside the ingested folder, with / between folders "
                    "(not absolute, no backslashes)"
                )
            if ".." in path.split("/"):
                raise ValueError(f"{path!r}: a path inside the ingested folder has no '..'")
            path_regex(path)  # an unclosed [ is refused here, not at the first search
        return paths

    @field_validator("filters")
    @classmethod
    def _filters(cls, filters: tuple[MetadataFilter, ...]) -> tuple[MetadataFilter, ...]:
        # The field types are the index's, known when a search runs; what no field type
        # takes is wrong whatever the index.
        for flt in filters:
            if not any(flt.op in ops for ops in OPERATORS_BY_TYPE.values()):
                raise ValueError(f"filter {flt.short()}: unknown operator")
            if (flt.op == "in") != isinstance(flt.value, list) or flt.value == []:
                raise ValueError(
                    f"filter {flt.short()}: 'in' takes a non-empty list, other operators one value"
                )
        return filters

    @property
    def everything(self) -> bool:
        """Whether the scope keeps every document (no paths, no filters)."""
        return not self.paths and not self.filters

    @cached_property
    def key(self) -> str:
        """The scope as text: equal scopes give equal keys (masks are kept by it)."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True)

    @cached_property
    def source_regex(self) -> str | None:
        """One regular expression for the paths, matched against a whole source name; None:
        no paths. Python's ``re`` and PostgreSQL's ``~`` read it alike: ``(?s)`` makes
        Python's ``.`` match a newline as PostgreSQL's does, and ``\\Z`` is the end of the
        text in both (Python's ``$`` also matches before a last newline)."""
        if not self.paths:
            return None
        return f"(?s)^(?:[^/]+/)?(?:{'|'.join(path_regex(p) for p in self.paths)})\\Z"

    def describe(self) -> str:
        """The scope in one line, as `ragchains domains list` shows it."""
        if self.everything:
            return "every document"
        parts = []
        if self.paths:
            parts.append("paths " + ", ".join(self.paths))
        if self.filters:
            parts.append("filters " + " and ".join(str(f) for f in self.filters))
        return "; ".join(parts)


EVERY_DOCUMENT = DocumentScope()


def path_regex(pattern: str) -> str:
    """A path glob as a regular expression over one source name (unanchored): ``**``
    any characters, ``*`` and ``?`` within one folder, ``[...]`` one character of a set
    (``[!...]`` not of it); a folder takes what is under it. ValueError for an unclosed
    ``[`` or an empty set. Every literal character is a ``\\u`` escape, so Python and
    PostgreSQL read the expression alike."""
    body = pattern.rstrip("/")
    out: list[str] = []
    i = 0
    while i < len(body):
        char = body[i]
        if body.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif body.startswith("**", i):
            out.append(".*")
            i += 2
        elif char == "*":
            out.append("[^/]*")
            i += 1
        elif char == "?":
            out.append("[^/]")
            i += 1
        elif char == "[":
            negated = body.startswith("[!", i)
            start = i + (2 if negated else 1)
            end = body.find("]", start + 1)  # a "]" first in the set is a member
            ranges = bracket_ranges(body[start:end]) if end > 0 else []
            if not ranges:
                raise ValueError(f"{pattern!r}: a '[' set is not closed, or holds nothing")
            members = "".join(
                regex_escape(low) if low == high else f"{regex_escape(low)}-{regex_escape(high)}"
                for low, high in ranges
            )
            # A set is one character of a name: never the "/" between folders.
            out.append(f"[^{members}/]" if negated else f"(?!/)[{members}]")
            i = end + 1
        else:
            out.append(regex_escape(char))
            i += 1
    # A pattern naming a folder (no wildcard in its last part) takes what is under it; one
    # ending in a wildcard names files ("*.pdf" is no folder of PDFs).
    last = body.rsplit("/", 1)[-1]
    return "".join(out) + ("(?:/.*)?" if not _GLOB_CHARS.intersection(last) else "")


def scope_mask(columns: MetadataColumns, scope: DocumentScope) -> np.ndarray:
    """The rows of an index's ``columns`` within ``scope``: their source matches a path
    and they pass every filter; a filter the index's fields cannot take keeps no row."""
    rows = np.ones(columns.size, dtype=bool)
    if scope.source_regex is not None:
        match = re.compile(scope.source_regex).match
        rows &= columns.rows_with("source", [s for s in columns.values("source") if match(s)])
    for flt in scope.filters:
        try:
            checked = validate_filters([flt], columns.schema)
        except FilterError:
            return np.zeros(columns.size, dtype=bool)
        found = columns.mask(checked)
        if found is not None:
            rows &= found
    return rows
