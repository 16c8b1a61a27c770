"""The `ragchains` command line."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import click
from pydantic import ValidationError

from ragchains import __version__

EXIT_NOTHING_INGESTED = 1
EXIT_FAILED = 1
EXIT_USAGE = 2


def _fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _settings() -> Any:
    from ragchains.factory import configure_runtime
    from ragchains.settings import Settings

    try:
        settings = Settings()
    except ValidationError as exc:
        problems = "; ".join(
            f"RAGCHAINS_{'_'.join(str(p) for p in err['loc']).upper()}: {err['msg']}"
            for err in exc.errors()
        )
        _fail(f"invalid settings: {problems}")
    configure_runtime(settings)
    return settings


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


@app.command("ingest")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--index",
    required=True,
    type=click.Path(path_type=Path),
    help="Index folder to create or update.",
)
@click.option(
    "--text-columns",
    metavar="COL,COL",
    help="Table columns that form each row's text (default: all). Other columns stay "
    "filterable metadata.",
)
@click.option("--rebuild", is_flag=True, help="Ignore the existing index and build it anew.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
def ingest_command(
    paths: tuple[Path, ...],
    index: Path,
    text_columns: str | None,
    rebuild: bool,
    as_json: bool,
    quiet: bool,
) -> None:
    """Build or update an index from PATHS (PDF, HTML, Markdown, text, CSV/TSV, JSON/JSONL).

    Re-runs embed only what changed and drop the chunks of files that are gone; unreadable
    files are skipped with a reason. Exits 1 when nothing at all could be ingested.
    """
    from ingest.pipeline import IngestError
    from ragchains.factory import run_ingest

    settings = _settings()
    columns = [c.strip() for c in text_columns.split(",") if c.strip()] if text_columns else None
    try:
        report = run_ingest(
            settings,
            paths,
            index,
            text_columns=columns,
            rebuild=rebuild,
            progress=not quiet and not as_json,
        )
    except IngestError as exc:
        code = EXIT_NOTHING_INGESTED if str(exc).startswith("nothing could") else EXIT_USAGE
        _fail(str(exc), code)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
        return
    for skipped in report.skipped:
        kept = " (previous version kept)" if skipped.source in report.kept_previous else ""
        click.echo(f"skipped {skipped.source}: {skipped.reason}{kept}", err=True)
    for note in report.notes:
        click.echo(f"note: {note}", err=True)
    counts = ", ".join(f"{v} {k}" for k, v in report.counts().items())
    state = "written" if report.wrote else "unchanged (nothing to write)"
    click.echo(
        f"{counts}; {report.chunks_total} chunks ({report.chunks_embedded} embedded); "
        f"index {index} {state}"
    )


def _parse_filters(filters: tuple[tuple[str, str, str], ...], fields: dict[str, str]) -> list[Any]:
    """``--filter FIELD OP VALUE`` options, typed by the index's fields and checked."""
    from retrievers.filters import OPERATORS, FilterError, parse_cli_value, validate_filters

    try:
        raw = []
        for field, op, value in filters:
            if op not in OPERATORS:
                _fail(f"unknown filter operator {op!r}; use one of {' '.join(OPERATORS)}")
            raw.append(
                {"field": field, "op": op, "value": parse_cli_value(field, op, value, fields)}
            )
        return validate_filters(raw, fields)
    except FilterError as exc:
        _fail(str(exc))


_INDEX: Callable[[Any], Any] = click.option(
    "--index",
    required=True,
    type=click.Path(path_type=Path),
    help="Index folder built by `ingest`.",
)
_FILTER = click.option(
    "--filter",
    "filters",
    nargs=3,
    multiple=True,
    metavar="FIELD OP VALUE",
    help="e.g. --filter price '<' 100, --filter filename = '*.pdf', "
    "--filter brand in Acme,Globex. OP: = != < <= > >= in. Repeat to AND them.",
)


