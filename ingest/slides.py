"""PowerPoint files (.pptx, python-pptx): one part per slide, cited as ``deck.pptx#slide=4``,
holding its title, the text of its shapes in the deck's shape order (groups opened, tables as
Markdown tables, SmartArt's node text, a chart's titles, series and categories) and its
speaker notes.

The shape tree is walked as XML rather than through python-pptx's shapes, which do not look
inside ``mc:AlternateContent`` (where newer shapes and equations sit, beside an older
fallback holding the same text: one is read) nor into a graphic frame's SmartArt or chart.
Slide layouts and masters are the deck's template (placeholder prompts, footers): not read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragchains.ingest.officezip import library_failure, open_office, part_xml
from ragchains.ingest.parts import LoadedFile, LoadOptions, Part, SkipFile, markdown_table

_A = "{http://schemas.openxmlformats.org/drawingml/2006/main}"
_P = "{http://schemas.openxmlformats.org/presentationml/2006/main}"
_DGM = "{http://schemas.openxmlformats.org/drawingml/2006/diagram}"
_CHART = "{http://schemas.openxmlformats.org/drawingml/2006/chart}"
_R = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}"
_MC = "{http://schemas.openxmlformats.org/markup-compatibility/2006}"
_ALTERNATE = f"{_MC}AlternateContent"
_MATH_TEXT = "{http://schemas.openxmlformats.org/officeDocument/2006/math}t"
_TEXT_CACHES = (f"{_CHART}strCache", f"{_CHART}strLit", f"{_CHART}multiLvlStrCache")
_PROPERTIES = {f"{_A}pPr", f"{_A}rPr", f"{_A}endParaRPr"}
# Category labels and series names read from a chart, at most: a chart of a few thousand
# points is data, and the deck's text is not the place to index it.
MAX_CHART_LABELS = 200


def _count(count: int, noun: str, plural: str | None = None) -> str:
    plural = plural or f"{noun}s"
    if count == 0:
        return f"no {plural}"
    return f"{count} {noun if count == 1 else plural}"


def _branch(alternate: Any) -> Any:
    """One branch of an ``mc:AlternateContent``: its choices and fallback hold the same
    content for readers of different versions, so only one is read."""
    for child in alternate:
        if child.tag in (f"{_MC}Choice", f"{_MC}Fallback"):
            return child
    return None


def _runs(element: Any, pieces: list[str]) -> None:
    for child in element:
        tag = child.tag
        if not isinstance(tag, str) or tag in _PROPERTIES:
            continue
        if tag in (f"{_A}t", _MATH_TEXT):
            pieces.append(child.text or "")
        elif tag == f"{_A}br":
            pieces.append(" ")
        elif tag == _ALTERNATE:
            branch = _branch(child)
            if branch is not None:
                _runs(branch, pieces)
        else:  # runs, fields, equations
            _runs(child, pieces)


def _paragraphs(body: Any) -> Iterator[tuple[str, int]]:
    """A text body's paragraphs as (text on one line, indent level)."""
    if body is None:
        return
    for paragraph in body.iter(f"{_A}p"):
        pieces: list[str] = []
        _runs(paragraph, pieces)
        text = " ".join("".join(pieces).split())
        if text:
            properties = paragraph.find(f"{_A}pPr")
            level = properties.get("lvl") if properties is not None else None
            yield text, int(level) if level and level.isdigit() else 0


@dataclass
class _Seen:
    """What the walk looked at, for the reason a deck yields nothing."""

    tables: int = 0
    groups: int = 0
    smartart: int = 0
    charts: int = 0
    pictures: int = 0


