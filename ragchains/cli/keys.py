"""``ragchains keys``: API keys with an owner and groups, for per-user document access."""

from __future__ import annotations

from pathlib import Path

import click

from ragchains.cli.common import fail, load_settings


@click.group("keys")
def keys_group() -> None:
    """API keys whose callers read only what their groups may (files labelled at ingest with
    --access or .ragchains-access.toml, or given groups at upload), each with a role: reader
    (asks and reads), editor (also adds, replaces and removes documents whose groups are all
    its own) or admin (everything). The server uses the file RAGCHAINS_KEYS_FILE names; keys
    are stored as their sha256, and each is shown once, when made."""


def _keys_file(path: Path | None) -> Path:
    chosen = path or load_settings().keys_file
    if chosen is None:
        fail("no keys file: pass --keys-file PATH or set RAGCHAINS_KEYS_FILE")
    return chosen


KEYS_FILE_OPTION = click.option(
    "--keys-file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="The keys file (default: RAGCHAINS_KEYS_FILE); `add` creates it, owner-only.",
)


@keys_group.command("add")
@click.argument("principal")
@click.option("--groups", required=True, metavar="GROUP[,GROUP]", help="What the key may read.")
@click.option(
    "--role",
    type=click.Choice(["reader", "editor", "admin"]),
    default="reader",
    show_default=True,
    help="reader: asks and reads; editor: also adds, replaces and removes documents within "
    "its groups (the Documents page, /documents); admin: every document and every job.",
)
@KEYS_FILE_OPTION
def add_command(principal: str, groups: str, role: str, keys_file: Path | None) -> None:
    """Make a key for PRINCIPAL (a person or a program) and print it, once."""
    from ragchains.serving.keys import KeysFileError, add_key

    path = _keys_file(keys_file)
    try:
        key = add_key(path, principal, groups.split(","), role)
    except KeysFileError as exc:
        fail(str(exc))
    click.echo(key)
    click.echo(f"key for {principal!r} added to {path}; it is not stored, keep it now", err=True)


@keys_group.command("list")
@KEYS_FILE_OPTION
def list_command(keys_file: Path | None) -> None:
    """Each key's owner, groups and role (never the keys)."""
    from ragchains.serving.keys import KeysFileError, list_keys

    try:
        for name, groups, role in list_keys(_keys_file(keys_file)):
            click.echo(f"{name}: {', '.join(groups)} ({role})")
    except KeysFileError as exc:
        fail(str(exc))


@keys_group.command("remove")
@click.argument("principal")
@KEYS_FILE_OPTION
def remove_command(principal: str, keys_file: Path | None) -> None:
    """Revoke PRINCIPAL's key: a running server refuses it within a second, no restart."""
    from ragchains.serving.keys import KeysFileError, remove_key

    path = _keys_file(keys_file)
    try:
        remove_key(path, principal)
    except KeysFileError as exc:
        fail(str(exc))
    click.echo(f"key for {principal!r} removed from {path}", err=True)
