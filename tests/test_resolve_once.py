"""A request's ``configurable`` is resolved once (issue 41): the server resolves it before any
work, to answer a bad choice with its status, and the chain's ``configure`` stage takes the
result instead of resolving it again. Counted on the real app under uvicorn, over every
way a request brings its choices: a body's config, a batch's list of configs, a share
link's config merged with the body's, /v1's model, an MCP tool's arguments."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from langserve.lzstring import LZString

from ragchains.chains.options import Choices

pytestmark = pytest.mark.slow

QUERY = {"query": "How much does the Standard health plan cost per month?"}


@pytest.fixture
def resolved(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every ``Choices.resolve`` call made while the test runs, by what it was given."""
    calls: list[Any] = []
    real = Choices.resolve

    def counted(self: Choices, configurable: Any) -> Any:
        calls.append(dict(configurable or {}))
        return real(self, configurable)

    monkeypatch.setattr(Choices, "resolve", counted)
    yield calls


def post(base: str, path: str, body: dict[str, Any]) -> httpx.Response:
    reply = httpx.post(f"{base}{path}", json=body, timeout=120)
    assert reply.status_code == 200, (path, reply.text[:300])
    return reply


@pytest.mark.parametrize("endpoint", ["invoke", "stream", "stream_log", "stream_events"])
def test_one_resolution_for_each_langserve_run(
    sample_server: str, resolved: list[Any], endpoint: str
) -> None:
    body = {"input": QUERY, "config": {"configurable": {"domain": "hr", "k": 3}}}
    post(sample_server, f"/retrieve/{endpoint}", body)
    assert len(resolved) == 1 and resolved[0]["domain"] == "hr", resolved


def test_one_resolution_for_each_config_of_a_batch(sample_server: str, resolved: list[Any]) -> None:
    shared = {"inputs": [QUERY, QUERY, QUERY], "config": {"configurable": {"k": 2}}}
    post(sample_server, "/retrieve/batch", shared)
    assert len(resolved) == 1, resolved
    resolved.clear()
    each = [{"configurable": {"k": k}} for k in (1, 2, 3)]
    outs = post(sample_server, "/retrieve/batch", {"inputs": [QUERY] * 3, "config": each})
    assert [c["k"] for c in resolved] == [1, 2, 3]
    assert [len(out) for out in outs.json()["output"]] == [1, 2, 3]  # each with its own k


def test_a_share_links_choices_are_resolved_once(sample_server: str, resolved: list[Any]) -> None:
    """A share link's config is decoded inside LangServe and merged with the body's, so it
    is resolved in LangServe's config hook, once; a bad one is refused there with its
    status. (LangServe fills a body's config with every default before merging, so a body
    that sends choices overrides all of the link's.)"""
    link = LZString.compressToEncodedURIComponent(
        json.dumps({"configurable": {"domain": "catalog", "k": 2}})
    )
    out = post(sample_server, f"/retrieve/c/{link}/invoke", {"input": QUERY}).json()["output"]
    assert len(resolved) == 1 and resolved[0]["domain"] == "catalog", resolved
    assert len(out) <= 2
    bad = LZString.compressToEncodedURIComponent(json.dumps({"configurable": {"k": 0}}))
    reply = httpx.post(f"{sample_server}/retrieve/c/{bad}/invoke", json={"input": QUERY})
    assert reply.status_code == 422 and "k" in reply.json()["detail"], reply.text


def test_one_resolution_for_a_v1_completion_and_an_ask(
    sample_server: str, resolved: list[Any]
) -> None:
    messages = [{"role": "user", "content": "How many vacation days do employees get?"}]
    post(sample_server, "/v1/chat/completions", {"model": "hr", "messages": messages})
    assert len(resolved) == 1 and resolved[0]["domain"] == "hr", resolved
    resolved.clear()
    question = {"question": "How many vacation days do employees get?"}
    post(sample_server, "/ask/invoke", {"input": question})
    assert len(resolved) == 1, resolved
