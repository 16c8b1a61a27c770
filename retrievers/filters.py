"""Metadata filters: data (field, operator, value), validated against the index's field types.

Filters are never code or query strings: each one is checked against the schema recorded in the
index manifest, then evaluated as a boolean mask over typed in-memory columns. Both retrievers
apply the same mask *before* ranking, so fusion only ever sees rows that pass.
"""

from __future__ import annotations

import fnmatch
import json
import re
import sys
from collections.abc import Callable, ItemsView, Iterable, Iterator, KeysView, Mapping, Sequence
from typing import Annotated, Any, Literal, get_args

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

FieldType = Literal["string", "number", "boolean"]
Operator = Literal["=", "!=", "<", "<=", ">", ">=", "in"]
Scalar = str | float | int | bool

OPERATORS: tuple[str, ...] = get_args(Operator)
OPERATORS_BY_TYPE: dict[str, tuple[str, ...]] = {
    "number": OPERATORS,
    "string": ("=", "!=", "in"),
    "boolean": ("=", "!="),
}
# Fields whose "=" and "!=" take shell-style globs ("*.pdf", "handbook-*").
GLOB_FIELDS = frozenset({"filename", "source"})
_GLOB_CHARS = set("*?[")

# What one request may ask for: bounds that keep checking and applying filters quick (a
# request is refused with the reason before any work) and keep request values from growing
# the process's memory (compiled globs are cached by the re module, 512 at most).
MAX_FILTERS = 16
MAX_IN_VALUES = 1000
MAX_VALUE_CHARS = 1000
MAX_GLOB_CHARS = 256
# Globs in one request, over all its filters. An exact value is one dictionary lookup; a glob
# is a regular expression compiled and tried against every distinct value of its field, so
# 16 lists of 1,000 took 12-16 s over 2,000 files and held the search pool meanwhile (issue
# 30). At 16, a request's globs cost about what its search does there (64 cost 40 ms, 6x
# a search); longer enumerations of names are what ``in`` with exact values is for.
MAX_GLOBS = 16
MAX_FIELD_CHARS = 64

Text = Annotated[str, StringConstraints(max_length=MAX_VALUE_CHARS)]
FilterScalar = Text | float | int | bool


# Fields every chunk can be filtered on, whatever its format (every caller is told of them:
# whether some file has pages says nothing of who may read it).
BASE_FIELDS: dict[str, str] = {
    "source": "string",
    "filename": "string",
    "format": "string",
    "title": "string",
    "section": "string",
    "page": "number",
    "row": "number",
}


class FilterError(ValueError):
    """A filter that does not fit the index: unknown field, wrong operator or wrong value type."""


