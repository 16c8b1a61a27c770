"""OCR quality and speed: the character error rate of scans read through ragchains' OCR
(``ingest.ocr``: clean-up, then tesseract), and pages per second on every core against one.

The pages are the repository's sample documents (samples/: Markdown, text and PDF), printed
on A4 at 300 dpi in 11-point DejaVu Serif and Liberation Sans, then read back clean, and as a
poor scanner returns them: turned by 1 to 2 degrees either way, softened, grey paper and ink,
grain and specks (``tests.test_ocr.degrade``, as the tests scan them). The same noisy pages
are also read by tesseract alone (its defaults: no clean-up, Otsu's threshold), to show what
the clean-up buys; and very noisy pages, to show their confidence falls under the 0.7 that
marks a chunk ``ocr_low_confidence``.

CER = Levenshtein distance / reference length, on text with its white space collapsed; the
median over pages. Targets (issue 25): at most 3 % clean, 8 % noisy and turned.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import resource
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import numpy as np
from PIL import ImageDraw, ImageFont

from bench.common import REPO, machine_line, write_section
from ragchains.ingest import ocr
from ragchains.ingest.loaders import load_file
from ragchains.ingest.parts import LoadOptions, Part
from tests.test_ocr import A4, DPI, SANS, SERIF, degrade, draw_page

ANGLES = (1.5, -2.0, 1.0, -1.5, 2.0, -1.0)  # noisy page i is turned by ANGLES[i % 6]
VERY_NOISY = {"noise": 70, "blur": 1.2, "specks": 0.005}
TIMEOUT = 300.0  # a page this bench cannot read is a result, not a time-out
SIZE_PT = 11
MARGIN = 300  # pixels: one inch


# ----------------------------------------------------------------------------- pages
def sample_paragraphs() -> list[str]:
    """The prose of samples/, one string per paragraph: Markdown's marks and tables' rules
    dropped (a scan of a table would not show them)."""
    paragraphs = []
    for path in sorted((REPO / "samples").rglob("*")):
        if path.suffix not in (".md", ".txt", ".pdf"):
            continue
        for part in load_file(path).parts:
            text = re.sub(r"^#+\s*", "", part.text, flags=re.MULTILINE)
            text = re.sub(r"^\|?[\s:|-]+\|?$", "", text, flags=re.MULTILINE)  # |---|---|
            for paragraph in re.split(r"\n\s*\n", text):
                words = paragraph.replace("|", " ").replace("**", "").split()
                if words:
                    paragraphs.append(" ".join(words))
    return paragraphs


def page_lines(paragraphs: Sequence[str], font: Path) -> list[list[str]]:
    """The paragraphs wrapped to A4 between one-inch margins, a blank line between them, cut
    into pages as ``draw_page`` lays its lines out."""
    face = ImageFont.truetype(str(font), round(SIZE_PT * DPI / 72))
    measure = ImageDraw.Draw(draw_page([])[0])
    width = A4[0] - 2 * MARGIN
    per_page = (A4[1] - 2 * MARGIN) // round(face.size * 1.45)
    lines: list[str] = []
    for paragraph in paragraphs:
        line = ""
        for word in paragraph.split():
            longer = f"{line} {word}".strip()
            if line and measure.textlength(longer, font=face) > width:
                lines.append(line)
                line = word
            else:
                line = longer
        lines += [line, ""]
    return [lines[i : i + per_page] for i in range(0, len(lines), per_page)]


# ----------------------------------------------------------------------------- measures
def cer(reference: str, read: str) -> float:
    """Levenshtein distance over the reference's length, white space collapsed first. One
    row of the distance table at a time: the insertions along a row are a running minimum."""
    ref = np.array([ord(c) for c in " ".join(reference.split())], dtype=np.int64)
    hyp = np.array([ord(c) for c in " ".join(read.split())], dtype=np.int64)
    if not len(ref):
        return float(len(hyp) > 0)
    steps = np.arange(len(hyp) + 1)
    row = steps.copy()
    for i, char in enumerate(ref, start=1):
        new = np.empty_like(row)
        new[0] = i
        new[1:] = np.minimum(row[1:] + 1, row[:-1] + (hyp != char))
        row = np.minimum.accumulate(new - steps) + steps
    return float(row[-1]) / len(ref)


def tesseract_alone(page: ocr.PageImage) -> Part | None:
    """The page through tesseract with its defaults (Otsu, no clean-up), parsed as ours."""
    done = subprocess.run(
        [ocr.require_tesseract(), "stdin", "stdout", "--psm", "3", "--dpi", str(DPI), "tsv"],
        input=_pnm(page),
        capture_output=True,
        timeout=TIMEOUT,
        env={**os.environ, "OMP_THREAD_LIMIT": "1"},
        check=True,
    )
    return ocr.page_part(page, done.stdout.decode("utf-8", "replace"))


def _pnm(page: ocr.PageImage) -> bytes:
    buffer = io.BytesIO()
    page.image.save(buffer, "PPM")
    return buffer.getvalue()


def ours(page: ocr.PageImage) -> Part | None:
    return ocr.read_page(page, ocr.require_tesseract(), TIMEOUT)


def read_all(
    pages: Sequence[ocr.PageImage], texts: Sequence[str], reader: Callable[..., Part | None]
) -> tuple[list[float], list[float]]:
    """Each page's CER and confidence, the pages read one per core."""
    with ThreadPoolExecutor(ocr.usable_cores()) as pool:
        parts = list(pool.map(reader, pages))
    errors = [cer(text, part.text if part else "") for part, text in zip(parts, texts, strict=True)]
    confidences = [(part.ocr_confidence or 0.0) if part else 0.0 for part in parts]
    return errors, confidences


