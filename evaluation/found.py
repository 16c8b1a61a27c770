"""`eval found`: whether retrieval keeps what a question needs, per kind of question.

A question is *found* when a source the retrieve stage keeps (after the compressor's cut,
as the chains and ``/retrieve`` keep them) is from one of its gold files, or, for a set
judged by section, carries one of its gold citation labels.

A follow-up (a question after others of its conversation, with a ``standalone`` rewrite)
is searched three ways: as the user wrote it (``raw``), as the hand-written standalone
question (``standalone``), and as the chat chain searches it: the rewrite stage over the
conversation, then the retrieve stage with the rewrite's query, phrasings and filters
(``chat``). The conversation the rewrite reads holds the earlier questions and their
reference answers, so that every run reads the same history whatever a model answered.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.documents import Document
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import Runnable, RunnableConfig
from tqdm import tqdm

from ragchains.chains.retrieve import citation_label
from ragchains.evaluation.answers import in_files
from ragchains.evaluation.datasets import QAItem

WAYS = ("raw", "standalone", "chat")


def judged(item: QAItem) -> bool:
    """Whether ``item`` says what finding it means (gold files or citations)."""
    return item.answerable and bool(item.files or item.citations)


def holds_gold(docs: Sequence[Document], item: QAItem) -> bool:
    """Whether a kept chunk is from a gold file (by path: many files share a name) or
    carries a gold citation label."""
    for doc in docs:
        if in_files(str(doc.metadata.get("source") or ""), item.files):
            return True
        if citation_label(doc) in item.citations:
            return True
    return False


def _config(configurable: Mapping[str, Any], item: QAItem) -> RunnableConfig:
    chosen = dict(configurable)
    if item.domain:
        chosen["domain"] = item.domain
    return RunnableConfig(configurable=chosen)


def _kept(docs: Sequence[Document]) -> list[str]:
    return [str(d.metadata.get("source") or citation_label(d)) for d in docs]


def evaluate_found(
    items: Sequence[QAItem],
    *,
    rewrite: Runnable[Any, Any],
    retrieve: Runnable[Any, list[Document]],
    configurable: Mapping[str, Any],
    on_item: Callable[[dict[str, Any]], None],
    progress: bool = True,
) -> dict[str, Any]:
    """Search each judged question, and each the collection does not answer; a follow-up
    three ways (``WAYS``). Returns the shares found: overall and per kind (the question as
    asked), and per way over the follow-ups; and the shares the cut left nothing for."""
    said: dict[str, list[BaseMessage]] = defaultdict(list)
    rows: list[dict[str, Any]] = []
    for item in tqdm(items, desc="questions", unit="question", disable=not progress):
        history = list(said[item.conversation]) if item.conversation else []
        if item.conversation:
            said[item.conversation] += [HumanMessage(item.question), AIMessage(item.answer)]
        if item.answerable and not judged(item):
            continue
        config = _config(configurable, item)
        raw = retrieve.invoke({"query": item.question}, config=config)
        row: dict[str, Any] = {
            **item.as_dict(),
            "found": holds_gold(raw, item) if item.answerable else None,
            # Nothing kept: the turn abstains before any model is asked.
            "cut_all": not raw,
            "kept": _kept(raw),
        }
        if history and item.standalone:
            standalone = retrieve.invoke({"query": item.standalone}, config=config)
            start = time.perf_counter()
            out = rewrite.invoke({"question": item.question, "chat_history": history}, config)
            searched = {
                "query": out.search_query,
                "alternatives": out.alternatives,
                "filters": out.filters,
            }
            chat = retrieve.invoke(searched, config=config)
            row.update(
                followup=True,
                found_raw=row["found"],
                found_standalone=holds_gold(standalone, item),
                found_chat=holds_gold(chat, item),
                searched=[out.search_query, *out.alternatives],
                kept_chat=_kept(chat),
                latency=round(time.perf_counter() - start, 4),
            )
        on_item(row)
        rows.append(row)
    return summarize_found(rows)


def _share(values: Sequence[bool]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def summarize_found(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``found`` over every judged question as asked, ``found_<kind>`` per kind, the cut's
    abstention both ways, and over the follow-ups ``followup_<way>`` with ``followups``
    their count."""
    answerable = [r for r in rows if r["answerable"]]
    unanswerable = [r for r in rows if not r["answerable"]]
    metrics: dict[str, Any] = {
        "questions": len(answerable),
        "found": _share([r["found"] for r in answerable]),
        # The cut's own abstention: of the questions the collection does not answer, the
        # share with nothing kept; of those it does, the share wrongly cut to nothing.
        "unanswerable": len(unanswerable),
        "cut_unanswerable": _share([r["cut_all"] for r in unanswerable]),
        "cut_answerable": _share([r["cut_all"] for r in answerable]),
    }
    kinds: dict[str, list[bool]] = defaultdict(list)
    for row in answerable:
        kinds[str(row["kind"])].append(bool(row["found"]))
    for kind, values in sorted(kinds.items()):
        metrics[f"found_{kind}"] = _share(values)
    followups = [r for r in rows if r.get("followup")]
    metrics["followups"] = len(followups)
    for way in WAYS:
        metrics[f"followup_{way}"] = _share([bool(r[f"found_{way}"]) for r in followups])
    return metrics
