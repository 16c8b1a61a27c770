"""Admission to the chat model's queue (``ragchains.models.queue``), for the HTTP routes.

Each request to a route that calls the model gets a ticket once its body has arrived and
passed the route's checks (``model_ticket``, a FastAPI dependency after those checks): its
arrival orders its model calls, and ``model_queue_wait`` bounds how long they may wait in
all. A route that calls the model checks its request in before any work (``admit``), so a
request that would wait too long is answered 503 with Retry-After while it still can be:
LangServe's stream endpoints send their 200 before the chain's first output. One that is
admitted and outwaits its bound all the same fails with ``ModelBusy``, which
``serving.errors`` answers with 503 too (in a stream already started: its error event).

Model-calling routes: /chat, /ask and /rewrite (each of their POST endpoints), /v1/chat/
completions and MCP's ``ask`` tool (which takes a ticket per tool call). /retrieve calls no
model.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import HTTPException, Request
from pydantic import ValidationError

from ragchains.chains.llm import LLM
from ragchains.models.queue import ModelBusy, Ticket, first_queue, held_ticket
from ragchains.serving.requests import BODY_KEYS, Route

# Where a request's ticket waits in its state, for work the request hands to tasks that do
# not inherit its context (MCP's tool calls run in the session manager's task group).
TICKET = "ragchains_model_ticket"
# The LangServe routes whose runs call the model.
MODEL_ROUTES = frozenset({"chat", "ask", "rewrite"})


def model_ticket(max_wait: float) -> Callable[[Request], AsyncIterator[Ticket]]:
    """A dependency of each route that calls the model, after the body's checks: the
    request's ticket for the model's queues, from then to its response's last byte (FastAPI
    leaves a dependency's ``yield`` once the response is sent, a stream's end included). In
    the request's state too, where ``end_model_work`` finds it when the client goes."""

    async def ticket(request: Request) -> AsyncIterator[Ticket]:
        with held_ticket(max_wait) as own:
            setattr(request.state, TICKET, own)
            yield own

    return ticket


class Ticketed:
    """An ASGI app whose requests each hold a ticket, in their state, from when they reach
    it to their last byte: for one FastAPI's dependencies do not reach (MCP's transport,
    mounted as a plain route; its tool calls take the ticket from there)."""

    def __init__(self, app: Any, max_wait: float) -> None:
        self.app = app
        self.max_wait = max_wait

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with held_ticket(self.max_wait) as ticket:
            scope.setdefault("state", {})[TICKET] = ticket
            await self.app(scope, receive, send)


def end_model_work(scope: dict[str, Any]) -> None:
    """The request's client has gone: its ticket ends now, and with it the model work still
    running or waiting for the request, wherever it runs (``Ticket.close``)."""
    ticket = scope.get("state", {}).get(TICKET)
    if isinstance(ticket, Ticket):
        ticket.close()


def check_in(ticket: Ticket | None, llm: LLM) -> None:
    """Count ``ticket``'s request in to ``llm``'s queue; ``ModelBusy`` when its estimated
    wait is over its bound."""
    queue = first_queue(llm.model)
    if ticket is not None and queue is not None:
        queue.admit(ticket)


def admit(ticket: Ticket | None, llm: LLM) -> None:
    """``check_in``, refused as an HTTP reply: 503 with Retry-After."""
    try:
        check_in(ticket, llm)
    except ModelBusy as exc:
        raise busy_reply(exc) from exc


def busy_reply(exc: ModelBusy) -> HTTPException:
    return HTTPException(503, str(exc), headers={"Retry-After": str(exc.retry_after)})


def request_ticket_of(request: Request) -> Ticket | None:
    """The ticket ``model_ticket`` or ``Ticketed`` gave the request, if any."""
    ticket = request.scope.get("state", {}).get(TICKET)
    return ticket if isinstance(ticket, Ticket) else None


def langserve_admission(route: Route, llm: LLM) -> Any:
    """A dependency of a model-calling LangServe route: its POST endpoints check the request
    in. Input that is bad is told as such (LangServe's 422 after this), not as busy."""

    async def check(request: Request) -> None:
        endpoint = request.url.path.rsplit("/", 1)[-1]
        if request.method != "POST" or endpoint not in BODY_KEYS:
            return
        ticket = request_ticket_of(request)
        if endpoint == "batch" and ticket is not None:
            ticket.inputs = await _batch_size(request)
        try:
            admit(ticket, llm)
        except HTTPException:
            if endpoint != "batch" and not await _valid_input(request, route):
                return
            raise

    return check


async def _batch_size(request: Request) -> int:
    """How many inputs a batch runs (its body was checked before: ``requests.check_body``);
    each is a request's work for the model."""
    try:
        body = await request.json()  # parsed once already, by json_body
    except ValueError:
        return 1
    inputs = body.get("inputs") if isinstance(body, dict) else None
    return max(1, len(inputs)) if isinstance(inputs, list) else 1


async def _valid_input(request: Request, route: Route) -> bool:
    """Whether a single-input body's input passes the route's checks (batches were checked
    in full before: ``requests.check_body``)."""
    try:
        body = await request.json()  # parsed once already, by json_body
        route.request_model.model_validate(body.get("input") if isinstance(body, dict) else None)
    except (ValueError, ValidationError):
        return False
    return True


@contextmanager
def tool_ticket(request: Request | None, max_wait: float) -> Iterator[Ticket]:
    """The ticket of a tool call (its run carries it in its config): the HTTP request's that
    carried it, or (stdio) one of its own, for the call."""
    ticket = request_ticket_of(request) if request is not None else None
    if ticket is not None:
        yield ticket
        return
    with held_ticket(max_wait) as own:
        yield own


def queue_status(llm: LLM, max_wait: float) -> dict[str, Any] | None:
    """The model queue's state for /readyz: slots, calls in service and waiting, requests
    in progress, the wait a request arriving now is expected to have, recent waits."""
    queue = first_queue(llm.model)
    if queue is None:
        return None
    return {**queue.status(), "max_wait_s": max_wait}
