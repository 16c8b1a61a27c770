"""Which access rules a run applies and records: ``--access`` checked against the files found,
the last run's rules kept when none are given, and a note for files this run opens up."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ragchains.ingest.discovery import Discovered
from ragchains.ingest.errors import IngestError
from ragchains.ingest.report import IngestReport
from ragchains.retrievers.access import AccessRule, groups_for
from ragchains.retrievers.indexformat import FileRecord


def check_rules_match(rules: Sequence[AccessRule], found: Discovered) -> None:
    """A rule that matches no file is a mistake (a wrong prefix leaves files public)."""
    for rule in rules:
        if not any(groups_for(source, [rule]) for source in found.files):
            example = next(iter(sorted(found.files)), "")
            raise IngestError(
                f"--access {rule.pattern!r} matches no file: files are named from the input "
                f"folder's name, e.g. {example!r}"
            )


def rules_for_run(
    access: Sequence[AccessRule] | None, kept: Sequence[Mapping[str, Any]], report: IngestReport
) -> list[AccessRule]:
    """This run's ``--access`` rules; None: the last run's (``kept``, as recorded) stand, so a
    plain re-run never opens files up; the report says so."""
    if access is not None:
        return list(access)
    rules = recorded_rules(kept)
    if rules:
        report.notes.append(
            "access rules of the last run kept: "
            + "; ".join(f"{r.pattern}={','.join(r.groups)}" for r in rules)
            + " (--access-clear drops them)"
        )
    return rules


def recorded_rules(kept: Sequence[Mapping[str, Any]]) -> list[AccessRule]:
    """Rules as an index manifest or a store's meta keeps them, read back."""
    return [AccessRule(r["pattern"], tuple(r["groups"])) for r in kept]


def rules_as_recorded(rules: Sequence[AccessRule]) -> list[dict[str, Any]]:
    """Rules as an index manifest or a store's meta keeps them."""
    return [{"pattern": r.pattern, "groups": list(r.groups)} for r in rules]


def note_opened(
    records: Mapping[str, FileRecord], old_files: Mapping[str, FileRecord], report: IngestReport
) -> None:
    """Name the files this run makes readable by everyone that had groups before
    (``records``: this run's file records)."""
    opened = sorted(
        s for s, r in records.items() if not r.access and old_files.get(s) and old_files[s].access
    )
    if opened:
        report.notes.append(
            f"{len(opened)} file(s) that had access groups are now readable by everyone: "
            + ", ".join(opened[:5])
        )
