"""An ingest run into an index folder: under the writer lock, read the previous generation,
apply the change plan (see ``ragchains.ingest.changes``), keep the originals of the files it
names and write the new generation."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
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
from ragchains.ingest.discovery import Discovered, discover
from ragchains.ingest.edits import CollectionEdit
from ragchains.ingest.embedding import chunk_vectors
from ragchains.ingest.errors import IngestError
from ragchains.ingest.fieldtypes import resolve_field_types
from ragchains.ingest.parsing import ParseBudget
from ragchains.ingest.parts import LoadOptions
from ragchains.ingest.report import IngestReport, log_ingest
from ragchains.ingest.runsetup import run_setup
from ragchains.retrievers.access import AccessRule
from ragchains.retrievers.bm25 import BM25_PARAMS, build_bm25
from ragchains.retrievers.dense import build_faiss
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.indexformat import (
    CURRENT_FILE,
    LOCK_FILE,
    Chunk,
    IndexBusyError,
    IndexDamagedError,
    IndexLoadError,
    IndexNotFoundError,
    current_generation,
    read_manifest,
    recorded_embedder,
)
from ragchains.retrievers.indexwriter import (
    IndexContents,
    store_originals,
    write_index,
    writer_lock,
)
from ragchains.retrievers.searchindex import SearchIndex, load_index

# Spans for `ragchains ingest` when it exports traces (the API's global provider; without
# one they record nothing).
_tracer = trace.get_tracer(__name__)


def ingest(
    paths: Sequence[str | Path],
    index_dir: str | Path,
    *,
    embedder: SentenceTransformerEmbedder,
    chunk_size: int,
    chunk_overlap: int,
    hnsw_min_chunks: int,
    load_options: LoadOptions | None = None,
    budget: ParseBudget | None = None,
    rebuild: bool = False,
    progress: bool = True,
    access: Sequence[AccessRule] | None = None,
    originals: bool = True,
    edit: CollectionEdit | None = None,
    report: IngestReport | None = None,
) -> IngestReport:
    """Bring the index at ``index_dir`` in line with ``paths`` (as ``ragchains.ingest.changes``
    describes), or make ``edit`` to it (``paths`` unused; see ``ragchains.ingest.edits``).
    ``report``: the one to fill (a caller watching its ``progress``; default a new one).
    ``originals``: keep each file's bytes in the index folder (``files/<sha256>``, served by
    ``GET /files/{id}``); False: keep none, and delete those kept before.
    ``budget``: what one file may cost to parse (``ragchains.ingest.parsing``).
    ``access``: who may read which files (``--access``), before the ``.ragchains-access.toml``
    files under the inputs (a deeper folder's first); the first rule that matches a file
    decides. None: the rules the index's last run was given ([]: none)."""
    index_dir = Path(index_dir)
    # Before locking: a typo in a path must not create the folder.
    found = edit.found() if edit is not None else discover(paths)
    if access and edit is None:
        check_rules_match(access, found)
    try:
        with writer_lock(index_dir):
            report = _ingest_locked(
                found,
                index_dir,
                embedder=embedder,
                chunk_size=chunk_size,
                chunk_overlap=chunk_overlap,
                hnsw_min_chunks=hnsw_min_chunks,
                load_options=load_options,
                budget=budget,
                rebuild=rebuild,
                progress=progress,
                access=access,
                originals=originals,
                edit=edit,
                report=report or IngestReport(index=index_dir),
            )
            # Counted for a server's /metrics; a folder that is no index yet stays empty
            # (a second run would take it for someone else's folder).
            if (index_dir / CURRENT_FILE).exists():
                try:
                    log_ingest(index_dir, report)
                except OSError as exc:  # the run itself is done and committed
                    report.notes.append(f"the run was not added to the ingest log: {exc}")
            report.progress.done()
            return report
    except IndexBusyError as exc:
        raise IngestError(str(exc)) from exc


def _open_previous(
    index_dir: Path, embedder: SentenceTransformerEmbedder, rebuild: bool
) -> SearchIndex | None:
    if rebuild:
        return None
    try:
        return load_index(index_dir, embedder_name=embedder.name, embedder_backend=embedder.backend)
    except IndexNotFoundError:
        if any(p.name != LOCK_FILE for p in index_dir.iterdir()):
            raise IngestError(
                f"{index_dir} exists, is not empty and is not a ragchains index; "
                "choose another --index folder"
            ) from None
        return None
    except IndexDamagedError as exc:  # its message already says how to mend it
        raise IngestError(str(exc)) from exc
    except IndexLoadError as exc:
        raise IngestError(f"{exc} (or pass --rebuild to build it anew)") from exc


def _ingest_locked(
    found: Discovered,
    index_dir: Path,
    *,
    embedder: SentenceTransformerEmbedder,
    chunk_size: int,
    chunk_overlap: int,
    hnsw_min_chunks: int,
    load_options: LoadOptions | None,
    budget: ParseBudget | None,
    rebuild: bool,
    progress: bool,
    access: Sequence[AccessRule] | None,
    originals: bool,
    edit: CollectionEdit | None,
    report: IngestReport,
) -> IngestReport:
    report.edit = edit is not None
    report.unlisted = sorted(edit.removes) if edit is not None else []
    report.skipped.extend(found.skipped)
    if not rebuild:  # an auto embedder keeps the backend the index was embedded with
        embedder.follow(recorded_embedder(index_dir))
    setup = run_setup(embedder, chunk_size, chunk_overlap, load_options, progress, budget)
    chunker, options, chunking = setup.chunker, setup.options, setup.chunking

    previous = _open_previous(index_dir, embedder, rebuild)
    try:
        old_files = previous.store.files() if previous else {}
        old_chunks: dict[str, list[Chunk]] = {}
        old_vectors: dict[str, np.ndarray] = {}
        if previous is not None:
            vectors = previous.vectors()
            for row, chunk in enumerate(previous.store.iter_chunks()):
                old_chunks.setdefault(chunk.metadata["source"], []).append(chunk)
                old_vectors[chunk.id] = vectors[row]
        same_chunking = previous is not None and previous.manifest.get("chunking") == chunking
        kept = (
            (previous.manifest.get("access_rules") or [])
            if previous is not None
            else _recorded_rules(index_dir)
        )
        # A generation written before BM25's row lengths were kept is written again once:
        # without them a caller's scores still weigh hidden rows' lengths.
        lengths_kept = previous is not None and previous.bm25.doc_lengths is not None
        same_originals = previous is not None and previous.manifest.get("originals", True) == (
            originals
        )
    except IndexLoadError as exc:  # damage found reading the chunks (the message says what to do)
        raise IngestError(str(exc)) from exc
    finally:
        if previous is not None:
            previous.close()

    # An edit labels its files itself, and keeps the rules the last run recorded.
    access = rules_for_run(access, kept, report) if edit is None else recorded_rules(kept)
    read = read_files(
        found,
        old_files,
        lambda source: {c.id for c in old_chunks.get(source, [])},
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
    per_file = {**{s: old_chunks.get(s, []) for s in read.kept}, **read.chunks}
    all_chunks = [c for source in sorted(per_file) for c in per_file[source]]
    report.chunks_total = len(all_chunks)
    wanted = originals_wanted(read.records, found, report) if originals else {}
    if previous is not None and not report.changed and same_chunking and same_originals:
        if lengths_kept:
            # The index already holds exactly this; only originals it lacks (an index
            # written before they were kept) are added, which needs no new generation.
            _keep_originals(index_dir, wanted, report)
            return report
        report.notes.append("written again to keep BM25's row lengths (an older generation)")

    fields = resolve_field_types(all_chunks, report, {s: r.access for s, r in read.records.items()})
    contents = IndexContents(
        chunks=all_chunks,
        vectors=chunk_vectors(embedder, all_chunks, old_vectors, report, progress),
        files=[read.records[s] for s in sorted(read.records)],
        fields=fields,
        embedder=embedder.record(),
        chunking=chunking,
        access_rules=rules_as_recorded(access),
        originals=originals,
    )
    report.progress.writing()
    build_and_write(
        index_dir,
        contents,
        hnsw_min_chunks=hnsw_min_chunks,
        progress=progress,
        originals=wanted,
        notes=report.notes,
    )
    report.wrote = True
    return report


def _keep_originals(
    index_dir: Path, wanted: Mapping[str, tuple[str, Path]], report: IngestReport
) -> None:
    report.notes.extend(store_originals(index_dir, wanted).notes)


def _recorded_rules(index_dir: Path) -> list[dict[str, Any]]:
    """The access rules the current generation records (for a rebuild, which opens nothing
    else of it); none when there is no readable generation."""
    try:
        rules = read_manifest(index_dir, current_generation(index_dir)).get("access_rules")
    except IndexLoadError:
        return []
    return rules if isinstance(rules, list) else []


@_tracer.start_as_current_span("write")
def build_and_write(
    index_dir: Path,
    contents: IndexContents,
    *,
    hnsw_min_chunks: int,
    progress: bool,
    originals: Mapping[str, tuple[str, Path]] | None = None,
    notes: list[str] | None = None,
) -> None:
    """Build BM25 and FAISS over embedded chunks and write them as the index's new generation
    (with the ``originals`` it keeps: sha256 -> (source, path); see ``write_index``)."""
    if progress:
        tqdm.write(f"Indexing {len(contents.chunks)} chunks (BM25 + FAISS)…", file=sys.stderr)
    bm25 = build_bm25([c.text for c in contents.chunks])
    dense, dense_info = build_faiss(contents.vectors, hnsw_min_chunks=hnsw_min_chunks)
    generation = write_index(
        index_dir,
        contents,
        bm25=bm25,
        dense=dense,
        dense_info=dense_info,
        bm25_info=BM25_PARAMS,
        originals=originals,
        notes=notes,
    )
    trace.get_current_span().set_attributes(
        {"ragchains.chunks": len(contents.chunks), "ragchains.index.generation": generation.name}
    )
