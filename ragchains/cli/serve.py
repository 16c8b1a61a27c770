"""``ragchains serve``: every chain over HTTP."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from ragchains.cli.common import DOMAINS_OPTION, fail, index_option, load_settings, target_of
from ragchains.retrievers.storeurl import shown


@click.command("serve")
@DOMAINS_OPTION
@index_option("Index folder built by `ingest` (default: RAGCHAINS_STORE, RAGCHAINS_INDEX).")
@click.option("--host", help="Address to listen on (default: RAGCHAINS_HOST or 127.0.0.1).")
@click.option(
    "--port", type=click.IntRange(1, 65535), help="Port (default: RAGCHAINS_PORT or 8000)."
)
@click.pass_context
def serve_command(
    ctx: click.Context, index: Path | str | None, host: str | None, port: int | None
) -> None:
    """Serve every chain over HTTP until Ctrl-C.

    The chat page at / (open it in a browser); LangServe routes /chat, /ask, /rewrite and
    /retrieve (invoke, batch, stream, playground); OpenAI-compatible /v1/chat/completions and
    /v1/models (one model per prompt domain); POST /feedback (votes kept in feedback.sqlite in
    the index folder, or RAGCHAINS_FEEDBACK_DB); MCP tools for assistants and IDEs at /mcp;
    Prometheus metrics at /metrics; /healthz and /readyz. With --domains DIR (or
    RAGCHAINS_DOMAINS), your own domains are served instead of the shipped examples, and
    edits to the folder are served as they are saved. Set RAGCHAINS_API_KEY (or
    RAGCHAINS_KEYS_FILE) to require a key on every route but the health checks and the page's
    files, RAGCHAINS_CORS_ORIGINS to allow browsers from other origins, and
    OTEL_EXPORTER_OTLP_ENDPOINT to export traces over OTLP/HTTP. A connection whose request
    line and headers take longer than RAGCHAINS_HEADER_TIMEOUT seconds (default 10) is
    closed; a body, longer than RAGCHAINS_BODY_TIMEOUT (default 30), gets 408.
    """
    import socket
    import threading
    import time

    import uvicorn

    from ragchains.server import KEEP_ALIVE_SECONDS, create_app
    from ragchains.serving.connections import header_timeout_protocol
    from ragchains.serving.keys import KeyRing, KeysFileError

    settings = load_settings()
    # What the domains folder does (a shipped domain replaced, an edit served or refused)
    # is told on the console, as the URLs are.
    logging.getLogger("ragchains.prompts").setLevel(logging.INFO)
    keyring = None
    if settings.keys_file is not None:  # before the slow loading, as the port below
        try:
            keyring = KeyRing(settings.keys_file)  # it follows the file from then on
        except KeysFileError as exc:
            fail(str(exc))
    index = target_of(index, settings)
    # The one target chosen above, whichever of the two settings named it.
    where = (
        {"store": index, "index": None}
        if isinstance(index, str)
        else {"index": index, "store": None}
    )
    updates = {**where, "host": host or settings.host, "port": port or settings.port}
    settings = settings.model_copy(update=updates)
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose protocol
    # says TCP (they inherit it from this one); without it every reply on a kept-alive
    # connection waits ~40 ms for the client's delayed ACK (Nagle).
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:  # before the slow loading: a busy port is the quickest failure
        listener.bind((settings.host, settings.port))
    except OSError as exc:
        fail(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror}")
    click.echo(f"loading models and index {shown(index)} ...", err=True)
    # The app builds its service itself, exactly as `uvicorn --factory` builds it: one path,
    # so what the tests serve is what users run (an index folder is served live).
    try:
        app = create_app(settings, keyring=keyring)
    except ValueError as exc:  # every expected failure (index, model, key, prompt files)
        fail(str(exc))
    service = app.state.service
    verbose = bool(ctx.parent and ctx.parent.params.get("verbose"))
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="info" if verbose else "warning",
            timeout_graceful_shutdown=5,
            timeout_keep_alive=KEEP_ALIVE_SECONDS,
            http=header_timeout_protocol(settings.header_timeout),
        )
    )
    shown_host = "localhost" if settings.host in ("0.0.0.0", "::", "127.0.0.1") else settings.host
    base = f"http://{shown_host}:{settings.port}"

    def announce() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started:
            click.echo(f"ragchains is serving {shown(index)} at {base}")
            click.echo(f"  chat page:   {base}/")
            click.echo(f"  playground:  {base}/chat/playground/")
            click.echo(f"  API docs:    {base}/docs")
            click.echo(f"  MCP:         {base}/mcp")
            click.echo(
                f"  OpenAI API:  {base}/v1 (models: {', '.join(sorted(service.prompts.domains))})"
            )
            if service.prompts.team is not None:
                click.echo(f"  domains:     {service.prompts.team} (edits are served live)")
            click.echo("Press Ctrl-C to stop.")

    threading.Thread(target=announce, daemon=True).start()
    try:
        server.run(sockets=[listener])
    except KeyboardInterrupt:
        # uvicorn re-raises the Ctrl-C it shut down gracefully on: a stop asked for, not an
        # abort (click would print "Aborted!" and exit 1).
        click.echo("ragchains stopped.", err=True)
