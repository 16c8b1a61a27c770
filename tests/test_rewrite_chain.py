"""The rewrite stage with fake chat models: every fallback, filters, glossary, history trimming."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import (
    FakeListChatModel,
    FakeMessagesListChatModel,
)
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from pydantic import Field

from ragchains.chains.llm import LLM, supports_tool_calling, trim_history
from ragchains.chains.queryguard import QueryGuard
from ragchains.chains.rewrite import (
    RewriteOutput,
    create_rewrite_chain,
    expand_glossary,
    interpret,
    keep_the_users_words,
)
from ragchains.chains.toolcalls import (
    call_grammar,
    lines_grammar,
    parse_alternatives,
    sanitize_query,
    text_calls,
)
from ragchains.prompts.registry import CHAIN_PROMPTS as REQUIRED_PROMPTS
from ragchains.prompts.registry import PromptRegistry
from ragchains.retrievers.bm25 import tokenize
from tests.fakes import RecordingModel

FIELDS = {"price": "number", "brand": "string", "filename": "string", "in_stock": "boolean"}
QUESTION = "which soil sensors cost less than 100?"


class ToolModel(FakeMessagesListChatModel):
    """A fake tool-calling model: returns queued AIMessages and records what it was sent."""

    seen: list = Field(default_factory=list)
    bound: list = Field(default_factory=list)

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        self.bound.append(tools)
        return self.bind(tools=tools, **kwargs)

    def _generate(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        self.seen.append(messages)
        return super()._generate(messages, *args, **kwargs)


def tool_llm(*replies: AIMessage) -> LLM:
    return LLM.of(ToolModel(responses=list(replies)), count_tokens=len)


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "args": args, "id": f"call-{name}", "type": "tool_call"}


@pytest.fixture(scope="module")
def prompts() -> PromptRegistry:
    return PromptRegistry(required=REQUIRED_PROMPTS)


def run(
    prompts: PromptRegistry,
    reply: AIMessage,
    question: str = QUESTION,
    history: Sequence[BaseMessage] = (),
    **config: Any,
) -> Any:
    chain = create_rewrite_chain(llm=tool_llm(reply), prompts=prompts, fields=FIELDS)
    turn = {"question": question, "chat_history": list(history)}
    return chain.invoke(turn, {"configurable": config})


# A conversation about soil moisture: a rewrite that brings in "moisture" is searched.
MOISTURE = [HumanMessage("we water by soil moisture"), AIMessage("Then measure it.")]


# ----------------------------------------------------------------------------- fallbacks
@pytest.mark.parametrize(
    "reply",
    [
        AIMessage(content="", tool_calls=[call("search_sources", search_query="0")]),
        AIMessage(content="", tool_calls=[call("search_sources", search_query="")]),
        AIMessage(content="", tool_calls=[call("search_sources", search_query="empty string")]),
        AIMessage(content="", tool_calls=[call("search_sources", search_query='""')]),
        AIMessage(content="", tool_calls=[call("search_sources", search_query="'  '")]),
        AIMessage(content="", tool_calls=[call("search_sources", search_query=None)]),
        AIMessage(
            content="",
            invalid_tool_calls=[
                {
                    "name": "search_sources",
                    "args": '{"search_query": "soil',
                    "id": "x",
                    "error": "bad json",
                    "type": "invalid_tool_call",
                }
            ],
        ),
        AIMessage(content='{"search_query": "soil sensors"'),  # JSON as text, broken
        AIMessage(content="0"),
        AIMessage(content=""),
    ],
    ids=[
        "zero",
        "empty",
        "empty-string-words",
        "quotes",
        "quoted-blank",
        "null",
        "invalid-json-call",
        "json-text",
        "zero-text",
        "empty-text",
    ],
)
def test_junk_falls_back_to_the_question(prompts: PromptRegistry, reply: AIMessage) -> None:
    out = run(prompts, reply)
    assert out.fallback is True
    assert out.search_query == QUESTION
    assert any("searching the question as asked" in n for n in out.notes)


def test_plain_reply_without_call_syntax_is_the_query(prompts: PromptRegistry) -> None:
    reply = AIMessage(content="soil moisture sensors\nunder 100 dollars")
    assert interpret(reply, QUESTION, FIELDS).search_query == "soil moisture sensors"
    # It brings in the conversation's "moisture": searched beside the question.
    out = run(prompts, reply, history=MOISTURE)
    assert out.search_query == QUESTION and not out.fallback
    assert out.alternatives == ["soil moisture sensors"]


@pytest.mark.parametrize(
    "reply",
    [
        "The Standard plan costs $45.00 per month [employee-handbook.md#benefit-plans].",
        "Soil sensors are devices that measure how much water is in the soil so that farmers "
        "know when to water their fields and how much.",
    ],
    ids=["cited", "long"],
)
def test_prose_answer_instead_of_a_query_falls_back(prompts: PromptRegistry, reply: str) -> None:
    out = run(prompts, AIMessage(content=reply))
    assert out.fallback and out.search_query == QUESTION
    assert any("answered in prose" in n for n in out.notes)


def test_quoted_query_is_unquoted(prompts: PromptRegistry) -> None:
    out = run(
        prompts,
        AIMessage(content="", tool_calls=[call("search_sources", search_query='"soil sensor"')]),
    )
    assert not out.fallback
    assert (
        interpret(
            AIMessage(
                content="", tool_calls=[call("search_sources", search_query='"soil sensor"')]
            ),
            QUESTION,
            FIELDS,
        ).search_query
        == "soil sensor"
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("  soil   sensor ", "soil sensor"),
        ("'\"soil sensor\"'", "soil sensor"),
        ("“soil sensor”", "soil sensor"),
        ("Empty String", None),
        ("0", None),
        ("none", None),
        ("[1, 2]", None),
        (42, None),
        ("x" * 1000, "x" * 400),
    ],
)
def test_sanitize_query(raw: Any, expected: str | None) -> None:
    assert sanitize_query(raw) == expected


# ----------------------------------------------------------------------------- filters
def test_numeric_and_filename_filters_are_checked(prompts: PromptRegistry) -> None:
    reply = AIMessage(
        content="",
        tool_calls=[
            call("search_sources", search_query="soil sensor"),
            call("add_filter", field="price", op="<", value=100),
            call("search_by_filename", filename="products.csv"),
            call("add_filter", field="price", op="<", value="cheap"),  # wrong type
            call("add_filter", field="colour", op="=", value="red"),  # unknown field
            call("add_filter", field="brand", op=">", value="A"),  # op does not fit
            call("add_filter", field="price; DROP TABLE", op="=", value=1),
        ],
    )
    out = run(prompts, reply, "which soil sensors in products.csv cost less than 100?")
    # "soil sensor" adds nothing to the question: the user's own words are searched.
    assert out.search_query == "which soil sensors in products.csv cost less than 100?"
    assert [f.model_dump() for f in out.filters] == [
        {"field": "price", "op": "<", "value": 100},
        {"field": "filename", "op": "=", "value": "products.csv"},
    ]
    dropped = [n for n in out.notes if n.startswith("dropped filter")]
    assert len(dropped) == 4
    assert "expected a number" in dropped[0] and "unknown filter field 'colour'" in dropped[1]


def test_plain_text_model_uses_the_call_syntax_of_the_few_shots(prompts: PromptRegistry) -> None:
    llm = FakeListChatModel(
        responses=[
            "search_sources(search_query='soil moisture sensor'); "
            "add_filter(field='price', op='<', value=100)"
        ]
    )
    assert not supports_tool_calling(llm)
    chain = create_rewrite_chain(llm=LLM.of(llm, count_tokens=len), prompts=prompts, fields=FIELDS)
    out = chain.invoke({"question": QUESTION, "chat_history": MOISTURE})
    assert out.alternatives == ["soil moisture sensor"]
    assert [f.model_dump() for f in out.filters] == [{"field": "price", "op": "<", "value": 100}]
    assert out.prompts == {"rewrite": "default/rewrite@v1"}


def test_grammar_model_is_held_to_the_call_syntax(prompts: PromptRegistry) -> None:
    model = RecordingModel(responses=["search_sources(search_query='soil sensor')"])
    llm = LLM(model=model, name="g", count_tokens=len, grammar=True)
    create_rewrite_chain(llm=llm, prompts=prompts, fields=FIELDS).invoke({"question": "q"})
    (grammar,) = model.grammars
    assert grammar == call_grammar(FIELDS)
    assert 'field ::= "brand" | "filename" | "in_stock" | "price"' in grammar
    assert call_grammar({}).startswith("root ::= lookup\n")  # no fields: no filter rule


def test_multi_query_adds_fused_phrasings(prompts: PromptRegistry) -> None:
    """The catalog domain asks for 2 queries: the rewrite and one more phrasing."""
    model = RecordingModel(
        responses=[
            "search_sources(search_query='soil sensor')",
            "1. SKU moisture sensors\n2. soil sensor\n3. ground humidity meter",
        ]
    )
    llm = LLM(model=model, name="g", count_tokens=len, grammar=True)
    out = create_rewrite_chain(llm=llm, prompts=prompts, fields=FIELDS).invoke(
        {"question": "sensors", "chat_history": MOISTURE}, {"configurable": {"domain": "catalog"}}
    )
    # The user's words are searched; the rewrite, which brings in the conversation's "soil",
    # and the phrasing beside them. The glossary's words count as said, and it applies.
    assert out.search_query == "sensors"
    assert out.alternatives == ["soil sensor", "SKU (product code) moisture sensors"]
    assert out.prompts == {
        "rewrite": "catalog/rewrite@v2",
        "multi_query": "default/multi_query@v2",
    }
    assert model.grammars[1] == lines_grammar(1) == "root ::= line\nline ::= [^\\n] [^\\n]{0,149}\n"
    assert lines_grammar(3).startswith('root ::= line ("\\n" line){2}\n')
    assert parse_alternatives("- a\n* b\nx\n\n0", main="x", count=5) == ["a", "b"]


# ----------------------------------------------------------------------------- the user's words
@pytest.mark.parametrize(
    ("question", "history", "rewrite", "searched", "also"),
    [
        # Drops the claim's words: the claim is searched.
        ("1,000 genomes project maps rare variants", [], "genomes project", "", []),
        # Keeps them but adds nothing: the question is searched.
        ("Inductive properties of biomaterials?", [], "biomaterials inductive", "", []),
        # Adds a word the conversation never held: a guess; the question is searched.
        ("soil sensors?", [], "soil moisture sensors", "", []),
        # A follow-up: "ones" is the previous question's subject; the question as asked and
        # the rewrite, which brings in the conversation's words, are searched beside it.
        (
            "Do unused ones carry over?",
            ["How many vacation days do employees get?"],
            "unused vacation days carry over",
            "Do unused vacation days employees carry over?",
            ["Do unused ones carry over?", "unused vacation days carry over"],
        ),
        # A follow-up without its subject gets the subject after it; a rewrite that leaves
        # out the question's words is not searched; the question as asked always is.
        (
            "and the sick days?",
            ["How many vacation days do employees get?"],
            "vacation",
            "and the sick days vacation employees?",
            ["and the sick days?"],
        ),
        # Brings in an earlier unrelated question: not searched.
        (
            "Which sensors cost less than 100 dollars?",
            ["What is the capital of Mongolia?"],
            "What is the capital of Mongolia? Which sensors cost less than 100 dollars?",
            "",
            [],
        ),
    ],
)
def test_the_search_keeps_the_users_words(
    question: str, history: list[str], rewrite: str, searched: str, also: list[str]
) -> None:
    out = RewriteOutput(search_query=rewrite)
    messages = [m for q in history for m in (HumanMessage(q), AIMessage("an answer"))]
    keep_the_users_words(out, question, messages, QueryGuard.for_turn(question, messages))
    assert out.search_query == (searched or question)
    assert out.alternatives == also


@pytest.mark.parametrize(
    ("question", "history", "query", "reason"),
    [
        # The follow-up of the issue: a re-query that states a price nobody gave.
        (
            "And how much is it to add children?",
            ["What does the standard health plan cost per month?"],
            "The cost of adding a child to the plan is 10.5 cents, which is equivalent to 2.6% "
            "of the total purchase price of 37.89 dollars",
            "adds a number the conversation never gave (10.5)",
        ),
        (
            "Which sensors cost less than 100 dollars?",
            [],
            "sensors cost less than 100 dollars National Institute NICESS Berlin",
            "adds a name the conversation never used (National)",
        ),
        (
            "Which sensors cost less than 100 dollars?",
            ["What is the capital of Mongolia?"],
            "What is the capital of Mongolia? Which sensors cost less than 100 dollars?",
            "joins more than one question",
        ),
        (
            "What does VACL stand for?",
            [],
            'The full form of the acronym "VACL" is: VACL.',
            "states something",
        ),
        (
            "What does VACL stand for?",
            [],
            "VACL stand for Virtual Access Control List",
            "adds a name the conversation never used (Virtual)",
        ),
        ("What is the capital of Mongolia?", [], "largest city", "leaves out words"),
        ("Is it in stock?", ["Is there a gateway with LTE?"], "No, it is not in stock.", "answers"),
    ],
)
def test_the_guard_refuses_what_the_conversation_never_said(
    question: str, history: list[str], query: str, reason: str
) -> None:
    messages = [m for q in history for m in (HumanMessage(q), AIMessage("an answer"))]
    refusal = QueryGuard.for_turn(question, messages).refusal(query)
    assert refusal is not None and reason in refusal


@pytest.mark.parametrize(
    ("question", "history", "query"),
    [
        (
            "And how much is it to add children?",
            ["What does the standard plan cost?"],
            "Standard plan cost adding children",
        ),
        ("What does PTO mean?", [], "PTO paid time off meaning"),
        ("Is it treatable?", ["What is throat cancer?"], "Is throat cancer treatable?"),
        # A number or name the assistant's answer gave counts as said.
        ("How do I book it?", ["Which hotel do we use in Berlin?"], "book Hotel Adlon Berlin"),
    ],
)
def test_the_guard_lets_the_conversations_words_through(
    question: str, history: list[str], query: str
) -> None:
    messages = [m for q in history for m in (HumanMessage(q), AIMessage("Hotel Adlon, 220 EUR."))]
    guard = QueryGuard.for_turn(question, messages, also_said=["PTO paid time off"])
    assert guard.refusal(query) is None


def test_a_prompts_example_copied_into_an_unrelated_query_is_refused() -> None:
    examples = ["search_sources(search_query='benefits health plan cost adding children')"]
    guard = QueryGuard.for_turn("What is the capital of Mongolia?", examples=examples)
    assert "copies the prompt's example" in (
        guard.refusal("benefits health plan capital of mongolia") or ""
    )
    # The example's words the conversation uses are the conversation's.
    asked = QueryGuard.for_turn("what do the benefits cost?", examples=examples)
    assert asked.refusal("benefits cost") is None
    assert "(health)" in (asked.refusal("benefits health cost") or "")


def test_plain_text_with_bad_arguments_falls_back() -> None:
    out = interpret("search_sources(search_query=soil sensor)", QUESTION, FIELDS)
    assert out.fallback and any("unparsable arguments" in n for n in out.notes)


def test_tools_offer_only_the_index_fields(prompts: PromptRegistry) -> None:
    llm = tool_llm(AIMessage(content="", tool_calls=[call("search_sources", search_query="x")]))
    create_rewrite_chain(llm=llm, prompts=prompts, fields=FIELDS).invoke({"question": "q"})
    tools = {t["function"]["name"]: t["function"] for t in llm.model.bound[-1]}
    assert set(tools) == {"search_sources", "search_by_filename", "add_filter"}
    assert tools["add_filter"]["parameters"]["properties"]["field"]["enum"] == sorted(FIELDS)


# ----------------------------------------------------------------------------- glossary, prompts
def test_glossary_expansion_per_domain(prompts: PromptRegistry) -> None:
    reply = AIMessage(
        content="", tool_calls=[call("search_sources", search_query="PTO carry over")]
    )
    question = "does unused PTO carry over?"
    expanded = run(prompts, reply, question, domain="hr")
    assert expanded.search_query == "does unused PTO (paid time off) carry over?"
    assert run(prompts, reply, question).search_query == question  # default: expansion off
    assert expand_glossary("PTO (paid time off)", {"PTO": "paid time off"}) == "PTO (paid time off)"
    assert expand_glossary("OPTOUT", {"PTO": "paid time off"}) == "OPTOUT"
    assert expand_glossary("pto days", {"PTO": "paid time off"}) == "pto days"  # an abbreviation
    # A word in lower case is found in any case, its case kept.
    word = {"vacation": "paid time off"}
    assert expand_glossary("Vacation days", word) == "Vacation (paid time off) days"
    assert expand_glossary("vacations", word) == "vacations"


def test_domain_and_version_pick_the_prompt(prompts: PromptRegistry) -> None:
    reply = AIMessage(content="", tool_calls=[call("search_sources", search_query="x")])
    assert run(prompts, reply, domain="hr").prompts["rewrite"] == "hr/rewrite@v3"
    assert (
        run(prompts, reply, domain="hr", rewrite_version="v1").prompts["rewrite"] == "hr/rewrite@v1"
    )
    assert run(prompts, reply).prompts["rewrite"] == "default/rewrite@v1"


# ----------------------------------------------------------------------------- history
def test_history_trimmed_to_budget_newest_turns_whole(prompts: PromptRegistry) -> None:
    history = []
    for i in range(6):
        history += [HumanMessage(f"question {i} " + "x" * 40), AIMessage(f"answer {i} " + "y" * 40)]
    kept = trim_history(history, max_tokens=200, count_tokens=len)
    assert kept[0].type == "human" and kept[-1].type == "ai"
    assert kept == history[-len(kept) :]  # newest, contiguous
    assert len(kept) % 2 == 0 and 0 < len(kept) < len(history)
    assert sum(len(str(m.content)) + 4 for m in kept) <= 200

    llm = tool_llm(AIMessage(content="", tool_calls=[call("search_sources", search_query="x")]))
    chain = create_rewrite_chain(llm=llm, prompts=prompts, fields=FIELDS, history_tokens=200)
    chain.invoke(
        {"question": "and the last one?", "chat_history": history},
        {"configurable": {"domain": "hr"}},
    )
    sent = llm.model.seen[-1]
    # System prompt and few-shots are always there, before the trimmed history.
    assert isinstance(sent[0], SystemMessage)
    assert sent[1].content == "what does the standard plan cost per month?"
    assert [m.content for m in sent[5:-1]] == [m.content for m in kept]
    assert sent[-1].content == "and the last one?"


# ----------------------------------------------------------------------------- examples do not leak
# Conversations that share no word with any domain's rewrite examples.
UNRELATED = [
    ("Which river flows through Vienna?", ["Who painted the Mona Lisa?"]),
    ("What is the capital of Mongolia?", ["Which flowers are cheap?", "Tell me about deserts."]),
    ("How tall is Mount Everest?", ["What is the capital of Mongolia?"]),
]


@pytest.mark.parametrize("domain", ["default", "hr", "catalog"])
def test_no_example_of_a_domains_rewrite_prompt_reaches_an_unrelated_search(
    prompts: PromptRegistry, smollm: LLM, domain: str
) -> None:
    """SmolLM2 through each domain's latest rewrite prompt: whatever it copies from the
    prompt's few-shot examples, no word of theirs that the conversation lacks is searched."""
    prompt = prompts.get(domain, "rewrite")
    calls = [c for e in prompt.examples for c in text_calls(e)]
    queries = [c["args"]["search_query"] for c in calls if c["name"] == "search_sources"]
    example_words = set(tokenize(" ".join(queries)))
    assert example_words
    chain = create_rewrite_chain(llm=smollm, prompts=prompts, fields=FIELDS)
    for question, said in UNRELATED:
        history = [m for q in said for m in (HumanMessage(q), AIMessage("I don't know."))]
        conversation = set(tokenize(" ".join([question, *said, "I don't know."])))
        assert not conversation & example_words
        out = chain.invoke(
            {"question": question, "chat_history": history}, {"configurable": {"domain": domain}}
        )
        searched = {t for q in [out.search_query, *out.alternatives] for t in tokenize(q)}
        assert not searched & example_words, (out.search_query, out.alternatives, out.notes)
