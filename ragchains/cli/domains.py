"""``ragchains domains new|check|list``: a team's own domains folder."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from ragchains.cli.common import (
    DOMAINS_OPTION,
    EXIT_FAILED,
    fail,
    index_option,
    load_settings,
)

_FOLDER_HELP = "name it with --domains DIR after the command's name, or RAGCHAINS_DOMAINS"


@click.group("domains")
def domains_group() -> None:
    """Your own domains: prompts, glossary and documents, in a folder outside the package.

    \b
    A domains folder has one folder per domain, as the shipped prompts/ has:
      my-domains/legal/domain.yaml        description, glossary, documents: (its scope)
      my-domains/legal/answer/v1.yaml     a prompt; one it leaves out is default's
      my-domains/default/                 optional: your own fallback domain
      my-domains/domains.yaml             optional: shipped: [hr] to keep a shipped one
    Serve it with `ragchains serve --domains my-domains` (or RAGCHAINS_DOMAINS): only its
    domains and default are offered, and edits are served without a restart.
    """


@domains_group.command("new")
@DOMAINS_OPTION
@click.argument("name")
@click.option(
    "--from",
    "source",
    default="default",
    show_default=True,
    help="The domain whose latest prompts the new one starts from.",
)
@click.option(
    "--description", default="", help="What the domain is about (shown on the chat page)."
)
def new_command(name: str, source: str, description: str) -> None:
    """Write the folder of a new domain NAME into your domains folder, to edit.

    Writes NAME/domain.yaml (description, glossary, documents, commented) and a v1.yaml of
    every prompt the chains use, copied from --from's latest, each headed by what its
    variables hold. Check it with `ragchains domains check`.
    """
    from ragchains.factory import build_prompts
    from ragchains.prompts.problems import PromptFileError
    from ragchains.prompts.scaffold import ScaffoldError, write_domain

    settings = load_settings()
    folder = _folder(settings)
    # --from: the folder's domains as served, else a shipped one (a folder serves only its
    # own and default, or may not load yet: a new domain does not depend on the others).
    registry = build_prompts(_shipped(settings))
    if folder.is_dir():
        try:
            served = build_prompts(settings)
        except PromptFileError as exc:
            if source not in registry.domains:
                fail(f"--from {source}: {exc}")
        else:
            registry = served if source in served.domains else registry
    try:
        written = write_domain(
            registry, folder, name, source, description or f"The {name} domain's documents."
        )
    except (ScaffoldError, OSError) as exc:
        fail(str(exc))
    click.echo(f"wrote the {name} domain, from {source}'s prompts:")
    for path in written:
        click.echo(f"  {path}")
    click.echo(
        f"edit them, then `ragchains domains check --domains {folder}`; "
        f"`ragchains serve --domains {folder}` serves it"
    )


@domains_group.command("check")
@DOMAINS_OPTION
@index_option(
    "Also check each domain's documents against this index: fields its filters name, "
    "and how many files its scope holds (default: none)."
)
def check_command(index: Path | str | None) -> None:
    """Check every file of your domains folder: each problem as FILE:LINE: reason.

    Exits 0 when the folder would be served as it is, 1 when some file does not check out
    (a running server then keeps serving the last version that did).
    """
    from ragchains.factory import build_prompts
    from ragchains.prompts.problems import PromptFileError

    settings = load_settings()
    folder = _folder(settings)
    try:
        registry = build_prompts(settings)
    except PromptFileError as exc:
        if not exc.problems:
            fail(str(exc), EXIT_FAILED)
        for problem in exc.problems:
            click.echo(str(problem))
        fail(f"{len(exc.problems)} problem(s) in {folder}; fix them and check again", EXIT_FAILED)
    warnings = _scope_warnings(registry, index) if index is not None else []
    for warning in warnings:
        click.echo(f"warning: {warning}")
    own = [n for n, d in registry.domains.items() if _is_own(d, folder)]
    click.echo(
        f"ok: {folder} checks out: {len(own)} domain(s) of its own ({', '.join(own) or 'none'}); "
        f"served: {', '.join(registry.domains)}"
    )


@domains_group.command("list")
@DOMAINS_OPTION
@index_option(
    "Count each domain's documents in this index (default: RAGCHAINS_STORE, RAGCHAINS_INDEX)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the domains as JSON.")
def list_command(index: Path | str | None, as_json: bool) -> None:
    """The domains served: each one's prompt versions (its own, or default's), its
    documents and how many files they are."""
    from ragchains.factory import build_prompts

    settings = load_settings()
    try:
        registry = build_prompts(settings)
    except ValueError as exc:
        fail(str(exc))
    target = index or settings.store or settings.index
    counts = _scope_counts(registry, target) if target is not None else None
    rows = [_row(registry, name, counts) for name in registry.domains]
    if as_json:
        click.echo(json.dumps(rows, indent=2, ensure_ascii=False))
        return
    click.echo(
        f"domains of {registry.team}" if registry.team else "the shipped domains (no --domains)"
    )
    for row in rows:
        click.echo(f"\n{row['name']}  ({row['from']})  {row['description']}")
        for prompt in row["prompts"]:
            owner = "" if prompt["own"] else "  (default's)"
            click.echo(
                f"  {prompt['name']}: {', '.join(prompt['versions'])}, latest "
                f"{prompt['latest']}{owner}"
            )
        documents = row["documents"]
        counted = f" ({row['files']} of {row['total']} files)" if row["files"] is not None else ""
        click.echo(f"  documents: {documents}{counted}")


# ----------------------------------------------------------------------------- helpers
def _folder(settings: Any) -> Path:
    if settings.domains is None:
        fail(f"no domains folder: {_FOLDER_HELP}")
    return Path(settings.domains).expanduser()


def _shipped(settings: Any) -> Any:
    """The settings without a domains folder: a new folder starts from the shipped ones."""
    return settings.model_copy(update={"domains": None})


def _is_own(domain: Any, folder: Path) -> bool:
    return domain.folder is not None and domain.folder.parent == folder


def _row(registry: Any, name: str, counts: dict[str, tuple[int, int]] | None) -> dict[str, Any]:
    from ragchains.prompts.registry import CHAIN_PROMPTS

    domain = registry.domains[name]
    prompts = []
    for prompt in CHAIN_PROMPTS:
        versions = registry.versions(name, prompt)
        prompts.append(
            {
                "name": prompt,
                "versions": [f"v{v}" for v in sorted(versions)],
                "latest": f"v{max(versions)}",
                "own": prompt in domain.prompts,
            }
        )
    team = registry.team
    origin = "yours" if team is not None and _is_own(domain, team) else "shipped"
    files, total = counts[name] if counts is not None else (None, None)
    return {
        "name": name,
        "from": origin,
        "folder": str(domain.folder) if domain.folder else None,
        "description": domain.description,
        "prompts": prompts,
        "documents": domain.scope.describe(),
        "files": files,
        "total": total,
    }


@contextlib.contextmanager
def _opened(target: Path | str) -> Iterator[tuple[Any, dict[str, Any]]]:
    """The index folder's current generation, or the store (no models loaded), and its
    file records by source."""
    from ragchains.retrievers.pgstore import PostgresStore
    from ragchains.retrievers.searchindex import load_index
    from ragchains.retrievers.storeurl import is_store_url

    try:
        if is_store_url(str(target)):
            index: Any = PostgresStore(str(target))
            records = index.files()
        else:
            index = load_index(target)
            records = index.store.files()
    except ValueError as exc:
        fail(str(exc))
    try:
        yield index, records
    finally:
        index.close()


def _scope_counts(registry: Any, target: Path | str) -> dict[str, tuple[int, int]]:
    """Each domain's files in the index, and the index's files: (in scope, all)."""
    with _opened(target) as (index, records):
        counts = {}
        for name, domain in registry.domains.items():
            sources = index.scope_sources(domain.scope)
            held = len(records) if sources is None else len(sources & records.keys())
            counts[name] = (held, len(records))
        return counts


def _scope_warnings(registry: Any, target: Path | str) -> list[str]:
    """What each domain's scope finds in the index: a filter on a field the index lacks, a
    scope that holds no file."""
    with _opened(target) as (index, records):
        fields = dict(index.fields)
        warnings = []
        for name, domain in registry.domains.items():
            scope = domain.scope
            if scope.everything:
                continue
            where = domain.folder / "domain.yaml" if domain.folder else name
            for n, flt in enumerate(scope.filters):
                if flt.field not in fields:
                    warnings.append(
                        f"{where}: documents.filters.{n}: the index has no field {flt.field!r} "
                        f"(fields: {', '.join(sorted(fields))}): the domain answers from nothing"
                    )
            sources = index.scope_sources(scope) or set()
            if not sources & records.keys():
                warnings.append(
                    f"{where}: the domain's documents ({scope.describe()}) hold none of the "
                    f"index's {len(records)} files: it will answer that it does not know"
                )
        return warnings
