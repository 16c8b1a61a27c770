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
import itertools
import re
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ragchains.ingest.officezip import library_failure, open_office, safe_xml
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


@dataclass(frozen=True)
class _Merge:
    """A merged range (1-based, inclusive) and the value of its top-left cell."""

    min_row: int
    max_row: int
    min_col: int
    max_col: int
    value: Any


class _MergedCells:
    """Each merged cell's value, that of its range's top-left cell (openpyxl leaves the
    others empty), filled in row by row as the rows are read. A sweep over the ranges open at
    a row costs at most that row's width: a range over a whole sheet fills only the cells
    that are read, never a map of every cell it covers."""

    def __init__(self, sheet: Any) -> None:
        merges = []
        self.spanning_rows: set[int] = set()  # rows where a range opens over several columns
        for merged in getattr(sheet, "merged_cells", None) or ():
            min_col, min_row, max_col, max_row = merged.bounds
            value = sheet.cell(row=min_row, column=min_col).value
            merges.append(_Merge(min_row, max_row, min_col, max_col, value))
            if max_col > min_col:
                self.spanning_rows.add(min_row)
        merges.sort(key=lambda m: m.min_row)
        self._pending = merges[::-1]  # by first row, the next to open last
        self._open: list[_Merge] = []

    def fill(self, number: int, values: list[Any]) -> None:
        """Rows must come in order: ``values`` of row ``number`` get their merged values."""
        while self._pending and self._pending[-1].min_row <= number:
            self._open.append(self._pending.pop())
        if not self._open:
            return
        self._open = [m for m in self._open if m.max_row >= number]
        for merge in self._open:
            for column in range(merge.min_col - 1, min(merge.max_col, len(values))):
                if values[column] is None:
                    values[column] = merge.value


def _column_names(header_rows: Sequence[Sequence[Any]]) -> list[str]:
    """One name per column: the header rows' words, top to bottom; a repeated name gets a
    number ("Price (2)"). Linear in the width: a sheet 16,384 columns wide whose header
    cells all read ``1`` is named in milliseconds."""
    width = max(len(row) for row in header_rows)
    names: list[str] = []
    taken: set[str] = set()
    repeats: dict[str, int] = {}
    for column in range(width):
        words: list[str] = []
        for row in header_rows:
            value = _value(row[column]) if column < len(row) else None
            text = _shown(value) if value is not None else ""
            if text and text not in words:
                words.append(text)
        name = base = " ".join(words) or f"column_{column + 1}"
        while name in taken:
            repeats[base] = repeats.get(base, 1) + 1
            name = f"{base} ({repeats[base]})"
        taken.add(name)
        names.append(name)
    return names


def _rows(sheet: Any, merged: _MergedCells) -> Iterator[tuple[int, list[Any], int]]:
    """Each row's cells, merged values filled in and empty cells at its end dropped, and how
    many cells hold a value of their own."""
    for number, row in enumerate(sheet.iter_rows(min_row=1, values_only=True), start=1):
        values = list(row)
        own = _filled(values)
        merged.fill(number, values)
        while values and _value(values[-1]) is None:
            values.pop()
        yield number, values, own


# A report's header row is found among its first rows with text: a title block ("Sales by
# region", "Fiscal year 2025") sits above the table, a cell per row.
HEADER_SEARCH_ROWS = 20
# Stacked header rows (a cell merged over columns heads the row below too) are bounded: a
# sheet whose every row has a merged cell is not one header.
MAX_HEADER_ROWS = 4


def _filled(values: Sequence[Any]) -> int:
    return sum(_value(v) is not None for v in values)


@dataclass
class SheetRows:
    """A sheet as read: its column names, then each row with a value as the row number the
    sheet shows and its cells (one per column, None where empty); ``title`` holds the lines
    of a title block above the table (a report's heading), if any."""

    columns: list[str]
    rows: list[tuple[int, list[Any]]]
    header_end: int  # the last header row
    cut_at: int | None = None  # the last row read, when ``budget`` stopped the reading
    title: list[tuple[int, str]] = field(default_factory=list)
    header_text: str = ""  # the header rows as written, a line each
    declared: int | None = None  # the rows the sheet's dimension record declares

    def shown(self) -> list[tuple[int, list[str]]]:
        """The rows as the sheet shows them ("" for an empty cell)."""
        return [(n, ["" if v is None else _shown(v) for v in cells]) for n, cells in self.rows]


