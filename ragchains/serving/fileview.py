"""What the chat page's viewer shows of an original file (``GET /files/{id}/view``), read
again from its stored bytes with the loaders the ingest used, so that a chunk's ``location``
points into what is shown: a text file's parts (the loader's ``Part.text``, which a chunk's
``start``/``end`` slice), a table's rows by the numbers its chunks cite, a PDF's or an
image's pages (never OCRed here: the boxes are in the chunks' metadata already). How a
format is shown is the ``view`` of its entry in ``retrievers.formats``.

Nothing here knows HTTP; ``serving.sourcefiles`` serves it.
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from ragchains.ingest import images, sheets
from ragchains.ingest.loaders import load_file
from ragchains.ingest.parts import LoadOptions
from ragchains.ingest.tables import csv_rows, json_records, render_value
from ragchains.retrievers.formats import view_of

PDF_PNG_DPI = 144.0  # a PDF page drawn as PNG: twice its size in points
# EXIF orientations that turn an image a quarter (its width and height swap).
_QUARTER_TURNS = frozenset({5, 6, 7, 8})


@dataclass
class Sheet:
    """A table's rows as the file shows them: column names, and (row number, cells)."""

    name: str | None
    columns: list[str]
    rows: list[tuple[int, list[str]]]

    def window(self, row: int | None, around: int) -> list[dict[str, Any]]:
        """The rows numbered ``row - around`` to ``row + around`` (those with text), or
        without ``row`` the first ``2 * around + 1``."""
        if row is None:
            picked = self.rows[: 2 * around + 1]
        else:
            picked = [r for r in self.rows if row - around <= r[0] <= row + around]
        return [{"row": number, "cells": cells} for number, cells in picked]


@dataclass
class FileView:
    """What the viewer needs of one file (the view JSON, less a table's window)."""

    file_id: str
    name: str
    source: str
    format: str
    title: str
    kind: str
    pages: int | None = None
    page_sizes: list[list[float]] | None = None
    parts: list[dict[str, Any]] | None = None
    sheets: list[Sheet] = field(default_factory=list)

    def body(self, *, row: int | None, sheet: str | None, around: int) -> dict[str, Any]:
        """The view JSON; for a table, the window of rows asked for (``KeyError`` for a
        sheet it does not have)."""
        body: dict[str, Any] = {
            "file_id": self.file_id,
            "name": self.name,
            "source": self.source,
            "format": self.format,
            "title": self.title,
            "kind": self.kind,
        }
        if self.kind in ("pdf", "image"):
            body["pages"] = self.pages
        if self.kind == "image":
            body["page_sizes"] = self.page_sizes
        if self.kind == "text":
            body["parts"] = self.parts
        if self.kind == "table":
            chosen = self.sheet(sheet)
            body["table"] = {
                "sheet": chosen.name,
                "sheets": [s.name for s in self.sheets if s.name is not None],
                "columns": chosen.columns,
                "rows": chosen.window(row, around),
                "total_rows": len(chosen.rows),
            }
        return body

    def sheet(self, name: str | None) -> Sheet:
        if name is None and self.sheets:
            return self.sheets[0]
        for found in self.sheets:
            if found.name == name:
                return found
        raise KeyError(name)


def build_view(
    file_id: str, source: str, file_format: str, data: bytes, options: LoadOptions
) -> FileView:
    """The view of a file from its bytes (``source``: its name in the index, whose suffix
    picks the loader; ``options``: those the ingest read it with). Raises ``SkipFile`` or
    the loaders' own errors for bytes they cannot read."""
    name = PurePosixPath(source).name
    kind = view_of(file_format)
    if kind is None:
        raise ValueError(f"no view for format {file_format!r}")
    view = FileView(file_id, name, source, file_format, PurePosixPath(name).stem, kind)
    if kind == "pdf":
        view.pages, view.title = _pdf_pages(data, view.title)
        return view
    if kind == "image":
        view.page_sizes = image_page_sizes(data)
        view.pages = len(view.page_sizes)
        return view
    # The loaders read a path: the bytes under the file's own name (its suffix picks the
    # loader, its stem is the title when the file names none), in a folder of their own.
    with tempfile.TemporaryDirectory(prefix="ragchains-view-") as folder:
        path = Path(folder) / name
        path.write_bytes(data)
        if kind == "text":
            loaded = load_file(path, options)
            view.title = loaded.title
            view.parts = [
                {
                    "text": part.text,
                    "section": part.section,
                    "anchor": part.anchor,
                    "slide": part.slide,
                    "page": part.page,
                    "title": part.title,
                }
                for part in loaded.parts
            ]
        else:
            title, view.sheets = TABLE_READERS[file_format](path, options)
            view.title = title or view.title
    return view


