"""API keys with an owner and groups, kept hashed in a TOML file (``RAGCHAINS_KEYS_FILE``).

    [[keys]]
    principal = "alice"
    groups = ["hr", "managers"]
    sha256 = "…"            # of the key; the key itself is shown once, by `ragchains keys add`

A request with one of these keys reads what its groups may read (see ``retrievers.access``);
``RAGCHAINS_API_KEY``, when also set, stays a key that reads everything.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ragchains.retrievers.access import AccessRuleError, checked_groups


class KeysFileError(ValueError):
    """A keys file that cannot be read or used (the message names it and says why)."""


@dataclass(frozen=True)
class Principal:
    name: str
    groups: frozenset[str]


def key_digest(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()


class KeyRing:
    """The keys of a keys file, by the sha256 of each key."""

    def __init__(self, principals: dict[str, Principal]) -> None:
        self._by_digest = principals

    @classmethod
    def load(cls, path: Path) -> KeyRing:
        return cls({str(entry["sha256"]): _principal(entry) for entry in _entries(path)})

    def find(self, key: bytes) -> Principal | None:
        # A lookup by digest: its timing tells nothing of a key that is not held.
        return self._by_digest.get(key_digest(key)) if key else None


def add_key(path: Path, principal: str, groups: list[str]) -> str:
    """A new key for ``principal`` with ``groups``, its digest written to ``path`` (created
    readable by its owner only); returns the key, which is kept nowhere else."""
    if not principal.strip() or not principal.isprintable():
        raise KeysFileError(f"{principal!r} is not a usable name for a key's owner")
    try:
        names = checked_groups(groups, "--groups")
    except AccessRuleError as exc:
        raise KeysFileError(str(exc)) from exc
    entries = _entries(path) if path.exists() else []
    if any(entry["principal"] == principal for entry in entries):
        raise KeysFileError(f"{path} already holds a key for {principal!r}")
    key = f"rk-{secrets.token_urlsafe(32)}"
    entries.append(
        {"principal": principal, "groups": list(names), "sha256": key_digest(key.encode())}
    )
    # JSON strings and lists are TOML basic strings and arrays.
    text = "".join(
        f"[[keys]]\nprincipal = {json.dumps(e['principal'])}\n"
        f"groups = {json.dumps(e['groups'])}\nsha256 = {json.dumps(e['sha256'])}\n\n"
        for e in entries
    )
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)
    return key


def list_keys(path: Path) -> list[tuple[str, list[str]]]:
    """Each key's owner and groups, in the file's order."""
    return [(str(e["principal"]), [str(g) for g in e["groups"]]) for e in _entries(path)]  # type: ignore[attr-defined]


def _entries(path: Path) -> list[dict[str, object]]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise KeysFileError(f"keys file {path}: {exc}") from exc
    entries = data.get("keys", [])
    if not isinstance(entries, list) or set(data) - {"keys"}:
        raise KeysFileError(f"keys file {path}: expected [[keys]] tables only")
    for n, entry in enumerate(entries):
        if (
            not isinstance(entry, dict)
            or set(entry) != {"principal", "groups", "sha256"}
            or not isinstance(entry["principal"], str)
            or not isinstance(entry["groups"], list)
            or not isinstance(entry["sha256"], str)
            or len(entry["sha256"]) != 64
        ):
            raise KeysFileError(
                f"keys file {path}: key {n + 1} needs principal (text), groups (a list) and "
                "sha256 (64 hex digits), nothing else"
            )
    return entries


def _principal(entry: dict[str, object]) -> Principal:
    groups = entry["groups"]
    assert isinstance(groups, list)
    return Principal(str(entry["principal"]), frozenset(str(g) for g in groups))
