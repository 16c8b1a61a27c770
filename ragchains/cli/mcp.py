"""``ragchains mcp``: the search and ask tools for MCP clients over stdio."""

from __future__ import annotations

from pathlib import Path

import click

from ragchains.cli.common import (
    DOMAINS_OPTION,
    index_option,
    load_settings,
    serve_mcp_stdio,
    target_of,
)


@click.command("mcp")
@DOMAINS_OPTION
@index_option("Index folder built by `ingest` (default: RAGCHAINS_STORE, RAGCHAINS_INDEX).")
def mcp_command(index: Path | str | None) -> None:
    """Serve the MCP tools over stdio, for a desktop assistant or an IDE that starts it.

    Tools: search (chunks with their citation label, source, location and score), ask (a
    cited answer, or abstained), list_domains and list_fields. The client starts this
    command and talks to it on stdin and stdout; logs go to stderr. It reads every
    document, as `ragchains ask` does. To share one server with keys and per-user access,
    point the client at `ragchains serve`'s http://HOST:PORT/mcp instead (see the README).
    """
    settings = load_settings()
    serve_mcp_stdio(settings, target_of(index, settings))