@app.command("retrieve")
@click.argument("query")
@_INDEX
@_FILTER
@click.option("--k", type=click.IntRange(min=1), help="How many chunks to return.")
@click.option(
    "--rerank/--no-rerank",
    default=False,
    show_default=True,
    help="Rerank with the compressor and cut at its score threshold.",
)
@click.option("--json", "as_json", is_flag=True, help="Print results as JSON.")
def retrieve_command(
    query: str,
    index: Path,
    filters: tuple[tuple[str, str, str], ...],
    k: int | None,
    rerank: bool,
    as_json: bool,
) -> None:
    """Hybrid (BM25 + dense, fused by RRF) search of an index for QUERY.

    Prints the ranked chunks with their citation labels and scores.
    """
    from ragchains.factory import build_compressor, build_embedder, build_retriever, open_index
    from retrievers.index import IndexLoadError

    settings = _settings()
    if not query.strip():
        _fail("the query is empty")
    embedder = build_embedder(settings)
    try:
        search_index = open_index(index, embedder)
    except IndexLoadError as exc:
        _fail(str(exc))
    checked = _parse_filters(filters, search_index.fields)
    retriever = build_retriever(settings, search_index, embedder)
    want = k or settings.k
    docs = retriever.invoke(query, k=want if not rerank else max(want, settings.k), filters=checked)
    compressor_status = None
    if rerank:
        compressor = build_compressor(settings, embedder, search_index)
        compressor.top_n = want
        docs = list(compressor.compress_documents(docs, query))
        compressor_status = compressor.status()
    results = [
        {
            "rank": rank,
            "citation": d.metadata["citation"],
            "id": d.id,
            "source": d.metadata["source"],
            "title": d.metadata.get("title"),
            "page": d.metadata.get("page"),
            "section": d.metadata.get("section"),
            "scores": {
                key: d.metadata.get(key)
                for key in ("rrf_score", "bm25_score", "dense_score", "rerank_score")
                if d.metadata.get(key) is not None
            },
            "text": d.page_content,
        }
        for rank, d in enumerate(docs[:want], start=1)
    ]
    if as_json:
        payload: dict[str, Any] = {
            "query": query,
            "filters": [f.model_dump() for f in checked],
            "results": results,
        }
        if compressor_status is not None:
            payload["compressor"] = compressor_status
        click.echo(json.dumps(payload, indent=2, ensure_ascii=False))
        return
    if compressor_status and compressor_status["fallback"]:
        click.echo(
            f"note: reranking with {compressor_status['kind']} ({compressor_status['model']}); "
            f"cross-encoder unavailable: {compressor_status['fallback_reason']}",
            err=True,
        )
    if not results:
        click.echo("no matching chunks")
        return
    width = int(os.environ.get("COLUMNS", "100"))
    for r in results:
        scores = "  ".join(f"{k.removesuffix('_score')}={v:.4f}" for k, v in r["scores"].items())
        click.echo(f"{r['rank']:>2}. [{r['citation']}]  {scores}")
        snippet = " ".join(r["text"].split())
        limit = max(40, width - 6)
        click.echo(f"    {snippet[:limit]}{'…' if len(snippet) > limit else ''}")


def _parse_prompt_versions(values: tuple[str, ...]) -> int | str | dict[str, str] | None:
    """``--prompt-version 2`` for every prompt, or ``--prompt-version rewrite=2`` per prompt."""
    if not values:
        return None
    mapping: dict[str, str] = {}
    for value in values:
        name, sep, version = value.partition("=")
        if not sep:
            if len(values) > 1:
                _fail("give one --prompt-version N, or NAME=N for each prompt")
            return value
        mapping[name.strip()] = version.strip()
    return mapping


def _checked_prompts(configurable: dict[str, Any], mode: str) -> Any:
    """The prompt files, with the request's domain and versions checked for ``mode``."""
    from chains.graph import REQUIRED_PROMPTS, check_configurable
    from prompts.registry import PromptRegistry

    try:
        prompts = PromptRegistry(required=REQUIRED_PROMPTS)
        check_configurable(prompts, configurable, mode)  # before the slow model loading
    except ValueError as exc:
        _fail(str(exc))
    return prompts


