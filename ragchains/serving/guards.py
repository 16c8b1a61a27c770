"""What runs before a request reaches any route: the API key and the body checked, and
the index generation the request keeps to."""

from __future__ import annotations

import asyncio
import hmac
import json
import re
import sys
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from opentelemetry import trace
from starlette.requests import Request
from starlette.routing import Match

from ragchains.llms import LLMFailure
from ragchains.retrievers.access import caller_groups
from ragchains.retrievers.live import LiveIndex
from ragchains.serving.errors import ErrorMiddleware, Message, Scope, error_body, send_json
from ragchains.serving.keys import KeyRing
from ragchains.settings import Settings


def add_guards(
    app: FastAPI,
    settings: Settings,
    *,
    keyring: KeyRing | None,
    index: object,
    on_llm_failure: Callable[[LLMFailure], None],
) -> None:
    """The middleware, outermost first: CORS, the key, the body's checks, the errors'
    replies, then (an index folder) the generation each request keeps to."""
    # Starlette runs the last added first.
    if isinstance(index, LiveIndex):
        app.add_middleware(GenerationMiddleware, index=index)
    app.add_middleware(ErrorMiddleware, on_llm_failure=on_llm_failure)
    app.add_middleware(
        BodyMiddleware, max_bytes=settings.max_request_bytes, timeout=settings.body_timeout
    )
    if settings.api_key is not None or keyring is not None:
        api_key = settings.api_key.get_secret_value() if settings.api_key is not None else None
        # /metrics needs a key unless the settings open it to a scraper that sends none.
        opened = frozenset({"/metrics"}) if settings.metrics_public else frozenset()
        app.add_middleware(ApiKeyMiddleware, api_key=api_key, keyring=keyring, opened=opened)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
        )


# Probes must work without the key: load balancers and orchestrators call them. The chat
# page and its files hold no data; the page asks for the key and sends it on each call. The
# API's document and its page likewise (a browser opening /docs cannot send a key; the page
# then asks for it): they name the routes and the domains, which /readyz names too.
# These routes only read (GET, HEAD): any other method reaches them and gets their 405
# (asking for a key first would answer 401 for a method no key could make work).
OPEN_PATHS = frozenset(
    {
        "/healthz",
        "/readyz",
        "/",
        "/favicon.ico",
        "/docs",
        "/docs/oauth2-redirect",
        "/openapi.json",
    }
)
OPEN_PREFIXES = ("/ui/", "/static-offline-docs/")  # the page's and the API docs' files


# Where ApiKeyMiddleware leaves the caller's groups in the request's state (absent: the caller
# reads everything).
CALLER_GROUPS = "ragchains_caller_groups"


class ApiKeyMiddleware:
    """Every route but the health checks and the page's files needs a key: ``X-API-Key:
    <key>`` or ``Authorization: Bearer <key>`` (what OpenAI SDKs send). ``api_key`` reads
    everything; a key of ``keyring`` reads what its groups may, for the whole request."""

    def __init__(
        self,
        app: Any,
        api_key: str | None,
        keyring: KeyRing | None = None,
        opened: frozenset[str] = frozenset(),
    ) -> None:
        self.app = app
        self.key = api_key.encode() if api_key is not None else None
        self.keyring = keyring
        self.opened = opened  # paths the settings open, besides OPEN_PATHS

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] == "OPTIONS"
            or is_open(scope["method"], scope["path"])
            or scope["path"] in self.opened
        ):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        given = headers.get(b"x-api-key")
        if given is None:
            scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
            given = token.strip() if scheme.lower() == b"bearer" else b""
        if self.key is not None and hmac.compare_digest(given, self.key):
            await self.app(scope, receive, send)  # reads everything
            return
        principal = self.keyring.find(given) if self.keyring is not None else None
        if principal is None:
            if method_not_allowed(scope):  # the router's 405: no key would change it
                await self.app(scope, receive, send)
                return
            reason = (
                "missing or wrong API key: send it as 'X-API-Key: <key>' or "
                "'Authorization: Bearer <key>'"
            )
            await refuse(scope, send, 401, reason, **{"WWW-Authenticate": "Bearer"})
            return
        # Also in the request's state, for work the request hands to tasks that do not
        # inherit its context (MCP's tool calls run in the session manager's task group).
        scope.setdefault("state", {})[CALLER_GROUPS] = principal.groups
        with caller_groups(principal.groups):
            await self.app(scope, receive, send)


