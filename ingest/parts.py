"""What a loader gives back: a file's titled parts (``Part``, ``LoadedFile``), the options it
reads them with, ``SkipFile`` with a reason a person can act on, and reading a file's text
whatever its encoding. Shared by the text loaders (``ingest.loaders``) and the table loaders
(``ingest.tables``).
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class SkipFile(Exception):
    """The file cannot be ingested; ``str(exc)`` is the reason shown to the user."""


# x0, top, x1, bottom in PDF points (1/72 inch), measured from the page's top-left corner.
Box = tuple[float, float, float, float]


@dataclass
class WordBox:
    """Where a word of a page's text is drawn: characters ``start:end`` of ``Part.text``."""

    start: int
    end: int
    box: Box


@dataclass
class Part:
    """A piece of a file with its own locator: a PDF page, a Markdown section, a slide, a
    table row. Its locator fields become the chunk's ``location`` (``ingest.chunking``)."""

    text: str
    anchor: str = ""  # citation suffix after '#': "page=3", "benefit-plans", "slide=4", "row=12"
    page: int | None = None
    section: str | None = None  # heading path, "Benefits > Parental leave"
    row: int | None = None
    slide: int | None = None
    sheet: str | None = None
    title: str | None = None  # overrides the file's title (table rows with a name column)
    fields: dict[str, Any] = field(default_factory=dict)  # typed, filterable metadata
    splittable: bool = True
    # A table: ``text`` is these header lines, then one line per row. Too long for a chunk,
    # it is split between rows, each piece under the header again (``Chunker.split_table``).
    table_header: str | None = None
    page_size: tuple[float, float] | None = None  # width, height in PDF points
    words: list[WordBox] = field(default_factory=list)  # in reading order, when known
    ocr_confidence: float | None = None  # 0-1, the page's mean word confidence, when OCRed


@dataclass
class LoadedFile:
    format: str
    title: str
    parts: list[Part]
    # What was left out of a file that was still read (rows over the cap, hidden sheets, a
    # page whose OCR timed out): one line each, shown in the ingest report.
    partial: list[str] = field(default_factory=list)


@dataclass
class LoadOptions:
    text_columns: Sequence[str] | None = None  # table columns that form the text; None = all
    include_notes: bool = False  # Word footnotes and comments (left out by default)
    max_sheet_rows: int = 100_000  # rows read per workbook; the rest is reported, not read
    ocr_page_timeout: float = 60.0  # seconds of OCR per page before it is left out


def slugify(text: str) -> str:
    """GitHub-style heading anchor: lowercase words joined by hyphens."""
    slug = re.sub(r"[^\w\s-]", "", text.lower()).strip()
    return re.sub(r"[\s_-]+", "-", slug)


def _cell_text(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def markdown_table(rows: list[list[str]]) -> tuple[str, str] | None:
    """(header lines, whole table) as a Markdown table; None for a table with no text."""
    rows = [[_cell_text(cell) for cell in row] for row in rows]
    rows = [row for row in rows if any(row)]
    if not rows:
        return None
    width = max(len(row) for row in rows)
    rows = [row + [""] * (width - len(row)) for row in rows]
    header = "| " + " | ".join(rows[0]) + " |\n|" + "---|" * width
    body = ["| " + " | ".join(row) + " |" for row in rows[1:]]
    return header, "\n".join([header, *body])


# ----------------------------------------------------------------------------- text input
def read_text(path: Path) -> str:
    """Decode a text file strictly (UTF-8, or UTF-16/32 with a BOM); skip what is not text."""
    data = read_bytes(path)
    if not data.strip():
        raise SkipFile("empty file")
    for bom, encoding in (
        (codecs.BOM_UTF32_LE, "utf-32"),
        (codecs.BOM_UTF32_BE, "utf-32"),
        (codecs.BOM_UTF16_LE, "utf-16"),
        (codecs.BOM_UTF16_BE, "utf-16"),
    ):
        if data.startswith(bom):
            try:
                text = data.decode(encoding)
            except UnicodeDecodeError as exc:
                raise SkipFile(f"undecodable {encoding} text ({exc.reason})") from exc
            break
    else:
        if b"\x00" in data[:8192]:
            raise SkipFile("binary file (NUL bytes), not text")
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise SkipFile(
                f"not valid UTF-8 text (byte {exc.start}: {exc.reason}); convert it to UTF-8"
            ) from exc
    if not text.strip():
        raise SkipFile("empty file (only white space)")
    return text


def read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SkipFile(f"unreadable: {exc.strerror or exc}") from exc