def _load_service(settings: Any, index: Path, configurable: dict[str, Any], mode: str) -> Any:
    """Models, index and graphs, with every problem reported as one line before any work."""
    from ragchains.factory import build_service

    prompts = _checked_prompts(configurable, mode)
    # Every expected failure (index, model, key) is a ValueError subclass with a message
    # made for the user.
    try:
        return build_service(settings, index, prompts=prompts)
    except ValueError as exc:
        _fail(str(exc))


def _one_line(exc: Exception) -> str:
    """What the user is told when a turn fails: the model's failure, or the input's fault."""
    from ragchains.llms import explain_failure

    failure = explain_failure(exc)
    if failure is not None:
        return failure.message
    if isinstance(exc, ValueError):
        return str(exc)
    raise exc  # a bug: the traceback is the useful report


@contextlib.contextmanager
def _model_failures_as_errors() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        _fail(_one_line(exc), EXIT_FAILED)


def _print_turn(events: Any, *, show_query: bool) -> str:
    """Stream one turn: the answer as it is written, then what it cites."""
    out: dict[str, Any] = {}
    for event in events:
        if "answer" in event:
            click.echo(event["answer"], nl=False)
        for key, value in event.items():
            out[key] = out.get(key, "") + value if key == "answer" else value
    click.echo()
    if show_query:
        filters = " ".join(f"{f['field']}{f['op']}{f['value']!r}" for f in out.get("filters", []))
        searched = out.get("search_query", "")
        click.echo(f"  searched: {searched}" + (f"  filters: {filters}" if filters else ""))
    for n, cite in enumerate(out.get("citations", []), start=1):
        page = f", page {cite['page']}" if cite.get("page") else ""
        click.echo(f"  [{n}] {cite['label']}  ({cite['source']}{page})")
    if out.get("abstained") and out.get("sources") == []:
        click.echo("  (no chunk passed the relevance threshold; the model was not asked)")
    return str(out.get("answer", ""))


_DOMAIN: Callable[[Any], Any] = click.option(
    "--domain", help="Prompt domain (e.g. hr, catalog); default: the 'default' domain."
)
_PROMPT_VERSION: Callable[[Any], Any] = click.option(
    "--prompt-version",
    "prompt_versions",
    multiple=True,
    metavar="N|NAME=N",
    help="Prompt version: N for every prompt, or NAME=N (e.g. rewrite=2), repeatable. "
    "Default: the latest.",
)
_K = click.option("--k", type=click.IntRange(1, 200), help="Chunks retrieved before reranking.")


def _configurable(domain: str | None, versions: tuple[str, ...], k: int | None) -> dict[str, Any]:
    chosen: dict[str, Any] = {"domain": domain, "prompt_version": _parse_prompt_versions(versions)}
    chosen["k"] = k
    return {key: value for key, value in chosen.items() if value is not None}


@app.command("ask")
@click.argument("question")
@_INDEX
@_DOMAIN
@_PROMPT_VERSION
@_K
@_FILTER
@click.option("--json", "as_json", is_flag=True, help="Print the whole answer object as JSON.")
def ask_command(
    question: str,
    index: Path,
    domain: str | None,
    prompt_versions: tuple[str, ...],
    k: int | None,
    filters: tuple[tuple[str, str, str], ...],
    as_json: bool,
) -> None:
    """Answer QUESTION from the index, citing the chunks used (single turn, no rewrite).

    Runs on the configured chat model: by default the embedded SmolLM2, offline.
    """
    if not question.strip():
        _fail("the question is empty")
    settings = _settings()
    configurable = _configurable(domain, prompt_versions, k)
    service = _load_service(settings, index, configurable, "ask")
    checked = _parse_filters(filters, service.index.fields)
    request = {"question": question, "filters": checked}
    config = {"configurable": configurable}
    with _model_failures_as_errors():
        if as_json:
            result = service.graphs.ask.invoke(request, config)
            click.echo(json.dumps(result, indent=2, ensure_ascii=False, default=str))
            return
        _print_turn(service.graphs.ask.stream(request, config), show_query=False)


