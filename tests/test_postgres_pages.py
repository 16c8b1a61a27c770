"""The chat page and the playgrounds served from the PostgreSQL store, in Chromium (any
console error or uncaught page error fails a test)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import httpx
import pytest

from tests.test_chat_page import ChatPage, fact
from tests.test_playground import retrieve_in_playground

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def store_server(
    sample_store: str,
    serve_samples: Callable[..., AbstractContextManager[str]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    """The real app over the samples in PostgreSQL, with the embedded SmolLM2."""
    feedback = tmp_path_factory.mktemp("pg-page") / "feedback.sqlite"
    with serve_samples(store=sample_store, feedback_db=feedback) as base:
        yield base


def test_the_chat_page_answers_from_the_store(store_server: str, browser: Any) -> None:
    chat = ChatPage.open(browser, store_server, (1280, 900))
    try:
        ready = httpx.get(f"{store_server}/readyz", timeout=30).json()["index"]
        assert ready["kind"] == "postgresql"
        chat.settings()
        assert fact(chat.page.locator("#server"), "Chunks") == str(ready["chunks"]) == "81"
        chat.close_settings()
        turn = chat.ask("What does the standard health plan cost?")
        answer = chat.wait_done(turn)
        cited = turn.locator(".answer-text a.cite").all_inner_texts()
        assert any(label.startswith("employee-handbook.md#") for label in cited), cited
        sources = answer.get_by_role("region", name="Sources")
        assert "employee-handbook.md" in sources.inner_text()
        assert "answer: default/quote@v1" in fact(chat.thoughts(turn), "Prompts")
        chat.watched.assert_clean()
    finally:
        chat.page.close()


def test_the_retrieve_playground_searches_the_store(store_server: str, browser: Any) -> None:
    query = "what does the standard health plan cost"
    watched, text = retrieve_in_playground(browser, store_server, query)
    assert "employee-handbook.md" in text and '"convex_score"' in text
    watched.assert_clean()
