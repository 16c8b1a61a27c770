"""What the command modules share: exit codes, settings, options, and the chain API calls.

Every place the CLI touches the chain API is here, once: ``checked_prompts`` (the prompt
selection check), ``load_service`` and ``service_chain`` (the service and the chain a turn
runs) and ``rewrite_chain`` (the rewrite chain alone, for `eval rewrites`). Command modules
import only this module, never the package or each other.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import click
from pydantic import ValidationError

from ragchains.retrievers.storeurl import is_store_url

EXIT_NOTHING_INGESTED = 1
EXIT_FAILED = 1
EXIT_DAMAGED = 1  # `index verify`: the index is damaged
EXIT_USAGE = 2
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def load_settings() -> Any:
    """The settings (RAGCHAINS_*, .env), with the command line's --domains over them."""
    from ragchains.factory import configure_runtime
    from ragchains.settings import Settings

    try:
        settings = Settings()
    except ValidationError as exc:
        problems = "; ".join(
            f"RAGCHAINS_{'_'.join(str(p) for p in err['loc']).upper()}: {err['msg']}"
            for err in exc.errors()
        )
        fail(f"invalid settings: {problems}")
    ctx = click.get_current_context(silent=True)
    domains = ctx.meta.get(_DOMAINS_META) if ctx is not None else None
    if domains is not None:
        settings = settings.model_copy(update={"domains": domains})
    configure_runtime(settings)
    return settings


# Where --domains leaves its folder for load_settings (click's per-invocation meta, which
# every command's context shares): the option is the same on every command that loads the
# prompts, and no command has to pass it on.
_DOMAINS_META = "ragchains.domains"


def _keep_domains(ctx: click.Context, _: click.Parameter, value: Path | None) -> None:
    if value is not None:
        ctx.meta[_DOMAINS_META] = value


DOMAINS_OPTION: Callable[[Any], Any] = click.option(
    "--domains",
    type=click.Path(path_type=Path, file_okay=False),
    expose_value=False,
    callback=_keep_domains,
    help="Your own domains folder (default: RAGCHAINS_DOMAINS): its domains and default are "
    "used instead of the shipped examples. See `ragchains domains --help`.",
)


# ----------------------------------------------------------------------------- shared options
class IndexOrStore(click.ParamType):
    """An index folder (a Path), or a PostgreSQL store's URL (kept as text)."""

    name = "DIR|URL"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, Path):
            return value
        text = str(value)
        return text if is_store_url(text) else Path(text)


INDEX_OR_STORE = IndexOrStore()
STORE_HELP = (
    "--store URL: a PostgreSQL store instead, postgresql://USER[:PASSWORD]@HOST[:PORT]/DB "
    "(add ?schema=NAME for a schema other than ragchains)."
)


def index_option(help_text: str, *, required: bool = False) -> Callable[[Any], Any]:
    """``--index DIR`` or ``--store URL`` (one parameter, ``index``)."""
    return click.option(
        "--index",
        "--store",
        "index",
        required=required,
        type=INDEX_OR_STORE,
        help=f"{help_text} {STORE_HELP}",
    )


def target_of(index: Path | str | None, settings: Any) -> Path | str:
    """The index folder or store URL to use: the option's, else RAGCHAINS_STORE, else
    RAGCHAINS_INDEX."""
    target = index or settings.store or settings.index
    if target is None:
        fail(
            "no index given: pass --index DIR or --store URL "
            "(or set RAGCHAINS_INDEX / RAGCHAINS_STORE)"
        )
    return target  # type: ignore[no-any-return]


INDEX_OPTION: Callable[[Any], Any] = index_option("Index folder built by `ingest`.", required=True)
FILTER_OPTION: Callable[[Any], Any] = click.option(
    "--filter",
    "filters",
    nargs=3,
    multiple=True,
    metavar="FIELD OP VALUE",
    help="e.g. --filter price '<' 100, --filter filename = '*.pdf', "
    "--filter brand in Acme,Globex. OP: = != < <= > >= in. Repeat to AND them.",
)
DOMAIN_OPTION: Callable[[Any], Any] = click.option(
    "--domain", help="Prompt domain (e.g. hr, catalog); default: the 'default' domain."
)
PROMPT_VERSION_OPTION: Callable[[Any], Any] = click.option(
    "--prompt-version",
    "prompt_versions",
    multiple=True,
    metavar="N|NAME=N",
    help="Prompt version: N for every prompt, or NAME=N (e.g. rewrite=2), repeatable. "
    "Default: the latest.",
)
K_OPTION: Callable[[Any], Any] = click.option(
    "--k", type=click.IntRange(1, 200), help="Chunks retrieved before reranking."
)


def parse_filters(filters: tuple[tuple[str, str, str], ...], fields: dict[str, str]) -> list[Any]:
    """``--filter FIELD OP VALUE`` options, typed by the index's fields and checked."""
    from ragchains.retrievers.filters import (
        OPERATORS,
        FilterError,
        parse_cli_value,
        validate_filters,
    )

    try:
        raw = []
        for field, op, value in filters:
            if op not in OPERATORS:
                fail(f"unknown filter operator {op!r}; use one of {' '.join(OPERATORS)}")
            raw.append(
                {"field": field, "op": op, "value": parse_cli_value(field, op, value, fields)}
            )
        return validate_filters(raw, fields)
    except FilterError as exc:
        fail(str(exc))


