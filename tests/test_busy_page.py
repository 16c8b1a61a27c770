"""The chat page when the model is busy (issue 30, case 4): a turn refused with 503 and
Retry-After says "busy, retrying" (also to screen readers, until it is sent again), is sent
again after that long, and then answers. A real
browser (Debian's Chromium) against the real app; the model is the OpenAI-compatible
provider over a local upstream whose every call takes 1.5 s, one call at a time."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import httpx
import pytest

from tests.servers import wait_until
from tests.test_chat_page import ChatPage

pytestmark = [pytest.mark.slow, pytest.mark.browser]

QUESTION = "What does the standard health plan cost the employee per month?"
# What Chromium itself logs for any response with an error status (a 503 is the server's
# answer here, not a fault of the page): the one console error the test expects, once for
# each 503 the page got, and no other.
REFUSED_LOG = (
    "console: Failed to load resource: the server responded with a status of 503 "
    "(Service Unavailable)"
)


def test_the_page_says_busy_retrying_and_then_answers(
    serve_upstream: Callable[..., AbstractContextManager[str]], browser: Any
) -> None:
    changes = {
        "openai_model": "slow",
        "model_concurrency": 1,
        "model_queue_wait": 1.0,
        "requery": False,
    }
    with serve_upstream(**changes) as base:
        body = {"input": {"question": QUESTION}}
        # One turn first: the queue learns how long a turn holds the model (about 3 s).
        assert httpx.post(f"{base}/chat/invoke", json=body, timeout=120).status_code == 200
        chat = ChatPage.open(browser, base, (1024, 768))
        refused: list[int] = []
        chat.page.on(
            "response",
            lambda r: refused.append(r.status) if r.url.endswith("/stream") else None,
        )
        # Another turn holds the model: the page's turn would wait about 3 s, over the 1 s
        # the server lets it.
        holder = threading.Thread(
            target=httpx.post, args=(f"{base}/chat/invoke",), kwargs={"json": body, "timeout": 120}
        )
        holder.start()
        wait_until(
            lambda: httpx.get(f"{base}/readyz").json()["llm"]["queue"]["busy"] == 1,
            "the other turn holding the model",
            every=0.05,
        )
        turn = chat.ask(QUESTION)
        busy = turn.get_by_text("busy, retrying", exact=False)
        busy.wait_for(timeout=60_000)
        assert "The model is busy, retrying in" in busy.inner_text()
        status = chat.page.locator("#status")
        assert "busy, retrying" in status.inner_text()
        # The turn sent again is answering (a turn takes about 3 s): no longer "busy".
        chat.page.wait_for_event(
            "response",
            predicate=lambda r: r.url.endswith("/stream") and r.status == 200,
            timeout=90_000,
        )
        assert "busy" not in status.inner_text()
        answer = chat.wait_done(turn)
        holder.join(120)
        assert "answer from slow" in answer.inner_text()
        assert not turn.get_by_text("busy, retrying", exact=False).is_visible()
        assert refused[0] == 503 and refused[-1] == 200, refused
        assert chat.watched.errors == [REFUSED_LOG] * refused.count(503), chat.watched.errors
        chat.page.close()
