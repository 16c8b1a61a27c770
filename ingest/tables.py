"""Table loaders: each row of a CSV, JSON or JSON Lines file becomes a part of its own, its
columns typed (numbers, booleans, short strings) and kept as filterable metadata, the row
rendered as ``column: value`` lines for search.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ragchains.ingest.parts import LoadedFile, LoadOptions, Part, SkipFile, read_text

# Metadata keys an ingest run sets itself; table columns with these names are renamed col_<name>.
RESERVED_FIELDS = frozenset(
    {
        "source",
        "filename",
        "format",
        "title",
        "section",
        "page",
        "row",
        "slide",
        "sheet",
        "location",
        "ocr_confidence",
        "ocr_low_confidence",
        "citation",
        "chunk_id",
        "chunk_index",
        "content_hash",
        "file_id",
    }
)


# String columns longer than this are prose, not something to filter on.
MAX_FILTERABLE_STRING = 100
# Filterable columns per table. Each chunk of a row carries its row's fields, so a sheet
# 16,384 columns wide would put 16,384 fields on every chunk of every row; columns past the
# cap are still read as text.
MAX_FIELD_COLUMNS = 64


_CURRENCY = re.compile(r"^[$€£¥]\s*")


# ----------------------------------------------------------------------------- table rows
def _flatten(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, prefix=f"{name}."))
        else:
            flat[name] = value
    return flat


def _parse_cell(text: str) -> Any:
    """A CSV cell as bool, number or string; '$45.00' and '1,200' count as numbers."""
    stripped = text.strip()
    if not stripped:
        return None
    lowered = stripped.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    candidate = _CURRENCY.sub("", stripped).replace(",", "")
    try:
        number = float(candidate)
    except ValueError:
        return stripped
    if number != number or number in (float("inf"), float("-inf")):
        return stripped
    return int(number) if number.is_integer() and "." not in candidate else number


def _column_types(records: Sequence[Mapping[str, Any]]) -> dict[str, str | None]:
    """One type per column; columns mixing types, or holding long prose, are not filterable."""
    types: dict[str, str | None] = {}
    for record in records:
        for key, value in record.items():
            if value is None:
                types.setdefault(key, "unset")
                continue
            if isinstance(value, bool):
                kind: str | None = "boolean"
            elif isinstance(value, int | float):
                kind = "number"
            elif isinstance(value, str):
                kind = "string" if len(value) <= MAX_FILTERABLE_STRING else None
            else:
                kind = None  # lists and the like go to the text only
            previous = types.get(key, "unset")
            if previous == "unset":
                types[key] = kind
            elif previous != kind:
                # Mixed numbers and text (e.g. "n/a" in a price column): treat as text.
                scalar = {previous, kind} <= {"number", "string", "boolean"}
                types[key] = "string" if scalar else None
    return {k: (None if v == "unset" else v) for k, v in types.items()}


def _render_value(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(_render_value(v) for v in value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def rows_to_parts(
    records: Sequence[Mapping[str, Any]],
    options: LoadOptions,
    *,
    display: Sequence[Mapping[str, str]] | None = None,
    partial: list[str] | None = None,
) -> list[Part]:
    """One part per row: text from the text columns, typed metadata from the rest (the
    first ``MAX_FIELD_COLUMNS`` that have a type; ``partial`` is told of the others).

    ``display`` holds each cell as written (CSV), so the text says "$45.00", not "45.0".
    """
    types = _column_types(records)
    columns = list(types)
    typed = [col for col in columns if types[col] is not None]
    if len(typed) > MAX_FIELD_COLUMNS:
        for col in typed[MAX_FIELD_COLUMNS:]:
            types[col] = None
        if partial is not None:
            partial.append(
                f"{len(typed) - MAX_FIELD_COLUMNS:,} columns after the first {MAX_FIELD_COLUMNS} "
                "typed ones are read as text, not kept as filterable fields"
            )
    text_columns = columns
    if options.text_columns:
        text_columns = [c for c in options.text_columns if c in types]
        if not text_columns:
            raise SkipFile(
                f"none of the text columns {', '.join(options.text_columns)} is in this table "
                f"(columns: {', '.join(columns)})"
            )
    parts = []
    for number, record in enumerate(records, start=1):
        shown = display[number - 1] if display is not None else None
        lines = [
            f"{col}: {shown[col] if shown is not None else _render_value(record[col])}"
            for col in text_columns
            if record.get(col) not in (None, "")
        ]
        if not lines:
            continue
        fields: dict[str, Any] = {}
        for col in columns:
            kind = types[col]
            value = record.get(col)
            if kind is None or value is None:
                continue
            key = f"col_{col}" if col in RESERVED_FIELDS else col
            fields[key] = str(value) if kind == "string" else value
        name = record.get("name") or record.get("title")
        parts.append(
            Part(
                text="\n".join(lines),
                row=number,
                anchor=f"row={number}",
                title=str(name) if name else None,
                fields=fields,
                splittable=False,
            )
        )
    if not parts:
        raise SkipFile("table has no rows with text")
    return parts


def csv_rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """A CSV or TSV file's column names and its rows with text, each cell as written (white
    space stripped): row N of the list is the record cited as ``#row=N+1``."""
    text = read_text(path)
    if path.suffix.lower() == ".tsv":
        dialect: Any = csv.excel_tab
    else:
        try:
            dialect = csv.Sniffer().sniff(text[:8192], delimiters=",;\t|")
        except csv.Error:
            dialect = csv.excel
    reader = csv.reader(io.StringIO(text), dialect)
    try:
        rows = list(reader)
    except csv.Error as exc:
        raise SkipFile(f"malformed CSV: {exc}") from exc
    if not rows or not any(cell.strip() for cell in rows[0]):
        raise SkipFile("CSV has no header row")
    header = [cell.strip() or f"column_{i + 1}" for i, cell in enumerate(rows[0])]
    if len(set(header)) != len(header):
        raise SkipFile(f"CSV header repeats a column name: {', '.join(header)}")
    display = [
        {col: cell.strip() for col, cell in zip(header, row, strict=False)}
        for row in rows[1:]
        if any(cell.strip() for cell in row)
    ]
    if not display:
        raise SkipFile("CSV has a header but no rows")
    return header, display


