"""A run's change plan: each input file compared with the previous index or store, and loaded
and chunked when it is new or changed.

After a run the index mirrors the given inputs: new files are added, changed files replaced,
files no longer found removed, and unchanged files kept with their stored vectors. A file
that cannot be read this time is skipped with its reason; if an earlier version of it is in
the index, that version is kept rather than lost.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from opentelemetry import trace

from ragchains.ingest.chunking import Chunker
from ragchains.ingest.details import UPLOADED_BY, file_details
from ragchains.ingest.discovery import Discovered
from ragchains.ingest.errors import NothingIngestedError
from ragchains.ingest.parsing import ParseBudget, Parsed, ParseJob, parse_files
from ragchains.ingest.parts import LoadOptions
from ragchains.ingest.report import IngestReport, Skipped
from ragchains.retrievers.access import AccessRule, groups_for
from ragchains.retrievers.indexformat import Chunk, FileRecord, file_sha256

# Spans for `ragchains ingest` when it exports traces (the API's global provider; without
# one they record nothing).
_tracer = trace.get_tracer(__name__)


@dataclass(frozen=True)
class RunPlan:
    """What a run does beside reading its inputs. By default it mirrors them: an earlier file
    not among them is removed, unless it was uploaded (through the documents API: only that
    API, or a rebuild, removes such a file). An edit of a few documents (``ingest.edits``)
    instead keeps every earlier file but those it ``removes``, reads ``read_again`` even if
    unchanged, labels its files with ``groups`` (over the rules) and records who made it."""

    removes: Collection[str] | None = None  # None: mirror the inputs
    read_again: Collection[str] = ()
    groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    uploaded_by: str | None = None

    @property
    def inputs_required(self) -> bool:
        """Whether a run with no readable input fails (a mirror does: it would empty the
        index; an edit may only remove)."""
        return self.removes is None

    def keeps(self, old: FileRecord) -> bool:
        """Whether an earlier file that is not among the inputs stays."""
        if self.removes is None:
            return bool(old.details.get(UPLOADED_BY))
        return old.source not in self.removes


@dataclass
class ReadResult:
    """What a run read: new chunks per file that changed, and the files whose stored chunks
    stay (unchanged, or unreadable now with an earlier version kept)."""

    chunks: dict[str, list[Chunk]] = field(default_factory=dict)
    kept: set[str] = field(default_factory=set)
    records: dict[str, FileRecord] = field(default_factory=dict)


@_tracer.start_as_current_span("read")  # loaded and chunked
def read_files(
    found: Discovered,
    old_files: dict[str, FileRecord],
    stored_ids: Callable[[str], set[str]],
    *,
    same_chunking: bool,
    chunker: Chunker,
    options: LoadOptions,
    budget: ParseBudget,
    report: IngestReport,
    progress: bool,
    rules: Sequence[AccessRule] = (),
    plan: RunPlan | None = None,
) -> ReadResult:
    """Load and chunk each file that is new or changed, in worker processes under
    ``budget`` (``ragchains.ingest.parsing``); record what happened to each in ``report``.
    ``stored_ids(source)``: the chunk ids the store holds for a file; ``rules``: who may read
    which file (the first that matches); ``plan``: what else the run keeps, reads or labels
    (``RunPlan``; default: a run that mirrors its inputs)."""
    plan = plan or RunPlan()
    read = ReadResult()
    hashed: dict[str, tuple[str, int, str | None]] = {}  # source -> sha256, size, failure
    jobs: list[ParseJob] = []
    for source, path in sorted(found.files.items()):
        try:
            sha, size = file_sha256(path)
        except OSError as exc:
            hashed[source] = ("", 0, f"unreadable: {exc.strerror or exc}")
            continue
        hashed[source] = (sha, size, None)
        old = old_files.get(source)
        if not (old and same_chunking and old.sha256 == sha) or source in plan.read_again:
            jobs.append(ParseJob(source, path, sha))
    report.progress.reading(len(jobs))
    parsed: dict[str, Parsed | str] = {}
    for job, result in parse_files(
        jobs,
        chunker=chunker,
        options=options,
        budget=budget,
        progress=progress,
        on_pages=report.progress.pages_told,
    ):
        parsed[job.source] = result
        chunks = result.chunks if isinstance(result, Parsed) else []
        pages = {c.metadata.get("page") for c in chunks if c.metadata.get("page") is not None}
        report.progress.file_read(job.source, len(pages), len(chunks))
    for source in sorted(found.files):
        sha, size, failure = hashed[source]
        old = old_files.get(source)
        given = plan.groups.get(source)
        groups = given if given is not None else groups_for(source, rules)
        outcome = parsed.get(source)
        if failure is None and outcome is None:  # unchanged: not parsed
            assert old is not None
            if old.access != groups:
                report.relabelled.append(source)  # new readers only: its chunks stay
            read.kept.add(source)
            read.records[source] = replace(old, access=groups)
            report.unchanged.append(source)
            continue
        if isinstance(outcome, str):
            failure = outcome
        if failure is not None:
            report.skipped.append(Skipped(source, failure, groups))
            if old is not None:
                read.kept.add(source)
                read.records[source] = replace(old, access=groups)
                report.kept_previous.append(source)
            continue
        assert isinstance(outcome, Parsed)
        chunks = outcome.chunks
        report.partial.extend(Skipped(source, reason) for reason in outcome.partial)
        details = file_details(chunks, outcome.partial, uploaded_by=plan.uploaded_by)
        read.records[source] = FileRecord(
            source, sha, size, len(chunks), outcome.format, groups, details
        )
        if (
            old is not None
            and old.sha256 == sha
            and old.chunk_count == len(chunks)
            and {c.id for c in chunks} <= stored_ids(source)
        ):
            # Only the chunking settings changed, and they changed no chunk's text here: the
            # same ids, whose vectors are reused, with the metadata of this chunker (a new
            # CHUNKER_VERSION may add to it).
            read.chunks[source] = chunks
            report.unchanged.append(source)
            continue
        read.chunks[source] = chunks
        (report.added if old is None else report.updated).append(source)
    for source, old in sorted(old_files.items()):
        if source not in read.records and plan.keeps(old):
            read.kept.add(source)  # not this run's to change: kept as it is
            read.records[source] = old
    report.removed = sorted(set(old_files) - set(read.records))
    nothing_read = not report.added and not report.updated and not report.unchanged
    if nothing_read and (found.files or plan.inputs_required):
        reasons = "; ".join(f"{s.source}: {s.reason}" for s in report.skipped[:5]) or "no files"
        raise NothingIngestedError(f"nothing could be ingested ({reasons})")
    trace.get_current_span().set_attributes(
        {
            "ragchains.files.read": len(read.chunks),
            "ragchains.files.skipped": len(report.skipped),
            "ragchains.chunks": sum(r.chunk_count for r in read.records.values()),
            "ragchains.chunks.new": sum(map(len, read.chunks.values())),
        }
    )
    return read


def originals_wanted(
    records: Mapping[str, FileRecord], found: Discovered, report: IngestReport
) -> dict[str, tuple[str, Path]]:
    """The files whose originals the run keeps, by sha256: (source, path). Not a file whose
    earlier version is kept because it cannot be read now (its bytes are not the record's)."""
    unread = set(report.kept_previous)
    wanted: dict[str, tuple[str, Path]] = {}
    for source in sorted(records):
        path = found.files.get(source)
        if path is not None and source not in unread:
            wanted.setdefault(records[source].sha256, (source, path))
    return wanted