class MetadataFilter(BaseModel):
    """One condition; a list of them is combined with AND."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    field: str = Field(min_length=1, max_length=MAX_FIELD_CHARS)
    op: Operator
    value: FilterScalar | Annotated[list[FilterScalar], Field(max_length=MAX_IN_VALUES)]

    def __str__(self) -> str:
        return f"{self.field} {self.op} {json.dumps(self.value)}"

    def short(self) -> str:
        """The filter as an error message names it: a long list by its first values, a
        long value cut short."""
        if isinstance(self.value, list) and len(self.value) > 3:
            shown = ", ".join(json.dumps(v) for v in self.value[:3])
            text = f"{self.field} {self.op} [{shown}, ... ({len(self.value)} values)]"
        else:
            text = str(self)
        return text if len(text) <= 160 else f"{text[:157]}..."


def _scalar_problem(field_type: str, value: Any) -> str | None:
    """What is wrong with ``value`` for a field of ``field_type``, or None."""
    if field_type == "number":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"expected a number, got {_shown(value)}"
        # A float's range, as the columns hold numbers (an integer of 400 digits is not one).
        if not -sys.float_info.max <= value <= sys.float_info.max:  # NaN is not within
            return f"expected a finite number, got {_shown(value)}"
        return None
    if field_type == "boolean":
        return None if isinstance(value, bool) else f"expected true or false, got {_shown(value)}"
    return None if isinstance(value, str) else f"expected a string, got {_shown(value)}"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _check_values(flt: MetadataFilter, field_type: str) -> None:
    """The filter's value(s) checked against the field's type in one pass; the filter is
    formatted only for the error. (The sizes of lists and values are MetadataFilter's
    own bounds, checked when it was made.)"""
    values = _values(flt)
    if flt.op == "in":
        if not isinstance(flt.value, list) or not flt.value:
            raise FilterError(f"filter {flt.short()}: 'in' takes a non-empty list of values")
    elif isinstance(flt.value, list):
        raise FilterError(f"filter {flt.short()}: only 'in' takes a list")
    for value in values:
        problem = _scalar_problem(field_type, value)
        if problem is not None:
            raise FilterError(f"filter {flt.short()}: {problem}")
        if is_glob(flt.field, value) and len(str(value)) > MAX_GLOB_CHARS:
            raise FilterError(
                f"filter {flt.field} {flt.op} {_shown(value)}: a pattern has "
                f"{len(str(value))} characters; the limit is {MAX_GLOB_CHARS}"
            )


def is_glob(field: str, value: Any) -> bool:
    """Whether ``value`` is a shell-style pattern for ``field`` (only GLOB_FIELDS take them),
    as every store matches it."""
    return field in GLOB_FIELDS and isinstance(value, str) and not _GLOB_CHARS.isdisjoint(value)


def validate_filters(
    filters: Iterable[MetadataFilter | Mapping[str, Any]] | None,
    schema: Mapping[str, str],
) -> list[MetadataFilter]:
    """Check each filter against the index's field types; raise FilterError naming the problem."""
    checked: list[MetadataFilter] = []
    given = list(filters or ())
    if len(given) > MAX_FILTERS:
        raise FilterError(f"{len(given)} filters; the limit is {MAX_FILTERS}")
    globs = 0
    for raw in given:
        if isinstance(raw, MetadataFilter):
            flt = raw
        else:
            try:
                flt = MetadataFilter.model_validate(raw)
            except Exception as exc:  # pydantic's message lists what is missing or wrong
                raise FilterError(
                    f"malformed filter {_shown(raw)}: expected {{field, op, value}} with op "
                    f"one of {', '.join(OPERATORS)}, a field name of at most "
                    f"{MAX_FIELD_CHARS} characters, values of at most {MAX_VALUE_CHARS} "
                    f"characters and at most {MAX_IN_VALUES} values in a list"
                ) from exc
        field_type = schema.get(flt.field)
        if field_type is None:
            known = ", ".join(sorted(schema)) or "(none)"
            raise FilterError(f"unknown filter field {_shown(flt.field)}; known fields: {known}")
        allowed = OPERATORS_BY_TYPE[field_type]
        if flt.op not in allowed:
            raise FilterError(
                f"operator {flt.op!r} does not apply to {field_type} field {flt.field!r} "
                f"(use one of: {', '.join(allowed)})"
            )
        _check_values(flt, field_type)
        globs += sum(is_glob(flt.field, v) for v in _values(flt))
        if globs > MAX_GLOBS:
            raise FilterError(
                f"more than {MAX_GLOBS} glob patterns (filename or source values with *, ? "
                f"or [) in one request; the limit is {MAX_GLOBS}: list exact names with 'in' "
                "instead"
            )
        checked.append(flt)
    return checked


def regex_escape(char: str) -> str:
    """``char`` as a regular expression matches it, in Python's ``re`` and PostgreSQL's
    alike (a ``\\u`` escape: nothing in it is special to either)."""
    code = ord(char)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def bracket_ranges(stuff: str) -> list[tuple[str, str]]:
    """The characters of a glob's ``[...]`` as ranges, as fnmatch reads them: ``a-c`` is a
    range (dropped when reversed), a ``-`` first or last is itself."""
    ranges: list[tuple[str, str]] = []
    k = 0
    while k < len(stuff):
        if k + 2 < len(stuff) and stuff[k + 1] == "-":
            low, high = stuff[k], stuff[k + 2]
            if low <= high:
                ranges.append((low, high))
            k += 3
        else:
            ranges.append((stuff[k], stuff[k]))
            k += 1
    return ranges


def _values(flt: MetadataFilter) -> list[FilterScalar]:
    return flt.value if isinstance(flt.value, list) else [flt.value]


