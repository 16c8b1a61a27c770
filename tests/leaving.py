"""Clients that leave mid-turn, for the tests of issue 39 (``test_leaving*.py``): a turn on a
streamed route cut at points spread over it, and what a server must show after each cut: the
model's queue idle within a second (``/readyz``), and a normal question answered in full, its
first token within three times its usual time (measured just after it, on a machine as busy
as then: the first token, not the whole answer, whose length varies with sampling).

Deadlines, not timed assertions: a second for the queue, three times the usual wait.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

QUESTION = "How many vacation days do employees get?"  # the turn that is cut
NEXT = "What does the standard health plan cost the employee per month?"  # asked after
ANOTHER_CALL = {  # a model call of another prompt
    "input": {
        "question": "and the premium?",
        "chat_history": [{"type": "human", "content": QUESTION}, {"type": "ai", "content": "20."}],
    }
}
POINTS = 10
# The suite cuts each route once, as its answer streams (where the freeze of issue 39 came
# from); the 10 points over the whole turn run with ``make test-long``.
POINT_COUNTS = [
    pytest.param(1, id="mid-answer"),
    pytest.param(POINTS, id=f"{POINTS}-points", marks=pytest.mark.long),
]
# The routes the suite cuts mid-answer: LangServe's stream (chat) and /v1's; ask streams
# through the same LangServe handler as chat, and is cut with ``make test-long``.
SUITE_ROUTES = ("chat", "v1")
SEED = 39
IDLE_WITHIN = 1.0  # seconds from the disconnect to an idle queue
ALLOWANCE = 3.0  # the question after a cut, against its usual wait for a first token
GUARD = 300.0  # seconds: only a hang comes near it


@dataclass(frozen=True)
class Route:
    """A streamed route as a client calls it, and how its stream says it ended well."""

    name: str
    path: str
    body: Callable[[str], dict[str, Any]]
    ended: Callable[[list[str]], bool]


def _langserve_ended(lines: list[str]) -> bool:
    events = [line.split(":", 1)[1].strip() for line in lines if line.startswith("event:")]
    answered = any(line.startswith("data:") and '"answer"' in line for line in lines)
    return events[-1:] == ["end"] and "error" not in events and answered


def _openai_ended(lines: list[str]) -> bool:
    data = [line[5:].strip() for line in lines if line.startswith("data:")]
    if data[-1:] != ["[DONE]"]:
        return False
    frames = [json.loads(d) for d in data[:-1]]
    text = "".join(f["choices"][0]["delta"].get("content") or "" for f in frames if "choices" in f)
    return bool(text.strip()) and all("error" not in f for f in frames)


ROUTES = [
    Route(
        "chat",
        "/chat/stream",
        lambda q: {"input": {"question": q, "chat_history": []}},
        _langserve_ended,
    ),
    Route("ask", "/ask/stream", lambda q: {"input": {"question": q}}, _langserve_ended),
    Route(
        "v1",
        "/v1/chat/completions",
        lambda q: {
            "model": "default",
            "messages": [{"role": "user", "content": q}],
            "stream": True,
        },
        _openai_ended,
    ),
]


@dataclass(frozen=True)
class Turn:
    seconds: float
    first_token: float  # seconds to the answer's first token


async def full_turn(client: httpx.AsyncClient, route: Route, question: str) -> Turn:
    """One complete turn, timed. Fails unless it answered in full."""
    started = time.monotonic()
    first_token = None
    lines = []
    async with client.stream("POST", route.path, json=route.body(question)) as response:
        async for line in response.aiter_lines():
            lines.append(line)
            if first_token is None and _has_answer_text(line):
                first_token = time.monotonic() - started
    assert response.status_code == 200 and route.ended(lines), (route.name, lines[-6:])
    assert first_token is not None
    return Turn(time.monotonic() - started, first_token)


def _has_answer_text(line: str) -> bool:
    """Whether an event's data carries answer text (LangServe's chunk or OpenAI's delta)."""
    if not line.startswith("data:") or line.strip() == "data: [DONE]":
        return False
    data = json.loads(line[5:])
    if "choices" in data:
        return bool(data["choices"][0].get("delta", {}).get("content"))
    return isinstance(data, dict) and bool(data.get("answer"))


