"""The file formats ragchains reads, in one table: what ingestion, the file viewer and the
descriptions of the ``format`` field all go by.

A format's ``name`` is what ingest stores in each chunk's ``format`` metadata (and what a
``format`` filter matches); its suffixes are the file names ingest reads as that format, each
with the media type a file of that name is served with; ``view`` is how the chat page's
viewer shows it. ``ingest.loaders`` pairs each format with its loader, ``serving.fileview``
and ``serving.sourcefiles`` show and serve files by it, and the API describes the field with
``format_names()``.

It lives in ``retrievers`` because every reader may import that package (``chains``,
``ingest`` and ``ragchains.*`` sit above it, ``prompts`` knows nothing of files) and because
``format`` is a field of the index: ``retrievers.filters`` filters on it and each file's
record keeps it. It imports only the standard library, so a command's ``--help`` may read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from types import MappingProxyType
from typing import Literal

ViewKind = Literal["pdf", "image", "text", "table"]
"""How the viewer shows a file: its pages drawn (pdf, image), its parts as text, or a window
of its rows."""

# What a file of an unknown name is served as: a download, never rendered.
UNKNOWN_MEDIA_TYPE = "application/octet-stream"

# The Office Open XML family's media types, as Microsoft registers them; a macro-enabled file
# or a template is served as what it is (its macros never run here).
_OOXML = "application/vnd.openxmlformats-officedocument"
_TEXT_UTF8 = "; charset=utf-8"  # ingest reads text files as UTF-8, and serves them so


# Compared and hashed as the object it is: each format is one entry of FORMATS (and its
# media types, a mapping, could not be hashed).
@dataclass(frozen=True, eq=False)
class FileFormat:
    """One format: ``name`` (as chunk metadata and filters have it), a ``label`` for people
    (singular and plural), how the viewer shows it, and its suffixes with their media types
    (a suffix in lower case with its dot)."""

    name: str
    label: str
    label_plural: str
    view: ViewKind
    media_types: Mapping[str, str]
    # Leading bytes and the media type they mean, for a format ingest reads by content and
    # not by name (an image: a .png that is really a JPEG is read, and served, as a JPEG).
    signatures: tuple[tuple[bytes, str], ...] = ()

    @property
    def suffixes(self) -> tuple[str, ...]:
        return tuple(self.media_types)


def _format(
    name: str,
    label: str,
    label_plural: str,
    view: ViewKind,
    media_types: dict[str, str],
    signatures: tuple[tuple[bytes, str], ...] = (),
) -> FileFormat:
    return FileFormat(name, label, label_plural, view, MappingProxyType(media_types), signatures)


# The order is the one people read them in (filter descriptions, --help).
FORMATS: tuple[FileFormat, ...] = (
    _format("pdf", "PDF", "PDFs", "pdf", {".pdf": "application/pdf"}),
    _format(
        "image",
        "scanned image",
        "scanned images",
        "image",
        {
            ".png": "image/png",
            ".jpg": "image/jpeg",
            ".jpeg": "image/jpeg",
            ".tif": "image/tiff",
            ".tiff": "image/tiff",
        },
        signatures=(
            (b"\x89PNG\r\n\x1a\n", "image/png"),
            (b"\xff\xd8\xff", "image/jpeg"),
            (b"II*\x00", "image/tiff"),
            (b"MM\x00*", "image/tiff"),
            (b"II+\x00", "image/tiff"),  # BigTIFF
            (b"MM\x00+", "image/tiff"),
        ),
    ),
    _format(
        "markdown",
        "Markdown file",
        "Markdown files",
        "text",
        {".md": f"text/markdown{_TEXT_UTF8}", ".markdown": f"text/markdown{_TEXT_UTF8}"},
    ),
    _format(
        "html",
        "web page",
        "web pages",
        "text",
        {".html": f"text/html{_TEXT_UTF8}", ".htm": f"text/html{_TEXT_UTF8}"},
    ),
    _format(
        "text",
        "text file",
        "text files",
        "text",
        {".txt": f"text/plain{_TEXT_UTF8}", ".text": f"text/plain{_TEXT_UTF8}"},
    ),
    _format(
        "csv",
        "CSV table",
        "CSV tables",
        "table",
        {".csv": f"text/csv{_TEXT_UTF8}", ".tsv": f"text/tab-separated-values{_TEXT_UTF8}"},
    ),
    _format(
        "json",
        "JSON file",
        "JSON files",
        "table",
        {
            ".json": "application/json",
            ".jsonl": "application/jsonl",
            ".ndjson": "application/x-ndjson",
        },
    ),
    _format(
        "docx",
        "Word document",
        "Word documents",
        "text",
        {
            ".docx": f"{_OOXML}.wordprocessingml.document",
            ".docm": "application/vnd.ms-word.document.macroEnabled.12",
            ".dotx": f"{_OOXML}.wordprocessingml.template",
            ".dotm": "application/vnd.ms-word.template.macroEnabled.12",
        },
    ),
    _format(
        "pptx",
        "PowerPoint deck",
        "PowerPoint decks",
        "text",
        {
            ".pptx": f"{_OOXML}.presentationml.presentation",
            ".pptm": "application/vnd.ms-powerpoint.presentation.macroEnabled.12",
            ".ppsx": f"{_OOXML}.presentationml.slideshow",
            ".ppsm": "application/vnd.ms-powerpoint.slideshow.macroEnabled.12",
            ".potx": f"{_OOXML}.presentationml.template",
            ".potm": "application/vnd.ms-powerpoint.template.macroEnabled.12",
        },
    ),
    _format(
        "xlsx",
        "Excel workbook",
        "Excel workbooks",
        "table",
        {
            ".xlsx": f"{_OOXML}.spreadsheetml.sheet",
            ".xlsm": "application/vnd.ms-excel.sheet.macroEnabled.12",
            ".xltx": f"{_OOXML}.spreadsheetml.template",
            ".xltm": "application/vnd.ms-excel.template.macroEnabled.12",
        },
    ),
)

_BY_NAME: Mapping[str, FileFormat] = MappingProxyType({f.name: f for f in FORMATS})
_BY_SUFFIX: Mapping[str, FileFormat] = MappingProxyType(
    {suffix: f for f in FORMATS for suffix in f.suffixes}
)


def format_names() -> tuple[str, ...]:
    """Every format's name, in the table's order: the values of chunks' ``format``."""
    return tuple(_BY_NAME)


