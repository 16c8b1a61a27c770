"""Word files (.docx, python-docx): the body in reading order, one part per heading section
(the heading path as ``section``, as Markdown headings give), list items as "- " lines, and
each table a part of its own, rendered as a Markdown table so every row is read under its
header (``Part.table_header``). Footnotes and comments are left out unless asked
(``LoadOptions.include_notes``); title and author come from the core properties.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ragchains.ingest.officezip import library_failure, open_office
from ragchains.ingest.parts import (
    LoadedFile,
    LoadOptions,
    Part,
    SkipFile,
    markdown_table,
    slugify,
)

_HEADING = re.compile(r"^heading (\d)$", re.IGNORECASE)
_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"


def heading_level(paragraph: Any) -> int | None:
    """1-9 for a heading paragraph (its style or the style it is based on), 0 for Title."""
    style = paragraph.style
    while style is not None:
        name = style.name or ""
        if name.lower() == "title":
            return 0
        match = _HEADING.match(name)
        if match:
            return int(match.group(1))
        style = style.base_style
    return None


def _table_rows(table: Any) -> list[list[str]]:
    rows = []
    for row in table.rows:
        cells: list[str] = []
        grid = row.cells
        column = 0
        # A cell merged across columns comes back once per grid column it spans: keep it
        # once. One merged down a column repeats in each row, so each row reads whole.
        while column < len(grid):
            cells.append(grid[column].text)
            column += max(grid[column].grid_span, 1)
        rows.append(cells)
    return rows


def _notes(document: Any) -> str:
    """Footnotes and comments, as lines after the body (only when asked)."""
    from docx.opc.constants import RELATIONSHIP_TYPE as RT
    from lxml import etree

    lines = []
    try:
        footnotes = document.part.part_related_by(RT.FOOTNOTES)
    except KeyError:
        footnotes = None
    if footnotes is not None:
        parser = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=False)
        root = etree.fromstring(footnotes.blob, parser)
        for note in root.iter(f"{_W}footnote"):
            if note.get(f"{_W}type") in ("separator", "continuationSeparator"):
                continue
            text = " ".join("".join(t.text or "" for t in note.iter(f"{_W}t")).split())
            if text:
                lines.append(f"Footnote: {text}")
    for comment in document.comments:
        text = " ".join(comment.text.split())
        if text:
            author = f" ({comment.author})" if comment.author else ""
            lines.append(f"Comment{author}: {text}")
    return "\n".join(lines)


def load_docx(path: Path, options: LoadOptions) -> LoadedFile:
    import docx
    from docx.table import Table

    data = open_office(path, "Word", "word")
    try:
        document = docx.Document(data)
        props = document.core_properties
        title, author = props.title, props.author
        blocks = list(document.iter_inner_content())
    except SkipFile:
        raise
    except Exception as exc:  # python-docx raises many kinds on damaged XML
        raise library_failure("Word", exc) from exc
    fields = {"author": author} if author else {}
    parts: list[Part] = []
    headings: list[tuple[int, str]] = []
    unwritten = 0  # how many of the last headings no part has shown yet
    lines: list[str] = []
    first_heading: str | None = None

    def section() -> tuple[str | None, str]:
        names = [name for _, name in headings]
        return (" > ".join(names) or None), (slugify(names[-1]) if names else "")

    def flush() -> None:
        # A heading straight above another heads the text under the deeper one, not a part
        # of its own: the part opens with every heading no part has shown yet.
        nonlocal unwritten
        if not lines:
            return
        shown = [f"{'#' * max(level, 1)} {name}" for level, name in headings[-unwritten:]]
        where, anchor = section()
        text = "\n".join((shown if unwritten else []) + lines)
        parts.append(Part(text=text, section=where, anchor=anchor, fields=fields))
        lines.clear()
        unwritten = 0

    for block in blocks:
        if isinstance(block, Table):
            rendered = markdown_table(_table_rows(block))
            if rendered is None:
                continue
            flush()
            header, table = rendered
            where, anchor = section()
            parts.append(
                Part(text=table, table_header=header, section=where, anchor=anchor, fields=fields)
            )
            continue
        text = block.text.strip()
        if not text:
            continue
        level = heading_level(block)
        if level is not None:
            flush()
            first_heading = first_heading or text
            while headings and headings[-1][0] >= level:
                headings.pop()
                unwritten = max(unwritten - 1, 0)
            headings.append((level, text))
            unwritten += 1
            continue
        style = (block.style.name or "") if block.style is not None else ""
        lines.append(f"- {text}" if style.lower().startswith("list") else text)
    flush()
    if options.include_notes:
        notes = _notes(document)
        if notes:
            parts.append(Part(text=notes, section="Notes", anchor="notes", fields=fields))
    if not parts:
        raise SkipFile("Word document has no text")
    return LoadedFile(format="docx", title=title or first_heading or path.stem, parts=parts)
