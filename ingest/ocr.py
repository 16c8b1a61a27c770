"""Reading page images by OCR: Debian's tesseract in a subprocess per page, the pages of a file
in parallel, each page's text in reading order with the boxes of its words and its mean word
confidence. Used by the image loader (``ingest.images``) and for PDF pages without a text
layer (``ingest.pdfs``).
"""

from __future__ import annotations

import io
import math
import os
import shutil
import subprocess
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from PIL import Image

from ragchains.ingest.parts import Part, SkipFile, WordBox

TESSERACT = "tesseract"
LANGUAGE = "eng"
# Scans are rendered and read at 300 dpi, the resolution tesseract's models are tuned for.
OCR_DPI = 300
# Pages larger than this are refused before they are decoded or rendered. 60 megapixels holds
# an A2 sheet at 300 dpi (35 MP) or an A1 at 270; each is 60 MB of grey pixels, held a few
# times over while it is cleaned up and read, on each core. Larger is a poster, a map or a
# decompression bomb, not a page to read.
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
    ``timeout``: seconds one page may take (``LoadOptions.ocr_page_timeout``); a full A4 page
    at 300 dpi takes about 1.5 s of one core (bench/ocr_quality.py), so a page over a minute
    is one tesseract is stuck on (very grainy scans can be).

    Pages are read by one tesseract process per core at a time; ``pages`` is drawn from
    lazily, at most one page ahead of the workers, so a long scan is never held in memory
    whole (a rendered A4 page is 9 MB)."""
    executable = require_tesseract()
    workers = workers or usable_cores()
    with ThreadPoolExecutor(workers, thread_name_prefix="ocr") as pool:
        pending: deque[tuple[PageImage, Future[Part | None]]] = deque()
        for page in pages:
            pending.append((page, pool.submit(read_page, page, executable, timeout)))
            if len(pending) > workers:
                yield from _finished(*pending.popleft(), timeout)
        while pending:
            yield from _finished(*pending.popleft(), timeout)


def usable_cores() -> int:
    """The cores this process may run on (its affinity, which a container or taskset can
    narrow), not all the machine has."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


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
    image, angle = clean_scan(page.image)
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
        # Sauvola's local threshold, not Otsu's one for the whole page: on a sparse page of
        # grainy paper Otsu's splits the grain itself and tesseract finds no text at all.
        "-c",
        "thresholding_method=2",
        "--dpi",
        str(round(min(max(page.dpi, 70), 2400))),
        "tsv",
    ]
    # One thread per process: the pages already run in parallel, one per core, and
    # tesseract's OpenMP threads on top of that slow it down (oversubscription).
    env = {**os.environ, "OMP_THREAD_LIMIT": "1"}
    try:
        done = subprocess.run(
            command, input=_pnm(image), capture_output=True, timeout=timeout, env=env
        )
    except FileNotFoundError as exc:
        raise SkipFile(MISSING) from exc
    if done.returncode != 0:
        detail = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise OcrFailed(f"OCR failed ({detail[-1][:160] if detail else done.returncode})")
    return page_part(page, done.stdout.decode("utf-8", "replace"), angle)


def _pnm(image: Image.Image) -> bytes:
    # PNM is read by leptonica without decoding work and costs nothing to write.
    buffer = io.BytesIO()
    image.save(buffer, "PPM")
    return buffer.getvalue()


# ----------------------------------------------------------------------------- clean-up
# On grainy, speckled scans turned by 1-2 degrees (bench/ocr_quality.py) tesseract's layout
# analysis takes paragraphs, or a whole page, for a picture and drops them: alone it lost one
# page of nine (median CER 0.8 %); despeckled and levelled first, the worst page is at 0.2 %.

# Isolated dark pixels per page pixel above which a page is despeckled: a clean render or
# scan has none (a letter's smallest part, an i's dot, is several pixels), a speckled scan
# from 2e-4 up. A 3x3 median removes them, and costs small print a little, so only then.
SPECKLED = 2e-5
# Skew is searched within this many degrees and corrected from MIN_SKEW up: below it
# tesseract's own line finding copes, and resampling the page would cost more than it gains.
MAX_SKEW = 5.0
MIN_SKEW = 0.3


def clean_scan(image: Image.Image) -> tuple[Image.Image, float]:
    """The page despeckled when it is speckled and turned level when it is skewed, with the
    angle it was turned by (degrees, counter-clockwise) to map boxes back."""
    grey = image.convert("L") if image.mode != "L" else image
    pixels = np.asarray(grey)
    paper = float(np.median(pixels[::8, ::8]))
    if _isolated_ink(pixels, _ink_level(pixels, paper)) > SPECKLED:
        grey = Image.fromarray(median3x3(pixels), "L")
    angle = skew_angle(grey, paper)
    if abs(angle) < MIN_SKEW:
        return grey, 0.0
    return grey.rotate(angle, resample=Image.Resampling.BICUBIC, fillcolor=round(paper)), angle


