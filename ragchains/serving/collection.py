"""What the caller may ask about: the documents they may read (how many, of which kinds, and
what people call each kind) and each domain's suggested questions, for the chat page's empty
state.

Counted from the index's file records (one row per ingested file: its format and access
groups), never from its chunks, so the answer stays quick on a large index. The counts are
kept per index generation and set of groups: callers share a few sets, and a new generation
(an ingest, served live) is counted again on its first request.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from fastapi import APIRouter
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from ragchains.factory import Service, Store
from ragchains.prompts.registry import PromptRegistry
from ragchains.retrievers.access import current_groups
from ragchains.retrievers.formats import format_named
from ragchains.retrievers.indexformat import FileRecord, IndexLoadError
from ragchains.retrievers.pgstore import PostgresStore
from ragchains.retrievers.scope import DocumentScope

# Generations × sets of groups remembered (a handful of each in practice).
_KEPT = 64


class DomainSummary(BaseModel):
    """A domain a request may choose, the documents it answers from and the questions they
    answer."""

    name: str = Field(description="the value of configurable.domain (and of model on /v1)")
    description: str
    suggestions: list[str] = Field(description="questions to offer before the first one")
    suggestions_ref: str | None = Field(
        description="the suggestions' file, as domain/suggestions@vN; null when the domain has none"
    )
    scoped: bool = Field(
        False,
        description="the domain answers from some of the documents only (its domain.yaml's "
        "documents: paths and filters); false: from every document",
    )
    documents: int | None = Field(
        None,
        ge=0,
        description="ingested files the caller may read that the domain answers from (all of "
        "the collection's when not scoped); null where not counted",
    )


class KindLabel(BaseModel):
    """What people call a file of one format, and several."""

    label: str = Field(description="one file of the format, e.g. 'PDF', 'Word document'")
    label_plural: str = Field(description="several, e.g. 'PDFs', 'Word documents'")


class CollectionSummary(BaseModel):
    """The documents the caller may read and the domains they may ask in."""

    documents: int = Field(ge=0, description="ingested files the caller may read")
    kinds: dict[str, int] = Field(
        description="those files by format (pdf, markdown, csv, ...), most first"
    )
    labels: dict[str, KindLabel] = Field(
        description="what people call each format in kinds; a format this server does not "
        "know (an index another release wrote) has none: show its name"
    )
    domains: list[DomainSummary]


def may_read(access: Iterable[str], groups: frozenset[str] | None) -> bool:
    """A file with these access groups is readable by a caller in ``groups`` (None: no
    access control; a file without groups is everyone's)."""
    labels = tuple(access)
    return groups is None or not labels or not groups.isdisjoint(labels)


def count_files(
    records: Iterable[FileRecord], groups: frozenset[str] | None
) -> tuple[int, dict[str, int]]:
    """How many of ``records`` a caller in ``groups`` may read, and how many of each format
    (most first, then by name)."""
    kinds = Counter(r.format for r in records if may_read(r.access, groups))
    ordered = dict(sorted(kinds.items(), key=lambda item: (-item[1], item[0])))
    return sum(kinds.values()), ordered


def kind_labels(kinds: Iterable[str]) -> dict[str, KindLabel]:
    """What people call each of the formats ``kinds`` names, by ``retrievers.formats``;
    formats it does not know are left out."""
    known = ((name, format_named(name)) for name in kinds)
    return {
        name: KindLabel(label=found.label, label_plural=found.label_plural)
        for name, found in known
        if found is not None
    }


def domain_summaries(
    prompts: PromptRegistry, counts: Callable[..., int] | None = None
) -> list[DomainSummary]:
    """Every domain with its description and latest suggested questions, default first.
    ``counts(*scopes)``: the files within every scope that the caller may read; with it each
    domain's files are counted, and its questions offered only when the caller may read one
    of the files they are about (None: nothing counted, every domain's questions)."""
    loaded = prompts.current()
    out = []
    for name in sorted(loaded.domains, key=lambda n: (n != "default", n)):
        domain = loaded.domains[name]
        suggested = loaded.suggestions(name)
        documents = counts(domain.scope) if counts is not None else None
        if suggested is not None and counts is not None:
            about = suggested.scope
            if documents == 0 or (not about.everything and counts(domain.scope, about) == 0):
                suggested = None  # questions about files this caller cannot read
        out.append(
            DomainSummary(
                name=name,
                description=domain.description,
                suggestions=list(suggested.questions) if suggested else [],
                suggestions_ref=suggested.ref if suggested else None,
                scoped=not domain.scope.everything,
                documents=documents,
            )
        )
    return out


class FileCounts:
    """The file counts of the generation a request reads, per set of caller groups and
    domain scope."""

    def __init__(self, index: Store) -> None:
        self.index = index
        self._lock = threading.Lock()
        self._counts: dict[
            tuple[str, frozenset[str] | None, tuple[str, ...]], tuple[int, dict[str, int]]
        ] = {}

    def count(
        self, groups: frozenset[str] | None, *scopes: DocumentScope
    ) -> tuple[int, dict[str, int]]:
        """Counts for a caller in ``groups`` of the files within every one of ``scopes``, of
        the generation this context reads: an index folder's pinned one
        (``serving.guards``), or the store's current one. Blocks (file records from SQLite
        or PostgreSQL the first time): call it in a thread that carries the request's
        context."""
        index = self.index
        if isinstance(index, PostgresStore):
            generation, files = f"store {index.generation}", index.files
            in_scope: Callable[[DocumentScope], set[str] | None] = index.scope_sources
        else:
            pinned = index.pinned()
            # Its folder names a generation; a key holding the object itself would keep an
            # old generation's index in memory.
            generation, files = f"folder {pinned.path}", pinned.store.files
            in_scope = pinned.scope_sources
        scoped = [s for s in scopes if not s.everything]
        key = (generation, groups, tuple(s.key for s in scoped))
        with self._lock:
            found = self._counts.get(key)
        if found is None:
            records: Mapping[str, FileRecord] = files()
            kept: Iterable[FileRecord] = records.values()
            for scope in scoped:
                sources = in_scope(scope) or set()
                kept = [r for r in kept if r.source in sources]
            found = count_files(kept, groups)
            with self._lock:
                if len(self._counts) >= _KEPT:
                    self._counts.clear()  # old generations' counts are never asked for again
                self._counts[key] = found
        return found


def unfound_domains(service: Service) -> list[str]:
    """What is wrong with domains whose documents hold none of the index's files (a shipped
    example served over other documents, a scope that names no ingested folder): one line
    each, for the log at start-up. Blocks: call it in a thread."""
    counts = FileCounts(service.index)
    told: list[str] = []
    for name, domain in service.prompts.current().domains.items():
        if domain.scope.everything:
            continue
        try:
            held = counts.count(None, domain.scope)[0]
        except IndexLoadError:  # a store out of reach: /readyz says so
            return told
        if held == 0:
            told.append(
                f"domain {name!r} answers from {domain.scope.describe()}, and the index holds "
                "none of those files: it will say it does not know (serve your own domains "
                "with --domains DIR; `ragchains domains list --index` counts each one's files)"
            )
    return told


def collection_router(service: Service) -> APIRouter:
    router = APIRouter(tags=["collection"])
    counts = FileCounts(service.index)

    def summary(groups: frozenset[str] | None) -> CollectionSummary:
        documents, kinds = counts.count(groups)
        domains = domain_summaries(
            service.prompts, lambda *scopes: counts.count(groups, *scopes)[0]
        )
        return CollectionSummary(
            documents=documents, kinds=kinds, labels=kind_labels(kinds), domains=domains
        )

    @router.get(
        "/collection",
        response_model=CollectionSummary,
        summary="The documents you may read and the domains you may ask in",
        responses={
            503: {
                "description": "The document store cannot be reached, or an index file was "
                "found damaged",
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/Problem"}}
                },
            }
        },
    )
    async def collection() -> CollectionSummary:
        """How many ingested files the caller's key may read, by format (with what people
        call each format), and each domain's description, suggested questions and the files
        it answers from (for a page to show before the first question). Files the key may
        not read are not counted."""
        # The thread runs in a copy of the request's context: the caller's groups, and the
        # index generation the request is pinned to.
        return await run_in_threadpool(summary, current_groups())

    return router
