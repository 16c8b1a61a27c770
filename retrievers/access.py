"""Who may read which documents: labels given at ingest, the caller's groups per request.

A file ingested with access groups (``ingest --access GLOB=GROUP[,GROUP]``, or a
``.ragchains-access.toml`` at the root of an input folder) is readable only by callers in one
of its groups; a file without groups is readable by everyone. The groups are kept per file:
in an index folder in ``chunks.sqlite``'s ``files`` table (each chunk reads them through its
source), in a PostgreSQL store in ``files`` and on each chunk (``retrievers.pgstore``).

A request's groups travel in a context variable (``caller_groups``) set by the server from the
caller's key, never from the request: every search run for the request (any route, stage,
playground, re-query) applies them inside BM25 and dense search, as a mask like a filter's;
BM25 also takes its statistics from the rows they may read (``bm25.bm25_search``).
Outside a request (the CLI, in-process callers) nothing is hidden.
"""

from __future__ import annotations

import contextvars
import fnmatch
import glob
import re
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ragchains.retrievers.filters import MetadataColumns

SIDECAR = ".ragchains-access.toml"
# A group name: what a keys file and a rule may hold (no commas: rules list them with commas).
GROUP = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,63}$")

_CALLER: contextvars.ContextVar[frozenset[str] | None] = contextvars.ContextVar(
    "ragchains-caller-groups", default=None
)


class AccessRuleError(ValueError):
    """A rule, a sidecar file or a group name that cannot be used (the message says where)."""


# ----------------------------------------------------------------------------- the caller
def current_groups() -> frozenset[str] | None:
    """The groups of this request's caller; None: nothing is hidden (no access control)."""
    return _CALLER.get()


@contextmanager
def caller_groups(groups: frozenset[str] | None) -> Iterator[None]:
    """Searches in this context (and the tasks and threads it starts) see only what
    ``groups`` may read; None: everything."""
    token = _CALLER.set(groups)
    try:
        yield
    finally:
        _CALLER.reset(token)


# ----------------------------------------------------------------------------- labels at ingest
@dataclass(frozen=True)
class AccessRule:
    """Files whose source name matches ``pattern`` (fnmatch, case-sensitive; ``*`` also
    crosses folders) are readable by ``groups`` only."""

    pattern: str
    groups: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> AccessRule:
        """``GLOB=GROUP[,GROUP...]`` as ``ingest --access`` takes it."""
        pattern, sep, groups = text.partition("=")
        if not sep or not pattern.strip():
            raise AccessRuleError(f"--access {text!r}: give GLOB=GROUP[,GROUP], e.g. 'hr/*=hr'")
        return cls(pattern.strip(), checked_groups(groups.split(","), f"--access {text!r}"))


def checked_groups(groups: Sequence[object], where: str) -> tuple[str, ...]:
    names = tuple(sorted({str(g).strip() for g in groups if str(g).strip()}))
    if not names:
        raise AccessRuleError(f"{where}: name at least one group")
    bad = [g for g in names if not GROUP.match(g)]
    if bad:
        raise AccessRuleError(
            f"{where}: {bad[0]!r} is not a group name (letters, digits and _.:@-, at most 64)"
        )
    return names


def sidecar_rules(root: Path, prefix: str) -> list[AccessRule]:
    """The rules of ``root``'s sidecar, their patterns made relative to the source names of
    the files under it (``<prefix>/<path>``); none when it has no sidecar."""
    path = root / SIDECAR
    if not path.is_file():
        return []
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise AccessRuleError(f"{path}: {exc}") from exc
    table = data.get("groups")
    unknown = sorted(set(data) - {"groups"})
    if not isinstance(table, dict) or unknown:
        raise AccessRuleError(
            f'{path}: expected one [groups] table of "pattern" = ["group", ...]'
            + (f"; unknown: {', '.join(unknown)}" if unknown else "")
        )
    rules = []
    for pattern, groups in table.items():
        if not isinstance(groups, list):
            raise AccessRuleError(f'{path}: {pattern!r} must list its groups, e.g. ["hr"]')
        where = f"{path}: {pattern!r}"
        # The folder's own name is literal: "team[hr]" is no character class.
        rules.append(AccessRule(f"{glob.escape(prefix)}/{pattern}", checked_groups(groups, where)))
    return rules