def _line(values: Sequence[Any]) -> str:
    """A row as one line of text, a merged cell's value once."""
    shown = (_shown(v) for v in map(_value, values) if v is not None)
    return " ".join(dict.fromkeys(shown))


def _all_text(values: Sequence[Any]) -> bool:
    return all(isinstance(v, str) for v in map(_value, values) if v is not None)


def _header_start(first: list[tuple[int, list[Any], int]]) -> int:
    """Where the table starts among a sheet's first rows with text: rows above the first row
    with two cells or more of their own (merged cells filled in do not count) are a title
    block, unless no row has two."""
    return next((i for i, (_, _, own) in enumerate(first) if own >= 2), 0)


def sheet_rows(sheet: Any, options: LoadOptions, budget: int) -> SheetRows | None:
    """The header rows (a row with a cell merged over columns heads the row below too), then
    up to ``budget`` rows with a value; None for a sheet with no text. Rows with text above
    the header (a report's title block) are kept as ``title``."""
    declared = sheet.max_row
    if hasattr(sheet, "reset_dimensions"):
        # A streamed sheet reads no further than its dimension record says, and writers get
        # it wrong (a record of "A1" over a full sheet): read every row there is.
        sheet.reset_dimensions()
    merged = _MergedCells(sheet)
    rows = _rows(sheet, merged)
    first: list[tuple[int, list[Any], int]] = []
    for number, values, own in rows:
        if _filled(values):
            first.append((number, values, own))
            if len(first) >= HEADER_SEARCH_ROWS:
                break
    if not first:
        return None
    start = _header_start(first)
    title = [(number, _line(values)) for number, values, _ in first[:start]]
    header_rows: list[list[Any]] = []
    header_end = 0
    pending = first[start:]
    for index, (number, values, _) in enumerate(pending):
        header_rows.append(values)
        header_end = number
        below = pending[index + 1][1] if index + 1 < len(pending) else []
        if (
            number not in merged.spanning_rows
            or len(header_rows) >= MAX_HEADER_ROWS
            or not _all_text(below)  # a row with numbers or dates under it is data
        ):
            break
    table = SheetRows(_column_names(header_rows), [], header_end, title=title, declared=declared)
    table.header_text = "\n".join(_line(values) for values in header_rows)
    width = len(table.columns)
    body = (item for item in pending if item[0] > header_end)
    last_read = header_end
    for number, values, _ in itertools.chain(body, rows):
        if len(table.rows) >= budget:
            table.cut_at = last_read
            break
        last_read = number
        cells = [_value(v) for v in values]
        if any(v is not None for v in cells):
            if len(cells) > width:  # a row wider than its header: the extra columns get names
                table.columns.extend(f"column_{i + 1}" for i in range(width, len(cells)))
                width = len(cells)
            table.rows.append((number, cells + [None] * (width - len(cells))))
    for index, (number, cells) in enumerate(table.rows):
        if len(cells) < width:
            table.rows[index] = (number, cells + [None] * (width - len(cells)))
    return table


