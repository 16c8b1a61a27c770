"""An independent count of the words an Office Open XML file holds, to judge the loaders by.

It shares nothing with ``ragchains.ingest`` nor with python-docx, openpyxl or python-pptx: it
opens the file as a zip and reads the text elements of each part with lxml, matching on local
names so that Transitional (schemas.openxmlformats.org) and Strict (purl.oclc.org/ooxml) files
count alike. A loader that reads far fewer words than this has lost text (headers, comments,
text boxes, a Strict workbook's cells) rather than found none.

The files it is pointed at are hostile (tests/odd_documents): entities are never expanded, no
DTD or network is read, huge trees are refused, a part declaring more than ``MAX_PART_BYTES``
is skipped and at most ``MAX_TOTAL_BYTES`` are decompressed in all. A part that cannot be read
or parsed is counted in ``unreadable_parts``, never raised.

    python -m tests.oddtext FILE...   # prints the counts of each file as JSON
"""

from __future__ import annotations

import json
import re
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from lxml import etree

MAX_PART_BYTES = 64 * 1024 * 1024  # declared uncompressed size of one part
MAX_TOTAL_BYTES = 256 * 1024 * 1024  # decompressed over the whole file

# word/*.xml parts that hold no document text (styles, settings, lists, fonts, theme, ...).
_WORD_NOT_TEXT = re.compile(
    r"^word/(styles|stylesWithEffects|settings|webSettings|fontTable|numbering|theme\d*"
    r"|people|commentsExtended|commentsIds|commentsExtensible|customizations)\.xml$",
    re.IGNORECASE,
)
# Excel header and footer codes: &L &C &R, &P &N &D &T &Z &F &A, &"Font,Bold", &12, &K00FF00.
_HEADER_CODES = re.compile(r'&(?:"[^"]*"|K[0-9A-Fa-f]{6}|K\d\d[+-]\d{3}|\d+|[A-Za-z&])')

_SHEET_HEADERS = frozenset(
    ("oddHeader", "oddFooter", "evenHeader", "evenFooter", "firstHeader", "firstFooter")
)

Counts = dict[str, int]


class _Budget:
    """What is left of ``MAX_TOTAL_BYTES`` to decompress, shared by all parts of a file."""

    def __init__(self) -> None:
        self.left = MAX_TOTAL_BYTES


class _CappedReader:
    """A part's stream that stops at the file's budget (a zip's sizes may lie)."""

    def __init__(self, stream: IO[bytes], budget: _Budget) -> None:
        self.stream = stream
        self.budget = budget

    def read(self, size: int = -1) -> bytes:
        if self.budget.left <= 0:
            raise _OverBudget
        size = self.budget.left if size is None or size < 0 else min(size, self.budget.left)
        data = self.stream.read(size)
        self.budget.left -= len(data)
        return data


class _OverBudget(Exception):
    pass


def _local(tag: object) -> str:
    # Comments, processing instructions and entity references have a function as their tag.
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def _ends(archive: zipfile.ZipFile, name: str, budget: _Budget) -> Iterator[etree._Element]:
    """Each element of a part as it ends, parsed safely; the caller clears what it has read."""
    with archive.open(name) as raw:
        events = etree.iterparse(
            _CappedReader(raw, budget),
            events=("end",),
            resolve_entities=False,
            load_dtd=False,
            no_network=True,
            huge_tree=False,
            remove_comments=True,
            remove_pis=True,
        )
        for _, element in events:
            yield element


def _words(text: str) -> int:
    return len(text.split())


def _word_part(archive: zipfile.ZipFile, name: str, kind: str, budget: _Budget) -> Counts:
    """w:t text of a WordprocessingML part, by paragraph (runs split words; paragraphs do not).

    Text inside a text box (w:txbxContent) counts as ``text_boxes`` and inside a content
    control (w:sdtContent) as ``content_controls``, whatever part it is in; the rest as
    ``kind``. A text box is saved twice, as DrawingML and again in an mc:Fallback for older
    readers; the fallback copy is left out.
    """
    counts: Counts = {}
    pieces: dict[str, list[str]] = {}
    for element in _ends(archive, name, budget):
        tag = _local(element.tag)
        if tag == "t":
            ancestors = [_local(ancestor.tag) for ancestor in element.iterancestors()]
            if "Fallback" in ancestors:
                continue  # the same text again, for readers without DrawingML
            where = kind
            if "txbxContent" in ancestors:
                where = "text_boxes"
            elif "sdtContent" in ancestors:
                where = "content_controls"
            pieces.setdefault(where, []).append(element.text or "")
        elif tag in ("tab", "br", "cr", "p", "tc"):
            for texts in pieces.values():
                texts.append(" ")
            if tag == "p":
                # Paragraphs end here: count them and free the tree built so far.
                for where, texts in pieces.items():
                    counts[where] = counts.get(where, 0) + _words("".join(texts))
                pieces = {}
                if element.getparent() is not None and _local(element.getparent().tag) == "body":
                    element.clear()
    for where, texts in pieces.items():
        counts[where] = counts.get(where, 0) + _words("".join(texts))
    return counts


def _drawing_part(archive: zipfile.ZipFile, name: str, budget: _Budget) -> int:
    """a:t text of a DrawingML part (slides, notes, shapes of a sheet), by paragraph; an
    mc:Fallback copy of a shape is left out."""
    total = 0
    texts: list[str] = []
    for element in _ends(archive, name, budget):
        tag = _local(element.tag)
        if tag == "t":
            if not any(_local(a.tag) == "Fallback" for a in element.iterancestors()):
                texts.append(element.text or "")
        elif tag in ("p", "br", "text"):
            if tag == "text":  # a legacy PowerPoint comment's p:text
                texts.append(element.text or "")
            total += _words("".join(texts))
            texts = []
    return total + _words("".join(texts))


