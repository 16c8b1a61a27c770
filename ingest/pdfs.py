"""PDF files: each page's text with the boxes of its words, read from the text layer with
pdfium; pages without a text layer are rendered and OCRed (``ingest.ocr``)."""

from __future__ import annotations

import ctypes
import math
import shutil
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c

from ragchains.ingest import ocr, pageprogress
from ragchains.ingest.parts import Box, LoadedFile, LoadOptions, Part, SkipFile, WordBox, read_bytes

# pdfium's character for a hyphen that ends a line while its word goes on at the start of the
# next: the text joins the halves ("hy-" + "phen" is "hyphen"), each half keeping its own box.
_LINE_END_HYPHEN = 0x02
# FPDF_PageToDevice answers in whole device units: asking for ten per point keeps a tenth.
_UNITS_PER_POINT = 10
_RENDER_SCALE = ocr.OCR_DPI / 72

_OPEN_ERRORS = {
    pdfium_c.FPDF_ERR_FILE: "the file cannot be read as a PDF",
    pdfium_c.FPDF_ERR_FORMAT: "damaged or not a PDF",
    pdfium_c.FPDF_ERR_UNKNOWN: "unknown error",
    pdfium_c.FPDF_ERR_SUCCESS: "no pages",
}


def load_pdf(path: Path, options: LoadOptions) -> LoadedFile:
    data = read_bytes(path)
    if not data.strip():
        raise SkipFile("empty file")
    pdf = _open(data)
    try:
        title = (pdf.get_metadata_value("Title") or "").strip()
        parts: list[Part] = []
        notes: list[str] = []
        scans: list[int] = []  # pages with no text layer, to OCR
        pageprogress.pages_to_read(len(pdf))
        for index in range(len(pdf)):
            number = index + 1
            page = _page(pdf, index, notes)
            if page is None:
                continue
            try:
                part = _text_part(page, number)
                if part is not None:
                    parts.append(part)
                    pageprogress.page_read()
                elif pdfium_c.FPDFPage_CountObjects(page) > 0:  # not a blank page
                    scans.append(index)
                else:
                    pageprogress.page_read()
            finally:
                page.close()
        if scans:
            if shutil.which(ocr.TESSERACT) is None:
                if not parts:
                    raise SkipFile(ocr.MISSING)
                notes.append(f"{_pages(scans)} not OCRed: {ocr.MISSING}")
            else:
                for result in ocr.ocr_pages(
                    _renders(pdf, scans, notes), timeout=options.ocr_page_timeout
                ):
                    pageprogress.page_read()
                    if isinstance(result, Part):
                        parts.append(result)
                    else:
                        notes.append(result)
    finally:
        pdf.close()
    if not parts:
        if notes:
            raise SkipFile(ocr.unread_reason(notes))
        raise SkipFile("PDF has no text (no text layer, and OCR found none)")
    parts.sort(key=lambda part: part.page or 0)
    return LoadedFile(format="pdf", title=title or path.stem, parts=parts, partial=notes)


def _open(data: bytes) -> pdfium.PdfDocument:
    try:
        # An empty password opens the many PDFs that carry only an owner password.
        return pdfium.PdfDocument(data, password="")
    except pdfium.PdfiumError as exc:
        if exc.err_code == pdfium_c.FPDF_ERR_PASSWORD:
            raise SkipFile("encrypted PDF (password required)") from exc
        if exc.err_code == pdfium_c.FPDF_ERR_SECURITY:
            raise SkipFile(
                "encrypted PDF that cannot be opened here (unsupported security)"
            ) from exc
        raise SkipFile(f"corrupt PDF: {_OPEN_ERRORS.get(exc.err_code, exc)}") from exc


def _page(pdf: pdfium.PdfDocument, index: int, notes: list[str]) -> pdfium.PdfPage | None:
    """The page, or None with a note when pdfium cannot open it (the others are still read)."""
    try:
        return pdf[index]
    except pdfium.PdfiumError as exc:
        notes.append(f"page {index + 1}: could not be read ({exc})")
        return None


def _pages(indexes: list[int]) -> str:
    numbers = [str(i + 1) for i in indexes]
    if len(numbers) == 1:
        return f"page {numbers[0]}"
    shown = ", ".join(numbers[:10]) + (", …" if len(numbers) > 10 else "")
    return f"{len(numbers)} pages without a text layer ({shown})"


def _text_part(page: pdfium.PdfPage, number: int) -> Part | None:
    """The page's text layer as a part, with its words' boxes; None when it has no text."""
    text, words = _text_layer(page)
    if not text.strip():
        return None
    return Part(
        text=text,
        page=number,
        anchor=f"page={number}",
        page_size=(page.get_width(), page.get_height()),
        words=words,
    )


