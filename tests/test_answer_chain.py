"""The answer stage with fake chat models: citations, abstention without an LLM call, prompts,
the answer styles and how one is chosen; and the quote style with the real SmolLM2."""

from __future__ import annotations

import asyncio
import re
import shutil

import pytest
from langchain_core.documents import Document
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, HumanMessage

from ragchains.chains.answer import (
    DONT_KNOW,
    UNCITED_NOTE,
    citation_grammar,
    create_answer_chain,
    format_context,
    parse_citations,
)
from ragchains.chains.llm import LLM
from ragchains.chains.retrieve import citation_label
from ragchains.evaluation.metrics import faithful_sentences
from ragchains.prompts.registry import CHAIN_PROMPTS as REQUIRED_PROMPTS
from ragchains.prompts.registry import PROMPTS_DIR, PromptRegistry, PromptSelectionError
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
        "uncited": False,
        "incomplete": False,
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


@pytest.mark.parametrize(
    "reply",
    ["The answer is: 12.", "$45.00 [made-up.md#nowhere]."],
    ids=["no-marker", "unknown-label"],
)
def test_an_answer_citing_no_source_is_marked_uncited(prompts: PromptRegistry, reply: str) -> None:
    """Whatever the model: an answer whose sentences cite nothing valid is shown, flagged
    ``uncited`` with a note saying what that means, never as a grounded answer."""
    out = answer_chain(FakeListChatModel(responses=[reply]), prompts).invoke(
        {"question": "q", "documents": DOCS}
    )
    assert out["uncited"] is True and out["abstained"] is False and out["citations"] == []
    assert out["notes"] == [UNCITED_NOTE]
    cited = answer_chain(
        FakeListChatModel(responses=["$45.00 [handbook.md#benefit-plans]."]), prompts
    ).invoke({"question": "q", "documents": DOCS})
    assert cited["uncited"] is False and cited["notes"] == []


def test_answer_streams_tokens_then_citations(prompts: PromptRegistry) -> None:
    llm = FakeListChatModel(responses=["  $45.00 [handbook.md#benefit-plans]."])
    events = list(answer_chain(llm, prompts).stream({"question": "q", "documents": DOCS}))
    tokens = [e["answer"] for e in events[:-1]]
    assert all(set(e) == {"answer"} for e in events[:-1]) and len(tokens) > 5
    assert "".join(tokens) == "$45.00 [handbook.md#benefit-plans]."  # leading blanks dropped
    assert set(events[-1]) == {
        "citations",
        "abstained",
        "uncited",
        "incomplete",
        "answer_style",
        "notes",
        "prompt",
    }
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


# ----------------------------------------------------------------------------- quote style
def test_quote_style_offers_the_shortlist_under_a_grammar(prompts: PromptRegistry) -> None:
    model = RecordingModel(responses=["Hotels up to $220 per night. [travel.pdf#page=2]"])
    out = answer_chain(model, prompts, grammar=True).invoke(
        {"question": "How much are hotels per night?", "documents": DOCS},
        {"configurable": {"domain": "hr"}},
    )
    (grammar,) = model.grammars
    assert 'q0 ::= "Hotels up to $220 per night." l0' in grammar
    assert 'l0 ::= " [travel.pdf#page=2]"' in grammar
    assert f'dontknow ::= "{DONT_KNOW}"' in grammar
    assert "Standard" not in grammar  # shares no word with the question: not offered
    assert model.kwargs[0]["temperature"] == 0.0  # greedy: a quote is copied, not sampled
    question_turn = model.seen[0][-1].content
    assert question_turn == (
        "Sources:\nHotels up to $220 per night. [travel.pdf#page=2]\n\n"
        "Question: How much are hotels per night?"
    )
    assert out["answer_style"] == "quote" and out["notes"] == []
    assert out["prompt"] == "hr/quote@v1"  # the domain's own quote prompt
    # The answer chain's citations read quotes as they read free answers.
    assert [c["id"] for c in out["citations"]] == ["c2"] and not out["abstained"]


def test_quote_style_abstention_is_recognised(prompts: PromptRegistry) -> None:
    model = RecordingModel(responses=[DONT_KNOW])
    out = answer_chain(model, prompts, grammar=True).invoke(
        {"question": "hotels?", "documents": DOCS}
    )
    assert out["abstained"] and out["citations"] == [] and out["answer_style"] == "quote"


