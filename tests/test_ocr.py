"""Scans read by OCR (tesseract): images and PDF pages without a text layer come back as text
with their page numbers, word boxes where the words were drawn and a confidence; what cannot
be read is skipped or noted with a reason. The scans are drawn here from known text.
"""

from __future__ import annotations

import difflib
import math
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from fpdf import FPDF
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from ragchains.ingest import ocr
from ragchains.ingest.chunking import Chunker, chunk_file
from ragchains.ingest.loaders import load_file
from ragchains.ingest.parts import LoadedFile, LoadOptions, Part, SkipFile
from ragchains.retrievers.searchindex import load_index

FONTS = Path("/usr/share/fonts/truetype")
SERIF = FONTS / "dejavu" / "DejaVuSerif.ttf"
SANS = FONTS / "liberation" / "LiberationSans-Regular.ttf"
DPI = 300
A4 = (2480, 3508)  # pixels at 300 dpi
POINTS = 72 / DPI

PAGE_ONE = [
    "Invoices must be approved by the finance team within 30 days.",
    "Parental leave is sixteen weeks at full pay for every employee.",
    "",
    "The warehouse in Lisbon opens at 07:30 on weekdays.",
]
PAGE_TWO = [
    "Quarterly budgets are frozen on the first Monday of March.",
    "Laptops are replaced every four years by the IT service desk.",
]

PixelBox = tuple[float, float, float, float]


# ----------------------------------------------------------------------------- scans
def draw_page(
    lines: list[str],
    *,
    font: Path = SERIF,
    size_pt: float = 11,
    left: int = 300,
    top: int = 300,
    size: tuple[int, int] = A4,
) -> tuple[Image.Image, dict[str, PixelBox]]:
    """A white page at 300 dpi with ``lines`` printed on it, and where each word was drawn
    (pixels; a word's first appearance)."""
    face = ImageFont.truetype(str(font), round(size_pt * DPI / 72))
    image = Image.new("L", size, 255)
    draw = ImageDraw.Draw(image)
    boxes: dict[str, PixelBox] = {}
    y = top
    for line in lines:
        draw.text((left, y), line, font=face, fill=0)
        x = float(left)
        for word in line.split():
            boxes.setdefault(word, draw.textbbox((x, y), word, font=face))
            x += draw.textlength(word + " ", font=face)
        y += round(face.size * 1.45)
    return image, boxes


def degrade(
    image: Image.Image,
    *,
    angle: float,
    noise: float = 28,
    blur: float = 0.7,
    specks: float = 0.002,
    paper: int = 230,
    ink: int = 40,
    seed: int = 0,
) -> Image.Image:
    """The page as a poor scanner returns it: turned by ``angle`` degrees (counter-clockwise),
    softened, grey paper and grey ink, grain of ``noise`` grey levels, and a fraction
    ``specks`` of pixels flipped to black or white."""
    rng = np.random.default_rng(seed)
    turned = image.rotate(angle, resample=Image.Resampling.BICUBIC, fillcolor=255)
    if blur:
        turned = turned.filter(ImageFilter.GaussianBlur(blur))
    pixels = ink + np.asarray(turned, dtype=np.float32) * (paper - ink) / 255
    pixels += rng.normal(0, noise, pixels.shape)
    flip = rng.random(pixels.shape)
    pixels[flip < specks / 2] = 0
    pixels[flip > 1 - specks / 2] = 255
    return Image.fromarray(pixels.clip(0, 255).astype(np.uint8))


def turned_point(x: float, y: float, angle: float, size: tuple[int, int]) -> tuple[float, float]:
    """Where ``Image.rotate(angle)`` moves the pixel (x, y): counter-clockwise about the
    centre, in image coordinates (y down)."""
    a = math.radians(angle)
    dx, dy = x - size[0] / 2, y - size[1] / 2
    return (
        size[0] / 2 + dx * math.cos(a) + dy * math.sin(a),
        size[1] / 2 - dx * math.sin(a) + dy * math.cos(a),
    )


def write_pdf(path: Path, pages: list[str | Path]) -> Path:
    """An A4 PDF: a string is a page with a text layer (the text at 30 mm, 50 mm), a path a
    scanned page (that image over the whole page, no text)."""
    pdf = FPDF(format="A4")
    pdf.set_font("Helvetica", size=12)
    for page in pages:
        pdf.add_page()
        if isinstance(page, Path):
            pdf.image(str(page), x=0, y=0, w=210, h=297)
        else:
            pdf.text(x=30, y=50, text=page)
    pdf.output(str(path))
    return path


