"""What an ingest run did: the files it added, updated, removed, kept or skipped, and why."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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
    partial: list[Skipped] = field(default_factory=list)  # read, but something left out
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
            "partly_read": [{"source": s.source, "reason": s.reason} for s in self.partial],
            "notes": self.notes,
        }
