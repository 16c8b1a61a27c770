"""Where a chunk came from in its source file: the ``location`` an ingest records in each
chunk's metadata (index folder and PostgreSQL store alike) and ``/retrieve`` returns with each
source, so a viewer can open the file at the place and highlight the words.

Only the keys that apply are present: a PDF page (text layer or OCR) has ``page``, its size
and ``boxes``; a slide has ``slide``; a spreadsheet row ``sheet`` and ``row``; a CSV or JSON
record ``row``; Markdown, HTML and Word text their heading path as ``section``. ``start`` and
``end`` are the chunk's characters within its part (the page, slide, section or row text).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

LOCATION_KEY = "location"


class Location(BaseModel):
    model_config = ConfigDict(extra="ignore")

    page: int | None = Field(None, description="1-based page of a PDF or scanned image")
    page_width: float | None = Field(None, description="the page's width in PDF points")
    page_height: float | None = Field(None, description="the page's height in PDF points")
    boxes: list[list[float]] | None = Field(
        None,
        description="the chunk's text on the page, one [x0, top, x1, bottom] per line, in PDF "
        "points from the page's top-left corner",
    )
    slide: int | None = Field(None, description="1-based slide of a deck")
    sheet: str | None = Field(None, description="the spreadsheet's sheet name")
    row: int | None = Field(
        None,
        description="a spreadsheet's row number as the sheet shows it; a CSV or JSON "
        "file's record number (1 = the first record)",
    )
    section: str | None = Field(None, description="heading path, 'Benefits > Parental leave'")
    start: int | None = Field(None, description="first character within the part's text")
    end: int | None = Field(None, description="character after the last, within the part's text")
    ocr_confidence: float | None = Field(
        None, description="0-1: the page's mean OCR word confidence, when its text was OCRed"
    )


def location_of(metadata: dict[str, Any]) -> Location | None:
    """A chunk's location: the one the ingest recorded, else what older metadata tells (an
    index written before locations were kept has page, section and row only)."""
    recorded = metadata.get(LOCATION_KEY)
    if isinstance(recorded, dict):
        return Location.model_validate(recorded)
    known = {key: metadata.get(key) for key in ("page", "section", "row", "slide", "sheet")}
    known = {key: value for key, value in known.items() if value is not None}
    if not known:
        return None
    try:
        return Location.model_validate(known)
    except ValueError:  # another retriever's page "ii": no location rather than a 500
        return None
