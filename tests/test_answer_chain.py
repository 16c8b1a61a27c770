"""The answer stage with fake chat models: citations, abstention without an LLM call, prompts."""

from __future__ import annotations

import pytest
from langchain_core.documents import Document
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, HumanMessage
from pydantic import Field

from chains.answer import DONT_KNOW, build_answer_chain, format_context, parse_citations
from prompts.registry import PromptRegistry, PromptSelectionError

DOCS = [
    Document(
        id="c1",
        page_content="| Standard | $45.00 | $1,000 |",
        metadata={
            "citation": "handbook.md#benefit-plans",
            "source": "s/handbook.md",
            "rerank_score": 0.9,
        },
    ),
    Document(
        id="c2",
        page_content="Hotels up to $220 per night.",
        metadata={
            "citation": "travel.pdf#page=2",
            "source": "s/travel.pdf",
            "page": 2,
            "rrf_score": 0.03,
        },
    ),
    Document(
        id="c3",
        page_content="Adding children costs $30.00 per month.",
        metadata={"citation": "handbook.md#benefit-plans", "source": "s/handbook.md"},
    ),
]


@pytest.fixture(scope="module")
def prompts() -> PromptRegistry:
    return PromptRegistry(required=("rewrite", "answer", "requery"))


class NoCallModel(FakeListChatModel):
    """Fails the test if the chain calls it."""

    def _call(self, *args: object, **kwargs: object) -> str:
        raise AssertionError("the LLM must not be called")


def test_citations_in_order_of_use_unknown_dropped() -> None:
    answer = (
        "Hotels cost up to $220 [travel.pdf#page=2]. The Standard plan is $45.00 "
        "[handbook.md#benefit-plans; travel.pdf#page=2] [made-up.pdf#page=9] [1]."
    )
    cited = parse_citations(answer, DOCS)
    assert [(c.id, c.label, c.page) for c in cited] == [
        ("c2", "travel.pdf#page=2", 2),
        ("c1", "handbook.md#benefit-plans", None),
    ]
    assert cited[0].score == 0.03 and cited[1].score == 0.9
    assert parse_citations("No markers at all.", DOCS) == []


def test_context_lists_each_chunk_with_its_label() -> None:
    context = format_context(DOCS[:2])
    assert context == (
        "[handbook.md#benefit-plans] | Standard | $45.00 | $1,000 |\n\n"
        "[travel.pdf#page=2] Hotels up to $220 per night."
    )


def test_no_chunks_abstains_without_calling_the_llm(prompts: PromptRegistry) -> None:
    chain = build_answer_chain(llm=NoCallModel(responses=["x"]), prompts=prompts)
    out = chain.invoke({"question": "What is the moon made of?", "documents": []})
    assert out.abstained and out.answer == DONT_KNOW and out.citations == [] and out.prompt is None


def test_answer_with_citations_and_prompt_ref(prompts: PromptRegistry) -> None:
    llm = FakeListChatModel(
        responses=["The Standard plan costs $45.00 [handbook.md#benefit-plans]."]
    )
    out = build_answer_chain(llm=llm, prompts=prompts).invoke(
        {"question": "standard plan cost?", "documents": DOCS},
        config={"configurable": {"domain": "hr"}},
    )
    assert not out.abstained
    assert [c.id for c in out.citations] == ["c1"]
    assert out.prompt == "hr/answer@v1"


def test_model_saying_it_does_not_know_is_abstention(prompts: PromptRegistry) -> None:
    llm = FakeListChatModel(responses=[DONT_KNOW])
    out = build_answer_chain(llm=llm, prompts=prompts).invoke(
        {"question": "capital of France?", "documents": DOCS}
    )
    assert out.abstained and out.citations == []


class RecordingModel(FakeListChatModel):
    """Answers from a list and keeps the messages it was sent."""

    seen: list = Field(default_factory=list)

    def _call(self, messages: list, *args: object, **kwargs: object) -> str:
        self.seen.append(messages)
        return super()._call(messages, *args, **kwargs)


def test_rendered_prompt_holds_sources_history_and_question(prompts: PromptRegistry) -> None:
    llm = RecordingModel(responses=["Children cost $30.00 [handbook.md#benefit-plans]."], seen=[])
    out = build_answer_chain(llm=llm, prompts=prompts).invoke(
        {
            "question": "and for children?",
            "chat_history": [HumanMessage("standard plan cost?"), AIMessage("$45.00")],
            "documents": DOCS,
        },
        config={"configurable": {"domain": "catalog"}},
    )
    (messages,) = llm.seen
    assert [m.type for m in messages] == ["system", "human", "ai", "human"]
    assert "Catalog rows:" in messages[0].content  # the catalog domain's own prompt
    assert "[travel.pdf#page=2] Hotels up to $220 per night." in messages[0].content
    assert messages[1].content == "standard plan cost?"
    assert messages[-1].content == "and for children?"
    assert out.prompt == "catalog/answer@v1"


def test_unknown_domain_or_version_is_an_error(prompts: PromptRegistry) -> None:
    chain = build_answer_chain(llm=FakeListChatModel(responses=["x"]), prompts=prompts)
    with pytest.raises(PromptSelectionError, match="unknown domain 'legal'"):
        chain.invoke({"question": "q", "documents": DOCS}, {"configurable": {"domain": "legal"}})
    with pytest.raises(PromptSelectionError, match="no version"):
        chain.invoke(
            {"question": "q", "documents": DOCS},
            {"configurable": {"domain": "hr", "prompt_version": 9}},
        )