def _shared_strings(archive: zipfile.ZipFile, name: str, budget: _Budget) -> int:
    """Each shared string once, however many cells use it; phonetic runs (rPh) left out."""
    total = 0
    for element in _ends(archive, name, budget):
        if _local(element.tag) == "si":
            texts = [
                t.text or ""
                for t in element.iter("{*}t")
                if not any(_local(a.tag) == "rPh" for a in t.iterancestors())
            ]
            total += _words("".join(texts))
            element.clear()
            while element.getprevious() is not None:
                del element.getparent()[0]
    return total


def _worksheet(archive: zipfile.ZipFile, name: str, budget: _Budget) -> Counts:
    """Inline strings (t="inlineStr") and formula strings (t="str") of a sheet's cells, and
    the text of its headers and footers; cells pointing at shared strings are counted there."""
    counts: Counts = {"cells": 0, "headers_footers": 0}
    for element in _ends(archive, name, budget):
        tag = _local(element.tag)
        if tag == "c":
            cell_type = element.get("t")
            if cell_type == "inlineStr":
                texts = [t.text or "" for t in element.iter("{*}t")]
                counts["cells"] += _words("".join(texts))
            elif cell_type == "str":
                values = [v.text or "" for v in element.iter("{*}v")]
                counts["cells"] += _words("".join(values))
            element.clear()
        elif tag == "row":
            element.clear()
            while element.getprevious() is not None:
                del element.getparent()[0]
        elif tag in _SHEET_HEADERS:
            text = _HEADER_CODES.sub(" ", element.text or "")
            counts["headers_footers"] += _words(text)
    return counts


def _cell_comments(archive: zipfile.ZipFile, name: str, budget: _Budget) -> int:
    total = 0
    for element in _ends(archive, name, budget):
        if _local(element.tag) == "comment":
            total += _words("".join(t.text or "" for t in element.iter("{*}t")))
            element.clear()
    return total


def _add(counts: Counts, more: Counts) -> None:
    for kind, words in more.items():
        counts[kind] = counts.get(kind, 0) + words


def _part_counts(archive: zipfile.ZipFile, name: str, budget: _Budget) -> Counts | None:
    """The counts of one part by kind; None for a part that holds no text we count."""
    lower = name.lower()
    if not lower.endswith(".xml"):
        return None
    if lower.startswith("word/") and lower.count("/") == 1 and not _WORD_NOT_TEXT.match(name):
        stem = lower[len("word/") :]
        if stem.startswith(("header", "footer")):
            kind = "headers_footers"
        elif stem.startswith("comments"):
            kind = "comments"
        elif stem.startswith(("footnotes", "endnotes")):
            kind = "notes"
        elif stem.startswith("document"):
            kind = "body"
        else:
            kind = "other"
        return _word_part(archive, name, kind, budget)
    if re.match(r"ppt/slides/slide\d+\.xml$", lower):
        return {"slides": _drawing_part(archive, name, budget)}
    if re.match(r"ppt/notesslides/notesslide\d+\.xml$", lower):
        return {"notes": _drawing_part(archive, name, budget)}
    if lower.startswith("ppt/comments/"):
        return {"comments": _drawing_part(archive, name, budget)}
    if lower == "xl/sharedstrings.xml":
        return {"shared_strings": _shared_strings(archive, name, budget)}
    if re.match(r"xl/worksheets/sheet[^/]*\.xml$", lower):
        return _worksheet(archive, name, budget)
    if re.match(r"xl/comments[^/]*\.xml$", lower):
        return {"comments": _cell_comments(archive, name, budget)}
    if re.match(r"xl/drawings/drawing[^/]*\.xml$", lower):
        return {"text_boxes": _drawing_part(archive, name, budget)}
    return None


def count_words(path: Path) -> Counts | None:
    """Words of text by part kind, plus ``total``; None for a file that is not an OOXML zip.

    Kinds: body, content_controls, text_boxes, headers_footers, comments, notes, other (Word);
    slides, notes, comments (PowerPoint); shared_strings, cells, headers_footers, comments,
    text_boxes (Excel). ``total`` is their sum. ``unreadable_parts`` and ``skipped_parts`` count
    parts left out (damaged, unparseable, or over the size caps) and are not words.
    """
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return None
    with archive:
        names = [info.filename for info in archive.infolist()]
        if not any(n.lower().startswith(("word/", "ppt/", "xl/")) for n in names):
            return None
        counts: Counts = {}
        problems: Counts = {"unreadable_parts": 0, "skipped_parts": 0}
        budget = _Budget()
        for info in archive.infolist():
            if info.file_size > MAX_PART_BYTES:
                if info.filename.lower().endswith(".xml"):
                    problems["skipped_parts"] += 1
                continue
            try:
                part = _part_counts(archive, info.filename, budget)
            except _OverBudget:
                problems["skipped_parts"] += 1
                continue
            except (etree.LxmlError, zipfile.BadZipFile, OSError, ValueError, EOFError):
                problems["unreadable_parts"] += 1
                continue
            except NotImplementedError:  # an unsupported compression method
                problems["unreadable_parts"] += 1
                continue
            if part:
                _add(counts, part)
    counts = {kind: words for kind, words in counts.items() if words}
    counts["total"] = sum(counts.values())
    counts.update(problems)
    return counts


def main(argv: list[str]) -> int:
    for name in argv:
        print(json.dumps({"file": name, "words": count_words(Path(name))}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
