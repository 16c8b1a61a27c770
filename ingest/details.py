"""What the documents API shows of an ingested file beyond its record's counts: how many pages,
slides, sheets or rows it has, how sure OCR was of its scanned pages, what was left out of
it, when it was read and who uploaded it. Kept on the file's record (``FileRecord.details``)
by the run that reads the file, so listing a collection never reads its chunks."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from statistics import fmean
from typing import Any

from ragchains.retrievers.indexformat import Chunk

# The places a chunk's metadata names, and what a file's count of each is called.
_UNITS = (("page", "pages"), ("slide", "slides"), ("sheet", "sheets"), ("row", "rows"))
# Who uploaded a file (through the documents API); a file a run read from disk has none.
UPLOADED_BY = "uploaded_by"


def file_details(
    chunks: Sequence[Chunk], left_out: Sequence[str], *, uploaded_by: str | None = None
) -> dict[str, Any]:
    """The details of a file read now into ``chunks``, with the reasons for what was left out
    of it (the run's "partly read" lines)."""
    details: dict[str, Any] = {
        "ingested_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "left_out": list(left_out),
    }
    for key, unit in _UNITS:
        seen = {c.metadata[key] for c in chunks if c.metadata.get(key) is not None}
        if seen:
            details[unit] = len(seen)
    # The mean of its OCRed pages' confidence (each page once, however many chunks it has).
    by_page = {
        c.metadata.get("page"): float(c.metadata["ocr_confidence"])
        for c in chunks
        if c.metadata.get("ocr_confidence") is not None
    }
    if by_page:
        details["ocr_confidence"] = round(fmean(by_page.values()), 3)
        details["ocr_pages"] = len(by_page)
    if uploaded_by is not None:
        details[UPLOADED_BY] = uploaded_by
    return details