@pytest.fixture(scope="module")
def styled(tmp_path_factory: pytest.TempPathFactory) -> PromptRegistry:
    """The shipped prompts plus a domain that quotes and one that generates freely."""
    root = tmp_path_factory.mktemp("prompts") / "prompts"
    shutil.copytree(PROMPTS_DIR, root, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    for name, style in (("quoting", "quote"), ("freeform", "free")):
        (root / name).mkdir()
        (root / name / "domain.yaml").write_text(
            f"description: {name}\nanswer_style: {style}\n", encoding="utf-8"
        )
    return PromptRegistry(root, required=REQUIRED_PROMPTS)


@pytest.mark.parametrize(
    ("request_style", "domain", "setting", "grammar", "style", "noted"),
    [
        # auto everywhere: the model decides.
        ("auto", "default", "auto", True, "quote", False),
        ("auto", "default", "auto", False, "free", False),
        # The setting, then the domain, then the request: each wins over the one before.
        ("auto", "default", "free", True, "free", False),
        ("auto", "quoting", "free", True, "quote", False),
        ("auto", "freeform", "quote", True, "free", False),
        ("free", "quoting", "quote", True, "free", False),
        ("quote", "freeform", "free", True, "quote", False),
        # Quote asked of a model without a grammar, at any level: free, with a note.
        ("quote", "default", "auto", False, "free", True),
        ("auto", "quoting", "auto", False, "free", True),
        ("auto", "default", "quote", False, "free", True),
        ("free", "default", "quote", False, "free", False),
    ],
)
def test_style_precedence_request_domain_setting_model(
    styled: PromptRegistry,
    request_style: str,
    domain: str,
    setting: str,
    grammar: bool,
    style: str,
    noted: bool,
) -> None:
    model = RecordingModel(responses=["Hotels up to $220 per night. [travel.pdf#page=2]"])
    chain = create_answer_chain(
        llm=LLM(model=model, name="tiny", count_tokens=len, grammar=grammar),
        prompts=styled,
        answer_style=setting,  # type: ignore[arg-type]
    )
    out = chain.invoke(
        {"question": "hotels per night?", "documents": DOCS},
        {"configurable": {"domain": domain, "answer_style": request_style}},
    )
    assert out["answer_style"] == style
    assert out["prompt"] == ("default/quote@v1" if style == "quote" else "default/answer@v2")
    assert bool(out["notes"]) is noted
    if noted:
        assert out["notes"] == [
            "answer_style quote needs a model that takes a grammar (tiny does not); "
            "this answer is freely generated"
        ]
        assert model.grammars == [None]  # and the model got no grammar it cannot take


def test_answer_style_is_an_enumeration_checked_like_the_other_choices(
    prompts: PromptRegistry,
) -> None:
    chain = answer_chain(FakeListChatModel(responses=["x"]), prompts)
    spec = next(s for s in chain.config_specs if s.id == "answer_style")
    assert spec.default == "auto" and spec.annotation.__args__ == ("auto", "quote", "free")
    with pytest.raises(ValueError, match="answer_style"):
        chain.invoke({"question": "q", "documents": DOCS}, {"configurable": {"answer_style": "x"}})
    with pytest.raises(ValueError, match="auto, quote or free"):
        create_answer_chain(llm=FakeListChatModel(responses=["x"]), answer_style="verbatim")  # type: ignore[arg-type]


HANDBOOK = [
    Document(
        id="h1",
        page_content=(
            "## Hotels\nHotel costs are reimbursed up to $220 per night in the United States\n"
            "and up to EUR 180 per night in Europe. Choose hotels within 30 minutes of the\n"
            "meeting place."
        ),
        metadata={"citation": "travel-policy.pdf#page=1", "section": "Travel > Hotels"},
    ),
    Document(
        id="h2",
        page_content=(
            "## Paid time off\nFull-time employees receive 25 days of paid time off (PTO) per\n"
            'calendar year. Up to 5 unused days carry over; the rest expire on 31 March.\n"Quoted'
            ' words" and a back\\slash stay as they are.'
        ),
        metadata={"citation": "handbook.md#paid-time-off", "section": "Handbook > Paid time off"},
    ),
]


@pytest.mark.slow
def test_smollm_quotes_only_verbatim_sentences_with_their_labels(
    prompts: PromptRegistry, smollm: LLM
) -> None:
    chain = create_answer_chain(llm=smollm, prompts=prompts)  # auto: quote for this model
    sources = {citation_label(d): [d.page_content] for d in HANDBOOK}
    quoted = 0
    for question in (
        "Up to how much per night are hotel costs reimbursed in the United States?",
        "How many unused PTO days carry over?",
    ):
        events = list(chain.stream({"question": question, "documents": HANDBOOK}))
        answer = "".join(e.get("answer", "") for e in events)
        ending = events[-1]
        assert ending["answer_style"] == "quote" and ending["prompt"] == "default/quote@v1"
        assert len([e for e in events if "answer" in e]) > 3  # streamed token by token
        if ending["abstained"]:
            assert answer == DONT_KNOW
            continue
        found, sentences = faithful_sentences(answer, sources, quoted=True)
        assert sentences >= 1 and found == sentences, answer
        assert re.fullmatch(r"(.+? \[[^\]]+\])( .+? \[[^\]]+\])?", answer), answer
        assert ending["citations"]
        quoted += 1
    assert quoted, "the model abstained on both questions: no quote was checked"
