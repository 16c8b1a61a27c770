"""Threads and runs under `ragchains serve`, driven by LangChain's own client
(``langgraph-sdk``) as its users write it, with bearer tokens of a real OpenID Connect
provider: a thread is created, two runs streamed (a question, then a follow-up given the first
as history), its state and history read, a run waited for, the thread deleted; another
person's token reads, runs and deletes none of it. A thread is a conversation: the page's
/conversations lists it. And the README's example runs as shown."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_sync_client
from langgraph_sdk.errors import NotFoundError

from ragchains.serving.keys import add_key
from tests.conftest import FIXTURES
from tests.oidc import OidcProvider, oidc_provider
from tests.servers import FakeOpenAI, ragchains_serve, user_env, wait_until
from tests.test_cli import run
from tests.test_domains_served import readme_block

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

QUESTION = "What is the tool shed code?"
FOLLOW_UP = "And how must the tools be returned?"


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("threads")
    shutil.copytree(FIXTURES / "docs", folder / "docs")
    assert run("ingest", folder / "docs", "--index", folder / "index").returncode == 0
    return folder / "index"


@pytest.fixture(scope="module")
def provider() -> Iterator[OidcProvider]:
    with oidc_provider() as started:
        yield started


def _serve(index: Path, provider: OidcProvider) -> Any:
    return ragchains_serve(
        "--index",
        str(index),
        RAGCHAINS_OIDC_ISSUER=provider.issuer,
        RAGCHAINS_OIDC_CLIENT_ID="ragchains",
    )


def _client(base: str, token: str) -> Any:
    # api_key=None: a LANGSMITH_API_KEY in the environment must not be sent to the server.
    return get_sync_client(url=base, api_key=None, headers={"Authorization": f"Bearer {token}"})


def _ask(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def test_langgraph_sdk_streams_two_runs_on_a_thread_and_reads_its_history(
    index: Path, provider: OidcProvider
) -> None:
    alice_token = provider.token("alice", groups=["garden"])
    bob_token = provider.token("bob", groups=["garden"])
    with _serve(index, provider) as base:
        alice, bob = _client(base, alice_token), _client(base, bob_token)
        thread = alice.threads.create(metadata={"topic": "garden"})
        tid = thread["thread_id"]
        assert thread["metadata"] == {"topic": "garden"} and thread["values"] is None

        first = list(
            alice.runs.stream(
                tid, "chat", input=_ask(QUESTION), stream_mode=["values", "messages-tuple"]
            )
        )
        assert first[0].event == "metadata" and "run_id" in first[0].data
        tokens = [p.data[0]["content"] for p in first if p.event == "messages"]
        final = [p for p in first if p.event == "values"][-1].data["messages"]
        assert [m["type"] for m in final] == ["human", "ai"]
        assert final[0]["content"] == QUESTION
        answer = final[1]
        assert tokens and "".join(tokens) == answer["content"], "the tokens add up to the answer"
        # What the answer rests on travels with it.
        assert answer["response_metadata"]["history_turns"] == 0
        assert "4172" in answer["content"], answer["content"]
        assert any("guide.md" in c["label"] for c in answer["response_metadata"]["citations"])

        second = list(alice.runs.stream(tid, "chat", input=_ask(FOLLOW_UP), stream_mode="values"))
        messages = [p for p in second if p.event == "values"][-1].data["messages"]
        assert [m["type"] for m in messages] == ["human", "ai", "human", "ai"]
        assert messages[2]["content"] == FOLLOW_UP
        # The follow-up was given the first turn as its history.
        assert messages[3]["response_metadata"]["history_turns"] == 1
        assert messages[3]["content"]

        state = alice.threads.get_state(tid)
        history = alice.threads.get_history(tid)
        assert len(history) == 2, "one checkpoint per turn"
        assert history[0]["values"] == state["values"]
        assert [m["content"] for m in state["values"]["messages"]][::2] == [QUESTION, FOLLOW_UP]
        assert history[0]["parent_checkpoint"] == history[1]["checkpoint"]
        assert [t["thread_id"] for t in alice.threads.search()] == [tid]

        # A run waited for returns the thread's values, the new turn last.
        waited = alice.runs.wait(tid, "chat", input=_ask("When do the drip lines run?"))
        assert len(waited["messages"]) == 6 and waited["messages"][-1]["type"] == "ai"

        # The thread is one of alice's conversations on the page's API.
        mine = httpx.get(
            f"{base}/conversations", headers={"Authorization": f"Bearer {alice_token}"}
        )
        listed = mine.json()["conversations"]
        assert [(c["id"], c["title"], c["turns"]) for c in listed] == [(tid, QUESTION, 3)]

        # bob reads, runs on and deletes none of it: as if it did not exist.
        with pytest.raises(NotFoundError):
            bob.threads.get(tid)
        with pytest.raises(NotFoundError):
            bob.threads.get_state(tid)
        with pytest.raises(NotFoundError):
            bob.threads.get_history(tid)
        with pytest.raises(NotFoundError):
            list(bob.runs.stream(tid, "chat", input=_ask("What is the tool shed code?")))
        with pytest.raises(httpx.HTTPStatusError) as refused:
            bob.runs.wait(tid, "chat", input=_ask("mine now?"))
        assert refused.value.response.status_code == 404
        with pytest.raises(NotFoundError):
            bob.threads.delete(tid)
        assert bob.threads.search() == []
        assert len(alice.threads.get_history(tid)) == 3

        alice.threads.delete(tid)
        with pytest.raises(NotFoundError):
            alice.threads.get(tid)
        assert alice.threads.search() == []


def test_threads_refuse_what_they_cannot_run_with_the_reason(
    index: Path, provider: OidcProvider
) -> None:
    token = provider.token("carol", groups=["garden"])
    with _serve(index, provider) as base:
        client = _client(base, token)
        tid = client.threads.create()["thread_id"]
        again = client.threads.create(thread_id=tid, if_exists="do_nothing")
        assert again["thread_id"] == tid
        auth = {"Authorization": f"Bearer {token}"}
        cases = [
            ({"assistant_id": "agent", "input": _ask("hi")}, 404, "no assistant 'agent'"),
            (
                {
                    "assistant_id": "chat",
                    "input": {"messages": [{"role": "system", "content": "x"}]},
                },
                422,
                "no human",
            ),
            ({"assistant_id": "chat", "input": _ask("   ")}, 422, "empty"),
            (
                {"assistant_id": "chat", "input": _ask("hi"), "stream_mode": "debug"},
                422,
                "stream_mode",
            ),
            (
                {
                    "assistant_id": "chat",
                    "input": _ask("hi"),
                    "config": {"configurable": {"domain": "nope"}},
                },
                400,
                "nope",
            ),
        ]
        for body, status, reason in cases:
            reply = httpx.post(f"{base}/threads/{tid}/runs/stream", json=body, headers=auth)
            assert reply.status_code == status, (body, reply.text)
            assert reason in reply.text, reply.text
        taken = httpx.post(f"{base}/threads", json={"thread_id": tid}, headers=auth)
        assert taken.status_code == 409
        unknown = httpx.get(f"{base}/threads/not-a-thread", headers=auth)
        assert unknown.status_code == 404
        # Nothing was stored of the refused runs.
        assert client.threads.get_history(tid) == []


def test_the_readmes_threads_example_runs_as_shown(index: Path, tmp_path: Path) -> None:
    """The README's langgraph-sdk example, run as a user runs it (a script, a key in the
    environment) against `ragchains serve`: both answers printed, then the history."""
    keys = tmp_path / "keys.toml"
    key = add_key(keys, "dana", ["garden"])
    script = tmp_path / "threads_example.py"
    script.write_text(readme_block("threads-example"))
    with ragchains_serve("--index", str(index), RAGCHAINS_KEYS_FILE=str(keys)) as base:
        ran = subprocess.run(
            [sys.executable, str(script)],
            env=user_env(RAGCHAINS_URL=base, RAGCHAINS_KEY=key),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert ran.returncode == 0, ran.stderr
        left = httpx.get(f"{base}/conversations", headers={"X-API-Key": key}).json()
    lines = ran.stdout.splitlines()
    assert lines[0] == "> What is the tool shed code?" and "4172" in lines[1], ran.stdout
    assert lines[2] == "> And how must the tools be returned?" and lines[3].strip()
    history = lines[4:]
    assert len(history) == 2 and all("guide.md" in line or "[]" in line for line in history)
    assert left["conversations"] == [], "the example deletes its thread"


def test_a_failed_run_says_why_and_a_run_left_midway_is_kept_as_stopped(
    index: Path, upstream: FakeOpenAI, tmp_path: Path
) -> None:
    """With a chat model that fails, a streamed run ends with its error event (the reason,
    the status) and a waited one with the failure's status, each kept as a failed turn; with
    one that trickles, a client that leaves midway frees the thread at once and the turn so
    far is kept as stopped."""
    keys = tmp_path / "keys.toml"
    key = add_key(keys, "erin", ["garden"])
    with ragchains_serve(
        "--index",
        str(index),
        RAGCHAINS_KEYS_FILE=str(keys),
        RAGCHAINS_LLM_PROVIDER="openai",
        RAGCHAINS_OPENAI_BASE_URL=upstream.base_url,
        RAGCHAINS_OPENAI_API_KEY="upstream-key",
        RAGCHAINS_OPENAI_MODEL="broken",
        RAGCHAINS_LLM_MAX_RETRIES="0",
    ) as base:
        client = get_sync_client(url=base, api_key=key)
        tid = client.threads.create()["thread_id"]
        parts = list(client.runs.stream(tid, "chat", input=_ask(QUESTION)))
        assert parts[-1].event == "error", parts
        assert parts[-1].data["status_code"] == 502 and parts[-1].data["message"], parts[-1]
        with pytest.raises(httpx.HTTPStatusError) as failed:
            client.runs.wait(tid, "chat", input=_ask(QUESTION))
        assert failed.value.response.status_code == 502
        turns = httpx.get(f"{base}/conversations/{tid}", headers={"X-API-Key": key}).json()
        assert [t["status"] for t in turns["history"]] == ["error", "error"]
        assert all(t["error"] for t in turns["history"])

        upstream.behave_as = "trickle"
        try:
            with httpx.stream(
                "POST",
                f"{base}/threads/{tid}/runs/stream",
                json={
                    "assistant_id": "chat",
                    "input": _ask(QUESTION),
                    "stream_mode": "messages-tuple",
                },
                headers={"X-API-Key": key},
                timeout=60,
            ) as reply:
                tokens = 0
                for line in reply.iter_lines():
                    tokens += line.startswith("event: messages")
                    if tokens >= 3:
                        break  # the client leaves

            def stopped() -> list[dict[str, Any]] | None:
                got = httpx.get(f"{base}/conversations/{tid}", headers={"X-API-Key": key}).json()
                last = got["history"][-1] if len(got["history"]) == 3 else None
                return last if last is not None and last["status"] == "stopped" else None

            kept = wait_until(stopped, "the run left midway kept as stopped", timeout=30)
            assert kept["output"]["answer"], kept  # the tokens that came before the client left
            assert client.threads.get(tid)["status"] == "idle"
        finally:
            upstream.behave_as = None
