"""What runs before a request reaches any route: the API key checked, and the index
generation the request keeps to."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from opentelemetry import trace
from starlette.routing import Match

from ragchains.models.providers import LLMFailure
from ragchains.retrievers.access import caller_groups
from ragchains.retrievers.live import LiveIndex
from ragchains.serving.errors import ErrorMiddleware, Scope, refuse
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
    """The middleware, outermost first: CORS, the key, the errors' replies, then (an index
    folder) the generation each request keeps to."""
    # Starlette runs the last added first.
    if isinstance(index, LiveIndex):
        app.add_middleware(GenerationMiddleware, index=index)
    app.add_middleware(ErrorMiddleware, on_llm_failure=on_llm_failure)
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
