"""Excel workbooks (.xlsx, openpyxl): each visible sheet's rows become parts exactly as CSV
rows do (``ingest.tables.rows_to_parts``: typed columns are filterable metadata), cited as
``prices.xlsx#sheet=EU&row=12`` with the row number the sheet shows.

Formulas give the value Excel saved with the file (openpyxl's ``data_only``); nothing is
recalculated, no macro runs and no external link is followed. Cells merged over several
columns in a header row head the columns under them ("Price EU", "Price US"); cells merged
down a column repeat in each row, so every row reads whole. Hidden and empty sheets are
left out and reported, and so are rows past ``LoadOptions.max_sheet_rows``.
"""

from __future__ import annotations

import datetime as dt
import io
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ragchains.ingest.officezip import library_failure, open_office
from ragchains.ingest.parts import LoadedFile, LoadOptions, Part, SkipFile
from ragchains.ingest.tables import rows_to_parts

# Worksheets whose XML unzips to more than this are streamed (openpyxl's read-only mode),
# which does not know merged cells: a workbook that large is data, not a formatted report.
FULL_LOAD_BYTES = 32 * 1024 * 1024


def _value(value: Any) -> Any:
    if isinstance(value, str):
        return value.strip() or None
    if isinstance(value, dt.datetime):
        return value.date().isoformat() if value.time() == dt.time() else value.isoformat()
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return str(value)
    return value


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


def _merged_values(sheet: Any, max_rows: int) -> dict[tuple[int, int], Any]:
    """Each merged cell's value, that of the range's top-left cell (openpyxl leaves the
    others empty). Bounded: a range over a whole sheet fills only the rows that are read."""
    filled: dict[tuple[int, int], Any] = {}
    for merged in getattr(sheet, "merged_cells", None) or ():
        rng = merged.bounds  # min_col, min_row, max_col, max_row
        value = sheet.cell(row=rng[1], column=rng[0]).value
        for row in range(rng[1], min(rng[3], rng[1] + max_rows) + 1):
            for column in range(rng[0], rng[2] + 1):
                filled[(row, column)] = value
    return filled


def _spans_columns(sheet: Any, row: int) -> bool:
    """Whether a header row has a cell merged over columns: a group over the row below."""
    return any(
        merged.min_row == row and merged.max_col > merged.min_col
        for merged in getattr(sheet, "merged_cells", None) or ()
    )


def _column_names(header_rows: Sequence[Sequence[Any]]) -> list[str]:
    width = max(len(row) for row in header_rows)
    names: list[str] = []
    for column in range(width):
        words: list[str] = []
        for row in header_rows:
            value = _value(row[column]) if column < len(row) else None
            text = _shown(value) if value is not None else ""
            if text and text not in words:
                words.append(text)
        name = " ".join(words) or f"column_{column + 1}"
        base, repeat = name, 2
        while name in names:
            name = f"{base} ({repeat})"
            repeat += 1
        names.append(name)
    return names


def _rows(sheet: Any, merged: dict[tuple[int, int], Any]) -> Iterator[tuple[int, list[Any]]]:
    for number, row in enumerate(sheet.iter_rows(min_row=1, values_only=True), start=1):
        values = list(row)
        if merged:
            for column in range(len(values)):
                if values[column] is None and (number, column + 1) in merged:
                    values[column] = merged[(number, column + 1)]
        yield number, values


@dataclass
class SheetRows:
    """A sheet as read: its column names, then each row with a value as the row number the
    sheet shows and its cells (one per column, None where empty)."""

    columns: list[str]
    rows: list[tuple[int, list[Any]]]
    header_end: int  # the last header row
    cut_at: int | None = None  # the last row read, when ``budget`` stopped the reading

    def shown(self) -> list[tuple[int, list[str]]]:
        """The rows as the sheet shows them ("" for an empty cell)."""
        return [(n, ["" if v is None else _shown(v) for v in cells]) for n, cells in self.rows]


def sheet_rows(sheet: Any, options: LoadOptions, budget: int) -> SheetRows | None:
    """The header rows (a row with a cell merged over columns heads the row below too), then
    up to ``budget`` rows with a value; None for a sheet with no header."""
    merged = _merged_values(sheet, options.max_sheet_rows)
    rows = _rows(sheet, merged)
    header_rows: list[list[Any]] = []
    header_end = 0
    for number, values in rows:
        if not any(_value(v) is not None for v in values):
            continue
        header_rows.append(values)
        header_end = number
        if not _spans_columns(sheet, number):
            break
    if not header_rows:
        return None
    table = SheetRows(_column_names(header_rows), [], header_end)
    last_read = header_end
    for number, values in rows:
        if len(table.rows) >= budget:
            table.cut_at = last_read
            break
        last_read = number
        cells = [_value(v) for v in values]
        if any(v is not None for v in cells):
            table.rows.append(
                (number, [cells[i] if i < len(cells) else None for i in range(len(table.columns))])
            )
    return table


