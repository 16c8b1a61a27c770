"""The HTTP service, called over real sockets: the app runs under uvicorn on a free port.

One server answers with the embedded SmolLM2 over the sample index. A second one talks to a
stand-in OpenAI upstream (tests/servers.py) that can be told to fail or stall, and has an API
key and CORS switched on.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from langchain_core.documents import Document
from langserve import RemoteRunnable

from ragchains.serving.openai_api import completion_request, to_chat_input
from ragchains.serving.requests import Limits

pytestmark = pytest.mark.slow

QUESTION = "what does the standard plan cost?"
KEY = "s3cret-key"


@pytest.fixture
def url(sample_server: str) -> str:
    return sample_server


def _sources_back_citations(out: dict[str, Any]) -> None:
    assert out["citations"], out
    given = {source["id"]: source["label"] for source in out["sources"]}
    for cite in out["citations"]:
        assert given.get(cite["id"]) == cite["label"]


# ----------------------------------------------------------------------------- LangServe routes
def test_remote_runnable_invoke_on_chat_cites_its_sources(url: str) -> None:
    chat = RemoteRunnable(f"{url}/chat/")
    out = chat.invoke({"question": QUESTION}, config={"configurable": {"domain": "hr"}})
    assert out["answer"].strip() and not out["abstained"]
    _sources_back_citations(out)
    assert out["prompts"]["answer"] == "hr/quote@v1"  # the embedded model quotes
    assert out["answer_style"] == "quote"
    free = chat.invoke(
        {"question": QUESTION}, config={"configurable": {"domain": "hr", "answer_style": "free"}}
    )
    assert free["answer_style"] == "free" and free["prompts"]["answer"] == "hr/answer@v2"


def test_remote_runnable_batch_on_ask(url: str) -> None:
    ask = RemoteRunnable(f"{url}/ask/")
    outs = ask.batch(
        [{"question": QUESTION}, {"question": "How many vacation days do employees get?"}],
        config={"configurable": {"domain": "hr"}},
    )
    assert len(outs) == 2
    for out in outs:
        _sources_back_citations(out)


def test_remote_runnable_stream_sends_sources_then_tokens_then_citations(url: str) -> None:
    chat = RemoteRunnable(f"{url}/chat/")
    history = [
        {"type": "human", "content": "Which health plans are there?"},
        {"type": "ai", "content": "Basic, Standard and Premium."},
    ]
    chunks = list(chat.stream({"question": QUESTION, "chat_history": history}))
    assert "sources" in chunks[0] and "search_query" in chunks[0]
    tokens = [c["answer"] for c in chunks if "answer" in c]
    assert len(tokens) > 1
    (ending,) = [c for c in chunks if "citations" in c]
    _sources_back_citations({**ending, "sources": chunks[0]["sources"]})
    assert chunks.index(ending) > max(i for i, c in enumerate(chunks) if "answer" in c)


def test_stream_on_ask(url: str) -> None:
    chunks = list(RemoteRunnable(f"{url}/ask/").stream({"question": QUESTION}))
    assert chunks[0]["sources"] and any("answer" in c for c in chunks)


def test_playground_and_schemas(url: str) -> None:
    page = httpx.get(f"{url}/chat/playground/")
    assert page.status_code == 200 and "<html" in page.text.lower()
    config = httpx.get(f"{url}/chat/config_schema").json()
    assert set(config["$defs"]["Configurable"]["properties"]) == {
        "domain",
        "rewrite_version",
        "multi_query_version",
        "requery_version",
        "answer_version",
        "quote_version",
        "answer_style",
        "k",
        "threshold",
    }
    choices = config["$defs"]["Configurable"]["properties"]
    assert choices["domain"]["enum"] == ["catalog", "default", "hr"]
    assert choices["rewrite_version"]["enum"] == ["latest", "v1", "v2", "v3"]
    assert "question" in httpx.get(f"{url}/ask/input_schema").json()["properties"]


@pytest.mark.parametrize(
    ("configurable", "reported"),
    [
        ({}, "default/rewrite@v1"),
        ({"domain": "hr"}, "hr/rewrite@v3"),
        ({"domain": "hr", "rewrite_version": "v1"}, "hr/rewrite@v1"),
        ({"domain": "hr", "rewrite_version": "v2"}, "hr/rewrite@v2"),
    ],
)
def test_domain_and_version_chosen_by_config(
    url: str, configurable: dict[str, Any], reported: str
) -> None:
    rewrite = RemoteRunnable(f"{url}/rewrite/")
    out = rewrite.invoke({"question": "cost of the standard plan"}, {"configurable": configurable})
    assert out["prompts"]["rewrite"] == reported


def test_retrieve_route_takes_k_and_filters(url: str) -> None:
    body = {
        "input": {
            "query": "sensors",
            "filters": [{"field": "price", "op": "<", "value": 50}],
        },
        # Product rows score under the similarity fallback's default cut (0.46, from
        # SciFact's abstracts); the catalog domain has its own (0.3).
        "config": {"configurable": {"k": 5, "domain": "catalog"}},
    }
    docs = httpx.post(f"{url}/retrieve/invoke", json=body).json()["output"]
    # Both catalog files with prices answer: products and the accessories made for sensors.
    sources = {d["metadata"]["source"].rsplit("/", 1)[-1] for d in docs}
    assert docs and len(docs) <= 5 and sources <= {"products.csv", "accessories.jsonl"}, sources
    assert all(d["metadata"]["price"] < 50 and "rerank_score" in d["metadata"] for d in docs)
    # RemoteRunnable gives back LangChain Documents, as a retriever would.
    remote = RemoteRunnable(f"{url}/retrieve/").invoke(
        {"query": "temperature sensor"}, {"configurable": {"domain": "catalog"}}
    )
    assert remote and all(isinstance(d, Document) for d in remote)


# ----------------------------------------------------------------------------- OpenAI-compatible
def test_openai_sdk_gets_an_answer_with_sources(url: str) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    assert {m.id for m in client.models.list()} == {"catalog", "default", "hr"}
    reply = client.chat.completions.create(
        model="hr", messages=[{"role": "user", "content": QUESTION}]
    )
    assert reply.choices[0].message.content and reply.choices[0].finish_reason == "stop"
    _sources_back_citations(reply.model_extra["ragchains"])  # type: ignore[index]


def test_openai_sdk_streams_sources_first_and_citations_last(url: str) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    messages: list[Any] = [
        {"role": "system", "content": "ignored: the domain's prompt files decide"},
        {"role": "user", "content": "Which health plans are there?"},
        {"role": "assistant", "content": "Basic, Standard and Premium."},
        {"role": "user", "content": QUESTION},
    ]
    chunks = list(client.chat.completions.create(model="hr", messages=messages, stream=True))
    first, last = chunks[0].model_extra["ragchains"], chunks[-1].model_extra["ragchains"]  # type: ignore[index]
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text.strip() and first["sources"] and chunks[-1].choices[0].finish_reason == "stop"
    _sources_back_citations({**last, "sources": first["sources"]})


def test_openai_messages_become_question_and_history() -> None:
    """The last user message is the question; what follows it is not read."""
    body = completion_request(Limits(1_000_000, 4000, 100, 100_000, 32)).model_validate(
        {
            "model": "default",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "first"}]},
                {"role": "assistant", "content": "reply"},
                {"role": "user", "content": "second"},
                {"role": "system", "content": "in English"},
            ],
        }
    )
    turn = to_chat_input(body.messages)  # type: ignore[attr-defined]
    assert turn["question"] == "second"
    assert [(m.type, m.content) for m in turn["chat_history"]] == [
        ("human", "first"),
        ("ai", "reply"),
    ]


# ----------------------------------------------------------------------------- bad input
LONG = "x" * 100_000


@pytest.mark.parametrize(
    ("path", "body", "status", "reason"),
    [
        ("/chat/invoke", {"input": {"question": ""}}, 422, "at least 1 character"),
        ("/chat/invoke", {"input": {"question": "   "}}, 422, "the question is empty"),
        ("/chat/invoke", {"input": {"question": LONG}}, 422, "the limit is 4000"),
        (
            "/chat/invoke",
            {"input": {"question": "hi", "chat_history": [{"role": "user"}]}},
            422,
            "chat_history[0] is not a turn of the conversation",
        ),
        ("/chat/invoke", {"input": {"question": "hi", "chat_history": "hello"}}, 422, "a list"),
        (
            "/chat/invoke",
            {"input": {"question": "hi"}, "config": {"configurable": {"domain": "legal"}}},
            400,
            "unknown domain 'legal'",
        ),
        (
            "/chat/stream",
            {"input": {"question": "hi"}, "config": {"configurable": {"answer_version": 9}}},
            400,
            "prompt answer has no version 9",
        ),
        (
            "/rewrite/invoke",
            {"input": {"question": "hi"}, "config": {"configurable": {"rewrite_version": "v2"}}},
            400,
            "prompt default/rewrite has no version",
        ),
        (
            "/retrieve/invoke",
            {"input": {"query": "hi"}, "config": {"configurable": {"answer_version": "v1"}}},
            422,
            "unknown configurable key(s) 'answer_version'",
        ),
        (
            "/ask/invoke",
            {"input": {"question": "hi"}, "config": {"configurable": {"temperature": 2}}},
            422,
            "unknown configurable key(s) 'temperature'",
        ),
        (
            "/ask/invoke",
            {"input": {"question": "hi"}, "config": {"configurable": {"k": 0}}},
            422,
            "k: Input should be greater than or equal to 1",
        ),
        (
            "/ask/invoke",
            {"input": {"question": "hi", "filters": [{"field": "colour", "op": "=", "value": 1}]}},
            422,
            "unknown filter field 'colour'",
        ),
        (
            "/ask/invoke",
            {"input": {"question": "hi", "filters": [{"field": "price", "op": "<", "value": "x"}]}},
            422,
            "expected a number",
        ),
        ("/ask/batch", {"inputs": [{"question": "hi"}] * 40}, 413, "the limit is 32"),
        ("/chat/invoke", {"input": {"question": "y" * 2_000_000}}, 413, "larger than"),
        ("/v1/chat/completions", {"model": "legal", "messages": []}, 422, "messages"),
        (
            "/v1/chat/completions",
            {"model": "legal", "messages": [{"role": "user", "content": "hi"}]},
            400,
            "unknown domain 'legal'",
        ),
        (
            "/v1/chat/completions",
            {"model": "hr", "messages": [{"role": "assistant", "content": "hi"}]},
            422,
            "the conversation has no user message to answer",
        ),
        (
            "/v1/chat/completions",
            {"model": "hr", "messages": [{"role": "user", "content": LONG}]},
            422,
            "the limit is 4000",
        ),
    ],
)
def test_bad_input_gets_the_documented_status_and_reason(
    url: str, path: str, body: dict[str, Any], status: int, reason: str
) -> None:
    response = httpx.post(f"{url}{path}", json=body, timeout=30)
    assert response.status_code == status, response.text
    assert reason in response.text
    assert "Traceback" not in response.text and len(response.text) < 2000


def test_malformed_json_is_422(url: str) -> None:
    response = httpx.post(
        f"{url}/v1/chat/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 422 and "not valid JSON" in response.json()["error"]["message"]


def test_health_and_readiness(url: str) -> None:
    assert httpx.get(f"{url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{url}/readyz").json()
    assert ready["ready"] and ready["llm"]["provider"] == "embedded"
    assert ready["index"]["chunks"] > 0 and ready["embedder"]["dimension"] == 384
    assert ready["embedder"]["backend"] == "openvino-int8"
    # No cross-encoder weights exist offline: the similarity fallback is in use and said so.
    assert ready["compressor"]["fallback"] and ready["degraded"]


def test_eval_answers_reaches_the_server_through_both_apis(url: str) -> None:
    """`ragchains eval answers` with a server URL: a LangServe route and the OpenAI API give
    the same turn shape, so the same metrics."""
    from ragchains.evaluation.answers import evaluate_answers, http_target
    from ragchains.evaluation.datasets import QAItem

    item = QAItem("cost", "What does the standard plan cost?", "$45.00", ["x#never-cited"])
    for route in ("/chat", "/v1"):
        rows: list[dict[str, Any]] = []
        target = http_target(f"{url}{route}", {"domain": "hr"}, None, timeout=120)
        summary = evaluate_answers([item], target, None, on_item=rows.append, progress=False)
        (row,) = rows
        assert "error" not in row, row
        assert row["answer_given"] and row["has_citation"] is True, (route, row)
        assert row["citation_match"] is False  # the gold label is not in the index
        assert row["cited"] and all("#" in label or "." in label for label in row["cited"])
        assert summary["errors"] == 0 and summary["has_citation"] == 1.0
    with pytest.raises(Exception, match="answered 404"):
        http_target(f"{url}/nowhere", {}, None, timeout=10).answer("hi")
