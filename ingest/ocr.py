"""Reading page images by OCR: Debian's tesseract in a subprocess per page, the pages of a file
in parallel, each page's text in reading order with the boxes of its words and its mean word
confidence. Used by the image loader (``ingest.images``) and for PDF pages without a text
layer (``ingest.pdfs``).
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from PIL import Image

from ragchains.ingest.parts import Part, SkipFile, WordBox

TESSERACT = "tesseract"
LANGUAGE = "eng"
# Scans are rendered and read at 300 dpi, the resolution tesseract's models are tuned for.
OCR_DPI = 300
# Pages larger than this are refused before they are decoded or rendered: 60 megapixels is an
# A0 sheet at 150 dpi or an A3 at 400, about 60 MB of grey pixels (and tesseract needs a few
# times that); larger is a poster, a map or a decompression bomb, not a page to read.
MAX_PIXELS = 60_000_000
MISSING = "OCR engine not installed (tesseract); run make setup"


@dataclass(frozen=True)
class PageImage:
    """One page to read: its 1-based number, its pixels, and the size of a pixel in PDF
    points, which turns tesseract's pixel boxes into the page's own coordinates."""

    number: int
    image: Image.Image
    points_per_pixel: tuple[float, float]
    dpi: float = OCR_DPI

    @property
    def page_size(self) -> tuple[float, float]:
        return (
            self.image.width * self.points_per_pixel[0],
            self.image.height * self.points_per_pixel[1],
        )


def over_pixel_cap(width: int, height: int) -> str | None:
    """Why an image of this size is refused, or None when it is within ``MAX_PIXELS``."""
    if width * height <= MAX_PIXELS:
        return None
    return f"image of {width}×{height} pixels is over the {MAX_PIXELS // 1_000_000}-megapixel cap"


def require_tesseract() -> str:
    """The tesseract executable, or the file is skipped with what to do about it."""
    found = shutil.which(TESSERACT)
    if found is None:
        raise SkipFile(MISSING)
    return found


def ocr_pages(
    pages: Iterable[PageImage], *, timeout: float, workers: int | None = None
) -> Iterator[Part | str]:
    """Each page's ``Part``, or a one-line note of why the page could not be read ("page 3:
    OCR timed out after 60 s"), in page order; a page with no text gives neither.
    ``timeout``: seconds one page may take (``LoadOptions.ocr_page_timeout``); a dense A4 page
    at 300 dpi takes 2-5 s on one core, so a page over a minute is one tesseract is stuck on.

    Pages are read by one tesseract process per core at a time; ``pages`` is drawn from
    lazily, at most one page ahead of the workers, so a long scan is never held in memory
    whole (a rendered A4 page is 9 MB)."""
    executable = require_tesseract()
    workers = workers or os.cpu_count() or 1
    with ThreadPoolExecutor(workers, thread_name_prefix="ocr") as pool:
        pending: deque[tuple[PageImage, Future[Part | None]]] = deque()
        for page in pages:
            pending.append((page, pool.submit(read_page, page, executable, timeout)))
            if len(pending) > workers:
                yield from _finished(*pending.popleft(), timeout)
        while pending:
            yield from _finished(*pending.popleft(), timeout)


def _finished(page: PageImage, future: Future[Part | None], timeout: float) -> Iterator[Part | str]:
    try:
        part = future.result()
    except subprocess.TimeoutExpired:
        yield f"page {page.number}: OCR timed out after {timeout:g} s"
    except OcrFailed as exc:
        yield f"page {page.number}: {exc}"
    else:
        if part is not None:
            yield part


class OcrFailed(Exception):
    """tesseract could not read a page; ``str(exc)`` says why, in one line."""


def read_page(page: PageImage, executable: str, timeout: float) -> Part | None:
    """One page through tesseract: its text, word boxes and confidence, None if blank."""
    command = [
        executable,
        "stdin",
        "stdout",
        "-l",
        LANGUAGE,
        # Automatic page segmentation: columns, headings and tables come out as blocks in
        # reading order, where --psm 6 reads the page as one block and interleaves columns.
        "--psm",
        "3",
        "--dpi",
        str(round(min(max(page.dpi, 70), 2400))),
        "tsv",
    ]
    # One thread per process: the pages already run in parallel, one per core, and
    # tesseract's OpenMP threads on top of that slow it down (oversubscription).
    env = {**os.environ, "OMP_THREAD_LIMIT": "1"}
    try:
        done = subprocess.run(
            command, input=_pnm(page.image), capture_output=True, timeout=timeout, env=env
        )
    except FileNotFoundError as exc:
        raise SkipFile(MISSING) from exc
    if done.returncode != 0:
        detail = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise OcrFailed(f"OCR failed ({detail[-1][:160] if detail else done.returncode})")
    return page_part(page, done.stdout.decode("utf-8", "replace"))


def _pnm(image: Image.Image) -> bytes:
    # PNM is read by leptonica without decoding work and costs nothing to write.
    buffer = io.BytesIO()
    image.save(buffer, "PPM")
    return buffer.getvalue()


def page_part(page: PageImage, tsv: str) -> Part | None:
    """The page's text from tesseract's TSV: words in its order, a space between the words of
    a line, a newline between lines, a blank line between paragraphs and blocks."""
    text: list[str] = []
    words: list[WordBox] = []
    confidences: list[float] = []
    length = 0
    last_line: tuple[str, str, str] | None = None
    sx, sy = page.points_per_pixel
    for row in tsv.splitlines()[1:]:
        cells = row.split("\t")
        # level 5 is a word; its text is the 12th column and may be empty (a speck)
        if len(cells) < 12 or cells[0] != "5" or not cells[11].strip():
            continue
        block, paragraph, line = cells[2], cells[3], cells[4]
        left, top, width, height = (int(v) for v in cells[6:10])
        word = cells[11].strip()
        if last_line is not None:
            if (block, paragraph) != last_line[:2]:
                gap = "\n\n"
            elif line != last_line[2]:
                gap = "\n"
            else:
                gap = " "
            text.append(gap)
            length += len(gap)
        last_line = (block, paragraph, line)
        box = (left * sx, top * sy, (left + width) * sx, (top + height) * sy)
        words.append(WordBox(length, length + len(word), box))
        text.append(word)
        length += len(word)
        confidences.append(max(float(cells[10]), 0.0) / 100.0)
    if not words:
        return None
    return Part(
        text="".join(text),
        page=page.number,
        anchor=f"page={page.number}",
        page_size=page.page_size,
        words=words,
        ocr_confidence=sum(confidences) / len(confidences),
    )


def unread_reason(notes: list[str]) -> str:
    """The reason a file none of whose pages could be read is skipped, in one line."""
    if len(notes) == 1:
        return notes[0]
    return f"{notes[0]} (and {len(notes) - 1} more pages)"
