"""What an ingest run did: the files it added, updated, removed, kept or skipped, and why."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ragchains.ingest.progress import IngestProgress

# The ingest log of an index folder (beside CURRENT): the runs so far, for a server's
# /metrics (the server runs in another process than `ragchains ingest`). A store keeps the
# same record in its meta table, under "ingests".
INGEST_LOG = "ingests.json"


@dataclass
class Skipped:
    source: str
    reason: str
    # Who could read it had it been read (None: not known, it was passed over before the
    # access rules applied); the documents API lists it to them only.
    groups: tuple[str, ...] | None = None


@dataclass
class IngestReport:
    index: Path | str  # an index folder, or a store's URL without its password
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    kept_previous: list[str] = field(default_factory=list)  # skipped now, old version kept
    partial: list[Skipped] = field(default_factory=list)  # read, but something left out
    relabelled: list[str] = field(default_factory=list)  # unchanged, but new access groups
    chunks_total: int = 0
    chunks_embedded: int = 0
    wrote: bool = False
    notes: list[str] = field(default_factory=list)
    edit: bool = False  # an edit of some documents (ingest.edits), not a run over inputs
    unlisted: list[str] = field(default_factory=list)  # what an edit removes, read or not
    # Where the run tells how far it has got, for whoever watches it (a documents-API job).
    progress: IngestProgress = field(default_factory=IngestProgress, repr=False, compare=False)

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
            "partly_read": [{"source": s.source, "reason": s.reason} for s in self.partial],
            "notes": self.notes,
        }


def logged(previous: Mapping[str, Any], report: IngestReport) -> dict[str, Any]:
    """The ingest log ``previous`` with ``report``'s run added: the runs and skipped files
    so far (counters: they only grow), the last run's counts, and each file that is skipped
    now with its reason (``SKIPPED``, which the documents API lists)."""
    return {
        "runs": int(previous.get("runs") or 0) + 1,
        "skipped_files": int(previous.get("skipped_files") or 0) + len(report.skipped),
        "last": {
            "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
            **report.counts(),
            "wrote": report.wrote,
        },
        SKIPPED: skipped_now(previous.get(SKIPPED) or {}, report),
    }


# The ingest log's record of the files skipped when last tried: source -> reason and when.
SKIPPED = "skipped_sources"


def skipped_now(previous: Mapping[str, Any], report: IngestReport) -> dict[str, Any]:
    """Which files are skipped after ``report``'s run: a run over inputs tried every one of
    them (those it skipped are all there are); an edit tried its own, and a file it read or
    removed is no longer skipped."""
    settled = {*report.added, *report.updated, *report.unchanged, *report.removed}
    settled |= set(report.unlisted)
    kept = (
        {s: v for s, v in previous.items() if s not in settled and isinstance(v, dict)}
        if report.edit
        else {}
    )
    at = datetime.now(UTC).isoformat(timespec="seconds")
    now = {
        s.source: {
            "reason": s.reason,
            "at": at,
            "groups": None if s.groups is None else list(s.groups),
        }
        for s in report.skipped
    }
    return {**kept, **now}


def read_ingest_log(index_dir: str | Path) -> dict[str, Any]:
    """An index folder's ingest log; {} before its first logged run."""
    try:
        recorded = json.loads((Path(index_dir) / INGEST_LOG).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    return recorded if isinstance(recorded, dict) else {}


def log_ingest(index_dir: str | Path, report: IngestReport) -> None:
    """Add ``report``'s run to the folder's ingest log (under the writer's lock: one run at
    a time). Replaced whole, so a server reading it never sees half of it."""
    path = Path(index_dir) / INGEST_LOG
    try:
        previous = read_ingest_log(index_dir)
    except ValueError:  # damaged: the counts start over (Prometheus reads it as a reset)
        previous = {}
    tmp = path.with_name(f".{INGEST_LOG}.tmp")
    tmp.write_text(json.dumps(logged(previous, report), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