def load_csv(path: Path, options: LoadOptions) -> LoadedFile:
    _, display = csv_rows(path)
    records = [{col: _parse_cell(cell) for col, cell in row.items()} for row in display]
    partial: list[str] = []
    parts = rows_to_parts(records, options, display=display, partial=partial)
    return LoadedFile(format="csv", title=path.stem, parts=parts, partial=partial)


def _json_records(items: Iterable[Any], where: Callable[[int], str]) -> list[dict[str, Any]]:
    records = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise SkipFile(f"{where(i)} is not a JSON object")
        records.append(_flatten(item))
    return records


def json_records(path: Path) -> list[dict[str, Any]]:
    """A JSON or JSON Lines file's records, nested objects flattened (``a.b``): record N of
    the list is the one cited as ``#row=N+1``."""
    text = read_text(path)
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        items = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                items.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise SkipFile(f"line {number} is not valid JSON ({exc.msg})") from exc
        records = _json_records(items, lambda i: f"record {i + 1}")
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SkipFile(f"not valid JSON (line {exc.lineno}: {exc.msg})") from exc
        if isinstance(data, Mapping):
            lists = [v for v in data.values() if isinstance(v, list)]
            if len(lists) != 1:
                raise SkipFile("JSON must be an array of objects, or an object holding one array")
            data = lists[0]
        if not isinstance(data, list):
            raise SkipFile("JSON must be an array of objects")
        records = _json_records(data, lambda i: f"item {i + 1}")
    if not records:
        raise SkipFile("JSON holds no records")
    return records


def render_value(value: Any) -> str:
    """A JSON value as a row's text shows it (lists joined, booleans as yes/no)."""
    return _render_value(value)


def load_json(path: Path, options: LoadOptions) -> LoadedFile:
    records = json_records(path)
    partial: list[str] = []
    parts = rows_to_parts(records, options, partial=partial)
    return LoadedFile(format="json", title=path.stem, parts=parts, partial=partial)