@app.command("chat")
@_INDEX
@_DOMAIN
@_PROMPT_VERSION
@_K
def chat_command(
    index: Path, domain: str | None, prompt_versions: tuple[str, ...], k: int | None
) -> None:
    """Chat with the index: follow-up questions are rewritten with the conversation so far.

    Type a question and press Enter. /reset forgets the conversation; /quit, or Ctrl-D, ends.
    Reads questions from standard input line by line when it is not a terminal.
    """
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

    settings = _settings()
    configurable = _configurable(domain, prompt_versions, k)
    service = _load_service(settings, index, configurable, "chat")
    interactive = sys.stdin.isatty()
    if interactive:
        click.echo("Ask a question (/reset to start over, /quit to leave).")
    history: list[BaseMessage] = []
    while True:
        if interactive:
            click.echo("> ", nl=False)
        line = sys.stdin.readline()
        if not line:
            break
        question = line.strip()
        if not question:
            continue
        if question in ("/quit", "/exit"):
            break
        if question == "/reset":
            history = []
            click.echo("(conversation cleared)")
            continue
        try:
            events = service.graphs.chat.stream(
                {"question": question, "chat_history": history}, {"configurable": configurable}
            )
            answer = _print_turn(events, show_query=True)
        except Exception as exc:  # a bad option or a model failure; the session goes on
            click.echo(f"\nerror: {_one_line(exc)}", err=True)
            continue
        history += [HumanMessage(question), AIMessage(answer)]


def run() -> None:
    """Console entry point: no stack trace reaches the user."""
    try:
        app(standalone_mode=True)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # last resort: one line, non-zero exit
        if os.environ.get("RAGCHAINS_DEBUG"):
            raise
        click.echo(f"error: unexpected {type(exc).__name__}: {exc}", err=True)
        sys.exit(70)


@app.command("serve")
@click.option(
    "--index",
    type=click.Path(path_type=Path),
    help="Index folder built by `ingest` (default: RAGCHAINS_INDEX).",
)
@click.option("--host", help="Address to listen on (default: RAGCHAINS_HOST or 127.0.0.1).")
@click.option(
    "--port", type=click.IntRange(1, 65535), help="Port (default: RAGCHAINS_PORT or 8000)."
)
@click.pass_context
def serve_command(
    ctx: click.Context, index: Path | None, host: str | None, port: int | None
) -> None:
    """Serve every chain over HTTP until Ctrl-C.

    LangServe routes /chat, /ask, /rewrite and /retrieve (invoke, batch, stream, playground),
    OpenAI-compatible /v1/chat/completions and /v1/models (one model per prompt domain),
    /healthz and /readyz. Set RAGCHAINS_API_KEY to require a key on every route but the
    health checks, RAGCHAINS_CORS_ORIGINS to allow browsers from other origins.
    """
    import socket
    import threading
    import time

    import uvicorn

    from server import create_app

    settings = _settings()
    index = index or settings.index
    if index is None:
        _fail("no index to serve: give --index DIR (or set RAGCHAINS_INDEX)")
    updates = {"index": index, "host": host or settings.host, "port": port or settings.port}
    settings = settings.model_copy(update=updates)
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:  # before the slow loading: a busy port is the quickest failure
        listener.bind((settings.host, settings.port))
    except OSError as exc:
        _fail(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror}")
    click.echo(f"loading models and index {index} ...", err=True)
    service = _load_service(settings, index, {}, "chat")
    verbose = bool(ctx.parent and ctx.parent.params.get("verbose"))
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings, service=service),
            log_level="info" if verbose else "warning",
            timeout_graceful_shutdown=5,
        )
    )
    shown_host = "localhost" if settings.host in ("0.0.0.0", "::", "127.0.0.1") else settings.host
    base = f"http://{shown_host}:{settings.port}"

    def announce() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started:
            click.echo(f"ragchains is serving {index} at {base}")
            click.echo(f"  playground:  {base}/chat/playground/")
            click.echo(f"  API docs:    {base}/docs")
            click.echo(
                f"  OpenAI API:  {base}/v1 (models: {', '.join(sorted(service.prompts.domains))})"
            )
            click.echo("Press Ctrl-C to stop.")

    threading.Thread(target=announce, daemon=True).start()
    server.run(sockets=[listener])


# The eval group lives in its own module; imported last, as it uses the helpers above.
from evaluation.cli import eval_group  # noqa: E402

app.add_command(eval_group)
