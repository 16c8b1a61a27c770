"""The `ragchains` command line: the group, the console entry point and its commands.

One module per command group (ingest, query, serve, mcp, domains, eval, feedback, index, keys), each
importing only ``ragchains.cli.common``; this module imports them to register their commands.
"""

from __future__ import annotations

import logging
import os
import sys

import click

from ragchains import __version__
from ragchains.cli.common import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE
from ragchains.cli.domains import domains_group
from ragchains.cli.eval import eval_group
from ragchains.cli.feedback import feedback_group
from ragchains.cli.index import index_group
from ragchains.cli.ingest import ingest_command
from ragchains.cli.keys import keys_group
from ragchains.cli.mcp import mcp_command
from ragchains.cli.query import ask_command, chat_command, retrieve_command
from ragchains.cli.serve import serve_command

__all__ = ["app", "run"]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="ragchains")
@click.option("-v", "--verbose", is_flag=True, help="Log more detail.")
def app(verbose: bool) -> None:
    """Grounded, cited answers over your own documents.

    Runs offline on the embedded default models. Settings come from RAGCHAINS_* environment
    variables or a .env file (e.g. RAGCHAINS_CHUNK_SIZE=200, RAGCHAINS_K=10).
    """
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


for _command in (
    ingest_command,
    retrieve_command,
    ask_command,
    chat_command,
    serve_command,
    mcp_command,
    domains_group,
    eval_group,
    feedback_group,
    index_group,
    keys_group,
):
    app.add_command(_command)


def run() -> None:
    """Console entry point: no stack trace reaches the user."""
    try:
        app(standalone_mode=True)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:  # last resort: one line, non-zero exit
        if os.environ.get("RAGCHAINS_DEBUG"):
            raise
        # Imported here: `ragchains --help` should not wait for FAISS.
        from ragchains.retrievers.indexformat import IndexLoadError, IndexWriteError

        # An index found damaged in the middle of a command (a chunk store page read late,
        # a full disk while writing): the message names the file and says what to do.
        if isinstance(exc, IndexLoadError | IndexWriteError):
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_USAGE)
        click.echo(f"error: unexpected {type(exc).__name__}: {exc}", err=True)
        sys.exit(EXIT_INTERNAL)
