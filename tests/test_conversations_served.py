"""People's conversations under `ragchains serve`, for an index folder and a PostgreSQL
store: each key owner's own, listed, renamed, exported and kept across a restart; another
person's answers 404; a deleted one is gone from the database, read directly; an admin may
delete anyone's. Bad input is refused with its reason and stores nothing."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from ragchains.retrievers.pgstore import split_schema
from ragchains.serving.keys import add_key
from tests.conftest import FIXTURES
from tests.servers import ragchains_serve
from tests.test_cli import run

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SECRET = "Please note my doctor's appointment on 3 March (private-4c1e)"


def _turn(question: str, answer: str, **extra: Any) -> dict[str, Any]:
    return {
        "question": question,
        "mode": "chat",
        "domain": "default",
        "status": "answered",
        "output": {
            "answer": answer,
            "citations": [{"label": "guide.md#tools", "id": "c1"}],
            "prompts": {"answer": "default/answer@v1", "rewrite": "default/rewrite@v1"},
            "search_query": question,
        },
        **extra,
    }


def _rows(target: list[str], tmp_path: Path) -> tuple[list[tuple[str, str]], str]:
    """Every conversation row and all turn text, read straight from the database."""
    if target[0] == "--index":
        with sqlite3.connect(Path(target[1]) / "conversations.sqlite") as db:
            rows = db.execute("SELECT id, owner FROM conversations ORDER BY id").fetchall()
            turns = db.execute("SELECT record FROM conversation_turns").fetchall()
        return rows, " ".join(str(t[0]) for t in turns)
    conninfo, schema = split_schema(target[1])
    with psycopg.connect(conninfo) as db:
        rows = db.execute(f'SELECT id, owner FROM "{schema}".conversations ORDER BY id').fetchall()
        turns = db.execute(f'SELECT record::text FROM "{schema}".conversation_turns').fetchall()
    return [(r[0], r[1]) for r in rows], " ".join(str(t[0]) for t in turns)


def test_conversations_are_each_persons_own_and_outlive_a_restart(
    target: list[str], tmp_path: Path
) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(FIXTURES / "docs", docs)
    assert run("ingest", docs, *target).returncode == 0
    keys = tmp_path / "keys.toml"
    alice = {"X-API-Key": add_key(keys, "alice", ["garden"])}
    bob = {"X-API-Key": add_key(keys, "bob", ["garden"])}
    admin = {"X-API-Key": add_key(keys, "root", ["it"], "admin")}
    env = {"RAGCHAINS_KEYS_FILE": str(keys)}

    with ragchains_serve(*target, **env) as base:
        kept = httpx.post(f"{base}/conversations", json={}, headers=alice).json()
        url = f"{base}/conversations/{kept['id']}"
        first = httpx.put(
            f"{url}/turns/t1",
            json=_turn("What is the tool shed code?", "4172 [guide.md#tools]"),
            headers=alice,
        )
        assert first.status_code == 201, first.text
        voted = _turn(
            "What is the tool shed code?",
            "4172 [guide.md#tools]",
            feedback={"score": 1, "comment": "right"},
        )
        assert httpx.put(f"{url}/turns/t1", json=voted, headers=alice).status_code == 200
        assert httpx.patch(url, json={"title": "Shed"}, headers=alice).status_code == 200
        gone = httpx.post(f"{base}/conversations", json={}, headers=alice).json()
        secret_turn = _turn(SECRET, f"Noted: {SECRET}")
        assert (
            httpx.put(
                f"{base}/conversations/{gone['id']}/turns/t1", json=secret_turn, headers=alice
            ).status_code
            == 201
        )
        theirs = httpx.post(f"{base}/conversations", json={"title": "bob's"}, headers=bob).json()

        # Bad input: refused with the reason, nothing stored.
        for body, status in [
            ({**_turn("q", "a"), "question": ""}, 422),
            ({**_turn("q", "a"), "status": "thinking"}, 422),
            ({**_turn("q", "a"), "output": {"answer": "half \ud800 a pair"}}, 422),
            ({**_turn("q", "a"), "surprise": 1}, 422),
        ]:
            sent = json.dumps(body)  # ASCII: a lone surrogate travels as its escape
            typed = {**alice, "Content-Type": "application/json"}
            refused = httpx.put(f"{url}/turns/bad", content=sent, headers=typed)
            assert refused.status_code == status, refused.text
            assert "Traceback" not in refused.text
        assert httpx.put(f"{url}/turns/a%2Fb", json=_turn("q", "a"), headers=alice).status_code in (
            404,
            422,
        )
        assert httpx.patch(url, json={"title": ""}, headers=alice).status_code == 422

    with ragchains_serve(*target, **env) as base:  # restarted
        url = f"{base}/conversations/{kept['id']}"
        listed = httpx.get(f"{base}/conversations", headers=alice).json()["conversations"]
        assert [c["id"] for c in listed] == [gone["id"], kept["id"]], "the most recent first"
        opened = httpx.get(url, headers=alice).json()
        assert opened["title"] == "Shed"
        [turn] = opened["history"]
        assert turn["output"]["answer"] == "4172 [guide.md#tools]"
        assert turn["output"]["prompts"]["answer"] == "default/answer@v1"
        assert turn["feedback"] == {"score": 1, "comment": "right"}
        assert turn["output"]["citations"][0]["label"] == "guide.md#tools"

        # Another person's: 404 on every route, as if it did not exist.
        assert httpx.get(url, headers=bob).status_code == 404
        assert httpx.patch(url, json={"title": "x"}, headers=bob).status_code == 404
        assert httpx.put(f"{url}/turns/t9", json=_turn("q", "a"), headers=bob).status_code == 404
        assert httpx.get(f"{url}/export", headers=bob).status_code == 404
        assert httpx.delete(url, headers=bob).status_code == 404
        assert [
            c["id"] for c in httpx.get(f"{base}/conversations", headers=bob).json()["conversations"]
        ] == [theirs["id"]]

        markdown = httpx.get(f"{url}/export", headers=alice)
        assert markdown.status_code == 200
        assert 'filename="Shed.md"' in markdown.headers["content-disposition"]
        assert "## What is the tool shed code?" in markdown.text and "4172" in markdown.text
        assert "Sources: guide.md#tools" in markdown.text and "rated helpful" in markdown.text
        exported = json.loads(httpx.get(f"{url}/export?format=json", headers=alice).text)
        assert exported["history"][0]["question"] == "What is the tool shed code?"

        # Deleted: gone from the database, read directly.
        assert SECRET in _rows(target, tmp_path)[1]
        assert httpx.delete(f"{base}/conversations/{gone['id']}", headers=alice).status_code == 204
        assert httpx.get(f"{base}/conversations/{gone['id']}", headers=alice).status_code == 404
        rows, text = _rows(target, tmp_path)
        assert gone["id"] not in [r[0] for r in rows] and SECRET not in text
        # An admin deletes anyone's.
        assert (
            httpx.delete(f"{base}/conversations/{theirs['id']}", headers=admin).status_code == 204
        )
        assert [r[0] for r in _rows(target, tmp_path)[0]] == [kept["id"]]

    if target[0] == "--index":
        # Nor is it anywhere in the file's bytes (secure_delete, the log checkpointed).
        for path in Path(target[1]).glob("conversations.sqlite*"):
            assert SECRET.encode() not in path.read_bytes(), path.name
