"""``ragchains ingest``: build or update an index."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ragchains.cli.common import EXIT_NOTHING_INGESTED, fail, index_option, load_settings
from ragchains.retrievers.formats import formats_described
from ragchains.retrievers.storeurl import is_store_url, shown

if TYPE_CHECKING:
    from ragchains.ingest.report import IngestReport

# The formats come from their table (retrievers.formats), as ingest reads them.
_HELP = f"""Build or update an index folder (or a PostgreSQL store, --store URL) from PATHS.

Reads {formats_described()}. Scanned PDF pages and images are read by OCR; files of other
types are skipped with the reason.

Re-runs embed only what changed and drop the chunks of files that are gone; unreadable files
are skipped with a reason (a version read before stays indexed), and what was left out of a
file still read (rows over the cap, hidden sheets, a page whose OCR timed out) is reported.
Each file is parsed in a worker process of its own, under a memory and a time budget the
operating system enforces: a file over one is skipped with the reason, and the rest of the
run goes on. Exits 1 when nothing at all could be ingested.
"""


@click.command("ingest", help=_HELP)
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@index_option("Index folder to create or update.", required=True)
@click.option(
    "--text-columns",
    metavar="COL,COL",
    help="Table columns that form each row's text (default: all). Other columns stay "
    "filterable metadata.",
)
@click.option(
    "--word-notes",
    is_flag=True,
    help="Also read the footnotes and comments of Word files (left out by default: review "
    "remarks are rarely meant as answers).",
)
@click.option("--rebuild", is_flag=True, help="Ignore the existing index and build it anew.")
@click.option(
    "--access",
    "access_rules",
    multiple=True,
    metavar="GLOB=GROUP[,GROUP]",
    help="Only callers in these groups may read the files whose source name matches GLOB "
    "(e.g. 'docs/hr/*=hr,managers'; repeatable, the first match wins, before each input "
    "folder's .ragchains-access.toml). Files no rule matches are readable by everyone. Keys "
    "get groups with `ragchains keys add`.",
)
@click.option(
    "--access-clear",
    is_flag=True,
    help="Drop the --access rules earlier runs gave (a run without --access keeps them).",
)
@click.option(
    "--no-originals",
    is_flag=True,
    help="Keep no copy of the files' bytes, and delete the copies earlier runs kept. By "
    "default each file's bytes are kept once, by their sha256 (INDEX/files/, or the store's "
    "originals table), so a citation opens the original (GET /files/{id}, the chat page's "
    "viewer); without them those answer 404. Holds for this run: a later run without it "
    "keeps them again.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=0, max=256),
    help="Files parsed at once, each in a process of its own (default: one per core, or "
    "RAGCHAINS_INGEST_WORKERS).",
)
@click.option(
    "--file-memory",
    metavar="MB",
    type=click.IntRange(min=512),
    help="Memory one file may take while it is parsed; a file over it is skipped with the "
    "reason and the run goes on (default 1024, or RAGCHAINS_INGEST_FILE_MEMORY_MB).",
)
@click.option(
    "--file-timeout",
    metavar="SECONDS",
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds one file may take to parse, OCR included; a file over it is skipped with "
    "the reason (default 120, or RAGCHAINS_INGEST_FILE_TIMEOUT).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
def ingest_command(
    paths: tuple[Path, ...],
    index: Path | str,
    text_columns: str | None,
    word_notes: bool,
    rebuild: bool,
    access_rules: tuple[str, ...],
    access_clear: bool,
    no_originals: bool,
    workers: int | None,
    file_memory: int | None,
    file_timeout: float | None,
    as_json: bool,
    quiet: bool,
) -> None:
    """Build or update an index from PATHS (the command's help: ``_HELP``)."""
    from ragchains.factory import run_ingest
    from ragchains.ingest.errors import IngestError, NothingIngestedError
    from ragchains.observability.tracing import command_span
    from ragchains.retrievers.access import AccessRule, AccessRuleError

    settings = load_settings()
    budget = {
        "ingest_workers": workers,
        "ingest_file_memory_mb": file_memory,
        "ingest_file_timeout": file_timeout,
    }
    settings = settings.model_copy(update={k: v for k, v in budget.items() if v is not None})
    columns = [c.strip() for c in text_columns.split(",") if c.strip()] if text_columns else None
    try:
        rules = [AccessRule.parse(rule) for rule in access_rules]
    except AccessRuleError as exc:
        fail(str(exc))
    if access_clear and rules:
        fail("give --access rules or --access-clear, not both")
    try:
        # Traced when the OTEL_* variables say where to (its stages are the span's children).
        with command_span("ingest") as span:
            report = run_ingest(
                settings,
                paths,
                index,
                text_columns=columns,
                include_notes=word_notes,
                rebuild=rebuild,
                progress=not quiet and not as_json,
                access=rules if rules or access_clear else None,
                originals=not no_originals,
            )
            if span.is_recording():
                span.set_attributes(_traced(report, index))
    except NothingIngestedError as exc:
        fail(str(exc), EXIT_NOTHING_INGESTED)
    except IngestError as exc:
        fail(str(exc))
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
        return
    for skipped in report.skipped:
        kept = " (previous version kept)" if skipped.source in report.kept_previous else ""
        click.echo(f"skipped {skipped.source}: {skipped.reason}{kept}", err=True)
    for partial in report.partial:
        click.echo(f"partly read {partial.source}: {partial.reason}", err=True)
    for note in report.notes:
        click.echo(f"note: {note}", err=True)
    counts = ", ".join(f"{v} {k}" for k, v in report.counts().items())
    state = "written" if report.wrote else "unchanged (nothing to write)"
    click.echo(
        f"{counts}; {report.chunks_total} chunks ({report.chunks_embedded} embedded); "
        f"index {shown(index)} {state}"
    )


def _traced(report: IngestReport, index: Path | str) -> dict[str, Any]:
    """The run's counts for its trace (never a path, nor a store's URL)."""
    from ragchains.retrievers.indexformat import IndexLoadError, current_generation

    attributes: dict[str, Any] = {
        "ragchains.files.ingested": len(report.added) + len(report.updated),
        "ragchains.files.unchanged": len(report.unchanged),
        "ragchains.files.removed": len(report.removed),
        "ragchains.files.skipped": len(report.skipped),
        "ragchains.chunks": report.chunks_total,
        "ragchains.chunks.embedded": report.chunks_embedded,
        "ragchains.index.wrote": report.wrote,
    }
    if not is_store_url(str(index)):
        with contextlib.suppress(IndexLoadError):  # no generation to name
            attributes["ragchains.index.generation"] = current_generation(index).name
    return attributes
