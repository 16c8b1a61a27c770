"""POST /feedback over real sockets: stored durably, validated, behind the API key; and the
chat page's files, which are open without a key."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from ragchains.feedback import FeedbackStore

pytestmark = pytest.mark.slow

KEY = "feedback-key"


def vote(**changes: Any) -> dict[str, Any]:
    body = {
        "run_id": str(uuid.uuid4()),
        "score": 0,
        "comment": "the answer cites the wrong section",
        "mode": "chat",
        "domain": "hr",
        "prompts": {"rewrite": "hr/rewrite@v2", "answer": "hr/answer@v2"},
        "question": "What does the standard plan cost?",
        "answer": "It costs $45.00 [perks-policy.md#learning-budget].",
        "cited_ids": ["4f17ddf701e7762d46ae7258"],
    }
    body.update(changes)
    return body


@pytest.fixture
def server(
    serve_samples: Callable[..., AbstractContextManager[str]],
) -> Callable[..., AbstractContextManager[str]]:
    """Starts a server over the sample index with the given settings changed."""
    return serve_samples


@pytest.fixture
def store_path(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "votes" / "feedback.sqlite"


@pytest.fixture(scope="module")
def validating(
    serve_samples: Callable[..., AbstractContextManager[str]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, Path]]:
    """One server for the validation cases, and its store."""
    path = tmp_path_factory.mktemp("validating") / "feedback.sqlite"
    with serve_samples(feedback_db=path) as url:
        yield url, path


def test_feedback_is_stored_and_survives_a_restart(
    server: Callable[..., AbstractContextManager[str]], store_path: Path
) -> None:
    first, second = vote(), vote(score=1, comment="", mode="ask", domain="default")
    with server(feedback_db=store_path) as url:
        reply = httpx.post(f"{url}/feedback", json=first)
        assert reply.status_code == 201, reply.text
        assert set(reply.json()) == {"id", "created_at"}
    with server(feedback_db=store_path) as url:  # a restart: a new process would do the same
        assert httpx.post(f"{url}/feedback", json=second).status_code == 201
    records = FeedbackStore(store_path).records()
    assert [r["run_id"] for r in records] == [first["run_id"], second["run_id"]]
    assert records[0]["prompts"] == first["prompts"]
    assert records[0]["cited_ids"] == first["cited_ids"]
    assert records[0]["comment"] == first["comment"] and records[0]["score"] == 0
    assert records[1]["score"] == 1 and records[1]["mode"] == "ask"


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (vote(score=2), "score"),
        (vote(score=True), "score"),
        (vote(score="1"), "score"),
        (vote(run_id="not-a-uuid"), "run_id"),
        (vote(question=""), "question"),
        (vote(question="   "), "question"),
        (vote(comment="x" * 2001), "comment"),
        (vote(mode="stream"), "mode"),
        (vote(cited_ids=["x"] * 101), "cited_ids"),
        (vote(extra="field"), "extra"),
        ({k: v for k, v in vote().items() if k != "run_id"}, "run_id"),
        ([vote()], "body"),
    ],
    ids=[
        "score-2",
        "score-true",
        "score-string",
        "run-id",
        "empty-question",
        "blank-question",
        "long-comment",
        "mode",
        "many-cited-ids",
        "unknown-key",
        "missing-run-id",
        "not-an-object",
    ],
)
def test_bad_feedback_is_422_with_the_reason_and_stores_nothing(
    validating: tuple[str, Path], body: Any, where: str
) -> None:
    url, store_path = validating
    reply = httpx.post(f"{url}/feedback", json=body)
    malformed = httpx.post(
        f"{url}/feedback", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert reply.status_code == 422, reply.text
    problems = reply.json()["detail"]
    assert any(where in [str(part) for part in p["loc"]] for p in problems), problems
    assert all(p["msg"] for p in problems)
    assert malformed.status_code == 422
    assert not store_path.exists() or FeedbackStore(store_path).records() == []


def test_feedback_needs_the_api_key_but_the_page_does_not(
    server: Callable[..., AbstractContextManager[str]], store_path: Path
) -> None:
    with server(feedback_db=store_path, api_key=SecretStr(KEY)) as url:
        refused = httpx.post(f"{url}/feedback", json=vote())
        by_header = httpx.post(f"{url}/feedback", json=vote(), headers={"X-API-Key": KEY})
        bearer = {"Authorization": f"Bearer {KEY}"}
        by_bearer = httpx.post(f"{url}/feedback", json=vote(), headers=bearer)
        page = httpx.get(f"{url}/", headers={"Accept": "text/html"})
        script = httpx.get(f"{url}/ui/app.js")
        ready = httpx.get(f"{url}/readyz").json()
    assert refused.status_code == 401 and "API key" in refused.json()["detail"]
    assert by_header.status_code == 201 and by_bearer.status_code == 201
    assert len(FeedbackStore(store_path).records()) == 2
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<title>ragchains</title>" in page.text
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert ready["api_key_required"] is True


def test_root_is_the_page_for_browsers_and_an_index_for_other_clients(
    server: Callable[..., AbstractContextManager[str]], store_path: Path
) -> None:
    with server(feedback_db=store_path) as url:
        browser = httpx.get(f"{url}/", headers={"Accept": "text/html,application/xhtml+xml"})
        client = httpx.get(f"{url}/")
        missing = httpx.get(f"{url}/ui/nothing.js")
        ready = httpx.get(f"{url}/readyz").json()
    assert 'placeholder="Ask a question about your documents"' in browser.text
    assert client.json()["playground"] == "/chat/playground/"
    assert missing.status_code == 404
    assert ready["api_key_required"] is False


def test_an_unusable_store_is_503_with_the_reason(
    server: Callable[..., AbstractContextManager[str]], tmp_path: Path
) -> None:
    folder = tmp_path / "a-folder"
    folder.mkdir()
    with server(feedback_db=folder) as url:
        reply = httpx.post(f"{url}/feedback", json=vote())
        healthy = httpx.get(f"{url}/healthz")
    assert reply.status_code == 503
    assert "feedback cannot be stored now" in reply.json()["detail"]
    assert healthy.status_code == 200
