"""The rewrite stage with fake chat models: every fallback, filters, glossary, history trimming."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import (
    FakeListChatModel,
    FakeMessagesListChatModel,
)
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from pydantic import Field

from chains.rewrite import (
    build_rewrite_chain,
    expand_glossary,
    interpret,
    sanitize_query,
    supports_tool_calling,
    trim_history,
)
from prompts.registry import PromptRegistry

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


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "args": args, "id": f"call-{name}", "type": "tool_call"}


@pytest.fixture(scope="module")
def prompts() -> PromptRegistry:
    return PromptRegistry(required=("rewrite", "answer", "requery"))


def run(prompts: PromptRegistry, reply: AIMessage, **config: Any) -> Any:
    chain = build_rewrite_chain(
        llm=ToolModel(responses=[reply]), prompts=prompts, fields=FIELDS, count_tokens=len
    )
    return chain.invoke({"question": QUESTION}, {"configurable": config})


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
    out = run(prompts, AIMessage(content="soil moisture sensors\nunder 100 dollars"))
    assert out.search_query == "soil moisture sensors" and not out.fallback


def test_quoted_query_is_unquoted(prompts: PromptRegistry) -> None:
    out = run(
        prompts,
        AIMessage(content="", tool_calls=[call("search_sources", search_query='"soil sensor"')]),
    )
    assert out.search_query == "soil sensor" and not out.fallback


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
    out = run(prompts, reply)
    assert out.search_query == "soil sensor"
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
    chain = build_rewrite_chain(llm=llm, prompts=prompts, fields=FIELDS, count_tokens=len)
    out = chain.invoke({"question": QUESTION}, {"configurable": {"domain": "catalog"}})
    assert out.search_query == "soil moisture sensor"
    assert [f.model_dump() for f in out.filters] == [{"field": "price", "op": "<", "value": 100}]
    assert out.prompt == "catalog/rewrite@v1"


def test_plain_text_with_bad_arguments_falls_back() -> None:
    out = interpret("search_sources(search_query=soil sensor)", QUESTION, FIELDS)
    assert out.fallback and any("unparsable arguments" in n for n in out.notes)


def test_tools_offer_only_the_index_fields(prompts: PromptRegistry) -> None:
    llm = ToolModel(
        responses=[AIMessage(content="", tool_calls=[call("search_sources", search_query="x")])]
    )
    build_rewrite_chain(llm=llm, prompts=prompts, fields=FIELDS, count_tokens=len).invoke(
        {"question": "q"}
    )
    tools = {t["function"]["name"]: t["function"] for t in llm.bound[-1]}
    assert set(tools) == {"search_sources", "search_by_filename", "add_filter"}
    assert tools["add_filter"]["parameters"]["properties"]["field"]["enum"] == sorted(FIELDS)


# ----------------------------------------------------------------------------- glossary, prompts
def test_glossary_expansion_per_domain(prompts: PromptRegistry) -> None:
    reply = AIMessage(
        content="", tool_calls=[call("search_sources", search_query="PTO carry over")]
    )
    assert run(prompts, reply, domain="hr").search_query == "PTO (paid time off) carry over"
    assert run(prompts, reply).search_query == "PTO carry over"  # default: expansion off
    assert expand_glossary("PTO (paid time off)", {"PTO": "paid time off"}) == "PTO (paid time off)"
    assert expand_glossary("OPTOUT", {"PTO": "paid time off"}) == "OPTOUT"


def test_domain_and_version_pick_the_prompt(prompts: PromptRegistry) -> None:
    reply = AIMessage(content="", tool_calls=[call("search_sources", search_query="x")])
    assert run(prompts, reply, domain="hr").prompt == "hr/rewrite@v2"
    assert run(prompts, reply, domain="hr", prompt_version=1).prompt == "hr/rewrite@v1"
    assert run(prompts, reply).prompt == "default/rewrite@v1"


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

    llm = ToolModel(
        responses=[AIMessage(content="", tool_calls=[call("search_sources", search_query="x")])]
    )
    chain = build_rewrite_chain(
        llm=llm, prompts=prompts, fields=FIELDS, count_tokens=len, history_tokens=200
    )
    chain.invoke(
        {"question": "and the last one?", "chat_history": history},
        {"configurable": {"domain": "hr"}},
    )
    sent = llm.seen[-1]
    # System prompt and few-shots are always there, before the trimmed history.
    assert isinstance(sent[0], SystemMessage)
    assert sent[1].content == "what does the standard plan cost per month?"
    assert [m.content for m in sent[5:-1]] == [m.content for m in kept]
    assert sent[-1].content == "and the last one?"
