"""The documents API's ingest jobs: each change of documents (an upload, a replacement, a
removal, a re-read) is an edit (``ingest.edits``) run by ``factory.run_ingest``, the
pipeline ``ragchains ingest`` runs, one job at a time and in the order they came.

A job's record and the files it stages live in a folder of their own (``<id>.json`` and
``<id>/``), written before the job is accepted, so nothing is lost with the server: at start
a job that had not finished is run again (an edit is idempotent: one that had committed
finds nothing to change), or, when its staged files are gone, reported failed. An index
generation or a store's transaction is committed whole or not at all, so a server killed
mid-job goes on serving the generation before it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from ragchains.ingest.edits import CollectionEdit
from ragchains.ingest.errors import IngestError
from ragchains.ingest.progress import IngestProgress
from ragchains.ingest.report import IngestReport

log = logging.getLogger(__name__)

FINISHED = frozenset({"done", "failed"})
# Finished jobs remembered (with their results), the oldest forgotten first.
KEPT_JOBS = 500
# How long a job waits for another writer (a `ragchains ingest` in a shell) to finish.
BUSY_WAIT_SECONDS = 600.0


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class Job:
    """One change of documents and how it went."""

    id: str
    kind: str
    by: str
    paths: list[str]
    groups: dict[str, list[str]] = field(default_factory=dict)  # per staged path
    staged: dict[str, str] = field(default_factory=dict)  # path -> staged file's name
    # path -> the staged file's sha256: an upload of the same bytes meanwhile is refused.
    digests: dict[str, str] = field(default_factory=dict)
    removes: list[str] = field(default_factory=list)
    read_again: list[str] = field(default_factory=list)
    state: str = "queued"
    created_at: str = field(default_factory=_now)
    started_at: str | None = None
    finished_at: str | None = None
    result: dict[str, Any] | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    progress: IngestProgress = field(default_factory=IngestProgress)
    version: int = 0  # bumped on every change, for whoever follows the job
    # The order jobs came in (created_at has whole seconds), kept in the job's record.
    order: int = field(default_factory=time.time_ns)

    def as_dict(self) -> dict[str, Any]:
        """The job as the API shows it."""
        return {
            "id": self.id,
            "kind": self.kind,
            "state": self.state,
            "by": self.by,
            "paths": list(self.paths),
            "created_at": self.created_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            # The run is over before the job: the server still takes the new index in.
            "progress": self.progress.snapshot(finished=self.state in FINISHED),
            "result": self.result,
            "error": self.error,
            "notes": list(self.notes),
        }

    def record(self) -> dict[str, Any]:
        """What the job's file keeps (the API's view, and what it needs to run again)."""
        return {
            **self.as_dict(),
            "groups": self.groups,
            "staged": self.staged,
            "digests": self.digests,
            "removes": self.removes,
            "read_again": self.read_again,
            "order": self.order,
        }

    @classmethod
    def from_record(cls, data: Mapping[str, Any]) -> Job:
        job = cls(
            id=str(data["id"]),
            kind=str(data["kind"]),
            by=str(data["by"]),
            paths=[str(p) for p in data.get("paths") or []],
            groups={str(k): [str(g) for g in v] for k, v in (data.get("groups") or {}).items()},
            staged={str(k): str(v) for k, v in (data.get("staged") or {}).items()},
            digests={str(k): str(v) for k, v in (data.get("digests") or {}).items()},
            removes=[str(p) for p in data.get("removes") or []],
            read_again=[str(p) for p in data.get("read_again") or []],
            state=str(data.get("state") or "queued"),
            created_at=str(data.get("created_at") or _now()),
            started_at=data.get("started_at"),
            finished_at=data.get("finished_at"),
            result=data.get("result"),
            error=data.get("error"),
            notes=[str(n) for n in data.get("notes") or []],
            order=int(data.get("order") or 0),
        )
        if job.state == "done":
            job.progress.done()
        return job


def job_result(report: IngestReport) -> dict[str, Any]:
    """What a job did, as ``ragchains ingest --json`` prints it, by the API's names."""
    shown = report.as_dict()
    return {
        "added": list(report.added),
        "updated": list(report.updated),
        "removed": list(report.removed),
        "unchanged": list(report.unchanged),
        "skipped": shown["skipped_files"],
        "partly_read": shown["partly_read"],
        "kept_previous": list(report.kept_previous),
        "chunks": report.chunks_total,
        "embedded": report.chunks_embedded,
        "wrote": report.wrote,
        "notes": list(report.notes),
    }


