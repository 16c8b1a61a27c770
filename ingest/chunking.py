"""Token-aware chunking and the identity of a chunk (id, citation label, content hash)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import PurePosixPath

from langchain_text_splitters import RecursiveCharacterTextSplitter

from ragchains.ingest.parts import LoadedFile
from ragchains.retrievers.indexformat import Chunk

_SEPARATORS = ["\n\n", "\n", ". ", "; ", ", ", " ", ""]


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
        self._splitter = RecursiveCharacterTextSplitter(
            chunk_size=chunk_size,
            chunk_overlap=chunk_overlap,
            length_function=count_tokens,
            separators=_SEPARATORS,
            keep_separator="end",
            strip_whitespace=True,
        )

    def split(self, text: str) -> list[str]:
        return [piece for piece in self._splitter.split_text(text) if piece.strip()]


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def chunk_file(source: str, loaded: LoadedFile, chunker: Chunker) -> list[Chunk]:
    """Chunks of one file, in reading order, with stable ids and citation labels.

    The id hashes source, locator and text: the same content in the same place of the same
    source gets the same id on every run; a repeat within one file gets a numbered suffix.
    """
    filename = PurePosixPath(source).name
    chunks: list[Chunk] = []
    seen: dict[str, int] = {}
    for part in loaded.parts:
        for piece in chunker.split(part.text):
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
            if part.page is not None:
                metadata["page"] = part.page
            if part.section is not None:
                metadata["section"] = part.section
            if part.row is not None:
                metadata["row"] = part.row
            metadata.update(part.fields)
            chunks.append(Chunk(id=chunk_id, text=piece, metadata=metadata))
    return chunks