# ----------------------------------------------------------------------------- checks
def similar(expected: str, text: str) -> bool:
    """Some line of ``text`` reads as ``expected`` but for a character or two."""
    return any(
        difflib.SequenceMatcher(None, expected, line.strip()).ratio() > 0.95
        for line in text.splitlines()
    )


def word_box(part: Part, word: str) -> tuple[float, float, float, float]:
    for found in part.words:
        if part.text[found.start : found.end] == word:
            return found.box
    raise AssertionError(f"{word!r} has no box in {part.text!r}")


def assert_near(box: tuple[float, ...], expected: tuple[float, ...], points: float) -> None:
    assert all(abs(a - b) <= points for a, b in zip(box, expected, strict=True)), (box, expected)


def in_points(box: PixelBox, scale: float = POINTS) -> tuple[float, ...]:
    return tuple(v * scale for v in box)


@pytest.fixture(scope="module")
def chunker() -> Chunker:
    return Chunker(lambda text: len(text.split()), chunk_size=200, chunk_overlap=20)


@pytest.fixture(scope="module")
def scans(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("scans")
    image, _ = draw_page(PAGE_ONE)
    image.save(folder / "page-one.png", dpi=(DPI, DPI))
    image, _ = draw_page(PAGE_TWO, font=SANS)
    image.save(folder / "page-two.png", dpi=(DPI, DPI))
    return folder


@pytest.fixture(scope="module")
def mixed_pdf(scans: Path) -> Path:
    """Page 1 and 3 with a text layer, page 2 a scan of PAGE_ONE."""
    return write_pdf(
        scans / "mixed.pdf",
        ["Quarterly revenue grew in every region.", scans / "page-one.png", "Closing notes."],
    )


@pytest.fixture(scope="module")
def mixed(mixed_pdf: Path) -> LoadedFile:
    return load_file(mixed_pdf)


# ----------------------------------------------------------------------------- images
def test_a_clean_scan_reads_back_its_sentences_where_they_were_drawn(tmp_path: Path) -> None:
    image, boxes = draw_page(PAGE_ONE)
    path = tmp_path / "memo.png"
    image.save(path, dpi=(DPI, DPI))
    loaded = load_file(path)
    assert (loaded.format, loaded.title, loaded.partial) == ("image", "memo", [])
    [part] = loaded.parts
    assert (part.page, part.anchor) == (1, "page=1")
    assert part.page_size == pytest.approx((595.2, 841.9), abs=0.1)
    for sentence in filter(None, PAGE_ONE):
        assert sentence in part.text
    # Lines of a paragraph one newline apart, paragraphs a blank line apart.
    assert f"{PAGE_ONE[0]}\n{PAGE_ONE[1]}\n\n{PAGE_ONE[3]}" in part.text
    assert part.ocr_confidence is not None and part.ocr_confidence > 0.9
    for word in ("approved", "Lisbon", "07:30"):
        assert_near(word_box(part, word), in_points(boxes[word]), 2.0)


def test_a_noisy_turned_multipage_tiff_reads_each_page(tmp_path: Path) -> None:
    one, one_boxes = draw_page(PAGE_ONE)
    two, _ = draw_page(PAGE_TWO, font=SANS)
    frames = [degrade(one, angle=1.5, seed=1), degrade(two, angle=-2.0, seed=2)]
    path = tmp_path / "scan.tiff"
    frames[0].save(path, save_all=True, append_images=frames[1:], dpi=(DPI, DPI))
    loaded = load_file(path)
    assert [p.anchor for p in loaded.parts] == ["page=1", "page=2"]
    for part, lines in zip(loaded.parts, (PAGE_ONE, PAGE_TWO), strict=True):
        for sentence in filter(None, lines):
            assert similar(sentence, part.text), (sentence, part.text)
        assert part.ocr_confidence is not None and part.ocr_confidence > 0.7
    # The box is where the word lies on the turned page as scanned, not on a levelled copy.
    x0, top, x1, bottom = one_boxes["approved"]
    centre = turned_point((x0 + x1) / 2, (top + bottom) / 2, 1.5, A4)
    box = word_box(loaded.parts[0], "approved")
    assert_near(((box[0] + box[2]) / 2, (box[1] + box[3]) / 2), in_points(centre), 3.0)


def test_a_very_noisy_page_is_marked_low_confidence(tmp_path: Path, chunker: Chunker) -> None:
    image, _ = draw_page(PAGE_ONE)
    path = tmp_path / "fax.png"
    degrade(image, angle=1.5, noise=70, blur=1.2, specks=0.005).save(path, dpi=(DPI, DPI))
    chunks = chunk_file("in/fax.png", load_file(path), chunker)
    assert chunks
    for chunk in chunks:
        assert chunk.metadata["citation"] == "fax.png#page=1"
        assert chunk.metadata["ocr_low_confidence"] is True
        assert chunk.metadata["location"]["ocr_confidence"] < 0.7


def _png_claiming(width: int, height: int) -> bytes:
    """A real 1×1 PNG whose header says it is width × height (its CRC made to match), as a
    decompression bomb's would: only the header is read before it is refused."""
    signature = b"\x89PNG\r\n\x1a\n"

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    pixels = zlib.compress(b"\x00\x80")
    return signature + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def test_an_image_over_the_pixel_cap_is_refused_from_its_header(tmp_path: Path) -> None:
    path = tmp_path / "bomb.png"
    path.write_bytes(_png_claiming(30_000, 30_000))
    with pytest.raises(SkipFile) as refused:
        load_file(path)
    assert str(refused.value) == "image of 30000×30000 pixels is over the 60-megapixel cap"


def test_corrupt_images_are_skipped_with_a_reason(tmp_path: Path) -> None:
    image, _ = draw_page(PAGE_TWO)
    whole = tmp_path / "whole.png"
    image.save(whole)
    cut = tmp_path / "cut.png"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    header_only = tmp_path / "header.png"
    header_only.write_bytes(b"\x89PNG\r\n\x1a\n")
    not_an_image = tmp_path / "notes.jpg"
    not_an_image.write_text("these are notes, not a photo")
    reasons = {}
    for path in (cut, header_only, not_an_image):
        with pytest.raises(SkipFile) as skipped:
            load_file(path)
        reasons[path.name] = str(skipped.value)
    assert reasons["cut.png"].startswith("corrupt image: ")
    assert reasons["header.png"] == "corrupt image: the file ends too early"
    assert reasons["notes.jpg"] == "not a PNG, JPEG or TIFF image (unrecognised header)"


# ----------------------------------------------------------------------------- PDFs
def test_a_pdf_reads_its_text_layer_and_ocrs_its_scanned_page(
    mixed: LoadedFile, scans: Path, chunker: Chunker
) -> None:
    assert [p.page for p in mixed.parts] == [1, 2, 3]
    assert mixed.partial == []
    text_page, scanned, _ = mixed.parts
    assert text_page.text == "Quarterly revenue grew in every region."
    assert text_page.ocr_confidence is None
    # fpdf2 wrote it at x = 30 mm with its baseline at y = 50 mm, in 12-point Helvetica.
    x0, top, _, bottom = word_box(text_page, "Quarterly")
    assert x0 == pytest.approx(30 * 72 / 25.4, abs=1.0)
    assert top < 50 * 72 / 25.4 < bottom + 0.5 and 8 < bottom - top < 13
    for sentence in filter(None, PAGE_ONE):
        assert sentence in scanned.text
    assert scanned.ocr_confidence is not None and scanned.ocr_confidence > 0.9
    # The scan fills the A4 page: its pixels are 595.28 / 2480 points wide.
    _, boxes = draw_page(PAGE_ONE)
    assert_near(word_box(scanned, "approved"), in_points(boxes["approved"], 595.28 / 2480), 2.0)
    labels = {c.metadata["citation"] for c in chunk_file("in/mixed.pdf", mixed, chunker)}
    assert labels == {"mixed.pdf#page=1", "mixed.pdf#page=2", "mixed.pdf#page=3"}


def test_a_page_over_the_time_limit_is_left_out_and_noted(mixed_pdf: Path, scans: Path) -> None:
    hurried = LoadOptions(ocr_page_timeout=0.001)
    loaded = load_file(mixed_pdf, hurried)
    assert [p.page for p in loaded.parts] == [1, 3]
    assert loaded.partial == ["page 2: OCR timed out after 0.001 s"]
    # A file none of whose pages could be read is skipped, with the reason.
    with pytest.raises(SkipFile, match=r"^page 1: OCR timed out after 0\.001 s$"):
        load_file(scans / "page-one.png", hurried)


def test_without_tesseract_scans_are_skipped_and_text_pages_kept(
    mixed_pdf: Path, scans: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ocr, "TESSERACT", "tesseract-not-installed")
    with pytest.raises(SkipFile, match=r"^OCR engine not installed \(tesseract\); run make setup$"):
        load_file(scans / "page-one.png")
    loaded = load_file(mixed_pdf)
    assert [p.page for p in loaded.parts] == [1, 3]
    assert loaded.partial == [f"page 2 not OCRed: {ocr.MISSING}"]


def test_a_huge_scanned_page_is_not_rendered(tmp_path: Path, scans: Path) -> None:
    pdf = FPDF(unit="pt", format=(14_400, 14_400))  # PDF's largest page: 200 inches a side
    pdf.add_page()
    pdf.image(str(scans / "page-two.png"), x=0, y=0, w=600)
    pdf.output(str(tmp_path / "poster.pdf"))
    with pytest.raises(SkipFile) as skipped:
        load_file(tmp_path / "poster.pdf")
    assert str(skipped.value) == (
        "page 1: a 14400×14400-point page is 60000×60000 pixels at 300 dpi, over the "
        "60-megapixel cap"
    )


# ----------------------------------------------------------------------------- the command
@pytest.mark.e2e
def test_ragchains_ingest_indexes_scans_with_boxes_and_confidence(tmp_path: Path) -> None:
    from tests.test_cli import run

    folder = tmp_path / "in"
    folder.mkdir()
    pages = [draw_page(PAGE_ONE)[0], draw_page(PAGE_TWO, font=SANS)[0]]
    pages[0].save(
        folder / "scan.pdf", "PDF", resolution=DPI, save_all=True, append_images=pages[1:]
    )
    result = run("ingest", folder, "--index", tmp_path / "index")
    assert result.returncode == 0, result.stderr
    assert "1 added" in result.stdout
    index = load_index(tmp_path / "index")
    try:
        chunks = list(index.store.iter_chunks())
    finally:
        index.close()
    by_label = {c.metadata["citation"]: c for c in chunks}
    assert set(by_label) == {"scan.pdf#page=1", "scan.pdf#page=2"}
    second = by_label["scan.pdf#page=2"]
    assert PAGE_TWO[1] in second.text
    place = second.metadata["location"]
    assert place["page"] == 2
    assert (place["page_width"], place["page_height"]) == pytest.approx((595.2, 841.9), abs=0.2)
    assert len(place["boxes"]) == 2  # one per line
    assert place["boxes"][0][0] == pytest.approx(300 * POINTS, abs=2)
    assert place["ocr_confidence"] > 0.9
    assert second.metadata["ocr_low_confidence"] is False


@pytest.mark.e2e
def test_a_scan_refused_or_timed_out_keeps_its_indexed_version(tmp_path: Path) -> None:
    """A scan replaced by an image over the pixel cap, and one whose pages all overrun the
    OCR time limit: the run names both, goes on, and keeps the versions it had indexed."""
    from tests.test_cli import run

    folder = tmp_path / "in"
    folder.mkdir()
    draw_page(PAGE_ONE)[0].save(folder / "photo.png", dpi=(DPI, DPI))
    draw_page(PAGE_TWO)[0].save(folder / "scan.pdf", "PDF", resolution=DPI)
    (folder / "notes.txt").write_text("The garden shed is painted green every spring.")
    first = run("ingest", folder, "--index", tmp_path / "index")
    assert first.returncode == 0, first.stderr
    before = {c.id for c in load_index(tmp_path / "index").store.iter_chunks()}

    (folder / "photo.png").write_bytes(_png_claiming(30_000, 30_000))
    draw_page(PAGE_TWO, font=SANS)[0].save(folder / "scan.pdf", "PDF", resolution=DPI)
    second = run(
        "ingest", folder, "--index", tmp_path / "index", env={"RAGCHAINS_OCR_PAGE_TIMEOUT": "0.001"}
    )
    assert second.returncode == 0, second.stderr
    assert "0 added, 0 updated, 0 removed, 1 unchanged, 2 skipped" in second.stdout
    assert (
        "skipped in/photo.png: image of 30000×30000 pixels is over the 60-megapixel cap "
        "(previous version kept)" in second.stderr
    )
    assert (
        "skipped in/scan.pdf: page 1: OCR timed out after 0.001 s (previous version kept)"
        in second.stderr
    )
    index = load_index(tmp_path / "index")
    try:
        assert {c.id for c in index.store.iter_chunks()} == before
    finally:
        index.close()
