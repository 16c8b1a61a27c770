"""Image files (scans, photos of pages): read by OCR (``ingest.ocr``), one page each (a
multi-page TIFF, one per frame)."""

from __future__ import annotations

from pathlib import Path

from ragchains.ingest.parts import LoadedFile, LoadOptions, SkipFile

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff")


def load_image(path: Path, options: LoadOptions) -> LoadedFile:
    raise SkipFile("images are not read yet")
