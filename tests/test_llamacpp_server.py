"""The openai provider against a real OpenAI-compatible server: llama.cpp's own
(``python -m llama_cpp.server``) serving the shipped SmolLM2, behind `ragchains serve` as a
user starts it. Ask, a chat follow-up, streaming, quote-style answers, a frozen upstream, and
the model's name as the server gives it."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pytest

from tests.servers import LLAMA_ALIAS, LlamaServer, llama_cpp_server, ragchains_serve

# The deadline of one model call where the upstream freezes: short, so that it fails fast.
DEADLINE = 5


@pytest.fixture(scope="module")
def llama() -> Iterator[LlamaServer]:
    with llama_cpp_server() as server:
        yield server


def serve(llama: LlamaServer, index: Path, **env: str) -> AbstractContextManager[str]:
    """`ragchains serve` with the openai provider pointed at ``llama``, as a user sets it."""
    return ragchains_serve(
        "--index",
        str(index),
        RAGCHAINS_LLM_PROVIDER="openai",
        RAGCHAINS_OPENAI_BASE_URL=llama.base_url,
        **env,
    )


@pytest.fixture(scope="module")
def served(llama: LlamaServer, sample_index: Path) -> Iterator[str]:
    with serve(llama, sample_index) as base:
        yield base


def invoke(base: str, route: str, inputs: dict[str, object], **configurable: object) -> dict:
    body = {"input": inputs, "config": {"configurable": configurable}}
    response = httpx.post(f"{base}/{route}/invoke", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["output"]


def grounded_or_marked(out: dict) -> None:
    """Every answer cites a source of the turn, or says it does not (uncited, abstained)."""
    labels = {s["label"] for s in out["sources"]}
    cited = {c["label"] for c in out["citations"]}
    assert (cited and cited <= labels) or out["uncited"] or out["abstained"], out


def test_the_server_is_asked_what_it_serves(served: str) -> None:
    llm = httpx.get(f"{served}/readyz", timeout=10).json()["llm"]
    # The name the server gives its model, not the provider's default, and its grammar field.
    assert llm["model"] == LLAMA_ALIAS and llm["grammar"] is True and llm["provider"] == "openai"


def test_ask_quotes_the_sources_through_the_servers_grammar(served: str) -> None:
    out = invoke(
        served, "ask", {"question": "How much is the hotel allowance per night in Europe?"}
    )
    assert out["answer_style"] == "quote" and not out["abstained"]
    assert "EUR 180" in out["answer"]
    assert [c["label"] for c in out["citations"]] == ["travel-policy.pdf#page=1"]
    grounded_or_marked(out)


def test_free_answers_cite_or_are_marked(served: str) -> None:
    for question in ("How many days of paid time off do full-time employees get?",
                     "How much is the wellness stipend?"):  # fmt: skip
        out = invoke(served, "ask", {"question": question}, answer_style="free")
        assert out["answer_style"] == "free"
        grounded_or_marked(out)


def test_chat_follow_up_searches_the_conversations_words(served: str) -> None:
    history = [
        {"type": "human", "content": "What does the Standard health plan cost per month?"},
        {"type": "ai", "content": "$45.00 per month. [employee-handbook.md#benefit-plans]"},
    ]
    out = invoke(
        served,
        "chat",
        {"question": "And how much is it to add children?", "chat_history": history},
        domain="hr",
    )
    assert "children" in out["search_query"] and "Standard" in out["search_query"]
    said = " ".join([*(m["content"] for m in history), "And how much is it to add children?"])
    for query in [out["search_query"], *out["alternatives"]]:
        assert set(re.findall(r"\d+", query)) <= set(re.findall(r"\d+", said)), query
    grounded_or_marked(out)


def test_the_answer_streams_over_sse(served: str) -> None:
    body = {"input": {"question": "How many weeks of parental leave do birth parents get?"}}
    events: list[dict] = []
    with httpx.stream("POST", f"{served}/ask/stream", json=body, timeout=120) as response:
        assert response.status_code == 200
        kind = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: ") and kind == "data":
                events.append(json.loads(line.removeprefix("data: ")))
    assert "sources" in events[0]
    tokens = [e["answer"] for e in events if set(e) == {"answer"}]
    assert tokens, events
    end = next(e for e in events if "citations" in e)
    assert end["citations"] or end["uncited"] or end["abstained"]


def test_a_frozen_upstream_answers_504_within_the_deadline(
    llama: LlamaServer, sample_index: Path
) -> None:
    """The server stops (SIGSTOP): it still accepts connections and never answers. One
    deadline covers the call and its retries: 504 after about DEADLINE seconds, not
    DEADLINE x (1 + retries)."""
    question = {"question": "How much is the home-office allowance?"}
    limits = {"RAGCHAINS_LLM_TIMEOUT": str(DEADLINE), "RAGCHAINS_LLM_MAX_RETRIES": "2"}
    with serve(llama, sample_index, **limits) as base:
        os.kill(llama.process.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            response = httpx.post(f"{base}/ask/invoke", json={"input": question}, timeout=120)
            took = time.monotonic() - started
        finally:
            os.kill(llama.process.pid, signal.SIGCONT)
        assert response.status_code == 504, response.text
        assert "did not answer in time" in response.json()["detail"]
        assert took < 2 * DEADLINE, took  # retries inside the deadline, not after it
