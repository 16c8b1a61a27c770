"""Image files (scans, photos of pages): read by OCR (``ingest.ocr``), one page each (a
multi-page TIFF, one per frame).

An image over ``ocr.MAX_PIXELS`` is refused from its header, before a pixel is decoded. Which
files are images (their suffixes, and the first bytes that say which kind) is the ``image``
entry of ``retrievers.formats``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import (
    Image,
    ImageFile,
    ImageOps,
    JpegImagePlugin,
    PngImagePlugin,
    TiffImagePlugin,
)

from ragchains.ingest import ocr
from ragchains.ingest.parts import LoadedFile, LoadOptions, Part, SkipFile
from ragchains.retrievers.formats import format_named

# Resolution assumed when an image does not record one, or records an impossible one (some
# writers store 0 or 1): scanners default to 300 dpi.
DEFAULT_DPI = 300.0

# Pillow's reader of each media type the image format's signatures name: a file is read by
# its first bytes, not its name (a .png that is really a JPEG still reads).
IMAGE_CLASSES: dict[str, type[ImageFile.ImageFile]] = {
    "image/png": PngImagePlugin.PngImageFile,
    "image/jpeg": JpegImagePlugin.JpegImageFile,
    "image/tiff": TiffImagePlugin.TiffImageFile,
}
_KINDS = [kind.removeprefix("image/").upper() for kind in IMAGE_CLASSES]  # PNG, ...
_UNRECOGNISED = f"not a {', '.join(_KINDS[:-1])} or {_KINDS[-1]} image (unrecognised header)"


def image_class(head: bytes) -> type[ImageFile.ImageFile] | None:
    """Pillow's reader of the image whose file starts with ``head``; None: no image this
    reads (by the signatures of ``retrievers.formats``' image format)."""
    image = format_named("image")
    for signature, media_type in image.signatures if image else ():
        if head.startswith(signature):
            return IMAGE_CLASSES.get(media_type)
    return None


def load_image(path: Path, options: LoadOptions) -> LoadedFile:
    ocr.require_tesseract()
    image = _open(path)
    undecoded: list[str] = []
    parts: list[Part] = []
    notes: list[str] = []
    with image:
        frames = _frames(image, undecoded)
        for result in ocr.ocr_pages(frames, timeout=options.ocr_page_timeout):
            if isinstance(result, Part):
                parts.append(result)
            else:
                notes.append(result)
    notes = undecoded + notes
    if not parts:
        raise SkipFile(ocr.unread_reason(notes) if notes else "no text found by OCR")
    return LoadedFile(format="image", title=path.stem, parts=parts, partial=notes)


def _open(path: Path) -> Image.Image:
    """The image with its header read and nothing decoded. Pillow's ``Image.open`` would
    refuse a large image with a DecompressionBombError that does not give its size; the
    format's own class reads only the header, and the cap here names the size."""
    try:
        with path.open("rb") as fh:
            head = fh.read(16)
    except OSError as exc:
        raise SkipFile(f"unreadable: {exc.strerror or exc}") from exc
    if not head:
        raise SkipFile("empty file")
    reader = image_class(head)
    if reader is None:
        raise SkipFile(_UNRECOGNISED)
    try:
        image = reader(str(path))
    except (SyntaxError, OSError, ValueError) as exc:
        raise SkipFile(f"corrupt image: {_detail(exc)}") from exc
    reason = ocr.over_pixel_cap(*image.size)
    if reason:
        image.close()
        raise SkipFile(reason)
    return image


def _frames(image: Image.Image, undecoded: list[str]) -> Iterator[ocr.PageImage]:
    """Each frame decoded in turn, as a grey page at its recorded resolution; a frame over
    the cap or that cannot be decoded is noted in ``undecoded`` and left out."""
    frames = getattr(image, "n_frames", 1)
    for index in range(frames):
        number = index + 1
        try:
            image.seek(index)
            # A TIFF's frames each have their own size; only the first was checked on open.
            reason = ocr.over_pixel_cap(*image.size)
            if reason:
                undecoded.append(f"page {number}: {reason}")
                continue
            dpi = _dpi(image)
            grey = _grey(ImageOps.exif_transpose(image) if frames == 1 else image)
        except (OSError, SyntaxError, ValueError, EOFError) as exc:
            if frames == 1:
                raise SkipFile(f"corrupt image: {_detail(exc)}") from exc
            undecoded.append(f"page {number}: corrupt image data ({_detail(exc)})")
            continue
        yield ocr.PageImage(number, grey, (72.0 / dpi[0], 72.0 / dpi[1]), dpi=dpi[0])


def _dpi(image: Image.Image) -> tuple[float, float]:
    recorded = image.info.get("dpi")
    try:
        x, y = (float(v) for v in recorded)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        return DEFAULT_DPI, DEFAULT_DPI
    if not (20 <= x <= 10_000 and 20 <= y <= 10_000):
        return DEFAULT_DPI, DEFAULT_DPI
    # PNG stores pixels per metre: 300 dpi comes back as 299.9994.
    return round(x, 1), round(y, 1)


def _grey(image: Image.Image) -> Image.Image:
    """Grey pixels as tesseract reads them. Transparent parts become white paper (a PNG's
    transparent background is black once its alpha is dropped), and 16-bit scans are scaled
    (Pillow's conversion clips them: everything over 255 turns white)."""
    if image.mode in ("1", "L"):
        return image.copy()
    if image.mode.startswith("I"):
        values = np.asarray(image, dtype=np.int64)
        return Image.fromarray((values >> 8).clip(0, 255).astype(np.uint8), "L")
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        paper = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(paper, rgba).convert("L")
    return image.convert("L")


def _detail(exc: BaseException) -> str:
    cause = exc.__cause__ or exc  # Pillow wraps a short read of the header in SyntaxError
    if isinstance(cause, (struct.error, EOFError)):
        return "the file ends too early"
    return (str(exc) or type(exc).__name__).splitlines()[0][:160]