@dataclass(frozen=True)
class Departure:
    after: float  # seconds into the turn
    when: float  # monotonic time of the disconnect
    answering: bool  # whether answer text had come by then


async def cut_turn(client: httpx.AsyncClient, route: Route, after: float) -> Departure:
    """A turn whose client disconnects ``after`` seconds in (its connection closed, as a
    closed tab or Stop does)."""
    answering = False
    try:
        async with asyncio.timeout(after):
            async with client.stream("POST", route.path, json=route.body(QUESTION)) as response:
                async for line in response.aiter_lines():
                    answering = answering or _has_answer_text(line)
    except TimeoutError:
        pass
    return Departure(after, time.monotonic(), answering)


async def queue_idle_after(client: httpx.AsyncClient, since: float) -> float:
    """Seconds from ``since`` until /readyz shows the model's queue idle (nothing held,
    waiting or in progress), and still idle a moment later (no late arrival)."""
    while True:
        queue = (await client.get("/readyz")).json()["llm"]["queue"]
        if queue["busy"] == queue["waiting"] == queue["requests"] == 0:
            seen = time.monotonic() - since
            await asyncio.sleep(0.3)
            queue = (await client.get("/readyz")).json()["llm"]["queue"]
            if queue["busy"] == queue["waiting"] == queue["requests"] == 0:
                return seen
        assert time.monotonic() - since < GUARD, f"the queue stayed busy: {queue}"
        await asyncio.sleep(0.025)


def cut_points(turn: Turn, points: int, rng: random.Random) -> list[float]:
    """``points`` moments over ``turn``: one at random in each equal part; a single one is
    halfway through its answer."""
    if points == 1:
        return [(turn.first_token + turn.seconds) / 2]
    return [turn.seconds * (n + rng.random()) / points for n in range(points)]


@dataclass
class Cut:
    route: str
    after: float
    idle: float  # seconds from the disconnect to an idle queue
    next_first_token: float  # seconds to the first token of the normal question after it
    usual: float  # the same question's, just after


def leave_at_every_point(
    base: str,
    route: Route,
    rng: random.Random,
    points: int,
    after_cut: Callable[[Turn, Departure], None] | None = None,
) -> list[Cut]:
    """The route's turn cut at ``points`` points; after each, the queue's idle time, then
    ``after_cut(turn, departure)`` (more checks: an upstream's state), then a normal
    question (``/ask``: the model is free for every reader, whatever route was cut); at the
    end a whole turn on the route itself. The question's usual wait is measured after each
    cut's question (a machine shared with other work is not as fast all along), after
    another reader's call of another prompt (a rewrite): the model never reads the
    question's prompt from the start of it that it kept from an /ask just before (about
    half of the wait, with the embedded model). The question is asked once before the
    first cut: the embedded model's prompt cache then holds its state for the turn after
    each cut and for the usual wait alike, as it would for any reader asking it again."""
    follow_up = ROUTES[1]

    async def run() -> list[Cut]:
        async with httpx.AsyncClient(base_url=base, timeout=GUARD) as client:

            async def usual_wait() -> float:
                rewrite = await client.post("/rewrite/invoke", json=ANOTHER_CALL)
                assert rewrite.status_code == 200, rewrite.text
                return (await full_turn(client, follow_up, NEXT)).first_token

            turn = await full_turn(client, route, QUESTION)
            await full_turn(client, follow_up, NEXT)  # in the prompt cache, as said above
            cuts = []
            for after in cut_points(turn, points, rng):
                departure = await cut_turn(client, route, after)
                idle = await queue_idle_after(client, departure.when)
                if after_cut is not None:
                    await asyncio.to_thread(after_cut, turn, departure)
                next_turn = await full_turn(client, follow_up, NEXT)
                usual = await usual_wait()
                cuts.append(Cut(route.name, round(after, 2), idle, next_turn.first_token, usual))
            await full_turn(client, route, QUESTION)
            return cuts

    return asyncio.run(run())


def assert_freed(cuts: list[Cut]) -> None:
    late = [c for c in cuts if c.idle > IDLE_WITHIN or c.next_first_token > ALLOWANCE * c.usual]
    assert not late, "\n".join(map(str, late))
