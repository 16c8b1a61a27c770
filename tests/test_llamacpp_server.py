"""The openai provider against a real OpenAI-compatible server: llama.cpp's own
(``python -m llama_cpp.server``) serving the shipped SmolLM2, behind `ragchains serve` as a
user starts it. Ask, a chat follow-up, streaming, quote-style answers, a frozen upstream, and
the model's name as the server gives it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pytest
import yaml

from tests.servers import (
    LLAMA_ALIAS,
    RAGCHAINS,
    REPO,
    LlamaServer,
    llama_cpp_server,
    ragchains_serve,
    user_env,
)

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


CHAT_SET = REPO / "evaluation/qa/samples-chat.jsonl"


def every_answer_cites_or_is_marked(served: str, dataset: Path, out: Path) -> list[dict]:
    """`ragchains eval answers` over ``dataset``, asked of the served /chat route in the free
    style (the quote style cites by construction): every answer cites a source or says it
    does not (uncited, abstained), and no searched query invents a number or a name. The
    rows, one per turn."""
    style = "free"
    config = out / "chat.yaml"
    config.write_text(
        yaml.safe_dump(
            {"dataset": str(dataset), "target": {"url": f"{served}/chat", "answer_style": style}}
        )
    )
    done = subprocess.run(
        [str(RAGCHAINS), "eval", "answers", "--config", str(config), "--out", str(out / "run"),
         "--quiet"],
        cwd=REPO, env=user_env(), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((out / "run" / "summary.json").read_text())["metrics"]
    assert metrics["errors"] == 0
    assert metrics["unmarked_uncited"] == 0 and metrics["invented_terms"] == 0, metrics
    rows = [json.loads(line) for line in (out / "run" / "items.jsonl").read_text().splitlines()]
    assert all(r["answer_style"] == style for r in rows)
    return rows


@pytest.mark.eval
def test_every_answer_over_the_chat_set_cites_or_is_marked(served: str, tmp_path: Path) -> None:
    """The committed chat set (9 conversations over samples/, 24 turns): an evaluation run
    (about 6 minutes on 2 cores), in `make eval`; the suite runs three of its turns."""
    rows = every_answer_cites_or_is_marked(served, CHAT_SET, tmp_path)
    assert len(rows) == 24


def test_two_conversations_of_the_chat_set_cite_or_are_marked(served: str, tmp_path: Path) -> None:
    """The chat set's representative in the suite: its first conversation (a follow-up that
    needs the history) and the first turn of its second (a question the documents do not
    answer)."""
    turns = [json.loads(line) for line in CHAT_SET.read_text().splitlines()]
    first, second = list(dict.fromkeys(t["conversation"] for t in turns))[:2]
    kept = [t for t in turns if t["conversation"] == first]
    kept.append(next(t for t in turns if t["conversation"] == second))
    subset = tmp_path / "two-conversations.jsonl"
    subset.write_text("".join(json.dumps(t) + "\n" for t in kept))
    rows = every_answer_cites_or_is_marked(served, subset, tmp_path)
    assert len(rows) == len(kept) >= 3


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


# Records every connection and name lookup the process attempts (Python's audit events).
_SOCKET_AUDIT = """
import json, os, sys

_LOG = os.environ["SOCKET_AUDIT_LOG"]

def _audit(event, args):
    if event in ("socket.connect", "socket.getaddrinfo"):
        where = args[1] if event == "socket.connect" else args[0]
        with open(_LOG, "a") as log:
            log.write(json.dumps([event, repr(where)]) + "\\n")

sys.addaudithook(_audit)
"""

# Inside a network namespace of its own, with only loopback up: the llama.cpp server and
# `ragchains ask` against it, the latter with the audit above.
_OFFLINE_RUN = """
import subprocess, sys
from tests.servers import RAGCHAINS, llama_cpp_server, user_env
question, index, audit_dir, log = sys.argv[1:5]
with llama_cpp_server() as llama:
    env = user_env(RAGCHAINS_LLM_PROVIDER="openai", RAGCHAINS_OPENAI_BASE_URL=llama.base_url,
                   PYTHONPATH=audit_dir, SOCKET_AUDIT_LOG=log)
    done = subprocess.run([str(RAGCHAINS), "ask", question, "--index", index, "--json"],
                          env=env, capture_output=True, text=True, timeout=600)
sys.stdout.write(done.stdout)
sys.stderr.write(done.stderr)
sys.exit(done.returncode)
"""


@pytest.mark.skipif(
    shutil.which("unshare") is None or shutil.which("ip") is None,
    reason="needs unshare (util-linux) and ip (iproute2)",
)
def test_with_networking_disabled_nothing_but_the_model_server_is_contacted(
    sample_index: Path, tmp_path: Path
) -> None:
    """No tokenizer file, encoding or model weights are fetched: with no network but
    loopback, every connection and lookup `ragchains ask` attempts is the model server's."""
    (tmp_path / "sitecustomize.py").write_text(_SOCKET_AUDIT)
    log = tmp_path / "sockets.jsonl"
    question = "How much is the hotel allowance per night in Europe?"
    done = subprocess.run(
        ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$0" "$@"', sys.executable,
         "-c", _OFFLINE_RUN, question, str(sample_index), str(tmp_path), str(log)],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "EUR 180" in json.loads(done.stdout)["answer"]
    attempts = [json.loads(line) for line in log.read_text().splitlines()]
    assert attempts, "the audit hook saw nothing: the run did not go through it"
    elsewhere = [a for a in attempts if "127.0.0.1" not in a[1]]
    assert elsewhere == [], (elsewhere, done.stderr[-2000:])