def format_named(name: str) -> FileFormat | None:
    """The format chunks' metadata calls ``name``; None for one this release does not know
    (an index written by another)."""
    return _BY_NAME.get(name)


def format_of_suffix(suffix: str) -> FileFormat | None:
    """The format a file whose name ends in ``suffix`` (``".PDF"``, ``".md"``) is read as;
    None when ingest does not read such files."""
    return _BY_SUFFIX.get(suffix.lower())


def suffixes() -> tuple[str, ...]:
    """Every suffix read as some format (lower case, with its dot)."""
    return tuple(_BY_SUFFIX)


def view_of(name: str) -> ViewKind | None:
    """How the viewer shows a file of the format called ``name``; None: it cannot."""
    found = _BY_NAME.get(name)
    return None if found is None else found.view


def media_type(source: str, format_name: str | None = None, head: bytes = b"") -> str:
    """The media type a file named ``source`` is served with: by its first bytes (``head``)
    for a format read by content, else by its suffix, else ``UNKNOWN_MEDIA_TYPE``."""
    declared = _BY_NAME.get(format_name) if format_name else None
    for signature, by_content in declared.signatures if declared else ():
        if head.startswith(signature):
            return by_content
    suffix = PurePosixPath(source).suffix.lower()
    found = _BY_SUFFIX.get(suffix)
    return UNKNOWN_MEDIA_TYPE if found is None else found.media_types[suffix]


def media_types() -> frozenset[str]:
    """Every media type a file may be served with, ``UNKNOWN_MEDIA_TYPE`` included."""
    by_name = {t for f in FORMATS for t in f.media_types.values()}
    by_content = {t for f in FORMATS for _, t in f.signatures}
    return frozenset({*by_name, *by_content, UNKNOWN_MEDIA_TYPE})


def formats_described() -> str:
    """The formats for people, with their suffixes: "PDFs (.pdf), scanned images (.png,
    .jpg, ...), ...", as a command's --help lists what it reads."""
    return ", ".join(f"{f.label_plural} ({', '.join(f.suffixes)})" for f in FORMATS)