@dataclass
class _Slide:
    part: Any
    number: int
    seen: _Seen = field(default_factory=_Seen)
    unread: list[str] = field(default_factory=list)  # parts that could not be parsed

    def shapes(self, tree: Any, title: Any) -> Iterator[str]:
        for shape in tree:
            tag = shape.tag
            if shape is title:
                continue
            if tag == f"{_P}sp":
                for text, level in _paragraphs(shape.find(f"{_P}txBody")):
                    # Indented paragraphs of a body placeholder are bullets.
                    yield f"- {text}" if level > 0 else text
            elif tag == f"{_P}grpSp":
                self.seen.groups += 1
                yield from self.shapes(shape, None)
            elif tag == f"{_P}graphicFrame":
                yield from self._frame(shape)
            elif tag == _ALTERNATE:
                branch = _branch(shape)
                if branch is not None:
                    yield from self.shapes(branch, title)
            elif tag == f"{_P}pic":
                self.seen.pictures += 1

    def _frame(self, frame: Any) -> Iterator[str]:
        data = frame.find(f"{_A}graphic/{_A}graphicData")
        if data is None:
            return
        table = data.find(f"{_A}tbl")
        if table is not None:
            self.seen.tables += 1
            rendered = markdown_table(_table_rows(table))
            if rendered is not None:
                yield rendered[1]
            return
        diagram = data.find(f"{_DGM}relIds")
        if diagram is not None:
            self.seen.smartart += 1
            yield from self._smartart(diagram.get(f"{_R}dm"))
            return
        chart = data.find(f"{_CHART}chart")
        if chart is not None:
            self.seen.charts += 1
            yield from self._chart(chart.get(f"{_R}id"))

    def _related(self, rid: str | None, what: str) -> Any:
        from lxml import etree

        try:
            return part_xml(self.part.related_part(rid)) if rid else None
        except KeyError:  # a relationship the package lacks: nothing to read there
            return None
        except etree.XMLSyntaxError as exc:
            self.unread.append(f"slide {self.number}: unreadable {what} ({exc})")
            return None

    def _smartart(self, rid: str | None) -> Iterator[str]:
        """SmartArt's node text, from its data part: the drawing part beside it holds the
        same text laid out in shapes."""
        data = self._related(rid, "SmartArt")
        if data is None:
            return
        for point in data.iter(f"{_DGM}pt"):
            # Connections (parTrans, sibTrans) and presentation points hold no text of
            # the author's; a node still showing its prompt ("[Text]") holds none either.
            if point.get("type", "node") not in ("node", "asst"):
                continue
            settings = point.find(f"{_DGM}prSet")
            if settings is not None and settings.get("phldr") in ("1", "true"):
                continue
            for text, _ in _paragraphs(point.find(f"{_DGM}t")):
                yield text

    def _chart(self, rid: str | None) -> Iterator[str]:
        """A chart's titles, series names and category labels (not its numbers)."""
        chart = self._related(rid, "chart")
        if chart is None:
            return
        titles = []
        for title in chart.iter(f"{_CHART}title"):  # the chart's and its axes'
            text = " ".join(text for text, _ in _paragraphs(title))
            if text:
                titles.append(text)
        labels: dict[str, list[str]] = {"series": [], "categories": []}
        for series in chart.iter(f"{_CHART}ser"):
            for name in series.iterfind(f"{_CHART}tx//{_CHART}v"):
                labels["series"].append(name.text or "")
            for category in series.iterfind(f"{_CHART}cat"):
                # Text categories only: numbers and dates are data, stored as serials.
                for cache in category.iter(*_TEXT_CACHES):
                    for point in cache.iter(f"{_CHART}v"):
                        labels["categories"].append(point.text or "")
        line = [f"Chart: {'; '.join(titles)}" if titles else "Chart"]
        for kind, names in labels.items():
            unique = [name for name in dict.fromkeys(" ".join(n.split()) for n in names) if name]
            if unique:
                line.append(f"{kind}: {', '.join(unique[:MAX_CHART_LABELS])}")
        if len(line) > 1 or titles:
            yield " - ".join(line)


def _table_rows(table: Any) -> list[list[str]]:
    rows = []
    above: dict[int, str] = {}  # column -> text of the cell last started there
    for row in table.iterfind(f"{_A}tr"):
        cells = []
        for column, cell in enumerate(row.iterfind(f"{_A}tc")):
            if cell.get("vMerge") in ("1", "true"):
                # Merged down from the row above: repeated, so each row reads whole.
                text = above.get(column, "")
            else:
                text = " ".join(text for text, _ in _paragraphs(cell.find(f"{_A}txBody")))
                above[column] = text
            cells.append(text)
        rows.append(cells)
    return rows


def load_pptx(path: Path, options: LoadOptions) -> LoadedFile:
    from pptx import Presentation

    data = open_office(path, "PowerPoint", "ppt")
    seen = _Seen()
    unread: list[str] = []
    try:
        deck = Presentation(data)
        title = deck.core_properties.title
        author = deck.core_properties.author
        slides = []
        notes_read = 0
        for number, slide in enumerate(deck.slides, start=1):
            title_shape = slide.shapes.title
            heading = " ".join(title_shape.text.split()) if title_shape is not None else ""
            lines = [heading] if heading else []
            walk = _Slide(slide.part, number, seen, unread)
            title_element = title_shape.element if title_shape is not None else None
            lines.extend(walk.shapes(slide.element.cSld.spTree, title_element))
            if slide.has_notes_slide:
                notes_read += 1
                notes = slide.notes_slide.notes_text_frame
                text = notes.text.strip() if notes is not None else ""
                if text:
                    lines.append(f"Speaker notes: {text}")
            slides.append((number, heading, lines))
    except SkipFile:
        raise
    except RecursionError as exc:
        raise SkipFile("PowerPoint deck nests its shapes too deeply to read") from exc
    except Exception as exc:  # python-pptx raises many kinds on damaged XML
        raise library_failure("PowerPoint", exc) from exc
    fields = {"author": author} if author else {}
    parts = [
        Part(
            text="\n".join(lines),
            slide=number,
            anchor=f"slide={number}",
            section=heading or None,
            fields=fields,
        )
        for number, heading, lines in slides
        if lines
    ]
    if not parts:
        raise SkipFile(_nothing_read(len(slides), notes_read, seen))
    first_title = next((heading for _, heading, _ in slides if heading), None)
    return LoadedFile(
        format="pptx", title=title or first_title or path.stem, parts=parts, partial=unread
    )


def _nothing_read(slides: int, notes: int, seen: _Seen) -> str:
    if not slides:
        return "PowerPoint deck has no slides"
    looked = [
        _count(slides, "slide"),
        _count(notes, "notes page"),
        _count(seen.groups, "group"),
        _count(seen.tables, "table"),
        _count(seen.smartart, "SmartArt graphic"),
        _count(seen.charts, "chart"),
    ]
    reason = f"PowerPoint deck has no text (looked at {', '.join(looked[:-1])} and {looked[-1]}"
    if seen.pictures:
        reason += f"; it holds {_count(seen.pictures, 'picture')}, whose text is not read"
    return reason + "; slide layouts and masters are the template, not read)"
