"""What a loader gives back: a file's titled parts (``Part``, ``LoadedFile``), the options it
reads them with, ``SkipFile`` with a reason a person can act on, and reading a file's text
whatever its encoding. Shared by the text loaders (``ingest.loaders``) and the table loaders
(``ingest.tables``).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class SkipFile(Exception):
    """The file cannot be ingested; ``str(exc)`` is the reason shown to the user."""


@dataclass
class Part:
    """A piece of a file with its own locator: a PDF page, a Markdown section, a table row."""

    text: str
    anchor: str = ""  # citation suffix after '#': "page=3", "benefit-plans", "row=12"
    page: int | None = None
    section: str | None = None
    row: int | None = None
    title: str | None = None  # overrides the file's title (table rows with a name column)
    fields: dict[str, Any] = field(default_factory=dict)  # typed, filterable metadata
    splittable: bool = True


@dataclass
class LoadedFile:
    format: str
    title: str
    parts: list[Part]


@dataclass
class LoadOptions:
    text_columns: Sequence[str] | None = None  # table columns that form the text; None = all


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
