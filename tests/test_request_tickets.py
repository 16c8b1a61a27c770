"""A request's ticket for the model's queue (issue 41): a FastAPI dependency gives it once the
body has arrived and passed its checks, and the run carries it in its ``RunnableConfig``
down to the model's calls, with no context variable set for the request. On the real app
under uvicorn, with the embedded SmolLM2: each way in that calls the model (LangServe's
routes, /v1, MCP's ask) and a body that arrives slowly."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from ragchains.models.queue import ModelQueue, Ticket

pytestmark = pytest.mark.slow

QUESTION = "How many vacation days do employees get?"


@dataclass
class Arrival:
    ticket: Ticket | None
    at: float


@pytest.fixture
def arrivals(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Arrival]]:
    """Every model call's arrival at the queue while the test runs, with its ticket."""
    seen: list[Arrival] = []
    real = ModelQueue._arrive

    def watched(self: ModelQueue, ticket: Ticket | None, *args: Any, **kwargs: Any) -> Any:
        seen.append(Arrival(ticket, time.monotonic()))
        return real(self, ticket, *args, **kwargs)

    monkeypatch.setattr(ModelQueue, "_arrive", watched)
    yield seen


def assert_one_request(arrivals: list[Arrival]) -> Ticket:
    """The calls came with one ticket, from the run's config."""
    assert arrivals, "no model call"
    tickets = {id(a.ticket) for a in arrivals}
    assert None not in [a.ticket for a in arrivals] and len(tickets) == 1, arrivals
    ticket = arrivals[0].ticket
    assert ticket is not None
    return ticket


def assert_closed(ticket: Ticket) -> None:
    """The request's ticket ends with its response (just after its last byte is sent)."""
    deadline = time.monotonic() + 5
    while not ticket.closed and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ticket.closed


HTTP_RUNS = {  # path -> body: LangServe's whole and streamed runs, /v1's completion
    "/ask/invoke": {"input": {"question": QUESTION}},
    "/ask/stream": {"input": {"question": QUESTION}},
    "/v1/chat/completions": {"model": "hr", "messages": [{"role": "user", "content": QUESTION}]},
}


@pytest.mark.parametrize("path", list(HTTP_RUNS))
def test_an_http_run_carries_its_requests_ticket(
    sample_server: str, arrivals: list[Arrival], path: str
) -> None:
    reply = httpx.post(f"{sample_server}{path}", json=HTTP_RUNS[path], timeout=120)
    assert reply.status_code == 200, reply.text[:300]
    assert_closed(assert_one_request(arrivals))


def test_an_mcp_ask_carries_its_requests_ticket(
    sample_server: str, arrivals: list[Arrival]
) -> None:
    async def ask() -> None:
        async with (
            httpx.AsyncClient(timeout=120) as client,
            streamable_http_client(f"{sample_server}/mcp", http_client=client) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            result = await session.call_tool("ask", {"question": QUESTION})
            assert not result.isError, result

    asyncio.run(ask())
    assert_one_request(arrivals)


def test_the_ticket_starts_once_the_body_has_arrived(
    sample_server: str, arrivals: list[Arrival]
) -> None:
    """A client that sends its body slowly is queued from its last byte, not its headers:
    a slow sender does not take the place of those who asked while it was still sending."""
    sent_last: list[float] = []

    async def slowly() -> AsyncIterator[bytes]:
        yield b'{"input": {"question": '
        await asyncio.sleep(1.0)
        sent_last.append(time.monotonic())
        yield b'"' + QUESTION.encode() + b'"}}'

    async def post() -> httpx.Response:
        async with httpx.AsyncClient(timeout=120) as client:
            return await client.post(
                f"{sample_server}/ask/invoke",
                content=slowly(),
                headers={"Content-Type": "application/json"},
            )

    reply = asyncio.run(post())
    assert reply.status_code == 200, reply.text[:300]
    ticket = assert_one_request(arrivals)
    assert ticket.arrived >= sent_last[0], (ticket.arrived, sent_last)
