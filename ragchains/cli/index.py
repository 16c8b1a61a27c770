"""``ragchains index verify``: is an index folder whole?"""

from __future__ import annotations

from pathlib import Path

import click

from ragchains.cli.common import EXIT_DAMAGED, INDEX_OR_STORE, fail


@click.group("index")
def index_group() -> None:
    """Check an index folder built by `ingest`."""


@index_group.command("verify")
@click.option(
    "--index",
    "index",
    required=True,
    type=INDEX_OR_STORE,
    metavar="DIR",
    help="Index folder built by `ingest`.",
)
def verify_command(index: Path | str) -> None:
    """Check every file of the index's current generation against the sha256 checksum its
    manifest recorded when it was written, then open the parts and check that their row
    counts agree.

    Prints one line per file (ok or DAMAGED) and a summary. Exits 0 when the index is sound,
    1 when it is damaged (rebuild it with `ingest --rebuild`, or restore the folder from a
    backup), 2 when DIR is no index. Loading an index (retrieve, ask, chat, serve, ingest)
    runs the same checksum check and refuses a damaged one.

    Indexes written before checksums were recorded are checked as far as they can be: files
    present, SQLite's own check, row counts, no NaN or infinite vectors.
    """
    from ragchains.retrievers.indexformat import IndexDamagedError, IndexLoadError
    from ragchains.retrievers.indexverify import verify_index

    if isinstance(index, str):
        fail(
            "`ragchains index verify` works on an index folder; a PostgreSQL store is "
            "checked by PostgreSQL itself"
        )
    try:
        result = verify_index(index)
    except IndexDamagedError as exc:  # CURRENT or the manifest itself
        fail(str(exc), EXIT_DAMAGED)
    except IndexLoadError as exc:  # no index there, or a format this release cannot read
        fail(str(exc))
    click.echo(f"index {index}, generation {result.generation}")
    for check in result.files:
        click.echo(
            f"  DAMAGED  {check.name} {check.problem}"
            if check.problem
            else f"  ok       {check.name}"
        )
    if not result.sound:
        fail(str(result.damage), EXIT_DAMAGED)
    if result.checksummed:
        click.echo(
            f"index {index} is sound: {len(result.files)} files match their checksums, "
            f"{result.rows} rows in every part"
        )
    else:
        click.echo(
            f"index {index} looks sound, but has no checksums (an older ragchains wrote it): "
            f"its parts are present and readable, {result.rows} rows in every part, no NaN or "
            "infinite vectors. Rebuild it with `ingest --rebuild` to record checksums."
        )