def _sheet_parts(sheet: Any, options: LoadOptions, budget: int, partial: list[str]) -> list[Part]:
    """The sheet's rows as parts, at most ``budget`` of them."""
    table = sheet_rows(sheet, options, budget)
    if table is None:
        partial.append(f"sheet {sheet.title!r} is empty")
        return []
    if table.cut_at is not None:
        total = sheet.max_row or table.cut_at + 1
        partial.append(
            f"sheet {sheet.title!r}: kept rows {table.header_end + 1:,}-{table.cut_at:,} of "
            f"{total:,} (the cap is {options.max_sheet_rows:,} rows per workbook)"
        )
    records = [dict(zip(table.columns, cells, strict=True)) for _, cells in table.rows]
    display = [{col: _shown(v) for col, v in record.items() if v is not None} for record in records]
    numbers = [number for number, _ in table.rows]
    if not records:
        partial.append(f"sheet {sheet.title!r} has a header but no rows")
        return []
    try:
        parts = rows_to_parts(records, options, display=display)
    except SkipFile as exc:
        partial.append(f"sheet {sheet.title!r}: {exc}")
        return []
    anchor_sheet = quote(sheet.title, safe="")
    for part in parts:
        assert part.row is not None  # rows_to_parts numbers its records from 1
        part.row = numbers[part.row - 1]
        part.sheet = sheet.title
        part.anchor = f"sheet={anchor_sheet}&row={part.row}"
        part.section = sheet.title
    return parts


def _unsaved_formulas(data: io.BytesIO, values: Any, sheet_names: Sequence[str]) -> dict[str, int]:
    """Per sheet, formula cells saved without a value (a file written by a program that does
    not calculate): their value cannot be known without recalculating, so they read empty."""
    import openpyxl

    formulas = openpyxl.load_workbook(data, data_only=False, keep_links=False)
    found = {}
    for name in sheet_names:
        count = 0
        for row in formulas[name].iter_rows():
            for cell in row:
                if cell.data_type == "f":
                    saved = values[name].cell(row=cell.row, column=cell.column).value
                    count += saved is None
        if count:
            found[name] = count
    return found


def open_workbook(path: Path) -> tuple[Any, io.BytesIO, bool]:
    """The workbook with the values Excel saved, its bytes, and whether it is streamed
    (openpyxl's read-only mode, for sheets over ``FULL_LOAD_BYTES``: close it after)."""
    import openpyxl

    data = open_office(path, "Excel", "xl")
    with zipfile.ZipFile(data) as archive:
        sheet_bytes = sum(
            e.file_size for e in archive.infolist() if e.filename.startswith("xl/worksheets/")
        )
    streamed = sheet_bytes > FULL_LOAD_BYTES
    book = openpyxl.load_workbook(data, read_only=streamed, data_only=True, keep_links=False)
    return book, data, streamed


def load_xlsx(path: Path, options: LoadOptions) -> LoadedFile:
    partial: list[str] = []
    parts: list[Part] = []
    try:
        book, data, streamed = open_workbook(path)
        title = book.properties.title
        for sheet in book.worksheets:
            if sheet.sheet_state != "visible":
                partial.append(f"sheet {sheet.title!r} is hidden: left out")
                continue
            budget = options.max_sheet_rows - len(parts)
            if budget <= 0:
                partial.append(
                    f"sheet {sheet.title!r} left out: the cap of {options.max_sheet_rows:,} "
                    "rows per workbook was reached"
                )
                continue
            parts.extend(_sheet_parts(sheet, options, budget, partial))
        if not streamed:
            shown = [sheet.title for sheet in book.worksheets if sheet.sheet_state == "visible"]
            for name, count in _unsaved_formulas(data, book, shown).items():
                partial.append(
                    f"sheet {name!r}: {count} formula cell(s) saved without a value read as "
                    "empty (open and save the file in Excel to store them)"
                )
        if streamed:
            book.close()
    except SkipFile:
        raise
    except Exception as exc:  # openpyxl raises many kinds on damaged XML
        raise library_failure("Excel", exc) from exc
    if not parts:
        reasons = "; ".join(partial) or "no sheets"
        raise SkipFile(f"Excel workbook has no rows with text ({reasons})")
    return LoadedFile(format="xlsx", title=title or path.stem, parts=parts, partial=partial)
