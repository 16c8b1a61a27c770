"""An edit of some documents of a collection, as the documents API makes them: files added or
replaced (each under the source name it is given, with the groups it is given), files read
again, files removed; every other file kept as it is. ``ingest`` and ``ingest_to_store`` run
an edit through the same pipeline as a run over input folders: the same parsing, chunking,
embedding and atomic write, and the same report."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ragchains.ingest.changes import RunPlan
from ragchains.ingest.discovery import Discovered


@dataclass(frozen=True)
class CollectionEdit:
    """``files``: source name -> the file to read as it (a staged upload, or a kept original
    to read again); ``groups``: who may read each of them (() = everyone); ``removes``: the
    sources to take out; ``read_again``: sources of ``files`` read even if their bytes are
    unchanged; ``by``: who made the edit (recorded on each file it reads)."""

    files: Mapping[str, Path] = field(default_factory=dict)
    groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    removes: frozenset[str] = frozenset()
    read_again: frozenset[str] = frozenset()
    by: str | None = None

    def found(self) -> Discovered:
        """The edit's files as a run's inputs."""
        return Discovered(files=dict(self.files))

    def plan(self) -> RunPlan:
        return RunPlan(
            removes=self.removes,
            read_again=self.read_again,
            groups=dict(self.groups),
            uploaded_by=self.by,
        )
