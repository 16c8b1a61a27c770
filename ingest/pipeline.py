"""Incremental ingestion: discover files, load and chunk what changed, embed, write atomically.

After a run the index mirrors the given inputs: new files are added, changed files replaced,
files no longer found removed, and unchanged files kept with their stored vectors. A file
that cannot be read this time is skipped with its reason; if an earlier version of it is in
the index, that version is kept rather than lost.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from ragchains.ingest.chunking import Chunker, chunk_file
from ragchains.ingest.loaders import LOADERS, LoadOptions, SkipFile, load_file
from ragchains.retrievers.access import (
    AccessRule,
    AccessRuleError,
    groups_for,
    mixed_type_problem,
    sidecar_rules,
)
from ragchains.retrievers.bm25 import BM25_PARAMS, build_bm25
from ragchains.retrievers.dense import build_faiss
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.filters import BASE_FIELDS
from ragchains.retrievers.indexformat import (
    LOCK_FILE,
    Chunk,
    FileRecord,
    IndexBusyError,
    IndexDamagedError,
    IndexLoadError,
    IndexNotFoundError,
    current_generation,
    file_sha256,
    read_manifest,
)
from ragchains.retrievers.indexwriter import IndexContents, write_index, writer_lock
from ragchains.retrievers.pgerrors import StoreError
from ragchains.retrievers.pgstore import PostgresStore
from ragchains.retrievers.pgwriter import SCHEMA_VERSION, StoreDelta
from ragchains.retrievers.searchindex import SearchIndex, load_index

log = logging.getLogger(__name__)

# Bump when chunk boundaries or metadata change for the same input, so re-runs re-chunk.
CHUNKER_VERSION = 1
_NOT_FILTERABLE = frozenset({"citation", "content_hash", "chunk_index"})
EMBED_BATCH = 256


class IngestError(ValueError):
    """The run cannot go ahead (bad arguments, unreadable existing index, nothing to ingest)."""


class NothingIngestedError(IngestError):
    """Every input was skipped (or there was none): the index would be empty."""


@dataclass
class Skipped:
    source: str
    reason: str


@dataclass
class IngestReport:
    index: Path | str  # an index folder, or a store's URL without its password
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    kept_previous: list[str] = field(default_factory=list)  # skipped now, old version kept
    relabelled: list[str] = field(default_factory=list)  # unchanged, but new access groups
    chunks_total: int = 0
    chunks_embedded: int = 0
    wrote: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.updated or self.removed or self.relabelled)

    def counts(self) -> dict[str, int]:
        return {
            "added": len(self.added),
            "updated": len(self.updated),
            "removed": len(self.removed),
            "unchanged": len(self.unchanged),
            "skipped": len(self.skipped),
            **({"relabelled": len(self.relabelled)} if self.relabelled else {}),
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": str(self.index),
            **self.counts(),
            "chunks": self.chunks_total,
            "embedded": self.chunks_embedded,
            "wrote": self.wrote,
            "skipped_files": [{"source": s.source, "reason": s.reason} for s in self.skipped],
            "notes": self.notes,
        }


# ----------------------------------------------------------------------------- discovery
@dataclass
class Discovered:
    files: dict[str, Path] = field(default_factory=dict)  # source name -> path
    skipped: list[Skipped] = field(default_factory=list)
    sidecar_rules: list[AccessRule] = field(default_factory=list)  # the inputs' own


def _check_rules_match(rules: Sequence[AccessRule], found: Discovered) -> None:
    """A rule that matches no file is a mistake (a wrong prefix leaves files public)."""
    for rule in rules:
        if not any(groups_for(source, [rule]) for source in found.files):
            example = next(iter(sorted(found.files)), "")
            raise IngestError(
                f"--access {rule.pattern!r} matches no file: files are named from the input "
                f"folder's name, e.g. {example!r}"
            )


def _within(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


def discover(paths: Sequence[str | Path]) -> Discovered:
    """Supported files under the given paths, named ``<root name>/<relative path>``.

    Hidden files and folders are passed over. Symlinks are followed only when they lead to a
    place inside one of the given roots; links to folders are never descended (their targets
    inside the roots are walked anyway, and this rules out cycles). Each folder's
    ``.ragchains-access.toml`` gives ``sidecar_rules``, a deeper folder's first (the more
    specific).
    """
    if not paths:
        raise IngestError("no input paths given")
    roots = [Path(p) for p in paths]
    for root in roots:
        if not root.exists() and not root.is_symlink():
            raise IngestError(f"input path not found: {root}")
    resolved_roots = [r.resolve() for r in roots]
    found = Discovered()
    sidecars: list[tuple[int, list[AccessRule]]] = []

    def add(source: str, path: Path) -> None:
        if source in found.files and found.files[source] != path:
            raise IngestError(
                f"two inputs map to the same source name {source!r}: {found.files[source]} and "
                f"{path}; pass them under different folder names"
            )
        if path.is_symlink():
            target = path.resolve()
            if not _within(target, resolved_roots):
                found.skipped.append(Skipped(source, "symlink leads outside the given roots"))
                return
        if path.suffix.lower() not in LOADERS:
            found.skipped.append(
                Skipped(source, f"unsupported file type {path.suffix or '(no extension)'!r}")
            )
            return
        found.files[source] = path

    for root, resolved in zip(roots, resolved_roots, strict=True):
        if not root.is_dir():
            add(root.name, root)
            continue
        prefix = root.name or resolved.name
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            here = Path(dirpath)
            kept_dirs = []
            for name in sorted(dirnames):
                sub = here / name
                if name.startswith("."):
                    continue
                if sub.is_symlink():
                    if not _within(sub.resolve(), resolved_roots):
                        rel = sub.relative_to(root).as_posix()
                        found.skipped.append(
                            Skipped(f"{prefix}/{rel}", "symlink leads outside the given roots")
                        )
                    continue
                kept_dirs.append(name)
            dirnames[:] = kept_dirs
            folder = here.relative_to(root)
            where = prefix if folder == Path(".") else f"{prefix}/{folder.as_posix()}"
            try:
                sidecars.append((len(folder.parts), sidecar_rules(here, where)))
            except AccessRuleError as exc:
                raise IngestError(str(exc)) from exc
            for name in sorted(filenames):
                if name.startswith("."):
                    continue
                path = here / name
                add(f"{prefix}/{path.relative_to(root).as_posix()}", path)
    sidecars.sort(key=lambda depth_rules: -depth_rules[0])
    found.sidecar_rules = [rule for _, rules in sidecars for rule in rules]
    return found


# ----------------------------------------------------------------------------- the run


def _resolve_field_types(
    chunks: Sequence[Chunk], report: IngestReport, groups_of: Mapping[str, tuple[str, ...]]
) -> dict[str, str]:
    """One type per field over the whole index; a field typed differently in two files
    becomes a string field (its values stringified) and the run says so, unless that type
    would tell a caller of files it may not read (``groups_of``: each source's groups)."""
    seen: dict[str, set[str]] = {}
    by_label: dict[str, dict[tuple[str, ...], set[str]]] = {}
    for chunk in chunks:
        label = groups_of.get(chunk.metadata["source"], ())
        for key, value in chunk.metadata.items():
            if key in _NOT_FILTERABLE or value is None:
                continue
            kind = (
                "boolean"
                if isinstance(value, bool)
                else "number"
                if isinstance(value, int | float)
                else "string"
            )
            seen.setdefault(key, set()).add(kind)
            by_label.setdefault(key, {}).setdefault(label, set()).add(kind)
    fields: dict[str, str] = {}
    for key, kinds in seen.items():
        if len(kinds) == 1:
            fields[key] = next(iter(kinds))
            continue
        problem = mixed_type_problem(key, by_label[key])
        if problem:
            raise IngestError(problem)
        fields[key] = "string"
        report.notes.append(
            f"field {key!r} holds {' and '.join(sorted(kinds))} values in different files; "
            "it is filterable as a string"
        )
        for chunk in chunks:
            value = chunk.metadata.get(key)
            if value is not None and not isinstance(value, str):
                chunk.metadata[key] = str(value)
    for key, kind in BASE_FIELDS.items():
        fields.setdefault(key, kind)
    return fields


def _open_previous(
    index_dir: Path, embedder: SentenceTransformerEmbedder, rebuild: bool
) -> SearchIndex | None:
    if rebuild:
        return None
    try:
        return load_index(index_dir, embedder_name=embedder.name)
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


def embed_texts(
    embedder: SentenceTransformerEmbedder, texts: list[str], progress: bool
) -> np.ndarray:
    if not texts:
        return np.zeros((0, embedder.dimension), dtype=np.float32)
    out = []
    with tqdm(total=len(texts), desc="Embedding", unit="chunk", disable=not progress) as bar:
        for start in range(0, len(texts), EMBED_BATCH):
            batch = texts[start : start + EMBED_BATCH]
            out.append(embedder.encode(batch))
            bar.update(len(batch))
    return np.concatenate(out)


def ingest(
    paths: Sequence[str | Path],
    index_dir: str | Path,
    *,
    embedder: SentenceTransformerEmbedder,
    chunk_size: int,
    chunk_overlap: int,
    hnsw_min_chunks: int,
    text_columns: Sequence[str] | None = None,
    rebuild: bool = False,
    progress: bool = True,
    access: Sequence[AccessRule] | None = None,
) -> IngestReport:
    """Bring the index at ``index_dir`` in line with ``paths``; see the module docstring.
    ``access``: who may read which files (``--access``), before the ``.ragchains-access.toml``
    files under the inputs (a deeper folder's first); the first rule that matches a file
    decides. None: the rules the index's last run was given ([]: none)."""
    index_dir = Path(index_dir)
    found = discover(paths)  # before locking: a typo in a path must not create the folder
    if access:
        _check_rules_match(access, found)
    try:
        with writer_lock(index_dir):
            return _ingest_locked(
                found,
                index_dir,
                embedder=embedder,
                chunk_size=chunk_size,
                chunk_overlap=chunk_overlap,
                hnsw_min_chunks=hnsw_min_chunks,
                text_columns=text_columns,
                rebuild=rebuild,
                progress=progress,
                access=access,
            )
    except IndexBusyError as exc:
        raise IngestError(str(exc)) from exc


@dataclass(frozen=True)
class _Setup:
    """How a run reads and cuts files, and the record of it an index or store keeps (a
    change of it re-chunks every file)."""

    chunker: Chunker
    options: LoadOptions
    chunking: dict[str, Any]


def _setup(
    embedder: SentenceTransformerEmbedder,
    chunk_size: int,
    chunk_overlap: int,
    text_columns: Sequence[str] | None,
    progress: bool,
) -> _Setup:
    """The run's chunker and load options, with the embedder loaded now (so the progress
    bars time the real work)."""
    if progress:
        tqdm.write(f"Loading embedding model {embedder.name}…", file=sys.stderr)
    embedder.count_tokens("")
    options = LoadOptions(text_columns=list(text_columns) if text_columns else None)
    chunking = {
        "chunker_version": CHUNKER_VERSION,
        "chunk_size": chunk_size,
        "chunk_overlap": chunk_overlap,
        "tokenizer": embedder.name,
        "text_columns": options.text_columns,
    }
    chunker = Chunker(embedder.count_tokens, chunk_size=chunk_size, chunk_overlap=chunk_overlap)
    return _Setup(chunker, options, chunking)


@dataclass
class _Read:
    """What a run read: new chunks per file that changed, and the files whose stored chunks
    stay (unchanged, or unreadable now with an earlier version kept)."""

    chunks: dict[str, list[Chunk]] = field(default_factory=dict)
    kept: set[str] = field(default_factory=set)
    records: dict[str, FileRecord] = field(default_factory=dict)


def _read_files(
    found: Discovered,
    old_files: dict[str, FileRecord],
    stored_ids: Callable[[str], set[str]],
    *,
    same_chunking: bool,
    chunker: Chunker,
    options: LoadOptions,
    report: IngestReport,
    progress: bool,
    rules: Sequence[AccessRule] = (),
) -> _Read:
    """Load and chunk each file that is new or changed; record what happened to each in
    ``report``. ``stored_ids(source)``: the chunk ids the store holds for a file; ``rules``:
    who may read which file (the first that matches)."""
    read = _Read()
    for source, path in tqdm(
        sorted(found.files.items()), desc="Reading", unit="file", disable=not progress
    ):
        try:
            sha, size = file_sha256(path)
        except OSError as exc:
            sha, size = "", 0
            failure: str | None = f"unreadable: {exc.strerror or exc}"
        else:
            failure = None
        old = old_files.get(source)
        groups = groups_for(source, rules)
        if failure is None and old and same_chunking and old.sha256 == sha:
            if old.access != groups:
                report.relabelled.append(source)  # new readers only: its chunks stay
            read.kept.add(source)
            read.records[source] = replace(old, access=groups)
            report.unchanged.append(source)
            continue
        if failure is None:
            try:
                loaded = load_file(path, options)
                chunks = chunk_file(source, loaded, chunker)
                if not chunks:
                    raise SkipFile("no text left after chunking")
            except SkipFile as exc:
                failure = str(exc)
            except Exception as exc:  # a parser bug must not sink the other files
                log.debug("loading %s failed", path, exc_info=True)
                failure = f"could not be parsed ({type(exc).__name__}: {str(exc)[:200]})"
        if failure is not None:
            report.skipped.append(Skipped(source, failure))
            if old is not None:
                read.kept.add(source)
                read.records[source] = replace(old, access=groups)
                report.kept_previous.append(source)
            continue
        read.records[source] = FileRecord(source, sha, size, len(chunks), loaded.format, groups)
        if (
            old is not None
            and old.sha256 == sha
            and old.chunk_count == len(chunks)
            and {c.id for c in chunks} <= stored_ids(source)
        ):
            # Only the chunking settings changed, and they changed nothing here.
            read.kept.add(source)
            report.unchanged.append(source)
            continue
        read.chunks[source] = chunks
        (report.added if old is None else report.updated).append(source)
    report.removed = sorted(set(old_files) - set(read.records))
    if not report.added and not report.updated and not report.unchanged:
        reasons = "; ".join(f"{s.source}: {s.reason}" for s in report.skipped[:5]) or "no files"
        raise NothingIngestedError(f"nothing could be ingested ({reasons})")
    return read


def _vectors(
    embedder: SentenceTransformerEmbedder,
    chunks: Sequence[Chunk],
    stored: dict[str, np.ndarray],
    report: IngestReport,
    progress: bool,
) -> np.ndarray:
    """Row-aligned vectors of ``chunks``: the stored one where a chunk id has one, the rest
    embedded now."""
    missing = [i for i, c in enumerate(chunks) if c.id not in stored]
    report.chunks_embedded = len(missing)
    vectors = np.zeros((len(chunks), embedder.dimension), dtype=np.float32)
    for row, chunk in enumerate(chunks):
        if chunk.id in stored:
            vectors[row] = stored[chunk.id]
    if missing:
        vectors[np.array(missing)] = embed_texts(
            embedder, [chunks[i].text for i in missing], progress
        )
    return vectors


def _ingest_locked(
    found: Discovered,
    index_dir: Path,
    *,
    embedder: SentenceTransformerEmbedder,
    chunk_size: int,
    chunk_overlap: int,
    hnsw_min_chunks: int,
    text_columns: Sequence[str] | None,
    rebuild: bool,
    progress: bool,
    access: Sequence[AccessRule] | None,
) -> IngestReport:
    report = IngestReport(index=index_dir)
    report.skipped.extend(found.skipped)
    setup = _setup(embedder, chunk_size, chunk_overlap, text_columns, progress)
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
    except IndexLoadError as exc:  # damage found reading the chunks (the message says what to do)
        raise IngestError(str(exc)) from exc
    finally:
        if previous is not None:
            previous.close()

    access = rules_for_run(access, kept, report)
    read = _read_files(
        found,
        old_files,
        lambda source: {c.id for c in old_chunks.get(source, [])},
        same_chunking=same_chunking,
        chunker=chunker,
        options=options,
        report=report,
        progress=progress,
        rules=[*access, *found.sidecar_rules],
    )
    _note_opened(read, old_files, report)
    per_file = {**{s: old_chunks.get(s, []) for s in read.kept}, **read.chunks}
    all_chunks = [c for source in sorted(per_file) for c in per_file[source]]
    report.chunks_total = len(all_chunks)
    if previous is not None and not report.changed and same_chunking:
        if lengths_kept:
            return report  # the index already holds exactly this; leave it untouched
        report.notes.append("written again to keep BM25's row lengths (an older generation)")

    fields = _resolve_field_types(
        all_chunks, report, {s: r.access for s, r in read.records.items()}
    )
    contents = IndexContents(
        chunks=all_chunks,
        vectors=_vectors(embedder, all_chunks, old_vectors, report, progress),
        files=[read.records[s] for s in sorted(read.records)],
        fields=fields,
        embedder={"name": embedder.name, "dimension": embedder.dimension},
        chunking=chunking,
        access_rules=_recorded(access),
    )
    build_and_write(index_dir, contents, hnsw_min_chunks=hnsw_min_chunks, progress=progress)
    report.wrote = True
    return report


def ingest_to_store(
    paths: Sequence[str | Path],
    store: PostgresStore,
    *,
    embedder: SentenceTransformerEmbedder,
    chunk_size: int,
    chunk_overlap: int,
    text_columns: Sequence[str] | None = None,
    rebuild: bool = False,
    progress: bool = True,
    access: Sequence[AccessRule] | None = None,
) -> IngestReport:
    """``ingest`` into a PostgreSQL store: the same files, chunks, ids and report, written as
    one transaction that deletes the chunks of changed and removed files and adds the new
    ones (unchanged files are not read back)."""
    found = discover(paths)
    if access:
        _check_rules_match(access, found)
    report = IngestReport(index=store.location)
    report.skipped.extend(found.skipped)
    try:
        with store.writer() as writer:
            recorded = store.meta(fresh=True)  # a rebuild keeps its access rules, and only them
            meta = {} if rebuild else recorded
            if meta:
                try:
                    store.check(
                        embedder_name=embedder.name, dimension=embedder.dimension, writing=True
                    )
                except StoreError as exc:
                    raise IngestError(f"{exc} (or pass --rebuild to build it anew)") from exc
            setup = _setup(embedder, chunk_size, chunk_overlap, text_columns, progress)
            chunker, options, chunking = setup.chunker, setup.options, setup.chunking
            old_files = store.files() if meta else {}
            same_chunking = bool(meta) and meta.get("chunking") == chunking
            access = rules_for_run(access, recorded.get("access_rules") or [], report)
            read = _read_files(
                found,
                old_files,
                lambda source: store.chunk_ids([source]),
                same_chunking=same_chunking,
                chunker=chunker,
                options=options,
                report=report,
                progress=progress,
                rules=[*access, *found.sidecar_rules],
            )
            _note_opened(read, old_files, report)
            report.chunks_total = sum(r.chunk_count for r in read.records.values())
            current = meta.get("schema_version") == SCHEMA_VERSION
            if meta and not report.changed and same_chunking and current:
                return report  # (an older store is written anyway: the write migrates it)
            new_chunks = [c for source in sorted(read.chunks) for c in read.chunks[source]]
            stored = store.stored_vectors([c.id for c in new_chunks]) if meta else {}
            vectors = _vectors(embedder, new_chunks, stored, report, progress)
            if progress:
                tqdm.write(f"Writing {len(new_chunks)} chunks to PostgreSQL…", file=sys.stderr)
            report.notes.extend(
                writer.write(
                    StoreDelta(
                        remove_sources=sorted(set(report.removed) | set(report.updated)),
                        chunks=new_chunks,
                        vectors=vectors,
                        files=[read.records[s] for s in sorted(read.records)],
                        embedder={"name": embedder.name, "dimension": embedder.dimension},
                        chunking=chunking,
                        rebuild=rebuild,
                        base_fields=BASE_FIELDS,
                        not_filterable=_NOT_FILTERABLE,
                        access_rules=_recorded(access),
                    )
                )
            )
    except StoreError as exc:
        raise IngestError(str(exc)) from exc
    report.wrote = True
    return report


def rules_for_run(
    access: Sequence[AccessRule] | None, kept: Sequence[Mapping[str, Any]], report: IngestReport
) -> list[AccessRule]:
    """This run's ``--access`` rules; None: the last run's (``kept``, as recorded) stand, so a
    plain re-run never opens files up; the report says so."""
    if access is not None:
        return list(access)
    rules = [AccessRule(r["pattern"], tuple(r["groups"])) for r in kept]
    if rules:
        report.notes.append(
            "access rules of the last run kept: "
            + "; ".join(f"{r.pattern}={','.join(r.groups)}" for r in rules)
            + " (--access-clear drops them)"
        )
    return rules


def _recorded_rules(index_dir: Path) -> list[dict[str, Any]]:
    """The access rules the current generation records (for a rebuild, which opens nothing
    else of it); none when there is no readable generation."""
    try:
        rules = read_manifest(index_dir, current_generation(index_dir)).get("access_rules")
    except IndexLoadError:
        return []
    return rules if isinstance(rules, list) else []


def _recorded(rules: Sequence[AccessRule]) -> list[dict[str, Any]]:
    """Rules as an index manifest or a store's meta keeps them."""
    return [{"pattern": r.pattern, "groups": list(r.groups)} for r in rules]


def _note_opened(read: _Read, old_files: Mapping[str, FileRecord], report: IngestReport) -> None:
    """Name the files this run makes readable by everyone that had groups before."""
    opened = sorted(
        s
        for s, r in read.records.items()
        if not r.access and old_files.get(s) and old_files[s].access
    )
    if opened:
        report.notes.append(
            f"{len(opened)} file(s) that had access groups are now readable by everyone: "
            + ", ".join(opened[:5])
        )


def build_and_write(
    index_dir: Path, contents: IndexContents, *, hnsw_min_chunks: int, progress: bool
) -> None:
    """Build BM25 and FAISS over embedded chunks and write them as the index's new generation."""
    if progress:
        tqdm.write(f"Indexing {len(contents.chunks)} chunks (BM25 + FAISS)…", file=sys.stderr)
    bm25 = build_bm25([c.text for c in contents.chunks])
    dense, dense_info = build_faiss(contents.vectors, hnsw_min_chunks=hnsw_min_chunks)
    write_index(
        index_dir, contents, bm25=bm25, dense=dense, dense_info=dense_info, bm25_info=BM25_PARAMS
    )
