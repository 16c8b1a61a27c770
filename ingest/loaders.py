"""File loaders: each turns one file into titled parts (pages, sections or table rows).

A loader either returns a ``LoadedFile`` or raises ``SkipFile`` with a reason a person can act
on ("encrypted PDF (password required)", "binary file", ...). Nothing here writes anything.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_text_splitters import MarkdownHeaderTextSplitter

# Metadata keys the pipeline sets itself; table columns with these names are renamed col_<name>.
RESERVED_FIELDS = frozenset(
    {
        "source",
        "filename",
        "format",
        "title",
        "section",
        "page",
        "row",
        "citation",
        "chunk_id",
        "chunk_index",
        "content_hash",
    }
)
# String columns longer than this are prose, not something to filter on.
MAX_FILTERABLE_STRING = 100
_HEADERS = [("#", "h1"), ("##", "h2"), ("###", "h3"), ("####", "h4")]
_FRONT_MATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*\n", re.DOTALL)
_TITLE_LINE = re.compile(r"^title:\s*[\"']?(.+?)[\"']?\s*$", re.MULTILINE)
_CURRENCY = re.compile(r"^[$€£¥]\s*")


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
    data = _read_bytes(path)
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


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SkipFile(f"unreadable: {exc.strerror or exc}") from exc


def slugify(text: str) -> str:
    """GitHub-style heading anchor: lowercase words joined by hyphens."""
    slug = re.sub(r"[^\w\s-]", "", text.lower()).strip()
    return re.sub(r"[\s_-]+", "-", slug)


# ----------------------------------------------------------------------------- formats
def load_text(path: Path, options: LoadOptions) -> LoadedFile:
    text = read_text(path)
    return LoadedFile(format="text", title=path.stem, parts=[Part(text=text)])


def _markdown_parts(markdown: str) -> tuple[str | None, list[Part]]:
    splitter = MarkdownHeaderTextSplitter(headers_to_split_on=_HEADERS, strip_headers=False)
    parts = []
    title = None
    for doc in splitter.split_text(markdown):
        if not doc.page_content.strip():
            continue
        headings = [doc.metadata[key] for _, key in _HEADERS if key in doc.metadata]
        if title is None and "h1" in doc.metadata:
            title = doc.metadata["h1"]
        parts.append(
            Part(
                text=doc.page_content,
                section=" > ".join(headings) or None,
                anchor=slugify(headings[-1]) if headings else "",
            )
        )
    return title, parts


def load_markdown(path: Path, options: LoadOptions) -> LoadedFile:
    text = read_text(path)
    front_title = None
    match = _FRONT_MATTER.match(text)
    if match:
        title_match = _TITLE_LINE.search(match.group(1))
        front_title = title_match.group(1) if title_match else None
        text = text[match.end() :]
    heading_title, parts = _markdown_parts(text)
    if not parts:
        raise SkipFile("empty file (no text outside front matter)")
    return LoadedFile(
        format="markdown", title=front_title or heading_title or path.stem, parts=parts
    )


def load_html(path: Path, options: LoadOptions) -> LoadedFile:
    import trafilatura

    html = read_text(path)
    # Markdown output keeps the headings, so sections survive as they do for .md files;
    # trafilatura drops navigation, headers, footers and other boilerplate.
    markdown = trafilatura.extract(
        html,
        output_format="markdown",
        include_tables=True,
        include_links=False,
        include_images=False,
        include_comments=False,
        favor_recall=True,
    )
    if not markdown or not markdown.strip():
        raise SkipFile("no main text found in the HTML")
    metadata = trafilatura.extract_metadata(html)
    heading_title, parts = _markdown_parts(markdown)
    title = (metadata.title if metadata and metadata.title else None) or heading_title or path.stem
    return LoadedFile(format="html", title=title, parts=parts)


def load_pdf(path: Path, options: LoadOptions) -> LoadedFile:
    from pypdf import PdfReader
    from pypdf.errors import DependencyError, FileNotDecryptedError, PyPdfError

    data = _read_bytes(path)
    if not data.strip():
        raise SkipFile("empty file")
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            try:
                # Many PDFs carry only an owner password and open with an empty user password.
                opened = reader.decrypt("")
            except (DependencyError, NotImplementedError) as exc:
                raise SkipFile(f"encrypted PDF that cannot be opened here ({exc})") from exc
            if not opened:
                raise SkipFile("encrypted PDF (password required)")
        title = None
        try:
            title = reader.metadata.title if reader.metadata else None
        except PyPdfError:
            title = None
        parts = []
        for number, page in enumerate(reader.pages, start=1):
            text = page.extract_text() or ""
            if text.strip():
                parts.append(Part(text=text, page=number, anchor=f"page={number}"))
    except SkipFile:
        raise
    except FileNotDecryptedError as exc:
        raise SkipFile("encrypted PDF (password required)") from exc
    except Exception as exc:  # pypdf raises many kinds on damaged files
        raise SkipFile(f"corrupt PDF: {type(exc).__name__}: {str(exc)[:120]}") from exc
    if not parts:
        raise SkipFile("PDF has no extractable text (scanned images need OCR first)")
    return LoadedFile(format="pdf", title=title or path.stem, parts=parts)


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
) -> list[Part]:
    """One part per row: text from the text columns, typed metadata from the rest.

    ``display`` holds each cell as written (CSV), so the text says "$45.00", not "45.0".
    """
    types = _column_types(records)
    columns = list(types)
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


def load_csv(path: Path, options: LoadOptions) -> LoadedFile:
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
    records = [{col: _parse_cell(cell) for col, cell in row.items()} for row in display]
    return LoadedFile(
        format="csv", title=path.stem, parts=rows_to_parts(records, options, display=display)
    )


def _json_records(items: Iterable[Any], where: Callable[[int], str]) -> list[dict[str, Any]]:
    records = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise SkipFile(f"{where(i)} is not a JSON object")
        records.append(_flatten(item))
    return records


def load_json(path: Path, options: LoadOptions) -> LoadedFile:
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
    return LoadedFile(format="json", title=path.stem, parts=rows_to_parts(records, options))


LOADERS: dict[str, Callable[[Path, LoadOptions], LoadedFile]] = {
    ".pdf": load_pdf,
    ".html": load_html,
    ".htm": load_html,
    ".md": load_markdown,
    ".markdown": load_markdown,
    ".txt": load_text,
    ".text": load_text,
    ".csv": load_csv,
    ".tsv": load_csv,
    ".json": load_json,
    ".jsonl": load_json,
    ".ndjson": load_json,
}


def load_file(path: Path, options: LoadOptions | None = None) -> LoadedFile:
    loader = LOADERS.get(path.suffix.lower())
    if loader is None:
        raise SkipFile(f"unsupported file type {path.suffix or '(no extension)'!r}")
    return loader(path, options or LoadOptions())