def groups_for(source: str, rules: Sequence[AccessRule]) -> tuple[str, ...]:
    """The groups of the first rule matching ``source``; () (everyone) when none does."""
    for rule in rules:
        if fnmatch.fnmatchcase(source, rule.pattern):
            return rule.groups
    return ()


# ----------------------------------------------------------------------------- labels at search
class AccessLabels:
    """Each row's readers, for masks: a row whose file has no groups is public. Rows are
    told apart by their ``source`` column (the index's typed filter columns)."""

    def __init__(self, columns: MetadataColumns, file_groups: Mapping[str, Sequence[str]]):
        labelled = {s: g for s, g in file_groups.items() if g}
        self._public = ~columns.rows_with("source", labelled)
        self._by_group: dict[str, np.ndarray] = {}
        for group in sorted({g for groups in labelled.values() for g in groups}):
            readers = [s for s, groups in labelled.items() if group in groups]
            self._by_group[group] = columns.rows_with("source", readers)

    @property
    def labelled(self) -> bool:
        return bool(self._by_group)

    def known(self, groups: frozenset[str]) -> frozenset[str]:
        """Of ``groups``, those some row is labelled with (the others change nothing)."""
        return frozenset(groups & self._by_group.keys())

    def mask(self, groups: frozenset[str] | None) -> np.ndarray | None:
        """Rows ``groups`` may read; None when they may read every row (no access control
        for this request, or nothing labelled)."""
        if groups is None or not self._by_group:
            return None
        return self.rows_for(groups)

    def rows_for(self, groups: frozenset[str]) -> np.ndarray:
        """Rows ``groups`` may read."""
        visible = self._public.copy()
        for group in groups & self._by_group.keys():
            visible |= self._by_group[group]
        return visible


def type_told_by_hidden(kinds: Mapping[tuple[str, ...], set[str]]) -> str | None:
    """Who would learn of files they may not read from a field's type, or None.

    ``kinds``: the field's value types by the groups of the files holding them (() for
    everyone's files). Values of several types make a string field; a caller whose readable
    files hold numbers only (say) would find it typed string, which tells that other files
    exist. Each caller reads everyone's files and those of its groups: a caller with one
    group reads the least of any caller that has it, so checking those is enough.
    """
    every = set().union(*kinds.values())
    if len(every) < 2:
        return None
    public = kinds.get((), set())
    readers: dict[str, set[str]] = {"everyone": set(public)}
    for label, own in kinds.items():
        for group in label:
            readers.setdefault(f"group {group!r}", set(public)).update(own)
    for who, seen in readers.items():
        if len(seen) == 1 and seen != {"string"}:
            return who
    return None


def mixed_type_problem(field: str, kinds: Mapping[tuple[str, ...], set[str]]) -> str | None:
    """Why a field of several types cannot be one string field (see ``type_told_by_hidden``),
    for the ingest to refuse it; None when it can."""
    who = type_told_by_hidden(kinds)
    if who is None:
        return None
    held = "; ".join(
        f"{','.join(label) or 'everyone'}: {' and '.join(sorted(k))}"
        for label, k in sorted(kinds.items())
    )
    return (
        f"field {field!r} holds values of different types in files of different readers "
        f"({held}); as one string field its type would tell {who} that files it may not read "
        "exist. Give the field one type in every file, or another name where it differs. "
        "Nothing was written."
    )


def combined(*masks: np.ndarray | None) -> np.ndarray | None:
    """Rows every given mask keeps (None: no restriction)."""
    result = None
    for mask in masks:
        if mask is not None:
            result = mask if result is None else result & mask
    return result