def _ink_level(pixels: np.ndarray, paper: float) -> float:
    """Grey below which a pixel is ink: halfway from the paper to the darkest pixels, and
    at least 48 levels under the paper (a page with hardly any print has no dark end)."""
    dark = float(np.percentile(pixels[::8, ::8], 1))
    return (paper + min(dark, paper - 96)) / 2


def _isolated_ink(pixels: np.ndarray, level: float) -> float:
    ink = pixels < level
    padded = np.pad(ink, 1)
    rows, cols = ink.shape
    neighbours = np.zeros(ink.shape, dtype=np.uint8)
    for dy in (0, 1, 2):
        for dx in (0, 1, 2):
            if dy != 1 or dx != 1:
                neighbours += padded[dy : dy + rows, dx : dx + cols]
    return float(np.count_nonzero(ink & (neighbours == 0))) / ink.size


# Exchanges that leave the median of nine values in the fifth (Paeth's network, 19 steps).
_MEDIAN_OF_9 = (
    (1, 2), (4, 5), (7, 8), (0, 1), (3, 4), (6, 7), (1, 2), (4, 5), (7, 8), (0, 3),
    (5, 8), (4, 7), (3, 6), (1, 4), (2, 5), (4, 7), (4, 2), (6, 4), (4, 2),
)  # fmt: skip


def median3x3(pixels: np.ndarray, strip: int = 512) -> np.ndarray:
    """Each pixel the median of its 3x3 neighbourhood, as ``ImageFilter.MedianFilter(3)``
    gives it at a twentieth of the time (Pillow ranks each window; this compares whole rows
    at once), a strip of rows at a time so the nine shifted copies stay small."""
    out = np.empty_like(pixels)
    padded = np.pad(pixels, 1, mode="edge")
    rows, cols = pixels.shape
    for top in range(0, rows, strip):
        n = min(strip, rows - top)
        window = [
            padded[top + dy : top + dy + n, dx : dx + cols].copy()
            for dy in range(3)
            for dx in range(3)
        ]
        for a, b in _MEDIAN_OF_9:
            low = np.minimum(window[a], window[b])
            np.maximum(window[a], window[b], out=window[b])
            window[a] = low
        out[top : top + n] = window[4]
    return out


def skew_angle(image: Image.Image, paper: float) -> float:
    """The rotation (degrees, counter-clockwise) that levels the page's lines: the angle at
    which the ink, projected onto the page's height, piles up into the sharpest rows. Found on
    a quarter-size copy, coarse then fine; 0 for a page with too little ink to tell."""
    small = np.asarray(image.reduce(4))
    ys, xs = np.nonzero(small < _ink_level(small, paper))
    if len(ys) < 200:
        return 0.0
    step = len(ys) // 200_000 + 1  # a sample is as sharp, and bounds the time on a dark page
    ys, xs = ys[::step], xs[::step]
    ys = ys.astype(np.float64)
    xs = xs.astype(np.float64) - small.shape[1] / 2

    def sharpness(angle: float) -> float:
        rows = np.round(ys - xs * math.tan(math.radians(angle))).astype(np.int64)
        counts = np.bincount(rows - rows.min()).astype(np.float64)
        return float(np.dot(counts, counts))

    coarse = max(np.arange(-MAX_SKEW, MAX_SKEW + 0.01, 0.5), key=sharpness)
    fine = max(np.arange(coarse - 0.5, coarse + 0.51, 0.1), key=sharpness)
    return round(float(fine), 1)


def _unrotate(angle: float, size: tuple[int, int]) -> Callable[[float, float], tuple[float, float]]:
    """Where a point of the page turned by ``angle`` (``Image.rotate``) lies on the page as
    it was: Pillow's own inverse mapping for that rotation."""
    theta = -math.radians(angle)
    cos, sin = math.cos(theta), math.sin(theta)
    cx, cy = size[0] / 2, size[1] / 2

    def back(x: float, y: float) -> tuple[float, float]:
        return cos * (x - cx) + sin * (y - cy) + cx, -sin * (x - cx) + cos * (y - cy) + cy

    return back


def page_part(page: PageImage, tsv: str, angle: float = 0.0) -> Part | None:
    """The page's text from tesseract's TSV: words in its order, a space between the words of
    a line, a newline between lines, a blank line between paragraphs and blocks."""
    text: list[str] = []
    words: list[WordBox] = []
    confidences: list[float] = []
    length = 0
    last_line: tuple[str, str, str] | None = None
    sx, sy = page.points_per_pixel
    back = _unrotate(angle, page.image.size) if angle else None
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
        x0, y0, x1, y1 = float(left), float(top), float(left + width), float(top + height)
        if back is not None:  # the box around the word's corners on the page as scanned
            corners = [back(x, y) for x in (x0, x1) for y in (y0, y1)]
            x0, x1 = min(x for x, _ in corners), max(x for x, _ in corners)
            y0, y1 = min(y for _, y in corners), max(y for _, y in corners)
        box = (x0 * sx, y0 * sy, x1 * sx, y1 * sy)
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
    more = len(notes) - 1
    return f"{notes[0]} (and {more} more page{'s' if more > 1 else ''})"