def parse_prompt_versions(values: tuple[str, ...]) -> str | dict[str, str] | None:
    """``--prompt-version 2`` for every prompt, or ``--prompt-version rewrite=2`` per prompt."""
    if not values:
        return None
    mapping: dict[str, str] = {}
    for value in values:
        name, sep, version = value.partition("=")
        if not sep:
            if len(values) > 1:
                fail("give one --prompt-version N, or NAME=N for each prompt")
            return value
        mapping[name.strip()] = version.strip()
    return mapping


def build_configurable(
    domain: str | None, versions: tuple[str, ...], k: int | None, mode: str
) -> dict[str, Any]:
    """The request's ``configurable`` from --domain, --prompt-version and --k (unset left out)
    for a turn of ``mode`` (the chain whose prompts --prompt-version N sets)."""
    from ragchains.chains.graph import PROMPTS_USED
    from ragchains.chains.options import OptionsError, version_choices

    chosen: dict[str, Any] = {"domain": domain, "k": k}
    try:
        chosen.update(version_choices(parse_prompt_versions(versions), PROMPTS_USED[mode]))
    except OptionsError as exc:
        fail(f"--prompt-version: {exc}")
    return {key: value for key, value in chosen.items() if value is not None}


# ----------------------------------------------------------------------------- the chain API
def checked_prompts(configurable: dict[str, Any], mode: str, settings: Any = None) -> Any:
    """The prompt files of the settings (the shipped domains, or --domains), with the
    request's domain and versions checked for ``mode``."""
    from ragchains.chains.graph import PROMPTS_USED
    from ragchains.chains.options import Choices
    from ragchains.factory import build_prompts

    try:
        prompts = build_prompts(settings if settings is not None else load_settings())
        Choices(prompts, PROMPTS_USED[mode]).resolve(configurable)  # before the slow loading
    except ValueError as exc:
        fail(str(exc))
    return prompts


def chosen_prompts(prompts: Any, configurable: dict[str, Any], mode: str) -> dict[str, str]:
    """The refs (``domain/name@vN``) of the prompts a turn of ``mode`` runs with."""
    from ragchains.chains.graph import PROMPTS_USED
    from ragchains.chains.options import Choices

    return dict(Choices(prompts, PROMPTS_USED[mode]).resolve(configurable).prompts)


def load_service(settings: Any, index: Path | str, configurable: dict[str, Any], mode: str) -> Any:
    """Models, index and chains, with every problem reported as one line before any work."""
    from ragchains.factory import build_service

    prompts = checked_prompts(configurable, mode, settings)
    # Every expected failure (index, model, key) is a ValueError subclass with a message
    # made for the user.
    try:
        return build_service(settings, index, prompts=prompts)
    except ValueError as exc:
        fail(str(exc))


def serve_mcp_stdio(settings: Any, index: Path | str) -> None:
    """The MCP tools over stdio until the client closes stdin; the index folder followed
    as ingests commit, as the server follows it."""
    from ragchains.factory import build_service
    from ragchains.prompts.live import LiveRegistry
    from ragchains.retrievers.live import LiveIndex
    from ragchains.retrievers.pgstore import PostgresStore
    from ragchains.serving.mcp_server import serve_stdio

    try:
        service = build_service(settings, index, live=True)
    except ValueError as exc:
        fail(str(exc))
    if isinstance(service.index, LiveIndex | PostgresStore):
        service.index.watch()
    if isinstance(service.prompts, LiveRegistry):  # a team's domains folder, followed too
        service.prompts.watch()
    try:
        serve_stdio(service)
    finally:
        if isinstance(service.index, LiveIndex | PostgresStore):
            service.index.close()
        if isinstance(service.prompts, LiveRegistry):
            service.prompts.close()


def service_chain(service: Any, mode: str) -> Any:
    """The chain of a loaded service that runs a turn of ``mode`` ("ask" or "chat")."""
    return service.chains[mode]


def rewrite_chain(settings: Any, llm: Any, prompts: Any, fields: dict[str, str]) -> Any:
    """The rewrite chain on its own (what `eval rewrites` measures), for an index's ``fields``."""
    from ragchains.chains.rewrite import create_rewrite_chain

    return create_rewrite_chain(
        llm=llm, prompts=prompts, fields=fields, history_tokens=settings.history_tokens
    )


# ----------------------------------------------------------------------------- turns
def one_line(exc: Exception) -> str:
    """What the user is told when a turn fails: the model's failure, or the input's fault."""
    from ragchains.models.providers import explain_failure

    failure = explain_failure(exc)
    if failure is not None:  # the operator's own upstream: its words help (credentials masked)
        return f"{failure.message}: {failure.detail}" if failure.detail else failure.message
    if isinstance(exc, ValueError):
        return str(exc)
    raise exc  # a bug: the traceback is the useful report


@contextlib.contextmanager
def model_failures_as_errors() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        fail(one_line(exc), EXIT_FAILED)


def print_turn(events: Any, *, show_query: bool) -> str:
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
