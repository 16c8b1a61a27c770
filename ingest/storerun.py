"""An ingest run into a PostgreSQL store: the change plan (see ``ragchains.ingest.changes``)
written as one transaction."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from tqdm import tqdm

from ragchains.ingest.accessrules import (
    check_rules_match,
    note_opened,
    recorded_rules,
    rules_as_recorded,
    rules_for_run,
)
from ragchains.ingest.changes import RunPlan, originals_wanted, read_files
from ragchains.ingest.discovery import discover
from ragchains.ingest.edits import CollectionEdit
from ragchains.ingest.embedding import chunk_vectors
from ragchains.ingest.errors import IngestError
from ragchains.ingest.fieldtypes import NOT_FILTERABLE
from ragchains.ingest.parsing import ParseBudget
from ragchains.ingest.parts import LoadOptions
from ragchains.ingest.report import IngestReport, logged
from ragchains.ingest.runsetup import run_setup
from ragchains.retrievers.access import AccessRule
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.filters import BASE_FIELDS
from ragchains.retrievers.indexformat import embedder_mismatch
from ragchains.retrievers.pgerrors import StoreError
from ragchains.retrievers.pgstore import PostgresStore
from ragchains.retrievers.pgwriter import SCHEMA_VERSION, StoreDelta, StoreWriter

# Spans for `ragchains ingest` when it exports traces (the API's global provider; without
# one they record nothing).
_tracer = trace.get_tracer(__name__)


def check_store_embedder(
    store: PostgresStore, embedder: SentenceTransformerEmbedder, *, writing: bool = False
) -> None:
    """Refuse a store of another schema or embedder (``PostgresStore.check``) or one filled
    by the other embedder backend; an ``auto`` embedder first takes the store's backend."""
    recorded = store.meta(fresh=True).get("embedder")
    embedder.follow(recorded if isinstance(recorded, dict) else None)
    store.check(embedder_name=embedder.name, dimension=embedder.dimension, writing=writing)
    problem = embedder_mismatch(
        f"the store at {store.redacted}", recorded or {}, None, None, embedder.backend
    )
    if problem:
        raise StoreError(problem)


def ingest_to_store(
    paths: Sequence[str | Path],
    store: PostgresStore,
    *,
    embedder: SentenceTransformerEmbedder,
    chunk_size: int,
    chunk_overlap: int,
    load_options: LoadOptions | None = None,
    budget: ParseBudget | None = None,
    rebuild: bool = False,
    progress: bool = True,
    access: Sequence[AccessRule] | None = None,
    originals: bool = True,
    edit: CollectionEdit | None = None,
    report: IngestReport | None = None,
) -> IngestReport:
    """``ingest`` into a PostgreSQL store: the same files, chunks, ids and report, written as
    one transaction that deletes the chunks of changed and removed files and adds the new
    ones (unchanged files are not read back). ``originals``: keep each file's bytes (the
    ``originals`` table); False: keep none, and delete those kept before. ``edit``, when
    given, is made instead of reading ``paths`` (see ``ragchains.ingest.edits``); ``report``:
    the one to fill."""
    found = edit.found() if edit is not None else discover(paths)
    if access and edit is None:
        check_rules_match(access, found)
    report = report or IngestReport(index=store.location)
    report.edit = edit is not None
    report.unlisted = sorted(edit.removes) if edit is not None else []
    report.skipped.extend(found.skipped)
    try:
        with store.writer() as writer:
            recorded = store.meta(fresh=True)  # a rebuild keeps its access rules, and only them
            meta = {} if rebuild else recorded
            if meta:
                try:
                    check_store_embedder(store, embedder, writing=True)
                except StoreError as exc:
                    raise IngestError(f"{exc} (or pass --rebuild to build it anew)") from exc
            setup = run_setup(embedder, chunk_size, chunk_overlap, load_options, progress, budget)
            chunker, options, chunking = setup.chunker, setup.options, setup.chunking
            old_files = store.files() if meta else {}
            same_chunking = bool(meta) and meta.get("chunking") == chunking
            kept_rules = recorded.get("access_rules") or []
            # An edit labels its files itself, and keeps the rules the last run recorded.
            access = (
                rules_for_run(access, kept_rules, report)
                if edit is None
                else recorded_rules(kept_rules)
            )
            read = read_files(
                found,
                old_files,
                lambda source: store.chunk_ids([source]),
                same_chunking=same_chunking,
                chunker=chunker,
                options=options,
                budget=setup.budget,
                report=report,
                progress=progress,
                rules=[*access, *found.sidecar_rules],
                plan=edit.plan() if edit is not None else RunPlan(),
            )
            note_opened(read.records, old_files, report)
            report.chunks_total = sum(r.chunk_count for r in read.records.values())
            current = meta.get("schema_version") == SCHEMA_VERSION
            wanted = originals_wanted(read.records, found, report) if originals else {}
            # Originals to add, or to drop (--no-originals): a write even if nothing changed.
            ids = {r.sha256 for r in read.records.values()}
            missing = store.missing_originals(sorted(ids)) if meta else ids
            originals_done = not (missing & wanted.keys()) if originals else missing == ids
            if meta and not report.changed and same_chunking and current and originals_done:
                _log_run(writer, recorded, report)
                report.progress.done()
                return report  # (an older store is written anyway: the write migrates it)
            new_chunks = [c for source in sorted(read.chunks) for c in read.chunks[source]]
            stored = store.stored_vectors([c.id for c in new_chunks]) if meta else {}
            vectors = chunk_vectors(embedder, new_chunks, stored, report, progress)
            if progress:
                tqdm.write(f"Writing {len(new_chunks)} chunks to PostgreSQL…", file=sys.stderr)
            delta = StoreDelta(
                # and the files re-chunked the same (their chunks' metadata may change)
                remove_sources=sorted(set(report.removed) | set(report.updated) | set(read.chunks)),
                chunks=new_chunks,
                vectors=vectors,
                files=[read.records[s] for s in sorted(read.records)],
                embedder=embedder.record(),
                chunking=chunking,
                rebuild=rebuild,
                base_fields=BASE_FIELDS,
                not_filterable=NOT_FILTERABLE,
                access_rules=rules_as_recorded(access),
                originals=wanted,
                keep_originals=originals,
            )
            report.progress.writing()
            with _tracer.start_as_current_span("write") as span:
                span.set_attribute("ragchains.chunks", len(new_chunks))
                report.notes.extend(writer.write(delta))
            report.wrote = True
            _log_run(writer, recorded, report)
    except StoreError as exc:
        raise IngestError(str(exc)) from exc
    report.progress.done()
    return report


def _log_run(writer: StoreWriter, recorded: Mapping[str, Any], report: IngestReport) -> None:
    """Add the run to the store's ingest log (meta "ingests"), for a server's /metrics."""
    try:
        writer.set_meta({"ingests": logged(recorded.get("ingests") or {}, report)})
    except StoreError as exc:  # the run itself is done and committed
        report.notes.append(f"the run was not added to the ingest log: {exc}")
