"""Turning failures into replies: a status and a one-line reason, never a stack trace.

Bad input is answered before any work (400/413/422, raised as HTTPException). What fails
during a run is either the chat model (504 when it timed out, 503 with Retry-After when
it was too busy to take the request in time, 502 otherwise), the document
store (503: a database that cannot be reached, or an index file found damaged), or a bug
(500, logged with its traceback here and nowhere else).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ragchains.chains.options import error_message
from ragchains.models.providers import LLMFailure, explain_failure
from ragchains.models.queue import model_busy
from ragchains.prompts.registry import PromptRegistry
from ragchains.retrievers.indexformat import IndexLoadError
from ragchains.retrievers.pgerrors import StoreError
from ragchains.serving.requests import configurable_problem

log = logging.getLogger("ragchains.server")

Scope = dict[str, Any]
Message = dict[str, Any]

OPENAI_PREFIX = "/v1/"
STORE_UNREACHABLE = "the document store cannot be reached; the server log has the details"
INDEX_UNREADABLE = "the index cannot be read; the server log has the details"


class Failed(NamedTuple):
    """The reply to a failed run: its status and one-line reason, the chat model's failure
    when that is what failed, and when to try again when the model was too busy (seconds,
    for Retry-After)."""

    status: int
    reason: str
    failure: LLMFailure | None = None
    retry_after: int | None = None


def failed(exc: BaseException) -> Failed:
    busy = model_busy(exc)
    if busy is not None:  # waited for the model as long as the request may: try later
        return Failed(503, str(busy), retry_after=busy.retry_after)
    if isinstance(exc, StoreError):  # the database is down or unreachable: not the caller's
        return Failed(503, STORE_UNREACHABLE)
    if isinstance(exc, IndexLoadError):  # damage found by a query (the log names the file)
        return Failed(503, INDEX_UNREADABLE)
    failure = explain_failure(exc)
    if failure is None:
        return Failed(500, "internal error; the server log has the details")
    return Failed(504 if failure.timed_out else 502, failure.message, failure)


def error_body(path: str, status: int, message: str) -> dict[str, Any]:
    """FastAPI's ``{"detail": ...}``, or OpenAI's error object under /v1/ so SDKs read it."""
    if path.startswith(OPENAI_PREFIX):
        kind = "invalid_request_error" if status < 500 else "server_error"
        return {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return {"detail": message}


def add_error_handlers(app: FastAPI, prompts: PromptRegistry) -> None:
    """Refusals as ``error_body`` says (OpenAI's format under /v1/), and invalid input as a
    list of problems that does not echo the input back."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        body = error_body(request.url.path, exc.status_code, str(exc.detail))
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_input(request: Request, exc: RequestValidationError) -> JSONResponse:
        # LangServe validates a request's config against the route's config schema itself
        # (APIHandler._get_config_and_input) and reports a failure as FastAPI's 422. The
        # body's own configurable was checked before (Route.check); what fails here is in
        # practice a share link's (/c/{config_hash}/...), answered in Route.check's words.
        config_errors = [
            err
            for err in exc.errors()
            if isinstance(err, dict) and tuple(err.get("loc") or ())[:1] == ("configurable",)
        ]
        if config_errors:
            return await http_error(request, configurable_problem(prompts, config_errors))
        # FastAPI's default echoes each bad input back: not for a 100k-character question.
        return JSONResponse({"detail": [_problem(err) for err in exc.errors()]}, status_code=422)


def _problem(err: Any) -> Any:
    if not isinstance(err, dict):
        return {"msg": str(err)}
    return {"loc": err.get("loc"), "msg": error_message(err), "type": err.get("type")}


async def send_json(send: Callable[[Message], Any], status: int, body: Any, **headers: str) -> None:
    payload = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload, "more_body": False})


async def refuse(
    scope: Mapping[str, Any], send: Any, status: int, reason: str, **headers: str
) -> None:
    """Answer the request with ``status`` and ``reason`` before any route sees it."""
    await send_json(send, status, error_body(scope["path"], status, reason), **headers)


class ErrorMiddleware:
    """Answers a failed run with its real status and reason.

    Before the response has started that is a JSON error. In a LangServe event stream the
    status is already 200, and LangServe's stream handlers (APIHandler.stream, stream_log,
    astream_events) catch every exception, send ``event: error`` with ``{"status_code": 500,
    "message": "Internal Server Error"}`` whatever failed, and raise it again. That event's
    bytes are held back here and replaced by an event with the real status and reason, which
    ``RemoteRunnable`` raises as an HTTP error. (LangServe has no hook to map exceptions.)
    """

    def __init__(self, app: Any, on_llm_failure: Callable[[LLMFailure], None]) -> None:
        self.app = app
        self.on_llm_failure = on_llm_failure

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = event_stream = False
        held: Message | None = None

        async def watched_send(message: Message) -> None:
            nonlocal started, event_stream, held
            if message["type"] == "http.response.start":
                started = True
                headers = dict(message.get("headers") or [])
                event_stream = headers.get(b"content-type", b"").startswith(b"text/event-stream")
            elif event_stream and message.get("body", b"").startswith(b"event: error"):
                held = message
                return
            elif held is not None:
                # The stream went on after its error event without raising (a stream of our
                # own that reports its failure so): the event is sent as it was, first.
                await send(held)
                held = None
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        except Exception as exc:
            status, reason, failure, retry_after = failed(exc)
            retry = {"Retry-After": str(retry_after)} if retry_after is not None else {}
            if failure is not None:
                self.on_llm_failure(failure)
                # The upstream's own words go to the log only (credentials masked).
                said = f" ({failure.detail})" if failure.detail else ""
                log.warning("%s %s: %s%s", scope.get("method"), scope.get("path"), reason, said)
            elif retry_after is not None:
                log.info("%s %s: %s", scope.get("method"), scope.get("path"), reason)
            elif status == 503:
                log.warning(
                    "%s %s: store or index failure: %s", scope.get("method"), scope.get("path"), exc
                )
            else:
                log.error("%s %s failed", scope.get("method"), scope.get("path"), exc_info=exc)
            if not started:
                body = error_body(scope.get("path", ""), status, reason)
                await send_json(send, status, body, **retry)
            elif held is not None:
                # A busy model's event says when to retry, as the header would.
                hint = {"retry_after": retry_after} if retry_after is not None else {}
                data = json.dumps({"status_code": status, "message": reason, **hint})
                event = f"event: error\r\ndata: {data}\r\n\r\n".encode()
                await send({"type": "http.response.body", "body": event, "more_body": False})
            elif event_stream:  # the stream sent its own error event; end it cleanly
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            # else: a plain response broke off midway; the client sees it cut short.
            return
        if held is not None:
            await send(held)


PROBLEM_CONTENT = {"application/json": {"schema": {"$ref": "#/components/schemas/Problem"}}}


def problem_responses(reasons: dict[int, str], *statuses: int) -> dict[int | str, dict[str, Any]]:
    """A route's refusals for its OpenAPI ``responses``: each of ``statuses`` answered with
    a Problem, described by ``reasons``."""
    return {s: {"description": reasons[s], "content": PROBLEM_CONTENT} for s in statuses}
