"""Word files (.docx, python-docx): the body in reading order, one part per heading section
(the heading path as ``section``, as Markdown headings give), list items as "- " lines, and
each table a part of its own, rendered as a Markdown table so every row is read under its
header (``Part.table_header``). Headers and footers form one part of their own ("Headers and
footers"). Footnotes, endnotes and comments are left out unless asked
(``LoadOptions.include_notes``); title and author come from the core properties.

The body is walked as XML (lxml, once, linearly) rather than through python-docx's
paragraphs, which do not look inside content controls (``w:sdt``), text boxes, tracked
insertions or nested tables: a form laid out in tables inside content controls would read
as having no text. Text a reader does not see is left out: deletions, the placeholder prompt
of an empty content control ("Click or tap here to enter text"), field codes, and a table
of contents (it repeats the headings).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragchains.ingest.officezip import library_failure, open_office, part_xml
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
_MC = "{http://schemas.openxmlformats.org/markup-compatibility/2006}"
_R = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}"
_REL = "http://schemas.openxmlformats.org/officeDocument/2006/relationships/"
_MATH_TEXT = "{http://schemas.openxmlformats.org/officeDocument/2006/math}t"
_PICTURE = "{http://schemas.openxmlformats.org/drawingml/2006/picture}pic"
_VML_IMAGE = "{urn:schemas-microsoft-com:vml}imagedata"
_P, _TBL, _TR, _TC, _SDT = (f"{_W}{name}" for name in ("p", "tbl", "tr", "tc", "sdt"))
_TEXT_BOX = f"{_W}txbxContent"
_ALTERNATE = f"{_MC}AlternateContent"
_SPANS = f"{_W}tcPr/{_W}gridSpan"
# Inline elements whose text a reader does not see: deleted and moved-away runs, field
# codes, the phonetic guide over ruby text, properties.
_UNSEEN = {
    f"{_W}{name}"
    for name in ("del", "moveFrom", "delText", "instrText", "rt", "pPr", "rPr", "sdtPr")
}
# Where a drawing's text boxes are (the shape's text is in them, not beside them).
_DRAWINGS = {f"{_W}drawing", f"{_W}pict", f"{_W}object"}
# Block-level wrappers whose children are blocks again.
_WRAPPERS = {f"{_W}customXml", f"{_W}ins", f"{_W}moveTo", f"{_W}smartTag"}
_NOTE_LINES = {"Footnote": "footnote", "Endnote": "endnote", "Comment": "comment"}


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


def _count(count: int, noun: str) -> str:
    plural = f"{noun}es" if noun.endswith("x") else f"{noun}s"
    if count == 0:
        return f"no {plural}"
    return f"{count} {noun if count == 1 else plural}"


@dataclass
class _Paragraph:
    element: Any
    text: str


@dataclass
class _Table:
    rows: list[list[str]]


@dataclass
class _Seen:
    """What the walk looked at, for the reason a document yields nothing."""

    tables: int = 0
    text_boxes: int = 0
    controls: int = 0
    pictures: int = 0
    imported: int = 0  # w:altChunk: another file's content Word merges in when it opens one


@dataclass
class _Walker:
    seen: _Seen = field(default_factory=_Seen)

    def blocks(self, parent: Any) -> Iterator[_Paragraph | _Table]:
        """``parent``'s paragraphs and tables in reading order, each text box's after the
        paragraph anchoring it."""
        for child in parent:
            tag = child.tag
            if tag == _P:
                pieces: list[str] = []
                boxes: list[Any] = []
                self._inline(child, pieces, boxes)
                yield _Paragraph(child, "".join(pieces))
                for box in boxes:
                    self.seen.text_boxes += 1
                    yield from self.blocks(box)
            elif tag == _TBL:
                yield from self._table(child)
            elif tag == _SDT:
                content = self._control(child, block=True)
                if content is not None:
                    yield from self.blocks(content)
            elif tag == _ALTERNATE:
                branch = _branch(child)
                if branch is not None:
                    yield from self.blocks(branch)
            elif tag in _WRAPPERS:
                yield from self.blocks(child)
            elif tag == f"{_W}altChunk":
                self.seen.imported += 1

    def _control(self, sdt: Any, *, block: bool) -> Any:
        """A content control's content, None when it shows only its placeholder prompt or
        is a table of contents."""
        self.seen.controls += 1
        properties = sdt.find(f"{_W}sdtPr")
        if properties is not None:
            prompt = properties.find(f"{_W}showingPlcHdr")
            if prompt is not None and prompt.get(f"{_W}val") not in ("0", "false", "off"):
                return None
            gallery = properties.find(f"{_W}docPartObj/{_W}docPartGallery")
            if (
                block
                and gallery is not None
                and "contents" in (gallery.get(f"{_W}val") or "").lower()
            ):
                return None
        return sdt.find(f"{_W}sdtContent")

    def _inline(self, element: Any, pieces: list[str], boxes: list[Any]) -> None:
        for child in element:
            tag = child.tag
            if not isinstance(tag, str) or tag in _UNSEEN:  # comments, processing instructions
                continue
            if tag == f"{_W}t" or tag == _MATH_TEXT:
                pieces.append(child.text or "")
            elif tag in (f"{_W}tab", f"{_W}ptab"):
                pieces.append("\t")
            elif tag == f"{_W}br":
                pieces.append("" if child.get(f"{_W}type") in ("page", "column") else "\n")
            elif tag == f"{_W}cr":
                pieces.append("\n")
            elif tag == f"{_W}noBreakHyphen":
                pieces.append("-")
            elif tag == _SDT:
                content = self._control(child, block=False)
                if content is not None:
                    self._inline(content, pieces, boxes)
            elif tag in _DRAWINGS:
                self._drawing(child, boxes)
            elif tag == _ALTERNATE:
                branch = _branch(child)
                if branch is not None:
                    self._inline(branch, pieces, boxes)
            else:  # runs, hyperlinks, insertions, smart tags, simple fields, math
                self._inline(child, pieces, boxes)

    def _drawing(self, element: Any, boxes: list[Any]) -> None:
        for child in element:
            tag = child.tag
            if tag == _TEXT_BOX:
                boxes.append(child)
            elif tag == _ALTERNATE:
                branch = _branch(child)
                if branch is not None:
                    self._drawing(branch, boxes)
            else:
                if tag in (_PICTURE, _VML_IMAGE):
                    self.seen.pictures += 1
                self._drawing(child, boxes)

    def _table(self, table: Any) -> Iterator[_Paragraph | _Table]:
        self.seen.tables += 1
        rows_in = list(_children(table, _TR))
        grid = [list(_children(row, _TC)) for row in rows_in]
        if len(grid) == 1 and len(grid[0]) == 1:
            # One cell: a frame around text (a boxed note, a page laid out in a table),
            # not a table of data; its headings and paragraphs read as the body's.
            yield from self.blocks(grid[0][0])
            return
        nested: list[_Paragraph | _Table] = []
        rows: list[list[str]] = []
        above: dict[int, str] = {}  # grid column -> text of the cell last started there
        for row, cells in zip(rows_in, grid, strict=True):
            before = row.find(f"{_W}trPr/{_W}gridBefore")
            column = _number(before.get(f"{_W}val") if before is not None else None, 0)
            texts: list[str] = []
            for cell in cells:
                merge = cell.find(f"{_W}tcPr/{_W}vMerge")
                if merge is not None and merge.get(f"{_W}val") != "restart":
                    # Merged down from the row above: repeated, so each row reads whole.
                    text = above.get(column, "")
                else:
                    text = self._cell(cell, nested)
                    above[column] = text
                texts.append(text)
                span = cell.find(_SPANS)
                column += max(_number(span.get(f"{_W}val") if span is not None else None, 1), 1)
            rows.append(texts)
        yield _Table(rows)
        # A table in a cell cannot be a Markdown table's cell: it follows as its own table.
        yield from nested

    def _cell(self, cell: Any, nested: list[_Paragraph | _Table]) -> str:
        texts = []
        for block in self.blocks(cell):
            if isinstance(block, _Table):
                nested.append(block)
            elif block.text.strip():
                texts.append(block.text)
        return "\n".join(texts)


def _branch(alternate: Any) -> Any:
    """One branch of an ``mc:AlternateContent``: its choices and fallback hold the same
    content for readers of different versions, so only one is read."""
    for child in alternate:
        if child.tag in (f"{_MC}Choice", f"{_MC}Fallback"):
            return child
    return None


def _children(parent: Any, tag: str) -> Iterator[Any]:
    """``parent``'s children named ``tag``, looking through content controls and the other
    wrappers a table's rows and cells may sit in."""
    for child in parent:
        if child.tag == tag:
            yield child
        elif child.tag == _SDT:
            content = child.find(f"{_W}sdtContent")
            if content is not None:
                yield from _children(content, tag)
        elif child.tag == _ALTERNATE:
            branch = _branch(child)
            if branch is not None:
                yield from _children(branch, tag)
        elif child.tag in _WRAPPERS:
            yield from _children(child, tag)


