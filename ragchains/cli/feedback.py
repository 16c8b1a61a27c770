"""``ragchains feedback ...``: what readers said about the answers (thumbs up or down)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import click

from ragchains.cli.common import fail, load_settings


@click.group("feedback")
def feedback_group() -> None:
    """Readers' feedback on answers, as the server stores it (POST /feedback).

    The store is a SQLite file: RAGCHAINS_FEEDBACK_DB when set, else feedback.sqlite in the
    index folder (a re-ingest keeps it).
    """


@feedback_group.command("export")
@click.option(
    "--index",
    metavar="DIR",
    type=click.Path(path_type=Path),
    help="Index folder whose feedback to export (default: RAGCHAINS_INDEX). The store is the "
    "one `serve` writes for it: RAGCHAINS_FEEDBACK_DB when set, else INDEX/feedback.sqlite.",
)
@click.option(
    "--db",
    metavar="FILE",
    type=click.Path(path_type=Path),
    help="The feedback SQLite file itself, instead of --index (e.g. a copy from a server).",
)
@click.option(
    "--json", "fmt", flag_value="json", default=True, help="A JSON array of records (default)."
)
@click.option(
    "--csv",
    "fmt",
    flag_value="csv",
    help="CSV: a header row, then one row per record; prompts and cited_ids as JSON text.",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    help="File to write (replaced if it exists). Default: standard output.",
)
def export_command(index: Path | None, db: Path | None, fmt: str, out: Path | None) -> None:
    """Export every stored feedback record, oldest first.

    Each record has id, created_at (UTC), run_id (the answer's LangServe run), score (1 =
    thumbs up, 0 = thumbs down), comment, mode (chat or ask), domain, prompts (name ->
    domain/name@vN), question, answer and cited_ids (chunk ids). The store is only read.

    \b
    Examples:
      ragchains feedback export --index .index/samples > feedback.json
      ragchains feedback export --db feedback.sqlite --csv --out feedback.csv
    """
    from ragchains.feedback import FeedbackStore, FeedbackStoreError, feedback_path

    if index is not None and db is not None:
        fail("give --index DIR or --db FILE, not both")
    if db is None:
        settings = load_settings()
        index = index or settings.index
        if index is None and settings.feedback_db is None:
            fail("no feedback store given: pass --index DIR or --db FILE (or set RAGCHAINS_INDEX)")
        db = feedback_path(settings, index) if index is not None else settings.feedback_db
    try:
        records = FeedbackStore(db, create=False).records()
    except FeedbackStoreError as exc:
        fail(str(exc))
    text = _as_csv(records) if fmt == "csv" else json.dumps(records, indent=2, ensure_ascii=False)
    if out is None:
        click.echo(text, nl=fmt != "csv")
        return
    try:
        out.write_text(text + ("" if fmt == "csv" else "\n"), encoding="utf-8", newline="")
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror or exc}")
    click.echo(f"wrote {len(records)} feedback records to {out}", err=True)


def _as_csv(records: list[dict[str, Any]]) -> str:
    """One header row, one row per record; the nested fields as JSON text, so a spreadsheet
    keeps them in one cell and a script can still decode them."""
    from ragchains.feedback import RECORD_FIELDS

    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(RECORD_FIELDS)
    for record in records:
        writer.writerow(
            json.dumps(value, ensure_ascii=False) if isinstance(value, dict | list) else value
            for value in (record[name] for name in RECORD_FIELDS)
        )
    return buffer.getvalue()