def pages_per_second(pages: Sequence[ocr.PageImage], workers: int) -> tuple[float, float]:
    """Pages per second of wall time, and CPU seconds per page (this process's clean-up and
    its tesseract children): the second does not depend on what else the machine runs."""
    cpu = _cpu_seconds()
    start = time.perf_counter()
    read = list(ocr.ocr_pages(pages, timeout=TIMEOUT, workers=workers))
    elapsed = time.perf_counter() - start
    assert all(isinstance(r, Part) for r in read), read
    return len(pages) / elapsed, (_cpu_seconds() - cpu) / len(pages)


def _cpu_seconds() -> float:
    own, children = (
        resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def scanned_pdf_pages_per_second(pages: Sequence[ocr.PageImage]) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "scan.pdf"
        first, *rest = [p.image for p in pages]
        first.save(path, "PDF", resolution=DPI, save_all=True, append_images=rest)
        start = time.perf_counter()
        loaded = load_file(path, LoadOptions(ocr_page_timeout=TIMEOUT))
        elapsed = time.perf_counter() - start
    assert len(loaded.parts) == len(pages) and not loaded.partial, loaded.partial
    return len(pages) / elapsed


# ----------------------------------------------------------------------------- report
def row(name: str, errors: list[float], confidences: list[float], target: str) -> str:
    low = sum(c < 0.7 for c in confidences)
    return (
        f"| {name} | {statistics.median(errors) * 100:.2f} % | {max(errors) * 100:.2f} % | "
        f"{statistics.mean(confidences):.3f} | {low} of {len(confidences)} | {target} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pages", type=int, default=0, help="at most this many (0 = all)")
    args = parser.parse_args()

    paragraphs = sample_paragraphs()
    layouts = [(lines, font) for font in (SERIF, SANS) for lines in page_lines(paragraphs, font)]
    if args.pages:
        layouts = layouts[: args.pages]
    texts = ["\n".join(lines) for lines, _ in layouts]
    scale = (72 / DPI, 72 / DPI)
    clean = [
        ocr.PageImage(i + 1, draw_page(lines, font=font)[0], scale)
        for i, (lines, font) in enumerate(layouts)
    ]
    noisy = [
        ocr.PageImage(p.number, degrade(p.image, angle=ANGLES[i % 6], seed=i), scale)
        for i, p in enumerate(clean)
    ]
    very_noisy = [
        ocr.PageImage(p.number, degrade(p.image, angle=ANGLES[i % 6], seed=i, **VERY_NOISY), scale)
        for i, p in enumerate(clean)
    ]

    # Speeds first: the machine is likelier to be as quiet as it was at the start.
    cores = ocr.usable_cores()
    load = os.getloadavg()[0]
    one, one_cpu = pages_per_second(clean, 1)
    every, every_cpu = pages_per_second(clean, cores)
    pdf = scanned_pdf_pages_per_second(clean)

    clean_cer, clean_conf = read_all(clean, texts, ours)
    noisy_cer, noisy_conf = read_all(noisy, texts, ours)
    alone_cer, alone_conf = read_all(noisy, texts, tesseract_alone)
    very_cer, very_conf = read_all(very_noisy, texts, ours)

    tesseract = subprocess.run(
        [ocr.require_tesseract(), "--version"], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    versions = ", ".join(f"{pkg} {metadata.version(pkg)}" for pkg in ("pillow", "pypdfium2"))
    characters = sum(len(" ".join(t.split())) for t in texts)
    body = "\n".join(
        [
            "## OCR quality and speed (`python -m bench.ocr_quality`)",
            "",
            machine_line(),
            "",
            f"tesseract {tesseract} (eng, one thread per process), {versions}. "
            f"{len(clean)} A4 pages at 300 dpi ({characters:,} characters) of samples/ in "
            f"{SIZE_PT}-point DejaVu Serif and Liberation Sans. Noisy: turned by ±1–2°, "
            "blurred 0.7 px, paper 230 and ink 40 grey, grain σ 28, 0.2 % specks; very noisy: "
            f"grain σ {VERY_NOISY['noise']}, blur {VERY_NOISY['blur']} px, "
            f"{VERY_NOISY['specks'] * 100:g} % specks. CER: Levenshtein distance / reference "
            "length, white space collapsed.",
            "",
            "| pages | CER median | worst page | mean confidence | pages under 0.7 | target |",
            "|---|---:|---:|---:|---:|---:|",
            row("clean", clean_cer, clean_conf, "≤ 3 %"),
            row("noisy, turned", noisy_cer, noisy_conf, "≤ 8 %"),
            row("noisy, turned: tesseract alone (no clean-up, Otsu)", alone_cer, alone_conf, ""),
            row("very noisy, turned", very_cer, very_conf, "marked low"),
            "",
            "| reading the clean pages | pages/s | CPU s per page |",
            "|---|---:|---:|",
            f"| OCR, 1 worker | {one:.2f} | {one_cpu:.2f} |",
            f"| OCR, {cores} workers (one per core) | {every:.2f} ({every / one:.2f} ×) | {every_cpu:.2f} |",
            f"| scanned PDF through `load_file` (render, clean-up, OCR; {cores} workers) | {pdf:.2f} | |",
            "",
            f"Load average before the run: {load:.1f} on {cores} cores. Pages/s count wall time, "
            "so they fall when other work shares the cores; CPU per page does not.",
        ]
    )
    write_section("ocr_quality", body)


if __name__ == "__main__":
    main()