def is_open(method: str, path: str) -> bool:
    """Whether a request needs no key (see OPEN_PATHS); whatever its method, the route
    answers reads only."""
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


def method_not_allowed(scope: Scope) -> bool:
    """Whether routes answer the request's path but none its method (TRACE, CONNECT, PUT on
    a route that reads): the router's 405, which no key would change, so asking for one
    first (401) would only mislead. The path's routes are no secret: /openapi.json, which
    needs no key, lists them. Only requests without a good key get here."""
    router = getattr(scope.get("app"), "router", None)  # Starlette puts the app in the scope
    if router is None:
        return False
    partial = False
    for route in router.routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return False
        partial = partial or match is Match.PARTIAL
    return partial


# The media types a body may have: JSON, the only one any route reads.
JSON_TYPES = (b"application/json",)
JSON_SUFFIX = b"+json"
# How deep a JSON body may nest: requests nest a few levels (a filter in a list in the
# input); a body nested a thousand deep only exhausts the parsers' recursion.
MAX_JSON_DEPTH = 64
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# Bodies larger than this are parsed in a thread (a 10,000-value filter list is ~50 KB:
# half a millisecond of the event loop otherwise, for each such request).
PARSE_OFF_LOOP = 16_384
# Where a body parsed by BodyMiddleware waits for its route (in the request's state).
PARSED_BODY = "ragchains_parsed_body"
_NOT_JSON = "send the request body as JSON, with 'Content-Type: application/json'"


