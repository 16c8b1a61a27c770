"""Evaluation: metrics, datasets and run folders; `ragchains eval` (ragchains.cli.eval_*)
calls it."""

from pathlib import Path

# Prompt files of the judge and of question generation (never served).
EVAL_PROMPTS = Path(__file__).resolve().parent / "prompts"
# The retriever settings `ragchains eval retrieval` can measure. "rewrite+hybrid" is the chat
# graph's search for a first turn: the model's rewrite (filters, phrasings) then hybrid.
RETRIEVERS = ("bm25", "dense", "hybrid", "hybrid+compress", "rewrite+hybrid")


class SetupError(ValueError):
    """An index, store or model an evaluation needs cannot be had; the message says why."""
