"""How a run reads and cuts files: its chunker, its load options, and the record of both that
an index or store keeps (a change of that record re-chunks every file)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from ragchains.ingest.chunking import Chunker
from ragchains.ingest.parsing import ParseBudget
from ragchains.ingest.parts import LoadOptions
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder

# Bump when chunk boundaries or metadata change for the same input, so re-runs re-chunk.
CHUNKER_VERSION = 3  # 2: each chunk records its location; 3: and its file's id (file_id)


@dataclass(frozen=True)
class RunSetup:
    """A run's chunker and load options, and ``chunking``, the record of them; what each
    file may cost to parse (``budget``: not recorded, it changes no chunk)."""

    chunker: Chunker
    options: LoadOptions
    chunking: dict[str, Any]
    budget: ParseBudget


def run_setup(
    embedder: SentenceTransformerEmbedder,
    chunk_size: int,
    chunk_overlap: int,
    load_options: LoadOptions | None,
    progress: bool,
    budget: ParseBudget | None = None,
) -> RunSetup:
    """The run's chunker and load options, with the embedder loaded now (so the progress
    bars time the real work)."""
    if progress:
        tqdm.write(f"Loading embedding model {embedder.name}…", file=sys.stderr)
    embedder.count_tokens("")
    options = load_options or LoadOptions()
    chunking = {
        "chunker_version": CHUNKER_VERSION,
        "chunk_size": chunk_size,
        "chunk_overlap": chunk_overlap,
        "tokenizer": embedder.name,
        "text_columns": list(options.text_columns) if options.text_columns else None,
        "include_notes": options.include_notes,
        "max_sheet_rows": options.max_sheet_rows,
    }
    chunker = Chunker(embedder.token_counter(), chunk_size=chunk_size, chunk_overlap=chunk_overlap)
    return RunSetup(chunker, options, chunking, budget or ParseBudget())