def _text_layer(page: pdfium.PdfPage) -> tuple[str, list[WordBox]]:
    """The page's characters in pdfium's order, its line breaks as newlines, and a box for
    each run of characters between white space (each half of a hyphenated word its own)."""
    textpage = page.get_textpage()
    to_page = _Device(page)
    pieces: list[str] = []
    words: list[WordBox] = []
    length = 0
    start: int | None = None
    left = bottom = math.inf
    right = top = -math.inf

    def close_word() -> None:
        nonlocal start, left, bottom, right, top
        if start is not None and start < length:
            words.append(WordBox(start, length, to_page.box(left, bottom, right, top)))
        start = None
        left = bottom = math.inf
        right = top = -math.inf

    try:
        previous = 0
        for i in range(textpage.count_chars()):
            code = pdfium_c.FPDFText_GetUnicode(textpage, i)
            if code == _LINE_END_HYPHEN:
                close_word()
                continue
            if code == 0x0A and previous == 0x0D:  # pdfium ends a line with \r\n
                previous = code
                continue
            previous = code
            char = "\n" if code in (0x0A, 0x0D) else _char(code)
            if not char:
                continue
            if char.isspace():
                close_word()
            else:
                if start is None:
                    start = length
                try:
                    x0, y0, x1, y1 = textpage.get_charbox(i)
                except pdfium.PdfiumError:
                    pass
                else:
                    left, bottom = min(left, x0), min(bottom, y0)
                    right, top = max(right, x1), max(top, y1)
            pieces.append(char)
            length += len(char)
        close_word()
    finally:
        textpage.close()
    return "".join(pieces), words


def _char(code: int) -> str:
    """The character, or '' for what is no text (controls, non-characters, a lone surrogate)."""
    if code > 0x10FFFF:
        return ""
    char = chr(code)
    if char == "\t":
        return char
    if unicodedata.category(char) in ("Cc", "Cs", "Cn"):
        return ""
    return char


class _Device:
    """Page space (points from the bottom-left of the media box, before the page's /Rotate)
    to the page as shown: points from its top-left corner, as a render draws it."""

    def __init__(self, page: pdfium.PdfPage) -> None:
        self.page = page
        self.width = round(page.get_width() * _UNITS_PER_POINT)
        self.height = round(page.get_height() * _UNITS_PER_POINT)
        self._x = ctypes.c_int()
        self._y = ctypes.c_int()

    def point(self, x: float, y: float) -> tuple[float, float]:
        pdfium_c.FPDF_PageToDevice(
            self.page, 0, 0, self.width, self.height, 0, x, y, self._x, self._y
        )
        return self._x.value / _UNITS_PER_POINT, self._y.value / _UNITS_PER_POINT

    def box(self, left: float, bottom: float, right: float, top: float) -> Box:
        if left > right:  # a word none of whose characters has a box
            return (0.0, 0.0, 0.0, 0.0)
        x0, y0 = self.point(left, bottom)
        x1, y1 = self.point(right, top)
        return (min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1))


def _renders(
    pdf: pdfium.PdfDocument, indexes: list[int], notes: list[str]
) -> Iterator[ocr.PageImage]:
    """The pages rendered grey at ``ocr.OCR_DPI`` one at a time, as the OCR workers take them
    (pdfium is not thread-safe: it renders in this thread only). A page that would render
    over the pixel cap is noted and left out."""
    for index in indexes:
        number = index + 1
        page = _page(pdf, index, notes)
        if page is None:
            continue
        try:
            width, height = page.get_width(), page.get_height()
            pixels = (math.ceil(width * ocr.OCR_DPI / 72), math.ceil(height * ocr.OCR_DPI / 72))
            if ocr.over_pixel_cap(*pixels):
                notes.append(
                    f"page {number}: a {width:.0f}×{height:.0f}-point page is "
                    f"{pixels[0]}×{pixels[1]} pixels at {ocr.OCR_DPI} dpi, over the "
                    f"{ocr.MAX_PIXELS // 1_000_000}-megapixel cap"
                )
                continue
            bitmap = page.render(scale=_RENDER_SCALE, grayscale=True)
            # A copy Pillow owns: the bitmap's memory is pdfium's, freed here, in this thread.
            image = bitmap.to_pil().copy()
            bitmap.close()
        except pdfium.PdfiumError as exc:
            notes.append(f"page {number}: could not be rendered ({exc})")
            continue
        finally:
            page.close()
        yield ocr.PageImage(number, image, (1 / _RENDER_SCALE, 1 / _RENDER_SCALE))
