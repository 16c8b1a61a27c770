"""Filters and access compiled to PostgreSQL: validated ``MetadataFilter`` objects and the
caller's groups become a WHERE clause whose every value (and field name) is a bound parameter,
so nothing from a request or a model is ever part of the SQL text. Globs on
``filename``/``source`` become anchored regular expressions whose every literal character is a
``\\uXXXX`` escape, so ``%``, ``_``, ``\\`` and quotes match themselves.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from psycopg import sql

from ragchains.retrievers.filters import (
    FilterError,
    MetadataFilter,
    Scalar,
    bracket_ranges,
    is_glob,
    regex_escape,
    validate_filters,
)
from ragchains.retrievers.scope import DocumentScope

_NUMBER_OPS = {"<": "<", "<=": "<=", ">": ">", ">=": ">=", "=": "=", "!=": "<>"}


class Params:
    """Bound parameters of one statement; ``add`` returns the placeholder of a value."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def add(self, value: Any) -> sql.Placeholder:
        name = f"p{len(self.values)}"
        self.values[name] = value
        return sql.Placeholder(name)


# ----------------------------------------------------------------------------- globs
def glob_regex(pattern: str) -> str | None:
    """A PostgreSQL regular expression matching what ``fnmatch.fnmatchcase`` matches, or None
    when nothing can match (an empty ``[]`` set, or a NUL, which PostgreSQL text never holds)."""
    if "\x00" in pattern:
        return None
    out = ["^"]
    i, n = 0, len(pattern)
    while i < n:
        char = pattern[i]
        i += 1
        if char == "*":
            if out[-1] != ".*":
                out.append(".*")
        elif char == "?":
            out.append(".")
        elif char == "[":
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:  # no closing bracket: a literal "["
                out.append(regex_escape("["))
                continue
            stuff, i = pattern[i:j], j + 1
            negate = stuff.startswith("!")
            ranges = bracket_ranges(stuff[1:] if negate else stuff)
            if not ranges:
                if not negate:
                    return None
                out.append(".")
                continue
            body = "".join(
                regex_escape(low) if low == high else f"{regex_escape(low)}-{regex_escape(high)}"
                for low, high in ranges
            )
            out.append(f"[{'^' if negate else ''}{body}]")
        else:
            out.append(regex_escape(char))
    out.append("$")
    return "".join(out)


def any_of(regexes: Sequence[str]) -> str:
    """One regular expression matching what any of ``regexes`` (each anchored) matches."""
    return regexes[0] if len(regexes) == 1 else "|".join(f"(?:{r})" for r in regexes)


# ----------------------------------------------------------------------------- filters
def filter_sql(
    filters: Sequence[MetadataFilter], fields: dict[str, str], params: Params
) -> sql.Composable:
    """The WHERE condition (over ``c.metadata``) that keeps the rows passing every filter.

    A missing value never matches, as on disk (and as NULL in SQL)."""
    if not filters:
        return sql.SQL("TRUE")
    return sql.SQL(" AND ").join(
        sql.SQL("({})").format(_one(f, fields[f.field], params)) for f in filters
    )


def _contains(field: str, value: Scalar, params: Params) -> sql.Composable:
    # jsonb containment uses the GIN index on metadata.
    return sql.SQL("c.metadata @> {}::jsonb").format(params.add(_json({field: value})))


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _one(flt: MetadataFilter, kind: str, params: Params) -> sql.Composable:
    name = params.add(flt.field)
    values = flt.value if isinstance(flt.value, list) else [flt.value]
    typed = sql.SQL("jsonb_typeof(c.metadata -> {}) = {}").format(name, sql.Literal(kind))
    if kind == "number":
        number = sql.SQL(
            "(CASE WHEN jsonb_typeof(c.metadata -> {n}) = 'number' "
            "THEN (c.metadata ->> {n})::float8 END)"
        ).format(n=name)
        if flt.op == "in":
            wanted = params.add([float(v) for v in values])  # type: ignore[arg-type]
            return sql.SQL("{} = ANY({}::float8[])").format(number, wanted)
        if flt.op == "=":
            return _contains(flt.field, values[0], params)
        value = params.add(float(values[0]))  # type: ignore[arg-type]
        return sql.SQL("{} {} {}::float8").format(number, sql.SQL(_NUMBER_OPS[flt.op]), value)
    if kind == "boolean":
        same = _contains(flt.field, values[0], params)
        return same if flt.op == "=" else sql.SQL("{} AND NOT {}").format(typed, same)
    # Strings: literal values by equality, globs by regular expression.
    text = sql.SQL("(c.metadata ->> {})").format(name)
    literals = [str(v) for v in values if not is_glob(flt.field, v) and "\x00" not in str(v)]
    patterns = [glob_regex(str(v)) for v in values if is_glob(flt.field, v)]
    regexes = [p for p in patterns if p is not None]
    if flt.op == "!=":
        if regexes:
            return sql.SQL("NOT ({} ~ {})").format(text, params.add(regexes[0]))
        if literals:
            return sql.SQL("{} <> {}").format(text, params.add(literals[0]))
        return sql.SQL("{} IS NOT NULL").format(text)  # a value no stored string can equal
    found: list[sql.Composable] = []
    if flt.op == "=" and len(literals) == 1:
        found.append(_contains(flt.field, literals[0], params))
    elif literals:
        found.append(sql.SQL("{} = ANY({}::text[])").format(text, params.add(literals)))
    if regexes:
        # One expression for the whole list: one match per row, not one per pattern as
        # ``~ ANY`` would make (the in-memory columns match a list the same way).
        found.append(sql.SQL("{} ~ {}").format(text, params.add(any_of(regexes))))
    if not found:
        return sql.SQL("FALSE")
    return sql.SQL(" OR ").join(found)


def readable_sql(groups: frozenset[str] | None, params: Params) -> sql.Composable:
    """A WHERE term keeping the chunks ``groups`` may read (their file has no groups, or
    shares one with them); TRUE without access control. Applied inside both halves, like a
    filter no request can widen."""
    if groups is None:
        return sql.SQL("TRUE")
    return sql.SQL("(cardinality(c.access) = 0 OR c.access && {}::text[])").format(
        params.add(sorted(groups))
    )


def scope_sql(
    scope: DocumentScope | None, fields: dict[str, str], params: Params
) -> sql.Composable:
    """A WHERE term keeping the chunks within a domain's ``scope`` (see
    ``retrievers.scope``): a source matching one of its paths, every one of its filters
    passed; a filter the store's ``fields`` cannot take keeps nothing, as on disk. TRUE
    without a scope."""
    if scope is None or scope.everything:
        return sql.SQL("TRUE")
    terms: list[sql.Composable] = []
    if scope.source_regex is not None:
        terms.append(
            sql.SQL("(c.metadata ->> {}) ~ {}").format(
                params.add("source"), params.add(scope.source_regex)
            )
        )
    for flt in scope.filters:
        try:
            (checked,) = validate_filters([flt], fields)
        except FilterError:
            return sql.SQL("FALSE")
        terms.append(sql.SQL("({})").format(_one(checked, fields[checked.field], params)))
    return sql.SQL(" AND ").join(terms)