def _number(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def _headers_and_footers(document: Any) -> tuple[list[Any], int, int, list[str]]:
    """Each header and footer part the sections use, once, in the sections' order; how many
    headers and footers there are; and a line for each that could not be read."""
    from lxml import etree

    rels = document.part.rels
    stories: list[Any] = []
    seen: set[str] = set()
    counts = {"header": 0, "footer": 0}
    unread: list[str] = []
    for properties in document.element.body.iter(f"{_W}sectPr"):
        for reference in properties:
            kind = {f"{_W}headerReference": "header", f"{_W}footerReference": "footer"}.get(
                reference.tag
            )
            rel = rels.get(reference.get(f"{_R}id")) if kind else None
            if kind is None or rel is None or rel.is_external or rel.reltype != _REL + kind:
                continue
            part = rel.target_part
            if str(part.partname) in seen:
                continue
            seen.add(str(part.partname))
            counts[kind] += 1
            try:
                stories.append(part_xml(part))
            except etree.XMLSyntaxError as exc:  # a part python-docx did not parse itself
                unread.append(f"{part.partname}: unreadable {kind} ({exc})")
    return stories, counts["header"], counts["footer"], unread


def _story_text(story: Any) -> str:
    """A footnote's (or another story's) text on one line: paragraphs and table cells."""
    pieces: list[str] = []
    for block in _Walker().blocks(story):
        if isinstance(block, _Table):
            pieces.extend(cell for row in block.rows for cell in row)
        else:
            pieces.append(block.text)
    return " ".join(pieces)


def _notes(document: Any) -> list[str]:
    """Footnotes, endnotes and comments, as lines after the body."""
    from docx.opc.constants import RELATIONSHIP_TYPE as RT

    lines = []
    for relationship, kind in ((RT.FOOTNOTES, "footnote"), (RT.ENDNOTES, "endnote")):
        try:
            notes = document.part.part_related_by(relationship)
        except KeyError:
            continue
        for note in part_xml(notes).iter(f"{_W}{kind}"):
            if note.get(f"{_W}type") in ("separator", "continuationSeparator"):
                continue
            text = " ".join(_story_text(note).split())
            if text:
                lines.append(f"{kind.capitalize()}: {text}")
    for comment in document.comments:
        text = " ".join(comment.text.split())
        if text:
            author = f" ({comment.author})" if comment.author else ""
            lines.append(f"Comment{author}: {text}")
    return lines


class _Styles:
    """Heading level and list-ness by paragraph style, each style looked up once."""

    def __init__(self, document: Any) -> None:
        self._document = document
        self._known: dict[str | None, tuple[int | None, bool]] = {}

    def of(self, paragraph: Any) -> tuple[int | None, bool]:
        from docx.text.paragraph import Paragraph

        style_id = paragraph.style  # CT_P.style: the style's id, None for the default
        if style_id not in self._known:
            wrapped = Paragraph(paragraph, self._document)
            style = wrapped.style
            name = (style.name or "") if style is not None else ""
            self._known[style_id] = (heading_level(wrapped), name.lower().startswith("list"))
        level, listed = self._known[style_id]
        if not listed and level is None:
            number = paragraph.find(f"{_W}pPr/{_W}numPr/{_W}numId")
            listed = number is not None and number.get(f"{_W}val") not in (None, "0")
        return level, listed


def load_docx(path: Path, options: LoadOptions) -> LoadedFile:
    import docx

    data = open_office(path, "Word", "word")
    walker = _Walker()
    try:
        document = docx.Document(data)
        props = document.core_properties
        title, author = props.title, props.author
        styles = _Styles(document)
        blocks = [
            (block, styles.of(block.element) if isinstance(block, _Paragraph) else (None, False))
            for block in walker.blocks(document.element.body)
        ]
        stories, headers, footers, unread = _headers_and_footers(document)
        margins = [block for story in stories for block in walker.blocks(story)]
        notes = _notes(document) if options.include_notes else []
    except SkipFile:
        raise
    except RecursionError as exc:
        raise SkipFile("Word document nests its content too deeply to read") from exc
    except Exception as exc:  # python-docx raises many kinds on damaged XML
        raise library_failure("Word", exc) from exc
    fields = {"author": author} if author else {}
    parts: list[Part] = []
    headings: list[tuple[int, str]] = []
    # Heading lines no part has shown yet: (level, line, whether a table part under it has
    # named it in its section).
    unshown: list[tuple[int, str, bool]] = []
    lines: list[str] = []
    first_heading: str | None = None

    def section() -> tuple[str | None, str]:
        names = [name for _, name in headings]
        return (" > ".join(names) or None), (slugify(names[-1]) if names else "")

    def flush(last: bool = False) -> None:
        # A heading straight above another heads the text under the deeper one, not a part
        # of its own: the part opens with every heading no part has shown yet, even one
        # with nothing under it (a document of headings alone is still read).
        shown = [line for _, line, named in unshown if lines or not named]
        if not lines and not (last and shown):
            return
        where, anchor = section()
        text = "\n".join(shown + lines)
        parts.append(Part(text=text, section=where, anchor=anchor, fields=fields))
        lines.clear()
        unshown.clear()

    def add_table(rows: list[list[str]], where: str | None, anchor: str) -> None:
        rendered = markdown_table(rows)
        if rendered is not None:
            header, table = rendered
            parts.append(
                Part(text=table, table_header=header, section=where, anchor=anchor, fields=fields)
            )

    for block, (level, listed) in blocks:
        if isinstance(block, _Table):
            if markdown_table(block.rows) is not None:
                flush()
                add_table(block.rows, *section())
                unshown[:] = [(level, line, True) for level, line, _ in unshown]
            continue
        text = block.text.strip()
        if not text:
            continue
        if level is not None:
            flush()
            text = " ".join(text.split())
            first_heading = first_heading or text
            while headings and headings[-1][0] >= level:
                headings.pop()
            # A heading this one closes was shown by the table under it, if there was one.
            unshown[:] = [entry for entry in unshown if not (entry[2] and entry[0] >= level)]
            headings.append((level, text))
            unshown.append((level, f"{'#' * max(level, 1)} {text}", False))
            continue
        lines.append(f"- {text}" if listed else text)
    flush(last=True)

    # Headers and footers repeat on every page, and the first page's often repeats the
    # others': each line is kept once. A line without a letter is a page number.
    margin_lines: dict[str, None] = {}
    for block in margins:
        if isinstance(block, _Table):
            add_table(block.rows, "Headers and footers", "headers-and-footers")
        elif any(character.isalpha() for character in block.text):
            margin_lines.setdefault(" ".join(block.text.split()), None)
    if margin_lines:
        parts.append(
            Part(
                text="\n".join(margin_lines),
                section="Headers and footers",
                anchor="headers-and-footers",
                fields=fields,
            )
        )
    if notes:
        parts.append(Part(text="\n".join(notes), section="Notes", anchor="notes", fields=fields))
    if not parts:
        raise SkipFile(_nothing_read(document, walker.seen, headers, footers, options))
    return LoadedFile(
        format="docx", title=title or first_heading or path.stem, parts=parts, partial=unread
    )


def _nothing_read(
    document: Any, seen: _Seen, headers: int, footers: int, options: LoadOptions
) -> str:
    if not options.include_notes:
        # Notes stay out when not asked for, even when they are all the text there is: the
        # option says comments are review remarks, not content, and an index whose
        # contents turned on whether a body happens to be empty would surprise more than a
        # skip that names the option.
        try:
            notes = _notes(document)
        except Exception:  # python-docx on damaged notes: only the wording depends on it
            notes = []
        if notes:
            counts: dict[str, int] = {}
            for line in notes:
                kind = _NOTE_LINES[line.split(":", 1)[0].split(" ", 1)[0]]
                counts[kind] = counts.get(kind, 0) + 1
            found = " and ".join(_count(count, kind) for kind, count in counts.items())
            return (
                f"Word document has no text outside its notes ({found}); notes are read "
                "when asked (ragchains ingest --word-notes)"
            )
    looked = [
        "the body",
        _count(headers, "header"),
        _count(footers, "footer"),
        _count(seen.tables, "table"),
        _count(seen.text_boxes, "text box"),
        _count(seen.controls, "content control"),
    ]
    if options.include_notes:
        looked.append("footnotes, endnotes and comments")
    reason = f"Word document has no text (looked at {', '.join(looked[:-1])} and {looked[-1]}"
    held = []
    if seen.pictures:
        held.append(f"{_count(seen.pictures, 'picture')}, whose text is not read")
    if seen.imported:
        held.append(
            f"{_count(seen.imported, 'imported file')} (altChunk) Word merges in on opening, "
            "which are not read; save the document again in Word to merge them"
        )
    return reason + (f"; it holds {' and '.join(held)})" if held else ")")