def filters_schema(fields: Mapping[str, str]) -> dict[str, Any]:
    """The JSON Schema of a filter as ``validate_filters`` accepts it over an index with
    ``fields`` (the server's API document): a field it has, an operator for the field's
    type, values of that type (a list for ``in``). One rule it cannot state: at most
    ``MAX_GLOBS`` patterns in all a request's filters (it states it per list)."""
    by_type: dict[str, list[str]] = {}
    for field, kind in fields.items():
        by_type.setdefault(kind, []).append(field)
    text: dict[str, Any] = {"type": "string", "maxLength": MAX_VALUE_CHARS}
    # A pattern (a value with *, ? or [) has a length limit of its own.
    globbed = {**text, "anyOf": [{"pattern": r"^[^*?\[]*$"}, {"maxLength": MAX_GLOB_CHARS}]}
    # The columns hold numbers as floats: _scalar_problem refuses what does not fit one.
    finite = {"minimum": -sys.float_info.max, "maximum": sys.float_info.max}
    values: dict[str, dict[str, Any]] = {
        "number": {"type": "number", **finite},
        "boolean": {"type": "boolean"},
        "string": text,
    }
    groups: list[tuple[str, list[str], dict[str, Any]]] = []
    for kind, names in sorted(by_type.items()):
        if kind == "string":  # shell-style patterns have a length limit of their own
            groups.append((kind, sorted(set(names) & GLOB_FIELDS), globbed))
            groups.append((kind, sorted(set(names) - GLOB_FIELDS), text))
        else:
            groups.append((kind, sorted(names), values[kind]))
    alternatives = []
    for kind, names, value in groups:
        if not names:
            continue
        ops = [op for op in OPERATORS_BY_TYPE[kind] if op != "in"]
        alternatives.append(_filter(names, {"enum": ops}, value))
        if "in" in OPERATORS_BY_TYPE[kind]:
            listed = {"type": "array", "minItems": 1, "maxItems": MAX_IN_VALUES, "items": value}
            if value is globbed:  # at most MAX_GLOBS patterns in a request, so in a list
                listed.update(contains=_A_GLOB, minContains=0, maxContains=MAX_GLOBS)
            alternatives.append(_filter(names, {"const": "in"}, listed))
    return {
        "title": "MetadataFilter",
        "description": "One condition on a field of the index; a list of them is combined "
        f"with AND. Filenames and sources take shell-style patterns (*, ?, [...]), at most "
        f"{MAX_GLOBS} in all the filters of a request.",
        "anyOf": alternatives,
    }


_A_GLOB = {"type": "string", "pattern": r"[*?\[]"}


def _filter(names: list[str], op: dict[str, Any], value: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["field", "op", "value"],
        "properties": {"field": {"type": "string", "enum": names}, "op": op, "value": value},
    }


def parse_cli_value(field: str, op: str, raw: str, schema: Mapping[str, str]) -> Any:
    """Turn the text of ``--filter FIELD OP VALUE`` into a value of the field's type.

    ``in`` takes a JSON list or comma-separated values. Text that does not parse as the
    field's type is left as text, so validation reports the mismatch with the field named.
    """
    field_type = schema.get(field)
    if op == "in":
        stripped = raw.strip()
        if stripped.startswith("["):
            try:
                return json.loads(stripped)
            except json.JSONDecodeError as exc:
                raise FilterError(f"filter {field} in {raw}: not a valid JSON list") from exc
        return [_parse_scalar(part.strip(), field_type) for part in raw.split(",") if part.strip()]
    return _parse_scalar(raw, field_type)


def _parse_scalar(raw: str, field_type: str | None) -> Any:
    if field_type == "number":
        try:
            number = float(raw)
        except ValueError:
            return raw
        return int(number) if number.is_integer() and "." not in raw else number
    if field_type == "boolean":
        lowered = raw.strip().lower()
        if lowered in ("true", "yes", "1"):
            return True
        if lowered in ("false", "no", "0"):
            return False
    return raw


