"""API keys with an owner, groups and a role, kept hashed in a TOML file
(``RAGCHAINS_KEYS_FILE``).

    [[keys]]
    principal = "alice"
    groups = ["hr", "managers"]
    role = "editor"         # reader (the default when absent), editor or admin
    sha256 = "…"            # of the key; the key itself is shown once, by `ragchains keys add`

A request with one of these keys reads what its groups may read (see ``retrievers.access``);
its role says what else it may do (``ROLES``). ``RAGCHAINS_API_KEY``, when also set, stays
a key that reads everything, with the admin role. A running server
re-reads the file within a second of a change (``ragchains keys add`` / ``remove``), so a key
is revoked without a restart; a file that can no longer be read then lets no key in.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import stat
import tempfile
import threading
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ragchains.retrievers.access import AccessRuleError, checked_groups

log = logging.getLogger(__name__)

RELOAD_INTERVAL = 1.0  # seconds between looks at the keys file for a change
_DIGEST = re.compile(r"^[0-9a-f]{64}$")


class KeysFileError(ValueError):
    """A keys file that cannot be read or used (the message names it and says why)."""


# What each role may do, each including the one before it:
#   reader  ask, search and read what its groups may (every key made before roles existed);
#   editor  also add, replace, re-ingest and remove documents whose groups are all its own;
#   admin   everything: every document and everyone's ingest jobs.
ROLES = ("reader", "editor", "admin")
# The names of people signed in with OpenID Connect (serving.signin) begin with it.
SIGNED_IN_PREFIX = "oidc:"
# The server's own principals (serving.guards), whose names no key's owner may take.
SERVER_PRINCIPALS = {
    "api-key": "RAGCHAINS_API_KEY's holder",
    "local": "everyone on a server without keys",
}
DEFAULT_ROLE = "reader"


@dataclass(frozen=True)
class Principal:
    """Who makes a request: a name, the groups it reads (None: every document) and its role."""

    name: str
    groups: frozenset[str] | None
    role: str = DEFAULT_ROLE
    display: str | None = None  # how a page names them (a signed-in person's name claim)
    via: str = "key"  # key, oidc (a session or a bearer token) or open (a server without keys)

    def may(self, role: str) -> bool:
        """Whether this principal has ``role`` or one above it (``ROLES``)."""
        return ROLES.index(self.role) >= ROLES.index(role)


def reserved_name(principal: str) -> str | None:
    """Why a key's owner cannot be named ``principal``, else None: the names of the server's
    own principals and of signed-in people are theirs alone (conversations are kept by the
    name: a key must never open another's)."""
    if principal.startswith(SIGNED_IN_PREFIX):
        return f"{principal!r}: {SIGNED_IN_PREFIX}… names a signed-in person, not a key's owner"
    if principal in SERVER_PRINCIPALS:
        return f"{principal!r} is the server's own name for {SERVER_PRINCIPALS[principal]}"
    return None


def checked_role(role: str) -> str:
    """``role`` if it is one of ``ROLES``; KeysFileError naming them otherwise."""
    if role not in ROLES:
        raise KeysFileError(f"{role!r} is not a role: choose one of {', '.join(ROLES)}")
    return role


def key_digest(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()


class KeyRing:
    """The keys of a keys file, by the sha256 of each key, re-read when the file changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        # A file that cannot be used stops the start. The stamp is that of the file read.
        entries, self._seen = _read(path)
        self._by_digest = _principals(entries)
        self._failed: Stamp | None = None
        self._looked = time.monotonic()

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
                    self._reread(stamp)
        return self._by_digest

    def _reread(self, stamp: Stamp | None) -> None:
        try:
            entries, self._seen = _read(self.path)
        except KeysFileError as exc:
            # A revocation must not be undone by a typo: no key until it is mended. The
            # stamp stays the last good one, so every look retries (a chmod, a passing I/O
            # error); the log says so once per state of the file.
            self._by_digest = {}
            if stamp != self._failed:
                self._failed = stamp
                log.error("%s; no key is accepted until it is mended", exc)
            return
        self._by_digest = _principals(entries)
        self._failed = None
        log.info("keys file %s re-read: %d keys", self.path, len(self._by_digest))


# What changes when the file is rewritten, replaced, or has its mode or owner changed.
Stamp = tuple[int, int, int, int, int, int]


def _stamp_of(st: os.stat_result) -> Stamp:
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_mode, st.st_uid)


def _stamp(path: Path) -> Stamp | None:
    try:
        return _stamp_of(path.stat())
    except OSError:
        return None  # gone, for now


def _principals(entries: list[dict[str, object]]) -> dict[str, Principal]:
    return {str(entry["sha256"]): _principal(entry) for entry in entries}


def add_key(path: Path, principal: str, groups: list[str], role: str = DEFAULT_ROLE) -> str:
    """A new key for ``principal`` with ``groups`` and ``role``, its digest written to
    ``path`` (created readable by its owner only); returns the key, which is kept nowhere
    else."""
    if not principal.strip() or not principal.isprintable():
        raise KeysFileError(f"{principal!r} is not a usable name for a key's owner")
    problem = reserved_name(principal)
    if problem is not None:
        raise KeysFileError(problem)
    checked_role(role)
    try:
        names = checked_groups(groups, "--groups")
    except AccessRuleError as exc:
        raise KeysFileError(str(exc)) from exc
    with _editing(path):
        entries = _read(path)[0] if path.exists() else []
        if any(entry["principal"] == principal for entry in entries):
            raise KeysFileError(f"{path} already holds a key for {principal!r}")
        key = f"rk-{secrets.token_urlsafe(32)}"
        entries.append(
            {
                "principal": principal,
                "groups": list(names),
                "role": role,
                "sha256": key_digest(key.encode()),
            }
        )
        _write(path, entries)
    return key


def remove_key(path: Path, principal: str) -> None:
    """Take ``principal``'s key out of ``path``: a server using the file refuses it within a
    second (``RELOAD_INTERVAL``)."""
    with _editing(path):
        entries = _read(path)[0]
        kept = [entry for entry in entries if entry["principal"] != principal]
        if len(kept) == len(entries):
            raise KeysFileError(f"{path} holds no key for {principal!r}")
        _write(path, kept)


@contextmanager
def _editing(path: Path) -> Iterator[None]:
    """One change to the file at a time: two commands at once must not write back a list
    read before the other's change (a removed key would come back)."""
    try:
        fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise KeysFileError(f"keys file {path}: cannot lock it ({exc.strerror})") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _write(path: Path, entries: list[dict[str, object]]) -> None:
    """Replace the file at once (a server never reads half of it), readable by its owner only."""
    # JSON strings and lists are TOML basic strings and arrays.
    text = "".join(
        f"[[keys]]\nprincipal = {json.dumps(e['principal'])}\n"
        f"groups = {json.dumps(e['groups'])}\nrole = {json.dumps(e.get('role', DEFAULT_ROLE))}\n"
        f"sha256 = {json.dumps(e['sha256'])}\n\n"
        for e in entries
    )
    # A new file of our own (mode 0600), never one a crash or another user left.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class ListedKey(NamedTuple):
    principal: str
    groups: list[str]
    role: str


def list_keys(path: Path) -> list[ListedKey]:
    """Each key's owner, groups and role, in the file's order."""
    return [
        ListedKey(str(e["principal"]), [str(g) for g in e["groups"]], str(e.get("role", "reader")))  # type: ignore[attr-defined]
        for e in _read(path)[0]
    ]


def _read(path: Path) -> tuple[list[dict[str, object]], Stamp]:
    """The file's entries and the stamp of the very file read (opened once: its mode and
    owner are checked on what is read, not on a name that may have been replaced since)."""
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            raw = fh.read()
        data = tomllib.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise KeysFileError(f"keys file {path}: {exc}") from exc
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):  # whoever can write it can let themselves in
        raise KeysFileError(
            f"keys file {path} can be changed by other users (mode {stat.S_IMODE(st.st_mode):o})"
            f": chmod 600 {path}"
        )
    if st.st_uid not in (os.geteuid(), 0):
        raise KeysFileError(
            f"keys file {path} belongs to another user (uid {st.st_uid}), who could add keys: "
            "give it to the user the server runs as"
        )
    return _entries(path, data), _stamp_of(st)


def _entries(path: Path, data: dict[str, object]) -> list[dict[str, object]]:
    entries = data.get("keys", [])
    if not isinstance(entries, list) or set(data) - {"keys"}:
        raise KeysFileError(f"keys file {path}: expected [[keys]] tables only")
    for n, entry in enumerate(entries):
        if (
            not isinstance(entry, dict)
            or set(entry) - {"role"} != {"principal", "groups", "sha256"}
            or not isinstance(entry["principal"], str)
            or not isinstance(entry["groups"], list)
            or not isinstance(entry["sha256"], str)
            or not _DIGEST.match(entry["sha256"])
        ):
            raise KeysFileError(
                f"keys file {path}: key {n + 1} needs principal (text), groups (a list) and "
                "sha256 (64 lowercase hex digits), and may have a role; nothing else"
            )
        problem = reserved_name(str(entry["principal"]))
        if problem is not None:
            raise KeysFileError(f"keys file {path}: key {n + 1}: {problem}")
        if entry.get("role", DEFAULT_ROLE) not in ROLES:
            raise KeysFileError(
                f"keys file {path}: key {n + 1} has role {entry['role']!r}: choose one of "
                + ", ".join(ROLES)
            )
    return entries


def _principal(entry: dict[str, object]) -> Principal:
    groups = entry["groups"]
    assert isinstance(groups, list)
    role = str(entry.get("role", DEFAULT_ROLE))
    return Principal(str(entry["principal"]), frozenset(str(g) for g in groups), role)
