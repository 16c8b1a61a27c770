"""A reader who leaves frees the embedded model for everyone at once (issue 39), against
`ragchains serve` as a user starts it (a subprocess, the embedded SmolLM2).

For chat, ask and ``/v1/chat/completions``, all streamed, a client disconnects at points
spread over a turn (seeded, one in each equal part of the turn's own time: rewrite,
retrieval, the answer's prompt and its tokens; ten with ``make test-long``; the suite cuts
chat and /v1 once, halfway through the answer, and ask with ``make test-long``); after each,
``/readyz`` shows the queue idle within a second and a normal question answers in full, its
first token within three times its usual wait (measured just after). The
playground, whole chat and /v1 replies and MCP's ask are each cut once. In the chat page:
reader A presses Stop mid-answer, reader B in another browser context gets a cited answer,
then A asks again and gets one.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.browser import open_page
from tests.leaving import (
    GUARD,
    IDLE_WITHIN,
    NEXT,
    POINT_COUNTS,
    QUESTION,
    ROUTES,
    SEED,
    SUITE_ROUTES,
    Route,
    assert_freed,
    leave_at_every_point,
    queue_idle_after,
)
from tests.servers import ragchains_serve

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


@pytest.fixture(scope="module")
def embedded(sample_index: Path) -> Iterator[str]:
    with ragchains_serve("--index", str(sample_index)) as base:
        yield base


def _cuts() -> list[Any]:
    """Each route at each count of points; the long ones (see SUITE_ROUTES) for test-long."""
    return [
        pytest.param(
            route,
            points.values[0],
            id=f"{route.name}-{points.id}",
            marks=[
                *points.marks,
                *([] if route.name in SUITE_ROUTES else [pytest.mark.long]),
            ],
        )
        for points in POINT_COUNTS
        for route in ROUTES
    ]


@pytest.mark.parametrize(("route", "points"), _cuts())
def test_a_client_that_leaves_at_any_point_frees_the_embedded_model_at_once(
    embedded: str, route: Route, points: int
) -> None:
    rng = random.Random(f"{SEED}-{route.name}-{points}")
    assert_freed(leave_at_every_point(embedded, route, rng, points))


# ----------------------------------------------------------------------------- other ways in
async def _playground(client: httpx.AsyncClient) -> None:
    """The chat playground's run: stream_log, asked from the playground's page."""
    headers = {"Referer": str(client.base_url.join("/chat/playground/"))}
    body = {"input": {"question": QUESTION, "chat_history": []}}
    async with client.stream("POST", "/chat/stream_log", json=body, headers=headers) as reply:
        lines = [line async for line in reply.aiter_lines()]
    assert reply.status_code == 200 and "event: end" in lines, lines[-4:]


async def _chat_invoke(client: httpx.AsyncClient) -> None:
    body = {"input": {"question": QUESTION, "chat_history": []}}
    reply = await client.post("/chat/invoke", json=body)
    assert reply.status_code == 200 and reply.json()["output"]["answer"], reply.text


async def _v1_whole(client: httpx.AsyncClient) -> None:
    body = {"model": "default", "messages": [{"role": "user", "content": QUESTION}]}
    reply = await client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]


async def _mcp_ask(client: httpx.AsyncClient) -> None:
    """MCP's ask tool through the SDK's streamable HTTP client."""
    async with (
        streamable_http_client(str(client.base_url.join("/mcp")), http_client=client) as (
            read,
            write,
            _,
        ),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        result = await session.call_tool("ask", {"question": QUESTION})
    assert not result.isError and result.structuredContent, result


WAYS_IN = {
    "playground": _playground,
    "chat-invoke": _chat_invoke,
    "v1-whole": _v1_whole,
    "mcp-ask": _mcp_ask,
}


@pytest.mark.parametrize("way", list(WAYS_IN))
def test_every_other_way_in_frees_the_model_when_its_client_leaves(embedded: str, way: str) -> None:
    """The playground's stream_log, a whole (unstreamed) chat turn, a whole /v1 completion
    and MCP's ask: a client gone two thirds into its call (timed by a whole one first) leaves
    the queue idle within a second, whatever it was doing then."""
    call = WAYS_IN[way]

    async def run() -> float:
        async with httpx.AsyncClient(base_url=embedded, timeout=GUARD) as client:
            started = time.monotonic()
            await call(client)
            whole = time.monotonic() - started
        async with httpx.AsyncClient(base_url=embedded, timeout=GUARD) as client:
            try:
                async with asyncio.timeout(whole * 2 / 3):
                    await call(client)
            except TimeoutError:
                pass
            gone = time.monotonic()
        async with httpx.AsyncClient(base_url=embedded, timeout=GUARD) as client:
            return await queue_idle_after(client, gone)

    idle = asyncio.run(run())
    assert idle <= IDLE_WITHIN, f"{way}: the queue was busy {idle:.2f} s after the client left"


# ----------------------------------------------------------------------------- the page
PLACEHOLDER = "Ask a question about your documents"
MODEL_WAIT = 180_000  # ms: the embedded model on a busy machine


def ask(page: Any, question: str) -> Any:
    """Send ``question`` as a reader does; the answer it adds."""
    page.get_by_placeholder(PLACEHOLDER).fill(question)
    page.get_by_role("button", name="Send", exact=True).click()
    return page.locator(".turn").last.get_by_role("article", name="Answer")


def cited_answer(page: Any, answer: Any) -> str:
    """The answer once it is complete, which must cite a source."""
    page.get_by_role("button", name="Send", exact=True).wait_for(timeout=MODEL_WAIT)
    assert answer.get_attribute("aria-busy") is None
    answer.locator(".answer-text a.cite").first.wait_for()
    return str(answer.locator(".answer-text").inner_text())


def test_stop_in_the_chat_page_frees_the_model_for_the_next_reader(
    embedded: str, browser: Any
) -> None:
    """Reader A presses Stop while the answer is being written; reader B, in another
    browser context, asks and gets a cited answer; then A asks again and gets one."""
    contexts = [browser.new_context(), browser.new_context()]
    try:
        reader_a, reader_b = (open_page(context, embedded) for context in contexts)
        for reader in (reader_a, reader_b):
            reader.page.locator("#domain option[value='hr']").wait_for(state="attached")
        a, b = reader_a.page, reader_b.page
        answer = ask(a, QUESTION)
        writing = answer.locator(".answer-text")
        answer.and_(a.locator("article[aria-busy='true']")).wait_for(timeout=MODEL_WAIT)
        writing.filter(has_text=re.compile(r"\w")).wait_for(timeout=MODEL_WAIT)
        a.get_by_role("button", name="Stop").click()
        stopped = time.monotonic()
        answer.get_by_text("Stopped.").wait_for()
        with ThreadPoolExecutor(1) as thread:  # Playwright's sync API holds this thread's loop
            idle = thread.submit(asyncio.run, idle_after(embedded, stopped)).result()
        assert idle <= IDLE_WITHIN, f"the queue was busy {idle:.2f} s after Stop"
        assert cited_answer(b, ask(b, NEXT))
        assert cited_answer(a, ask(a, NEXT))
        reader_a.assert_clean()
        reader_b.assert_clean()
    finally:
        for context in contexts:
            context.close()


async def idle_after(base: str, since: float) -> float:
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        return await queue_idle_after(client, since)
