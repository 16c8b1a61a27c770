"""Token-aware chunking and the identity of a chunk (id, citation label, content hash)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any

from langchain_text_splitters import RecursiveCharacterTextSplitter

from ragchains.ingest.parts import Box, LoadedFile, Part
from ragchains.retrievers.indexformat import Chunk
from ragchains.retrievers.location import LOCATION_KEY

_SEPARATORS = ["\n\n", "\n", ". ", "; ", ", ", " ", ""]

# A page OCRed with a mean word confidence under this is marked ``ocr_low_confidence``: on
# clean scans tesseract's mean is above 0.9; noisy or skewed ones fall towards 0.6.
LOW_OCR_CONFIDENCE = 0.7


class Chunker:
    """Splits text into pieces of at most ``chunk_size`` tokens, consecutive pieces sharing
    up to ``chunk_overlap`` tokens. Tokens are counted with the embedder's own tokenizer, so a
    chunk never exceeds what the embedder reads."""

    def __init__(
        self, count_tokens: Callable[[str], int], *, chunk_size: int, chunk_overlap: int
    ) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        if not 0 <= chunk_overlap < chunk_size:
            raise ValueError(
                f"chunk_overlap must be in [0, chunk_size), got {chunk_overlap} for {chunk_size}"
            )
        self.chunk_size = chunk_size
        self.chunk_overlap = chunk_overlap
        self.count_tokens = count_tokens
        self._splitter = RecursiveCharacterTextSplitter(
            chunk_size=chunk_size,
            chunk_overlap=chunk_overlap,
            length_function=count_tokens,
            separators=_SEPARATORS,
            keep_separator="end",
            strip_whitespace=True,
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Sent to ingest workers: rebuilt from its settings (the splitter is built anew).
        return (_chunker, (self.count_tokens, self.chunk_size, self.chunk_overlap))

    def split(self, text: str) -> list[str]:
        return [piece for piece in self._splitter.split_text(text) if piece.strip()]

    def split_at(self, text: str) -> list[tuple[str, int]]:
        """The pieces with the offset each starts at in ``text``. Pieces come in order and
        overlap only their predecessor, so each is found from just after the last one's
        start (the splitter strips white space only at the ends: a piece is a substring).
        Not the splitter's ``add_start_index``: it steps back by ``chunk_overlap`` counted as
        characters, where ours counts tokens, and finds no start (-1) for overlapping pieces."""
        found = []
        cursor = 0
        for piece in self.split(text):
            start = text.find(piece, cursor)
            if start < 0:
                start = max(text.find(piece), 0)
            found.append((piece, start))
            cursor = start + 1
        return found

    def split_table(self, text: str, header: str) -> list[tuple[str, int]]:
        """A table's rows packed into pieces under ``chunk_size`` tokens, the header lines
        first in each, so every row is read with its column names. A row longer than a chunk
        on its own is split as text, under the header too. Offsets are the rows' own."""
        body_start = len(header) + 1
        rows = []
        offset = body_start
        for line in text[body_start:].split("\n"):
            if line.strip():
                rows.append((line, offset))
            offset += len(line) + 1
        if not rows:
            return self.split_at(text)
        budget = self.chunk_size - self.count_tokens(header + "\n")
        pieces: list[tuple[str, int]] = []
        batch: list[tuple[str, int]] = []
        used = 0

        def flush() -> None:
            if batch:
                body = "\n".join(line for line, _ in batch)
                pieces.append((f"{header}\n{body}", batch[0][1]))
                batch.clear()

        for line, start in rows:
            size = self.count_tokens(line + "\n")
            if batch and used + size > budget:
                flush()
                used = 0
            if size > budget:
                for part, at in self.split_at(line):
                    pieces.append((f"{header}\n{part}", start + at))
                continue
            batch.append((line, start))
            used += size
        flush()
        return pieces


def _chunker(count_tokens: Callable[[str], int], chunk_size: int, chunk_overlap: int) -> Chunker:
    return Chunker(count_tokens, chunk_size=chunk_size, chunk_overlap=chunk_overlap)