def _sheet_parts(sheet: Any, options: LoadOptions, budget: int, partial: list[str]) -> list[Part]:
    """The sheet's rows as parts, at most ``budget`` of them; a title block above the table,
    or a sheet that is only a header (a form, a note), as a text part of its own."""
    table = sheet_rows(sheet, options, budget)
    if table is None:
        partial.append(f"sheet {sheet.title!r} is empty")
        return []
    if table.cut_at is not None:
        total = max(table.declared or 0, table.cut_at + 1)
        partial.append(
            f"sheet {sheet.title!r}: kept rows {table.header_end + 1:,}-{table.cut_at:,} of "
            f"{total:,} (the cap is {options.max_sheet_rows:,} rows per workbook)"
        )
    anchor_sheet = quote(sheet.title, safe="")
    lines = list(table.title)
    if not table.rows:  # no rows under the header: its cells are the sheet's text
        lines.append((table.header_end, table.header_text))
    parts = []
    if lines:
        first = lines[0][0]
        parts.append(
            Part(
                text="\n".join(text for _, text in lines),
                row=first,
                anchor=f"sheet={anchor_sheet}&row={first}",
                sheet=sheet.title,
                section=sheet.title,
            )
        )
    if not table.rows:
        return parts
    records = [dict(zip(table.columns, cells, strict=True)) for _, cells in table.rows]
    display = [{col: _shown(v) for col, v in record.items() if v is not None} for record in records]
    numbers = [number for number, _ in table.rows]
    try:
        notes: list[str] = []
        rows = rows_to_parts(records, options, display=display, partial=notes)
        partial.extend(f"sheet {sheet.title!r}: {note}" for note in notes)
    except SkipFile as exc:
        partial.append(f"sheet {sheet.title!r}: {exc}")
        return parts
    for part in rows:
        assert part.row is not None  # rows_to_parts numbers its records from 1
        part.row = numbers[part.row - 1]
        part.sheet = sheet.title
        part.anchor = f"sheet={anchor_sheet}&row={part.row}"
        part.section = sheet.title
    return parts + rows


_FORMULA = re.compile(rb"<(?:\w+:)?f[\s>/]")


def _has_formulas(data: io.BytesIO) -> bool:
    """Whether any worksheet holds a formula, read as a stream (the check below loads the
    workbook a second time, which a sheet with none does not need)."""
    with zipfile.ZipFile(data) as archive:
        for entry in archive.infolist():
            if not entry.filename.startswith("xl/worksheets/"):
                continue
            with archive.open(entry) as stream:
                tail = b""
                while block := stream.read(1 << 20):
                    if _FORMULA.search(tail + block):
                        return True
                    tail = block[-16:]
    return False


def _unsaved_formulas(data: io.BytesIO, values: Any, sheet_names: Sequence[str]) -> dict[str, int]:
    """Per sheet, formula cells saved without a value (a file written by a program that does
    not calculate): their value cannot be known without recalculating, so they read empty."""
    import openpyxl

    if not _has_formulas(data):
        return {}
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


_EMPTY_SHEET = (
    b'<worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">'
    b"<sheetData/></worksheet>"
)


