"""``ragchains retrieve``, ``ask`` and ``chat``: searching and questioning an index."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from ragchains.cli.common import (
    DOMAIN_OPTION,
    DOMAINS_OPTION,
    FILTER_OPTION,
    INDEX_OPTION,
    K_OPTION,
    PROMPT_VERSION_OPTION,
    build_configurable,
    fail,
    load_service,
    load_settings,
    model_failures_as_errors,
    one_line,
    parse_filters,
    print_turn,
    service_chain,
)


@click.command("retrieve")
@click.argument("query")
@INDEX_OPTION
@FILTER_OPTION
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
    """Hybrid search of an index for QUERY: BM25 and dense, fused as the index says.

    Prints the ranked chunks with their citation labels and scores.
    """
    from ragchains.factory import (
        build_compressor,
        build_embedder,
        build_retriever,
        filterable_fields,
        open_index,
    )
    from ragchains.retrievers.indexformat import IndexLoadError

    settings = load_settings()
    if not query.strip():
        fail("the query is empty")
    embedder = build_embedder(settings)
    try:
        search_index = open_index(index, embedder)
    except IndexLoadError as exc:
        fail(str(exc))
    checked = parse_filters(filters, dict(filterable_fields(search_index)))
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
                for key in (
                    "convex_score",
                    "rrf_score",
                    "bm25_score",
                    "dense_score",
                    "rerank_score",
                )
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


@click.command("ask")
@DOMAINS_OPTION
@click.argument("question")
@INDEX_OPTION
@DOMAIN_OPTION
@PROMPT_VERSION_OPTION
@K_OPTION
@FILTER_OPTION
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
        fail("the question is empty")
    settings = load_settings()
    configurable = build_configurable(domain, prompt_versions, k, "ask")
    service = load_service(settings, index, configurable, "ask")
    checked = parse_filters(filters, service.index.fields)
    graph = service_chain(service, "ask")
    request = {"question": question, "filters": checked}
    config = {"configurable": configurable}
    with model_failures_as_errors():
        if as_json:
            result = graph.invoke(request, config)
            click.echo(json.dumps(result, indent=2, ensure_ascii=False, default=str))
            return
        print_turn(graph.stream(request, config), show_query=False)


@click.command("chat")
@DOMAINS_OPTION
@INDEX_OPTION
@DOMAIN_OPTION
@PROMPT_VERSION_OPTION
@K_OPTION
def chat_command(
    index: Path, domain: str | None, prompt_versions: tuple[str, ...], k: int | None
) -> None:
    """Chat with the index: follow-up questions are rewritten with the conversation so far.

    Type a question and press Enter. /reset forgets the conversation; /quit, or Ctrl-D, ends.
    Reads questions from standard input line by line when it is not a terminal.
    """
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

    settings = load_settings()
    configurable = build_configurable(domain, prompt_versions, k, "chat")
    service = load_service(settings, index, configurable, "chat")
    graph = service_chain(service, "chat")
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
            events = graph.stream(
                {"question": question, "chat_history": history}, {"configurable": configurable}
            )
            answer = print_turn(events, show_query=True)
        except Exception as exc:  # a bad option or a model failure; the session goes on
            click.echo(f"\nerror: {one_line(exc)}", err=True)
            continue
        history += [HumanMessage(question), AIMessage(answer)]
