"""Turning failures into replies: a status and a one-line reason, never a stack trace.

Bad input is answered before any work (400/413/422, raised as HTTPException). What fails
during a run is either the chat model (504 when it timed out, 502 otherwise), the document
store (503: a database that cannot be reached, or an index file found damaged), or a bug
(500, logged with its traceback here and nowhere else).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from ragchains.llms import LLMFailure, explain_failure
from ragchains.retrievers.indexformat import IndexLoadError
from ragchains.retrievers.pgerrors import StoreError

log = logging.getLogger("ragchains.server")

Scope = dict[str, Any]
Message = dict[str, Any]

OPENAI_PREFIX = "/v1/"
STORE_UNREACHABLE = "the document store cannot be reached; the server log has the details"
INDEX_UNREADABLE = "the index cannot be read; the server log has the details"


def classify(exc: BaseException) -> tuple[int, str, LLMFailure | None]:
    if isinstance(exc, StoreError):  # the database is down or unreachable: not the caller's
        return 503, STORE_UNREACHABLE, None
    if isinstance(exc, IndexLoadError):  # damage found by a query (the log names the file)
        return 503, INDEX_UNREADABLE, None
    failure = explain_failure(exc)
    if failure is None:
        return 500, "internal error; the server log has the details", None
    return (504 if failure.timed_out else 502), failure.message, failure


def error_body(path: str, status: int, message: str) -> dict[str, Any]:
    """FastAPI's ``{"detail": ...}``, or OpenAI's error object under /v1/ so SDKs read it."""
    if path.startswith(OPENAI_PREFIX):
        kind = "invalid_request_error" if status < 500 else "server_error"
        return {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return {"detail": message}


async def send_json(send: Callable[[Message], Any], status: int, body: Any, **headers: str) -> None:
    payload = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload, "more_body": False})


class ErrorMiddleware:
    """Answers a failed run with its real status and reason.

    Before the response has started that is a JSON error. In a LangServe event stream the
    status is already 200, so LangServe's own last event ("error", always 500 "Internal
    Server Error") is held back and replaced by one with the real status and reason, which
    ``RemoteRunnable`` raises as an HTTP error.
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
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        except Exception as exc:
            status, reason, failure = classify(exc)
            if failure is not None:
                self.on_llm_failure(failure)
                # The upstream's own words go to the log only (credentials masked).
                said = f" ({failure.detail})" if failure.detail else ""
                log.warning("%s %s: %s%s", scope.get("method"), scope.get("path"), reason, said)
            elif status == 503:
                log.warning(
                    "%s %s: store or index failure: %s", scope.get("method"), scope.get("path"), exc
                )
            else:
                log.error("%s %s failed", scope.get("method"), scope.get("path"), exc_info=exc)
            if not started:
                await send_json(send, status, error_body(scope.get("path", ""), status, reason))
            elif held is not None:
                data = json.dumps({"status_code": status, "message": reason})
                event = f"event: error\r\ndata: {data}\r\n\r\n".encode()
                await send({"type": "http.response.body", "body": event, "more_body": False})
            elif event_stream:  # the stream sent its own error event; end it cleanly
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            # else: a plain response broke off midway; the client sees it cut short.
            return
        if held is not None:
            await send(held)