class BodyMiddleware:
    """Every request body checked before any route reads it: JSON by its Content-Type (415;
    a page on another origin can send text or form bodies without asking first, JSON it
    cannot), at most ``max_bytes`` (413), arriving within ``timeout`` seconds (408), and
    text every route can take (400, see ``parse_json``). The body is read here, bounded,
    parsed once, and handed on: the bytes to whoever reads them, the parsed value in the
    request's state (``PARSED_BODY``, read through ``request_json``)."""

    def __init__(self, app: Any, max_bytes: int, timeout: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout
        self._too_large = f"the request body is larger than {max_bytes} bytes"

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await refuse(scope, send, 413, self._too_large)
            return
        content_type = headers.get(b"content-type")
        if content_type is not None and not _is_json(content_type):
            await refuse(scope, send, 415, _NOT_JSON)
            return
        body = await self._read(scope, receive, send)
        if body is None:
            return
        # A request without a body (and so without its type) goes on to its route, which
        # answers it: 405 for a method the route does not take, 422 for a missing input.
        if content_type is None and body:
            await refuse(scope, send, 415, _NOT_JSON)
            return
        if body:
            # Off the event loop when large: a 10,000-value filter list (~50 KB) is half a
            # millisecond of parsing. A small one takes microseconds, less than the hand-off.
            if len(body) > PARSE_OFF_LOOP:
                problem, parsed = await asyncio.to_thread(parse_json, body)
            else:
                problem, parsed = parse_json(body)
            if problem is not None:
                await refuse(scope, send, 400, problem)
                return
            if parsed is not MALFORMED:
                scope.setdefault("state", {})[PARSED_BODY] = parsed
        replay = [{"type": "http.request", "body": body, "more_body": False}]

        async def replayed() -> Message:
            return replay.pop() if replay else await receive()

        await self.app(scope, replayed, send)

    async def _read(self, scope: Scope, receive: Any, send: Any) -> bytes | None:
        """The whole body, or None once the request has been refused (too large, too slow,
        or the client went away)."""
        chunks: list[bytes] = []
        size = 0
        deadline = asyncio.get_running_loop().time() + self.timeout  # for the whole body
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                reason = f"the request body did not arrive within {self.timeout:g} seconds"
                await refuse(scope, send, 408, reason, Connection="close")
                return None
            if message["type"] != "http.request":  # the client disconnected
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await refuse(scope, send, 413, self._too_large)
                return None
            if not message.get("more_body"):
                return b"".join(chunks)


async def refuse(scope: Scope, send: Any, status: int, reason: str, **headers: str) -> None:
    """Answer the request with ``status`` and ``reason`` before any route sees it."""
    await send_json(send, status, error_body(scope["path"], status, reason), **headers)


def _is_json(content_type: bytes) -> bool:
    media, _, params = content_type.partition(b";")
    media = media.strip().lower()
    if media not in JSON_TYPES and not (
        media.startswith(b"application/") and media.endswith(JSON_SUFFIX)
    ):
        return False
    # Parameters other than charset say nothing about how to read the body.
    for param in params.split(b";"):
        name, _, value = param.strip().lower().partition(b"=")
        if name == b"charset" and value.strip(b'" ') not in (b"utf-8", b"utf8"):
            return False
    return True


# What parse_json gives for a body that is not JSON at all: its route answers it (422,
# naming where), parsing the same text the same way (see parse_json).
MALFORMED: Any = object()
# A \uD800-\uDFFF escape: only through one can a JSON string hold a surrogate (UTF-8 text
# cannot). Bodies without one, nearly all, are not searched for lone surrogates.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_NOT_UTF8_JSON = "the request body is not UTF-8 text (it begins as UTF-16 or UTF-32 does)"
_LONE_SURROGATE = (
    "a string in the JSON body holds a lone surrogate (an escape in \\ud800-\\udfff "
    "without its pair): not Unicode text"
)
_TOO_DEEP = f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels"


def parse_json(body: bytes) -> tuple[str | None, Any]:
    """``body`` parsed as JSON text, once for every route: (None, the value); or why no
    route can take it (a 400's reason, which never quotes the body), and None; or (None,
    MALFORMED) when it is not JSON, which its route reports.

    The same bytes read by ``json.loads(bytes)`` (Starlette's ``Request.json()``, the MCP
    SDK) give this value or fail too: that guesses UTF-16 or UTF-32 from NUL bytes at the
    start, which JSON text in UTF-8 never has, so such a body is refused here, and both
    drop a UTF-8 byte-order mark. What is refused: text that is not UTF-8, JSON nested
    deeper than MAX_JSON_DEPTH, an integer longer than Python converts (its
    ``sys.get_int_max_str_digits()``; ``json`` raises a ValueError that is no
    JSONDecodeError), and a lone surrogate escape in a string or key (it parses into a str
    that cannot be encoded again: in a reply, a log line, a tokenizer)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"the request body is not UTF-8 text (a bad byte at position {exc.start})", None
    try:
        value = json.loads(text.removeprefix("\ufeff"))
    except RecursionError:
        return _TOO_DEEP, None
    except json.JSONDecodeError:
        if json.detect_encoding(body) not in ("utf-8", "utf-8-sig"):
            return _NOT_UTF8_JSON, None
        return None, MALFORMED
    except ValueError:  # int("9" * 5000): no other ValueError comes out of json's parser
        limit = sys.get_int_max_str_digits()
        return f"a number in the JSON body has more than {limit} digits", None
    if (
        body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH  # it cannot nest deeper otherwise
        and _depth(value) > MAX_JSON_DEPTH
    ):
        return _TOO_DEEP, None
    if _SURROGATE_ESCAPE.search(text) and _has_surrogate(value):
        return _LONE_SURROGATE, None
    return None, value


def _has_surrogate(value: Any) -> bool:
    """Whether a string or key in ``value`` holds a surrogate (no recursion: it may be
    deep)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            pending.extend(item)
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


def _depth(value: Any) -> int:
    """How deep lists and objects nest in ``value`` (no recursion: it may be deep)."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, level = pending.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, level)
            pending.extend((child, level + 1) for child in item)
    return deepest


GENERATION_ATTRIBUTE = "ragchains.index.generation"


class GenerationMiddleware:
    """Each request keeps to the index generation current when it arrived, to its last
    streamed byte, while ingests commit new ones (see ``retrievers.live``)."""

    def __init__(self, app: Any, index: LiveIndex) -> None:
        self.app = app
        self.index = index

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with self.index.pin() as pinned:
            # On the request's span (a no-op when tracing is off): which generation answered.
            trace.get_current_span().set_attribute(GENERATION_ATTRIBUTE, pinned.path.name)
            await self.app(scope, receive, send)


async def request_json(request: Request) -> Any:
    """The request's JSON body as BodyMiddleware parsed it (``PARSED_BODY``); Starlette
    keeps it on the request for the route. A body that is not JSON raises here as
    ``Request.json()`` does (a JSONDecodeError)."""
    state = request.scope.get("state", {})
    if PARSED_BODY in state:
        # LangServe's handlers parse the body themselves, on the event loop, with
        # ``await request.json()`` (APIHandler._get_config_and_input), and take no parsed
        # body. Starlette's Request.json() returns its private ``_json`` when set, and FastAPI
        # hands the route and its dependencies one Request: setting it here is the only way
        # to give LangServe the one parsed value (and spare it a second parse).
        request._json = state[PARSED_BODY]
    return await request.json()
