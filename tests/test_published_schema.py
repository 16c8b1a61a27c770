"""The published schema is the one the server enforces (issue 30, case 7): each rule the server
checks is in /openapi.json, and each value the document forbids is refused. The fuzz test
(tests/test_openapi_fuzz.py) checks both ways at random; these are the probe's own cases."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base(serve_upstream: Callable[..., AbstractContextManager[str]]) -> Iterator[str]:
    with serve_upstream(openai_model="ok-schema") as url:
        yield url


@pytest.fixture(scope="module")
def document(base: str) -> dict[str, Any]:
    return httpx.get(f"{base}/openapi.json").json()


def schema(document: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    return document["components"]["schemas"][ref["$ref"].rsplit("/", 1)[-1]]


def config_of(document: dict[str, Any], route: str) -> dict[str, Any]:
    envelope = document["components"]["schemas"][f"{route}InvokeRequest"]
    return schema(document, envelope["properties"]["config"])


def test_the_document_states_the_bounds_of_k_and_threshold(document: dict[str, Any]) -> None:
    """/config_schema said 1-200 and 0-1; /openapi.json said nothing."""
    configurable = config_of(document, "chat")["properties"]["configurable"]
    k, threshold = configurable["properties"]["k"], configurable["properties"]["threshold"]
    assert (k["minimum"], k["maximum"]) == (1, 200)
    assert (threshold["minimum"], threshold["maximum"]) == (0, 1)
    assert configurable["additionalProperties"] is False  # unknown keys are refused


def test_each_domain_lists_only_its_own_prompt_versions(
    document: dict[str, Any], base: str
) -> None:
    """catalog has rewrite v1 and v2 only: v3 is the hr domain's, and refused elsewhere."""
    configurable = config_of(document, "rewrite")["properties"]["configurable"]
    domains = {
        d["properties"]["domain"]["const"]: d["properties"]["rewrite_version"]["enum"]
        for d in configurable["allOf"][0]["anyOf"]
    }
    assert "v3" in domains["hr"] and "v3" not in domains["catalog"]
    body = {
        "input": {"question": "And the premium one?"},
        "config": {"configurable": {"domain": "catalog", "rewrite_version": "v3"}},
    }
    refused = httpx.post(f"{base}/rewrite/invoke", json=body, timeout=60)
    assert refused.status_code == 400 and "no version 'v3'" in refused.text


def test_filters_are_typed_by_the_index_fields(document: dict[str, Any], base: str) -> None:
    """Filter field names and value types were left out; 2,934 schema-valid requests were
    refused for them (and for the rules below)."""
    filters = document["components"]["schemas"]["AskRequest"]["properties"]["filters"]
    kinds = {
        (tuple(alt["properties"]["field"]["enum"]), str(alt["properties"]["op"])): alt
        for alt in filters["items"]["anyOf"]
    }
    fields = {name for names, _ in kinds for name in names}
    assert {"filename", "price", "page"} <= fields
    price = next(alt for (names, op), alt in kinds.items() if "price" in names and "in" in op)
    assert price["properties"]["value"]["items"]["type"] == "number"
    unknown = {"question": "x", "filters": [{"field": "colour", "op": "=", "value": "red"}]}
    refused = httpx.post(f"{base}/ask/invoke", json={"input": unknown}, timeout=60)
    assert refused.status_code == 422 and "unknown filter field 'colour'" in refused.text


def test_text_fields_publish_the_pattern_they_are_checked_with(
    document: dict[str, Any],
) -> None:
    schemas = document["components"]["schemas"]
    question = schemas["ChatRequest"]["properties"]["question"]
    assert question["maxLength"] == 4000 and question["minLength"] == 1
    pattern = re.compile(question["pattern"])
    assert pattern.search("What does it cost?")
    assert not pattern.search("   ") and not pattern.search("cost\x00")
    history = schemas["ChatRequest"]["properties"]["chat_history"]
    assert history["maxItems"] == 100
    kinds = {schema(document, ref)["title"] for ref in history["items"]["anyOf"]}
    assert kinds == {"HumanTurnMessage", "AITurnMessage", "UserTurnMessage", "AssistantTurnMessage"}


