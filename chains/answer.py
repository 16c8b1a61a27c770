"""The answer stage: cited answers from compressed chunks, abstaining without an LLM call.

Kept chunks are shown to the model as ``[label] text`` blocks. The model cites with those labels
in square brackets; ``parse_citations`` maps the markers back to chunks, in order of first use,
and drops markers that name no chunk it was given.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
from pydantic import BaseModel, Field

from prompts.registry import PromptRegistry

DONT_KNOW = "I don't know based on the available documents."
_MARKER = re.compile(r"\[([^\[\]\n]{1,300})\]")
_SPLIT = re.compile(r"\s*[;,]\s*")


class Citation(BaseModel):
    id: str
    label: str
    source: str
    page: int | None = None
    score: float | None = None


class AnswerInput(BaseModel):
    question: str
    chat_history: list[BaseMessage] = Field(default_factory=list)
    documents: list[Document] = Field(default_factory=list)


class AnswerOutput(BaseModel):
    answer: str
    citations: list[Citation]
    abstained: bool
    prompt: str | None = None  # "domain/answer@vN", None when no LLM was called


def format_context(documents: Sequence[Document]) -> str:
    """The sources block of the answer prompt: one ``[label] text`` paragraph per chunk."""
    return "\n\n".join(
        f"[{doc.metadata.get('citation', doc.id)}] {' '.join(doc.page_content.split())}"
        for doc in documents
    )


def _score(doc: Document) -> float | None:
    for key in ("rerank_score", "rrf_score", "dense_score", "bm25_score"):
        value = doc.metadata.get(key)
        if value is not None:
            return float(value)
    return None


def parse_citations(answer: str, documents: Sequence[Document]) -> list[Citation]:
    """Chunks cited in ``answer``, in order of first citation; unknown markers are dropped.

    A marker may hold several labels ("[a.pdf#page=1; b.md#x]"). Where chunks share a label
    (two pieces of one section), the best-ranked of them stands for it.
    """
    by_label: dict[str, Document] = {}
    for doc in documents:
        by_label.setdefault(str(doc.metadata.get("citation", doc.id)), doc)
    cited: list[Citation] = []
    seen: set[str] = set()
    for marker in _MARKER.findall(answer):
        for label in _SPLIT.split(marker.strip()):
            hit = by_label.get(label)
            if hit is None or label in seen:
                continue
            seen.add(label)
            page = hit.metadata.get("page")
            cited.append(
                Citation(
                    id=str(hit.id or hit.metadata.get("chunk_id")),
                    label=label,
                    source=str(hit.metadata.get("source", "")),
                    page=int(page) if page is not None else None,
                    score=_score(hit),
                )
            )
    return cited


def build_answer_chain(
    *, llm: BaseChatModel, prompts: PromptRegistry
) -> Runnable[AnswerInput | dict[str, Any], AnswerOutput]:
    """Answer from the given chunks only, with citations; abstain without calling the LLM
    when no chunk survived compression."""

    def answer(inputs: AnswerInput | dict[str, Any], config: RunnableConfig) -> AnswerOutput:
        data = inputs if isinstance(inputs, AnswerInput) else AnswerInput.model_validate(inputs)
        if not data.documents:
            return AnswerOutput(answer=DONT_KNOW, citations=[], abstained=True)
        prompt = prompts.select("answer", config.get("configurable"))
        params = prompt.model_parameters
        chain = (
            prompt.template
            | llm.bind(temperature=params.temperature, max_tokens=params.max_tokens)
            | StrOutputParser()
        )
        text = chain.invoke(
            {
                "question": data.question,
                "context": format_context(data.documents),
                "chat_history": data.chat_history,
            },
            config,
        ).strip()
        citations = parse_citations(text, data.documents)
        abstained = not citations and DONT_KNOW.lower().rstrip(".") in text.lower()
        return AnswerOutput(
            answer=text, citations=citations, abstained=abstained, prompt=prompt.ref
        )

    return (
        RunnableLambda(answer)
        .with_types(input_type=AnswerInput, output_type=AnswerOutput)
        .with_config(run_name="answer")
    )
