"""API keys with an owner and groups, kept hashed in a TOML file (``RAGCHAINS_KEYS_FILE``).

    [[keys]]
    principal = "alice"
    groups = ["hr", "managers"]
    sha256 = "…"            # of the key; the key itself is shown once, by `ragchains keys add`

A request with one of these keys reads what its groups may read (see ``retrievers.access``);
``RAGCHAINS_API_KEY``, when also set, stays a key that reads everything. A running server
re-reads the file within a second of a change (``ragchains keys add`` / ``remove``), so a key
is revoked without a restart; a file that can no longer be read then lets no key in.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import stat
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ragchains.retrievers.access import AccessRuleError, checked_groups

log = logging.getLogger(__name__)

RELOAD_INTERVAL = 1.0  # seconds between looks at the keys file for a change
_DIGEST = re.compile(r"^[0-9a-f]{64}$")


class KeysFileError(ValueError):
    """A keys file that cannot be read or used (the message names it and says why)."""


@dataclass(frozen=True)
class Principal:
    name: str
    groups: frozenset[str]


def key_digest(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()


class KeyRing:
    """The keys of a keys file, by the sha256 of each key, re-read when the file changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._by_digest = _principals(path)  # a file that cannot be used stops the start
        self._seen = _stamp(path)
        self._looked = time.monotonic()

    @classmethod
    def load(cls, path: Path) -> KeyRing:
        return cls(path)

    def find(self, key: bytes) -> Principal | None:
        # A lookup by digest: its timing tells nothing of a key that is not held.
        return self._current().get(key_digest(key)) if key else None

    def _current(self) -> dict[str, Principal]:
        now = time.monotonic()
        if now - self._looked < RELOAD_INTERVAL:
            return self._by_digest
        with self._lock:
            if now - self._looked >= RELOAD_INTERVAL:
                self._looked = now
                stamp = _stamp(self.path)
                if stamp != self._seen:
                    self._seen = stamp
                    try:
                        self._by_digest = _principals(self.path)
                        log.info("keys file %s re-read: %d keys", self.path, len(self._by_digest))
                    except KeysFileError as exc:  # a revocation must not be undone by a typo
                        self._by_digest = {}
                        log.error("%s; no key is accepted until it is mended", exc)
        return self._by_digest


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes when the file is rewritten (in place or replaced); None: it is gone."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _principals(path: Path) -> dict[str, Principal]:
    return {str(entry["sha256"]): _principal(entry) for entry in _entries(path)}


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
    _write(path, entries)
    return key


def remove_key(path: Path, principal: str) -> None:
    """Take ``principal``'s key out of ``path``: a server using the file refuses it within a
    second (``RELOAD_INTERVAL``)."""
    entries = _entries(path)
    kept = [entry for entry in entries if entry["principal"] != principal]
    if len(kept) == len(entries):
        raise KeysFileError(f"{path} holds no key for {principal!r}")
    _write(path, kept)


def _write(path: Path, entries: list[dict[str, object]]) -> None:
    """Replace the file at once (a server never reads half of it), readable by its owner only."""
    # JSON strings and lists are TOML basic strings and arrays.
    text = "".join(
        f"[[keys]]\nprincipal = {json.dumps(e['principal'])}\n"
        f"groups = {json.dumps(e['groups'])}\nsha256 = {json.dumps(e['sha256'])}\n\n"
        for e in entries
    )
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a stale tmp file left by a crash keeps its own mode otherwise
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def list_keys(path: Path) -> list[tuple[str, list[str]]]:
    """Each key's owner and groups, in the file's order."""
    return [(str(e["principal"]), [str(g) for g in e["groups"]]) for e in _entries(path)]  # type: ignore[attr-defined]


def _entries(path: Path) -> list[dict[str, object]]:
    try:
        mode = path.stat().st_mode
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise KeysFileError(f"keys file {path}: {exc}") from exc
    if mode & (stat.S_IWGRP | stat.S_IWOTH):  # whoever can write it can let themselves in
        raise KeysFileError(
            f"keys file {path} can be changed by other users (mode {stat.S_IMODE(mode):o}): "
            f"chmod 600 {path}"
        )
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
            or not _DIGEST.match(entry["sha256"])
        ):
            raise KeysFileError(
                f"keys file {path}: key {n + 1} needs principal (text), groups (a list) and "
                "sha256 (64 lowercase hex digits), nothing else"
            )
    return entries


def _principal(entry: dict[str, object]) -> Principal:
    groups = entry["groups"]
    assert isinstance(groups, list)
    return Principal(str(entry["principal"]), frozenset(str(g) for g in groups))