# Each was accepted (200) though the document (or the question's own rule) forbids it.
REFUSED = [
    (
        "/v1/chat/completions",
        {"model": "default", "stream": 0, "messages": [{"role": "user", "content": "plan cost"}]},
        "stream",
    ),
    (
        "/chat/invoke",
        {
            "input": {
                "question": "plan",
                "chat_history": [{"type": "human", "content": "plan cost", "extras": 5}],
            }
        },
        "extras",
    ),
    (
        "/chat/invoke",
        {
            "input": {
                "question": "plan",
                "chat_history": [{"type": "human", "content": "plan\x00cost"}],
            }
        },
        "control characters",
    ),
    (
        "/rewrite/invoke",
        {"input": {"question": "plan", "chat_history": [{"role": "assistant", "content": "\x00"}]}},
        "control characters",
    ),
    (
        "/v1/chat/completions",
        {
            "model": "default",
            "messages": [
                {"role": "assistant", "content": "a\x00"},
                {"role": "user", "content": "plan"},
            ],
        },
        "control characters",
    ),
    (
        "/retrieve/invoke",
        {"input": {"query": "plan"}, "config": {"recursion_limit": "x"}},
        "recursion_limit",
    ),
    ("/retrieve/invoke", {"input": {"query": "plan"}, "config": {"callbacks": "x"}}, "callbacks"),
    ("/retrieve/invoke", {"input": {"query": "plan"}, "config": {"run_id": 5}}, "run_id"),
    ("/chat/stream", {"input": {"question": "plan"}, "config": {"tags": "x"}}, "tags"),
]


@pytest.mark.parametrize(("path", "body", "named"), REFUSED)
def test_what_the_document_forbids_is_refused(
    base: str, path: str, body: dict[str, Any], named: str
) -> None:
    reply = httpx.post(f"{base}{path}", json=body, timeout=60)
    assert reply.status_code == 422, reply.text
    assert named in reply.text


def test_what_remote_runnable_sends_is_accepted(base: str) -> None:
    """RemoteRunnable sends tags, metadata and recursion_limit in every config, and history
    as LangChain serialises messages: all within the document."""
    from langchain_core.messages import AIMessage, HumanMessage
    from langserve import RemoteRunnable

    chat = RemoteRunnable(f"{base}/rewrite")
    history = [HumanMessage("What does the standard plan cost?"), AIMessage("45 dollars.")]
    out = chat.invoke(
        {"question": "And the premium one?", "chat_history": history},
        {"tags": ["probe"], "metadata": {"who": "test"}, "configurable": {"domain": "hr"}},
    )
    assert out["search_query"]
    batch = RemoteRunnable(f"{base}/retrieve").batch(
        [{"query": "standard plan cost"}, {"query": "soil moisture sensor"}],
        [{"configurable": {"k": 3}}, {"configurable": {"k": 4}}],
    )
    assert len(batch) == 2


def test_the_question_is_the_last_user_message(base: str, document: dict[str, Any]) -> None:
    """The document cannot say "the last message is the user's"; what it says is the rule:
    the last user message is the question, what follows it is not read."""
    body = {
        "model": "hr",
        "messages": [
            {"role": "user", "content": "What does the standard plan cost?"},
            {"role": "system", "content": "Answer briefly."},
        ],
    }
    reply = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    messages = document["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert messages["messages"]["contains"] == {
        "type": "object",
        "properties": {"role": {"const": "user"}},
    }
    none = {"model": "hr", "messages": [{"role": "assistant", "content": "hi"}]}
    refused = httpx.post(f"{base}/v1/chat/completions", json=none, timeout=60)
    assert refused.status_code == 422 and "no user message" in refused.text
