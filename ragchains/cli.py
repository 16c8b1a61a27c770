"""The `ragchains` command line."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import click
from pydantic import ValidationError

from ragchains import __version__

EXIT_NOTHING_INGESTED = 1
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


@app.command("retrieve")
@click.argument("query")
@click.option(
    "--index",
    required=True,
    type=click.Path(path_type=Path),
    help="Index folder built by `ingest`.",
)
@click.option(
    "--filter",
    "filters",
    nargs=3,
    multiple=True,
    metavar="FIELD OP VALUE",
    help="e.g. --filter price '<' 100, --filter filename = '*.pdf', "
    "--filter brand in Acme,Globex. OP: = != < <= > >= in. Repeat to AND them.",
)
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
    from retrievers.filters import OPERATORS, FilterError, parse_cli_value, validate_filters
    from retrievers.index import IndexLoadError

    settings = _settings()
    if not query.strip():
        _fail("the query is empty")
    embedder = build_embedder(settings)
    try:
        search_index = open_index(index, embedder)
    except IndexLoadError as exc:
        _fail(str(exc))
    try:
        raw_filters = []
        for field, op, raw in filters or []:
            if op not in OPERATORS:
                _fail(f"unknown filter operator {op!r}; use one of {' '.join(OPERATORS)}")
            value = parse_cli_value(field, op, raw, search_index.fields)
            raw_filters.append({"field": field, "op": op, "value": value})
        checked = validate_filters(raw_filters, search_index.fields)
    except FilterError as exc:
        _fail(str(exc))
    retriever = build_retriever(settings, search_index, embedder)
    want = k or settings.k
    docs = retriever.invoke(query, k=want if not rerank else max(want, settings.k), filters=checked)
    compressor_status = None
    if rerank:
        compressor = build_compressor(settings, embedder)
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
