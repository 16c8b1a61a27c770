"""PowerPoint files (.pptx, python-pptx): one part per slide, cited as ``deck.pptx#slide=4``,
holding its title, the text of its shapes in the deck's shape order (groups opened, tables as
Markdown tables) and its speaker notes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ragchains.ingest.officezip import library_failure, open_office
from ragchains.ingest.parts import LoadedFile, LoadOptions, Part, SkipFile, markdown_table


def _shape_lines(shapes: Any, title_shape: Any) -> Iterator[str]:
    from pptx.enum.shapes import MSO_SHAPE_TYPE

    for shape in shapes:
        if title_shape is not None and shape.shape_id == title_shape.shape_id:
            continue
        if shape.shape_type == MSO_SHAPE_TYPE.GROUP:
            yield from _shape_lines(shape.shapes, None)
        elif shape.has_table:
            rows = [[cell.text for cell in row.cells] for row in shape.table.rows]
            rendered = markdown_table(rows)
            if rendered is not None:
                yield rendered[1]
        elif shape.has_text_frame:
            for paragraph in shape.text_frame.paragraphs:
                text = " ".join(paragraph.text.split())
                if text:
                    # Indented paragraphs of a body placeholder are bullets.
                    yield f"- {text}" if paragraph.level > 0 else text


def load_pptx(path: Path, options: LoadOptions) -> LoadedFile:
    from pptx import Presentation

    data = open_office(path, "PowerPoint", "ppt")
    try:
        deck = Presentation(data)
        title = deck.core_properties.title
        author = deck.core_properties.author
        slides = []
        for number, slide in enumerate(deck.slides, start=1):
            title_shape = slide.shapes.title
            heading = " ".join(title_shape.text.split()) if title_shape is not None else ""
            lines = [heading] if heading else []
            lines.extend(_shape_lines(slide.shapes, title_shape))
            if slide.has_notes_slide:
                notes = slide.notes_slide.notes_text_frame
                text = notes.text.strip() if notes is not None else ""
                if text:
                    lines.append(f"Speaker notes: {text}")
            slides.append((number, heading, lines))
    except SkipFile:
        raise
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
        raise SkipFile("PowerPoint deck has no text")
    first_title = next((heading for _, heading, _ in slides if heading), None)
    return LoadedFile(format="pptx", title=title or first_title or path.stem, parts=parts)