class PathBusy(Exception):
    """A job still to end changes this path."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


def _busy(exc: BaseException) -> bool:
    return isinstance(exc, IngestError) and "another ingest is writing" in str(exc)


class IngestJobs:
    """The jobs of one served index folder or store, kept in ``folder``.

    ``run(edit, report)``: makes an edit (``factory.run_ingest`` over the served target);
    ``committed()``: called after an edit that wrote, so the server serves it at once.
    """

    def __init__(
        self,
        folder: Path,
        run: Callable[[CollectionEdit, IngestReport], IngestReport],
        committed: Callable[[], None] = lambda: None,
    ) -> None:
        self.folder = folder
        self._run = run
        self._committed = committed
        # Held briefly (the event loop takes it too), never across a job's work.
        self._lock = threading.RLock()
        self._jobs: dict[str, Job] = {}
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        folder.mkdir(parents=True, exist_ok=True)
        self._load()

    # ------------------------------------------------------------------ the jobs' files
    def _record_path(self, job_id: str) -> Path:
        return self.folder / f"{job_id}.json"

    def staging(self, job_id: str) -> Path:
        """The folder a job's files are staged in."""
        return self.folder / job_id

    def _save(self, job: Job) -> None:
        # Replaced whole: a server killed while writing leaves the last record.
        path = self._record_path(job.id)
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(job.record(), fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            # A full disk (ENOSPC at the write or the fsync) must leave no partial record
            # behind in the jobs folder.
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise

    def _load(self) -> None:
        """The jobs of an earlier run of the server: those it left unfinished are queued
        again, or failed when what they staged is gone."""
        records = []
        for path in self.folder.glob("*.json"):
            try:
                records.append(Job.from_record(json.loads(path.read_text(encoding="utf-8"))))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("ingest job record %s cannot be read (%s); left alone", path, exc)
        for job in sorted(records, key=lambda j: (j.order, j.id)):
            self._jobs[job.id] = job
            if job.state in FINISHED:
                continue
            staged = self.staging(job.id)
            if all((staged / name).is_file() for name in job.staged.values()):
                job.state = "queued"
                job.notes.append("the server stopped before this job ended; it runs again")
                self._save(job)
                self._queue.put(job.id)
            else:
                self._finish(
                    job,
                    error="the server stopped during this job and its files are "
                    "gone; nothing of it was applied: upload them again",
                )

    # ------------------------------------------------------------------ submitting
    def new_id(self) -> str:
        return f"j-{datetime.now(UTC):%Y%m%d%H%M%S}-{secrets.token_hex(4)}"

    def submit(self, job: Job) -> Job:
        """Queue ``job`` (its files staged in ``staging(job.id)`` already); PathBusy when a
        job still to end changes one of its paths (checked and queued at once: of two
        requests for a path at the same moment, one is refused)."""
        with self._lock:
            busy = sorted(self.busy_paths() & set(job.paths))
            if busy:
                raise PathBusy(busy[0])
            # Saved first: a record that cannot be written (a full disk) refuses the job
            # whole, never leaving it listed, queued and holding its paths in memory only.
            self._save(job)
            self._jobs[job.id] = job
        self._queue.put(job.id)
        return job

    def busy_paths(self) -> set[str]:
        """The paths a job still to end will change."""
        with self._lock:
            return {p for j in self._jobs.values() if j.state not in FINISHED for p in j.paths}

    def pending_content(self) -> dict[str, tuple[str, list[str]]]:
        """The sha256 of each file a job still to end will add, with its path and groups."""
        with self._lock:
            return {
                digest: (path, j.groups.get(path, []))
                for j in self._jobs.values()
                if j.state not in FINISHED
                for path, digest in j.digests.items()
            }

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def listed(self, by: str | None) -> list[Job]:
        """Jobs newest first: ``by``'s, or everyone's (None)."""
        with self._lock:
            jobs = [j for j in self._jobs.values() if by is None or j.by == by]
        return sorted(jobs, key=lambda j: (j.order, j.id), reverse=True)

    # ------------------------------------------------------------------ running
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._work, name="ragchains-ingest-jobs", daemon=True
            )
            self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Stop taking jobs; one running goes on in its thread (a daemon: a server stopping
        does not wait for it, and the next start runs it again)."""
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    def _work(self) -> None:
        while True:
            job_id = self._queue.get()
            if job_id is None:
                return
            job = self.get(job_id)
            if job is None or job.state in FINISHED:
                continue
            try:
                self._execute(job)
            except Exception:  # never the worker's end: the next job must still run
                log.exception("ingest job %s failed", job.id)
                self._finish(job, error="the job failed inside the server; see its log")

    def _changed(self, job: Job) -> None:
        with self._lock:
            job.version += 1

    def _execute(self, job: Job) -> None:
        with self._lock:
            job.state, job.started_at = "running", _now()
            job.progress = IngestProgress(on_change=lambda: self._changed(job))
            job.version += 1
            self._save(job)
        staged = self.staging(job.id)
        edit = CollectionEdit(
            files={path: staged / name for path, name in job.staged.items()},
            groups={path: tuple(groups) for path, groups in job.groups.items()},
            removes=frozenset(job.removes),
            read_again=frozenset(job.read_again),
            by=job.by,
        )
        report = IngestReport(index="", progress=job.progress)
        try:
            for attempt in Retrying(
                retry=retry_if_exception(_busy),
                wait=wait_exponential(multiplier=0.5, max=10),
                stop=stop_after_delay(BUSY_WAIT_SECONDS),
                reraise=True,
            ):
                with attempt:  # each try a report of its own: a busy one read nothing
                    report = self._run(edit, IngestReport(index="", progress=job.progress))
        except IngestError as exc:  # NothingIngestedError included: the reason is the job's
            self._finish(job, error=str(exc), report=report)
            return
        if report.wrote:
            self._committed()
        self._finish(job, report=report)

    def _finish(
        self, job: Job, *, error: str | None = None, report: IngestReport | None = None
    ) -> None:
        # Told outside the lock (whoever follows the job takes it).
        if error is None:
            job.progress.done()
        else:
            job.progress.stopped()
        with self._lock:
            job.state = "failed" if error is not None else "done"
            job.error = error
            job.finished_at = _now()
            if report is not None:
                job.result = job_result(report)
            job.version += 1
            self._save(job)
            self._forget_old()
        shutil.rmtree(self.staging(job.id), ignore_errors=True)

    def _forget_old(self) -> None:
        finished = sorted(
            (j for j in self._jobs.values() if j.state in FINISHED),
            key=lambda j: (j.order, j.id),
        )
        for job in finished[: max(0, len(finished) - KEPT_JOBS)]:
            del self._jobs[job.id]
            with contextlib.suppress(OSError):
                self._record_path(job.id).unlink()


def staged_name(index: int, path: str) -> str:
    """The name a job's ``index``-th file is staged under: its number and its suffix (the
    loaders go by the suffix; the document's name is its path, kept in the job)."""
    return f"{index:04d}{Path(path).suffix.lower()}"
