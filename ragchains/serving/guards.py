"""Checks made before a request reaches any route: the API key and the body size."""

from __future__ import annotations

import hmac
from typing import Any

from ragchains.serving.errors import Message, Scope, error_body, send_json

# Probes must work without the key: load balancers and orchestrators call them. The chat
# page and its files hold no data; the page asks for the key and sends it on each call.
# Only reads are open (GET, HEAD): nothing that runs a model or stores anything.
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/"})
OPEN_PREFIXES = ("/ui/",)
OPEN_METHODS = frozenset({"GET", "HEAD"})


class ApiKeyMiddleware:
    """Every route but the health checks and the page's files needs the key: ``X-API-Key: <key>`` or
    ``Authorization: Bearer <key>`` (what OpenAI SDKs send)."""

    def __init__(self, app: Any, api_key: str) -> None:
        self.app = app
        self.key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or _is_open(scope):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        given = headers.get(b"x-api-key")
        if given is None:
            scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
            given = token.strip() if scheme.lower() == b"bearer" else b""
        if not hmac.compare_digest(given, self.key):
            reason = (
                "missing or wrong API key: send it as 'X-API-Key: <key>' or "
                "'Authorization: Bearer <key>'"
            )
            body = error_body(scope["path"], 401, reason)
            await send_json(send, 401, body, **{"WWW-Authenticate": "Bearer"})
            return
        await self.app(scope, receive, send)


def _is_open(scope: Scope) -> bool:
    path = scope["path"]
    return scope["method"] in OPEN_METHODS and (
        path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)
    )


class BodyLimitMiddleware:
    """Bodies over the limit get 413 before anything reads them."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            if length.isdigit() and int(length) > self.max_bytes:
                await self._refuse(scope, send)
                return
            await self.app(scope, receive, send)
            return
        # No length given (chunked upload): read up to the limit, then hand the body on.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await self._refuse(scope, send)
                return
            if not message.get("more_body"):
                break
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replayed() -> Message:
            return replay.pop() if replay else await receive()

        await self.app(scope, replayed, send)

    async def _refuse(self, scope: Scope, send: Any) -> None:
        reason = f"the request body is larger than {self.max_bytes} bytes"
        await send_json(send, 413, error_body(scope["path"], 413, reason))