def _damaged_sheets_emptied(data: io.BytesIO, damaged: list[str]) -> io.BytesIO:
    """The archive again, each worksheet part that fails its CRC (or cannot be inflated)
    replaced by an empty sheet, its name added to ``damaged``."""
    out = io.BytesIO()
    with zipfile.ZipFile(data) as archive, zipfile.ZipFile(out, "w") as repaired:
        for entry in archive.infolist():
            try:
                content = archive.read(entry)
            except (zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
                if not entry.filename.startswith("xl/worksheets/"):
                    raise
                damaged.append(f"{entry.filename} is damaged ({exc}): its sheet reads empty")
                content = _EMPTY_SHEET
            repaired.writestr(entry.filename, content, zipfile.ZIP_DEFLATED)
    out.seek(0)
    return out


def open_workbook(path: Path, *, repair: list[str] | None = None) -> tuple[Any, io.BytesIO, bool]:
    """The workbook with the values Excel saved, its bytes, and whether it is streamed
    (openpyxl's read-only mode, for sheets over ``FULL_LOAD_BYTES``: close it after).
    ``repair``: first empty the damaged worksheet parts, saying which in that list."""
    import openpyxl

    data = open_office(path, "Excel", "xl")
    if repair is not None:
        data = _damaged_sheets_emptied(data, repair)
    with zipfile.ZipFile(data) as archive:
        sheet_bytes = sum(
            e.file_size for e in archive.infolist() if e.filename.startswith("xl/worksheets/")
        )
    streamed = sheet_bytes > FULL_LOAD_BYTES
    book = openpyxl.load_workbook(data, read_only=streamed, data_only=True, keep_links=False)
    return book, data, streamed


_A = "{http://schemas.openxmlformats.org/drawingml/2006/main}"


def _text_boxes(data: io.BytesIO) -> list[str]:
    """The paragraphs of the text boxes and shapes drawn over the sheets (xl/drawings/),
    which openpyxl does not read."""
    lines: list[str] = []
    with zipfile.ZipFile(data) as archive:
        for entry in archive.infolist():
            name = entry.filename
            if not (name.startswith("xl/drawings/") and name.endswith(".xml")):
                continue
            root = safe_xml(archive.read(entry))
            for paragraph in root.iter(f"{_A}p"):
                text = " ".join("".join(t.text or "" for t in paragraph.iter(f"{_A}t")).split())
                if text:
                    lines.append(text)
    return lines


# Header and footer codes: &P page number, &"Arial,Bold" font, &12 size, &U underline...
_HF_CODE = re.compile(r'&(?:"[^"]*"|\d+|[A-Za-z])')


def _headers_and_footers(sheet: Any) -> list[str]:
    """A sheet's printed headers and footers (left, centre, right), each text once."""
    found: list[str] = []
    for attribute in ("oddHeader", "oddFooter", "evenHeader", "evenFooter", "firstHeader",
                      "firstFooter"):  # fmt: skip
        block = getattr(sheet, attribute, None)
        for side in ("left", "center", "right"):
            text = getattr(getattr(block, side, None), "text", None)
            text = " ".join(_HF_CODE.sub(" ", text).replace("&&", "&").split()) if text else ""
            if text and text not in found:
                found.append(text)
    return found


def _comments(sheet: Any) -> list[str]:
    lines = []
    for row in sheet.iter_rows():
        for cell in row:
            comment = getattr(cell, "comment", None)
            text = " ".join(comment.text.split()) if comment is not None and comment.text else ""
            if text:
                lines.append(f"Comment on {cell.coordinate}: {text}")
    return lines


def _workbook_notes(
    book: Any, data: io.BytesIO, streamed: bool, options: LoadOptions
) -> list[Part]:
    """Text outside the cells, a part each: headers and footers (not known to a streamed
    workbook), text boxes, and cell comments when notes are asked for (as Word comments)."""
    parts = []
    visible = [sheet for sheet in book.worksheets if sheet.sheet_state == "visible"]
    if not streamed:
        lines = [line for sheet in visible for line in _headers_and_footers(sheet)]
        if lines:
            parts.append(Part(text="\n".join(lines), section="Headers and footers"))
        if options.include_notes:
            lines = [line for sheet in visible for line in _comments(sheet)]
            if lines:
                parts.append(Part(text="\n".join(lines), section="Comments", anchor="comments"))
    boxes = _text_boxes(data)
    if boxes:
        parts.append(Part(text="\n".join(boxes), section="Text boxes"))
    return parts


def _read_sheets(
    book: Any, data: io.BytesIO, streamed: bool, options: LoadOptions, partial: list[str]
) -> list[Part]:
    """The visible sheets' parts, with what was left out of them in ``partial``."""
    parts: list[Part] = []
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
    return parts


def load_xlsx(path: Path, options: LoadOptions) -> LoadedFile:
    partial: list[str] = []
    try:
        try:
            book, data, streamed = open_workbook(path)
        except (zipfile.BadZipFile, EOFError):
            # A damaged worksheet part (a bad CRC) fails the whole workbook: read the others.
            book, data, streamed = open_workbook(path, repair=partial)
        try:
            title = book.properties.title
            parts = _read_sheets(book, data, streamed, options, partial)
            parts += _workbook_notes(book, data, streamed, options)
        finally:
            if streamed:
                book.close()
    except SkipFile:
        raise
    except Exception as exc:  # openpyxl raises many kinds on damaged XML
        raise library_failure("Excel", exc) from exc
    if not parts:
        looked = "; ".join(partial) or "no sheets"
        raise SkipFile(
            f"Excel workbook has no text (looked at the cells, headers, footers and text "
            f"boxes: {looked})"
        )
    return LoadedFile(format="xlsx", title=title or path.stem, parts=parts, partial=partial)
