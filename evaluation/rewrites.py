"""Query-rewrite evaluation: the rewrite chain's search query against a gold rewrite.

The raw utterance, scored the same way, is the baseline a rewriter has to beat: on a
first turn it already is the gold rewrite; on a follow-up ("Is it treatable?") it is not.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.runnables import Runnable, RunnableConfig
from tqdm import tqdm

from ragchains.chains.llm import LLM
from ragchains.evaluation.datasets import RewriteItem, load_rewrites
from ragchains.evaluation.metrics import exact_match, token_f1
from ragchains.evaluation.runs import RunWriter, llm_config, run_dir
from ragchains.retrievers.bm25 import STOPWORDS
from ragchains.retrievers.filters import BASE_FIELDS
from ragchains.settings import Settings

REWRITE_METRICS = (
    "token_f1",
    "exact_match",
    "content_f1",
    "raw_token_f1",
    "raw_exact_match",
    "raw_content_f1",
)
# The filter fields every index has: the rewrite prompt shows the model these.
REWRITE_FIELDS = BASE_FIELDS


def score_rewrite(item: RewriteItem, rewritten: str) -> dict[str, float]:
    """Token F1 and exact match (SQuAD-normalised), and ``content_f1``: token F1 without the
    stop words BM25 ignores, which does not penalise a keyword query ("lung cancer
    symptoms") for leaving out "what are"."""
    scores = {}
    for prefix, text in (("", rewritten), ("raw_", item.raw)):
        scores[f"{prefix}token_f1"] = token_f1(text, item.rewrite)
        scores[f"{prefix}exact_match"] = exact_match(text, item.rewrite)
        scores[f"{prefix}content_f1"] = token_f1(text, item.rewrite, ignore=STOPWORDS)
    return scores


def evaluate_rewrites(
    items: Sequence[RewriteItem],
    rewrite: Runnable[Any, Any],
    *,
    config: RunnableConfig,
    on_item: Callable[[dict[str, Any]], None],
    progress: bool = True,
) -> dict[str, float]:
    """Run ``rewrite`` on each (history, raw utterance); return the summary metrics.

    Besides the means over all turns, the ``followup_`` metrics cover turns with history,
    where rewriting is needed at all.
    """
    rows: list[dict[str, Any]] = []
    for item in tqdm(items, desc="rewrites", unit="turn", disable=not progress):
        start = time.perf_counter()
        out = rewrite.invoke({"question": item.raw, "chat_history": item.history}, config)
        latency = time.perf_counter() - start
        row = {
            "id": item.id,
            "raw": item.raw,
            "gold": item.rewrite,
            "rewrite": out.search_query,
            "fallback": out.fallback,
            "followup": bool(item.history),
            **score_rewrite(item, out.search_query),
            "latency": round(latency, 4),
            "notes": out.notes,
        }
        on_item(row)
        rows.append(row)
    return summarize_rewrites(rows)


def summarize_rewrites(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    def mean(name: str, subset: Sequence[dict[str, Any]]) -> float:
        return statistics.fmean(r[name] for r in subset) if subset else float("nan")

    followups = [r for r in rows if r["followup"]]
    summary = {name: mean(name, rows) for name in REWRITE_METRICS}
    summary["followup_token_f1"] = mean("token_f1", followups)
    summary["followup_raw_token_f1"] = mean("raw_token_f1", followups)
    summary["followup_content_f1"] = mean("content_f1", followups)
    summary["followup_raw_content_f1"] = mean("raw_content_f1", followups)
    summary["fallback_rate"] = mean("fallback", rows)
    summary["latency_p50"] = statistics.median(r["latency"] for r in rows)
    return summary


@dataclass
class RewriteTurns:
    """The turns an `eval rewrites` run asks, and the run folder it will write."""

    dataset: Path
    items: list[RewriteItem]
    out: Path


def load_turns(dataset: Path, *, out: Path | None, limit: int | None) -> RewriteTurns:
    """The first ``limit`` turns of ``dataset``; its run folder checked free before the
    chat model loads."""
    items = load_rewrites(dataset)[:limit]
    return RewriteTurns(dataset, items, run_dir(out, "rewrites", dataset.parent.name))


def run_rewrites(
    turns: RewriteTurns,
    rewrite: Runnable[Any, Any],
    *,
    llm: LLM,
    prompt: str,
    settings: Settings,
    configurable: dict[str, Any],
    progress: bool = True,
) -> Path:
    """Score ``rewrite`` (the rewrite chain over ``REWRITE_FIELDS`` on ``llm``, its prompt
    ``prompt``, chosen by ``configurable``) on ``turns``; write and return the run folder."""
    config = {
        "kind": "rewrites",
        "label": f"{turns.dataset.parent.name}/{llm.name}",
        "dataset": str(turns.dataset),
        "turns": len(turns.items),
        "llm": llm_config(settings, llm),
        "prompts": {"rewrite": prompt},
        "fields": REWRITE_FIELDS,
        "history_tokens": settings.history_tokens,
    }
    with RunWriter(turns.out, config) as writer:
        metrics = evaluate_rewrites(
            turns.items,
            rewrite,
            config={"configurable": configurable},
            on_item=writer.add,
            progress=progress,
        )
        return writer.finish(
            {
                "count": writer.count,
                "metrics": metrics,
                "item_metrics": ["token_f1", "content_f1", "exact_match", "latency"],
                "item_outputs": ["rewrite"],
            }
        )
