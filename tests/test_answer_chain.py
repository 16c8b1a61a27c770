"""The answer stage with fake chat models: citations, abstention without an LLM call, prompts."""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.documents import Document
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, HumanMessage

from ragchains.chains.answer import (
    DONT_KNOW,
    citation_grammar,
    create_answer_chain,
    format_context,
    parse_citations,
)
from ragchains.chains.llm import LLM
from ragchains.prompts.registry import CHAIN_PROMPTS as REQUIRED_PROMPTS
from ragchains.prompts.registry import PromptRegistry, PromptSelectionError
from tests.fakes import NoCallModel, RecordingModel

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
    return PromptRegistry(required=REQUIRED_PROMPTS)


def answer_chain(model: FakeListChatModel, prompts: PromptRegistry, **kwargs: object) -> object:
    return create_answer_chain(
        llm=LLM(model=model, name="fake", count_tokens=len, **kwargs), prompts=prompts
    )


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


def test_context_lists_each_chunk_with_its_label_best_last() -> None:
    context = format_context(DOCS[:2])
    assert context == (
        "[travel.pdf#page=2] Hotels up to $220 per night.\n\n"
        "[handbook.md#benefit-plans] | Standard | $45.00 | $1,000 |"
    )


def test_no_chunks_abstains_without_calling_the_llm(prompts: PromptRegistry) -> None:
    chain = answer_chain(NoCallModel(), prompts)
    out = chain.invoke({"question": "What is the moon made of?", "documents": []})
    assert out == {
        "answer": DONT_KNOW,
        "citations": [],
        "abstained": True,
        "answer_style": "free",  # a model without a grammar answers freely
        "notes": [],
        "prompt": None,
    }


def test_answer_with_citations_and_prompt_ref(prompts: PromptRegistry) -> None:
    llm = FakeListChatModel(
        responses=["The Standard plan costs $45.00 [handbook.md#benefit-plans]."]
    )
    out = answer_chain(llm, prompts).invoke(
        {"question": "standard plan cost?", "documents": DOCS},
        config={"configurable": {"domain": "hr"}},
    )
    assert not out["abstained"]
    assert out["answer"] == "The Standard plan costs $45.00 [handbook.md#benefit-plans]."
    assert [c["id"] for c in out["citations"]] == ["c1"]
    assert out["prompt"] == "hr/answer@v2"


def test_answer_streams_tokens_then_citations(prompts: PromptRegistry) -> None:
    llm = FakeListChatModel(responses=["  $45.00 [handbook.md#benefit-plans]."])
    events = list(answer_chain(llm, prompts).stream({"question": "q", "documents": DOCS}))
    tokens = [e["answer"] for e in events[:-1]]
    assert all(set(e) == {"answer"} for e in events[:-1]) and len(tokens) > 5
    assert "".join(tokens) == "$45.00 [handbook.md#benefit-plans]."  # leading blanks dropped
    assert set(events[-1]) == {"citations", "abstained", "answer_style", "notes", "prompt"}
    assert events[-1]["citations"][0]["label"] == "handbook.md#benefit-plans"


def test_answer_streams_the_same_asynchronously(prompts: PromptRegistry) -> None:
    llm = FakeListChatModel(responses=["$45.00 [handbook.md#benefit-plans]."])
    chain = answer_chain(llm, prompts)

    async def collect() -> list:
        return [e async for e in chain.astream({"question": "q", "documents": DOCS})]

    events = asyncio.run(collect())
    assert "".join(e.get("answer", "") for e in events) == "$45.00 [handbook.md#benefit-plans]."
    assert events[-1]["citations"][0]["id"] == "c1"


def test_grammar_model_must_cite_a_given_label(prompts: PromptRegistry) -> None:
    model = RecordingModel(responses=["$45.00 [handbook.md#benefit-plans]."])
    answer_chain(model, prompts, grammar=True).invoke(
        {"question": "q", "documents": DOCS}, {"configurable": {"answer_style": "free"}}
    )
    (grammar,) = model.grammars
    assert grammar == citation_grammar(["handbook.md#benefit-plans", "travel.pdf#page=2"])
    assert 'label ::= "handbook.md#benefit-plans" | "travel.pdf#page=2"' in grammar
    assert f'dontknow ::= "{DONT_KNOW}"' in grammar
    answer_chain(model := RecordingModel(responses=["x"]), prompts).invoke(
        {"question": "q", "documents": DOCS}
    )
    assert model.grammars == [None]  # only models that take grammars get one


def test_model_saying_it_does_not_know_is_abstention(prompts: PromptRegistry) -> None:
    llm = FakeListChatModel(responses=[DONT_KNOW])
    out = answer_chain(llm, prompts).invoke({"question": "capital of France?", "documents": DOCS})
    assert out["abstained"] and out["citations"] == []


def test_rendered_prompt_holds_sources_history_and_question(prompts: PromptRegistry) -> None:
    llm = RecordingModel(responses=["Children cost $30.00 [handbook.md#benefit-plans]."])
    out = answer_chain(llm, prompts).invoke(
        {
            "question": "and for children?",
            "chat_history": [HumanMessage("standard plan cost?"), AIMessage("$45.00")],
            "documents": DOCS,
        },
        config={"configurable": {"domain": "catalog"}},
    )
    (messages,) = llm.seen
    assert [m.type for m in messages] == ["system", "human", "ai", "human"]
    assert "customers" in messages[0].content  # the catalog domain's own prompt
    assert messages[1].content == "standard plan cost?"
    assert messages[-1].content.startswith("Catalog rows:\n[handbook.md#benefit-plans] Adding")
    assert "[travel.pdf#page=2] Hotels up to $220 per night." in messages[-1].content
    assert messages[-1].content.endswith("\n\nQuestion: and for children?")
    assert out["prompt"] == "catalog/answer@v2"
    # v1 keeps the sources in the system message.
    llm = RecordingModel(responses=["x"])
    answer_chain(llm, prompts).invoke(
        {"question": "and for children?", "documents": DOCS},
        config={"configurable": {"domain": "catalog", "answer_version": "v1"}},
    )
    assert "Catalog rows:" in llm.seen[0][0].content
    assert llm.seen[0][-1].content == "and for children?"


def test_unknown_domain_or_version_is_an_error(prompts: PromptRegistry) -> None:
    chain = answer_chain(FakeListChatModel(responses=["x"]), prompts)
    with pytest.raises(PromptSelectionError, match="unknown domain 'legal'"):
        chain.invoke({"question": "q", "documents": DOCS}, {"configurable": {"domain": "legal"}})
    with pytest.raises(PromptSelectionError, match="no version"):
        chain.invoke(
            {"question": "q", "documents": DOCS},
            {"configurable": {"domain": "hr", "answer_version": 9}},
        )