def _numbered(rows: Iterable[Any]) -> Iterable[tuple[int, Any]]:
    return enumerate(rows, start=1)  # a record's number, as its chunk's location cites it


def _pdf_pages(data: bytes, stem: str) -> tuple[int, str]:
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument(data, password="")
    try:
        title = (pdf.get_metadata_value("Title") or "").strip()
        return len(pdf), title or stem
    finally:
        pdf.close()


def _open_image(data: bytes) -> Any:
    from PIL import Image

    image = Image.open(io.BytesIO(data))
    reason = images.ocr.over_pixel_cap(*image.size)
    if reason:
        image.close()
        raise ValueError(reason)
    return image


def image_page_sizes(data: bytes) -> list[list[float]]:
    """Each page's (frame's) width and height in the units of its chunks' ``boxes`` and
    ``page_width``/``page_height``: PDF points (1/72 inch), the pixels scaled by the
    resolution the image records (300 dpi when it records none), after the EXIF turn a
    single-page image is read with."""
    image = _open_image(data)
    sizes = []
    with image:
        frames = getattr(image, "n_frames", 1)
        for index in range(frames):
            image.seek(index)
            width, height = image.size
            if frames == 1 and image.getexif().get(0x0112) in _QUARTER_TURNS:
                width, height = height, width
            dpi_x, dpi_y = images._dpi(image)
            sizes.append([round(width * 72.0 / dpi_x, 1), round(height * 72.0 / dpi_y, 1)])
    return sizes


def image_page_png(data: bytes, page: int) -> bytes | None:
    """Page ``page`` (1-based) of an image file as PNG, turned as OCR read it; None when the
    file has no such page."""
    from PIL import ImageOps

    image = _open_image(data)
    with image:
        frames = getattr(image, "n_frames", 1)
        if not 1 <= page <= frames:
            return None
        image.seek(page - 1)
        shown = ImageOps.exif_transpose(image) if frames == 1 else image.copy()
        if shown.mode not in ("1", "L", "LA", "I", "I;16", "P", "RGB", "RGBA"):
            shown = shown.convert("RGB")  # CMYK JPEGs, and the like
        out = io.BytesIO()
        shown.save(out, format="PNG")
        return out.getvalue()


def pdf_page_png(data: bytes, page: int) -> bytes | None:
    """Page ``page`` (1-based) of a PDF drawn as PNG at ``PDF_PNG_DPI``; None when the file
    has no such page, or it would be over the pixel cap."""
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument(data, password="")
    try:
        if not 1 <= page <= len(pdf):
            return None
        drawn = pdf[page - 1]
        scale = PDF_PNG_DPI / 72.0
        width, height = drawn.get_size()
        if images.ocr.over_pixel_cap(round(width * scale), round(height * scale)):
            return None
        out = io.BytesIO()
        drawn.render(scale=scale).to_pil().save(out, format="PNG")
        return out.getvalue()
    finally:
        pdf.close()


def _csv_sheets(path: Path, options: LoadOptions) -> tuple[str | None, list[Sheet]]:
    columns, rows = csv_rows(path)
    cells = [(n, [row.get(c, "") for c in columns]) for n, row in _numbered(rows)]
    return None, [Sheet(None, columns, cells)]


def _json_sheets(path: Path, options: LoadOptions) -> tuple[str | None, list[Sheet]]:
    records = json_records(path)
    columns = list(dict.fromkeys(key for record in records for key in record))
    cells = [
        (n, ["" if record.get(c) is None else render_value(record[c]) for c in columns])
        for n, record in _numbered(records)
    ]
    return None, [Sheet(None, columns, cells)]


def _xlsx_sheets(path: Path, options: LoadOptions) -> tuple[str | None, list[Sheet]]:
    """The visible sheets' rows as the loader reads them (``ingest.sheets.sheet_rows``: the
    same header, merged cells and row cap), by the row numbers the sheet shows."""
    book, _, streamed = sheets.open_workbook(path)
    found: list[Sheet] = []
    budget = options.max_sheet_rows
    try:
        for sheet in book.worksheets:
            if sheet.sheet_state != "visible":
                continue
            table = sheets.sheet_rows(sheet, options, max(budget, 0))
            if table is None:
                found.append(Sheet(sheet.title, [], []))
                continue
            budget -= len(table.rows)
            found.append(Sheet(sheet.title, table.columns, table.shown()))
        title = book.properties.title or path.stem
    finally:
        if streamed:
            book.close()
    return title, found


# How each format the viewer shows as a table is read into rows (as its loader reads them),
# by the format's name; each returns the title the file names (None: its name's stem).
TABLE_READERS: dict[str, Callable[[Path, LoadOptions], tuple[str | None, list[Sheet]]]] = {
    "csv": _csv_sheets,
    "json": _json_sheets,
    "xlsx": _xlsx_sheets,
}