class MetadataColumns:
    """Typed columns over every chunk's metadata, for vectorised filter masks.

    Strings are dictionary-encoded (int32 codes, -1 = missing), numbers are float64 (NaN =
    missing), booleans int8 (-1 = missing). A missing value never matches, as NULL in SQL.
    """

    def __init__(self, rows: Sequence[Mapping[str, Any]], schema: Mapping[str, str]) -> None:
        self.schema = dict(schema)
        self.size = len(rows)
        self._numbers: dict[str, np.ndarray] = {}
        self._codes: dict[str, np.ndarray] = {}
        self._vocab: dict[str, dict[str, int]] = {}
        for field, field_type in schema.items():
            values = [row.get(field) for row in rows]
            if field_type == "number":
                self._numbers[field] = np.array(
                    [float(v) if v is not None else np.nan for v in values], dtype=np.float64
                )
            elif field_type == "boolean":
                self._codes[field] = np.array(
                    [-1 if v is None else int(bool(v)) for v in values], dtype=np.int8
                )
            else:
                vocab: dict[str, int] = {}
                codes = np.full(len(values), -1, dtype=np.int32)
                for i, v in enumerate(values):
                    if v is not None:
                        codes[i] = vocab.setdefault(str(v), len(vocab))
                self._codes[field] = codes
                self._vocab[field] = vocab

    def rows_with(self, field: str, values: Iterable[str]) -> np.ndarray:
        """Rows whose (string) ``field`` holds one of ``values``."""
        vocab = self._vocab[field]
        codes = [vocab[v] for v in values if v in vocab]
        return np.isin(self._codes[field], np.array(codes, dtype=np.int32))

    def values(self, field: str) -> list[str]:
        """The distinct values of a (string) ``field``."""
        return list(self._vocab[field])

    def values_in(self, field: str, rows: np.ndarray) -> set[str]:
        """The distinct values a (string) ``field`` holds in ``rows`` (a boolean mask)."""
        names = list(self._vocab[field])  # in code order: a code is its value's position
        return {names[code] for code in np.unique(self._codes[field][rows]) if code >= 0}

    def present_in(self, rows: np.ndarray) -> list[str]:
        """The fields that have a value in at least one of ``rows`` (a boolean mask)."""
        present = []
        for field in self.schema:
            if field in self._numbers:
                held = ~np.isnan(self._numbers[field])
            else:
                held = self._codes[field] != -1
            if bool((held & rows).any()):
                present.append(field)
        return present

    def mask(self, filters: Sequence[MetadataFilter]) -> np.ndarray | None:
        """Boolean mask of rows passing every filter; None when there are no filters."""
        if not filters:
            return None
        result = np.ones(self.size, dtype=bool)
        for flt in filters:
            result &= self._mask_one(flt)
        return result

    def _mask_one(self, flt: MetadataFilter) -> np.ndarray:
        field_type = self.schema[flt.field]
        if field_type == "number":
            column = self._numbers[flt.field]
            present = ~np.isnan(column)
            if flt.op == "in":
                assert isinstance(flt.value, list)
                return present & np.isin(column, np.array(flt.value, dtype=np.float64))
            value = float(flt.value)  # type: ignore[arg-type]
            with np.errstate(invalid="ignore"):
                compare = {
                    "=": column == value,
                    "!=": column != value,
                    "<": column < value,
                    "<=": column <= value,
                    ">": column > value,
                    ">=": column >= value,
                }[flt.op]
            return present & compare
        codes = self._codes[flt.field]
        present = codes >= 0
        if field_type == "boolean":
            target = int(bool(flt.value))
            return present & ((codes == target) if flt.op == "=" else (codes != target))
        wanted = self._string_codes(flt)
        hit = np.isin(codes, wanted)
        return present & (~hit if flt.op == "!=" else hit)

    def _string_codes(self, flt: MetadataFilter) -> np.ndarray:
        vocab = self._vocab[flt.field]
        texts = [str(value) for value in _values(flt)]
        wanted = {vocab[t] for t in texts if t in vocab and not is_glob(flt.field, t)}
        # One expression for the list's patterns (as PostgreSQL gets them), each distinct
        # value tried once. Not fnmatch's own matcher: it keeps every pattern it compiles
        # (32,768); the re module keeps at most 512.
        globs = [fnmatch.translate(t) for t in dict.fromkeys(texts) if is_glob(flt.field, t)]
        if globs:
            match = re.compile("|".join(f"(?:{g})" for g in globs)).match
            wanted.update(i for v, i in vocab.items() if i not in wanted and match(v))
        return np.array(sorted(wanted), dtype=np.int32)


class LiveFields(Mapping[str, str]):
    """Metadata field types as a mapping that follows its source (``read`` gives them as
    they are now: an index that follows ingests, a store), for code that holds on to
    ``fields``: request validation, the rewriter's tools. Each whole-mapping read (items,
    a copy, a lookup) reads the source once, so it never mixes two versions."""

    def __init__(self, read: Callable[[], Mapping[str, str]]) -> None:
        self._read = read

    def __getitem__(self, key: str) -> str:
        return self._read()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._read()))

    def __len__(self) -> int:
        return len(self._read())

    def __contains__(self, key: object) -> bool:
        return key in self._read()

    def get(self, key: str, default: Any = None) -> Any:
        return self._read().get(key, default)

    def items(self) -> ItemsView[str, str]:
        return dict(self._read()).items()

    def keys(self) -> KeysView[str]:
        return dict(self._read()).keys()
