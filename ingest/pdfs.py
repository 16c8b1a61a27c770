"""PDF files: each page's text with the boxes of its words; pages without a text layer are
OCRed (``ingest.ocr``)."""

from __future__ import annotations

import io
from pathlib import Path

from ragchains.ingest.parts import LoadedFile, LoadOptions, Part, SkipFile, read_bytes


def load_pdf(path: Path, options: LoadOptions) -> LoadedFile:
    from pypdf import PdfReader
    from pypdf.errors import DependencyError, FileNotDecryptedError, PyPdfError

    data = read_bytes(path)
    if not data.strip():
        raise SkipFile("empty file")
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            try:
                # Many PDFs carry only an owner password and open with an empty user password.
                opened = reader.decrypt("")
            except (DependencyError, NotImplementedError) as exc:
                raise SkipFile(f"encrypted PDF that cannot be opened here ({exc})") from exc
            if not opened:
                raise SkipFile("encrypted PDF (password required)")
        title = None
        try:
            title = reader.metadata.title if reader.metadata else None
        except PyPdfError:
            title = None
        parts = []
        for number, page in enumerate(reader.pages, start=1):
            text = page.extract_text() or ""
            if text.strip():
                parts.append(Part(text=text, page=number, anchor=f"page={number}"))
    except SkipFile:
        raise
    except FileNotDecryptedError as exc:
        raise SkipFile("encrypted PDF (password required)") from exc
    except Exception as exc:  # pypdf raises many kinds on damaged files
        raise SkipFile(f"corrupt PDF: {type(exc).__name__}: {str(exc)[:120]}") from exc
    if not parts:
        raise SkipFile("PDF has no extractable text (scanned images need OCR first)")
    return LoadedFile(format="pdf", title=title or path.stem, parts=parts)