def line_boxes(part: Part, start: int, end: int) -> list[list[float]]:
    """The boxes of the words within ``start:end``, merged into one box per line, rounded to
    a tenth of a point (a highlight needs no more)."""
    lines: list[Box] = []
    for word in part.words:
        if word.end <= start or word.start >= end:
            continue
        x0, top, x1, bottom = word.box
        if lines:
            lx0, ltop, lx1, lbottom = lines[-1]
            height = max(lbottom - ltop, bottom - top, 1e-6)
            overlap = min(lbottom, bottom) - max(ltop, top)
            if overlap > 0.5 * height and x0 >= lx0 - 1:
                lines[-1] = (min(lx0, x0), min(ltop, top), max(lx1, x1), max(lbottom, bottom))
                continue
        lines.append(word.box)
    return [[round(v, 1) for v in box] for box in lines]


def location(part: Part, start: int, end: int) -> dict[str, Any]:
    """The chunk's place in its file (see ``retrievers.location``), the keys that apply."""
    place: dict[str, Any] = {
        "page": part.page,
        "slide": part.slide,
        "sheet": part.sheet,
        "row": part.row,
        "section": part.section,
        "start": start,
        "end": end,
    }
    if part.page_size is not None:
        place["page_width"], place["page_height"] = (round(v, 1) for v in part.page_size)
    if part.words:
        place["boxes"] = line_boxes(part, start, end)
    if part.ocr_confidence is not None:
        place["ocr_confidence"] = round(part.ocr_confidence, 3)
    return {key: value for key, value in place.items() if value is not None}


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def chunk_file(
    source: str, loaded: LoadedFile, chunker: Chunker, *, file_id: str | None = None
) -> list[Chunk]:
    """Chunks of one file, in reading order, with stable ids and citation labels.
    ``file_id``: the file's sha256, recorded in each chunk's metadata (the id its original is
    served by, ``GET /files/{file_id}``); not part of the chunk's id.

    The id hashes source, locator and text: the same content in the same place of the same
    source gets the same id on every run; a repeat within one file gets a numbered suffix.
    """
    filename = PurePosixPath(source).name
    chunks: list[Chunk] = []
    seen: dict[str, int] = {}
    for part in loaded.parts:
        if part.table_header is not None:
            pieces = chunker.split_table(part.text, part.table_header)
        else:
            pieces = chunker.split_at(part.text)
        for piece, start in pieces:
            base = sha256_text(f"{source}\x00{part.anchor}\x00{piece}")[:24]
            repeat = seen.get(base, 0)
            seen[base] = repeat + 1
            chunk_id = base if repeat == 0 else f"{base}-{repeat}"
            metadata = {
                "source": source,
                "filename": filename,
                "format": loaded.format,
                "title": part.title or loaded.title,
                "citation": f"{filename}#{part.anchor}" if part.anchor else filename,
                "content_hash": sha256_text(piece),
                "chunk_index": len(chunks),
            }
            if file_id is not None:
                metadata["file_id"] = file_id
            if part.page is not None:
                metadata["page"] = part.page
            if part.section is not None:
                metadata["section"] = part.section
            if part.row is not None:
                metadata["row"] = part.row
            if part.slide is not None:
                metadata["slide"] = part.slide
            if part.sheet is not None:
                metadata["sheet"] = part.sheet
            if part.ocr_confidence is not None:
                metadata["ocr_confidence"] = round(part.ocr_confidence, 3)
                metadata["ocr_low_confidence"] = part.ocr_confidence < LOW_OCR_CONFIDENCE
            metadata.update(part.fields)
            end = start + len(piece)
            if part.table_header is not None:  # the rows' span, without the repeated header
                end = start + len(piece) - len(part.table_header) - 1
            metadata[LOCATION_KEY] = location(part, start, end)
            chunks.append(Chunk(id=chunk_id, text=piece, metadata=metadata))
    return chunks
