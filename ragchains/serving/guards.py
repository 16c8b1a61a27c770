"""What each request is allowed and keeps to: who it comes from (a key, the identity
provider's bearer token, a signed-in person's session) and the groups they read, and the
index generation it reads from start to end; and the middleware around every route (CORS,
the errors' replies)."""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Callable, Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, HTTPException, Request
from fastapi.middleware.cors import CORSMiddleware
from opentelemetry import trace
from starlette.datastructures import Headers

from ragchains.models.providers import LLMFailure
from ragchains.retrievers.access import caller_groups
from ragchains.retrievers.live import LiveIndex
from ragchains.serving.errors import ErrorMiddleware, Scope, refuse
from ragchains.serving.keys import KeyRing, Principal
from ragchains.serving.signin import EXPIRED_SESSION, SIGN_IN_PATHS, SignIn, TokenRefused
from ragchains.settings import Settings


def add_guards(
    app: FastAPI, settings: Settings, *, on_llm_failure: Callable[[LLMFailure], None]
) -> None:
    """The middleware, outermost first: CORS, then the errors' replies. (The key and the
    generation are each request's dependencies: ``request_guard``.)"""
    # Starlette runs the last added first.
    app.add_middleware(ErrorMiddleware, on_llm_failure=on_llm_failure)
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
# These routes only read (GET, HEAD); the router answers any other method 405 before a
# key is asked for (no key would make it work).
OPEN_PATHS = frozenset(
    {
        "/healthz",
        "/readyz",
        "/me",  # who is asking: nobody, when no key or sign-in came (the page then asks)
        "/",
        "/favicon.ico",
        "/docs",
        "/docs/oauth2-redirect",
        "/openapi.json",
    }
)
OPEN_PREFIXES = ("/ui/", "/static-offline-docs/")  # the page's and the API docs' files


# Where the guard leaves the caller's groups in the request's state (None: the caller
# reads everything), for work the request hands to tasks that do not inherit its context
# (MCP's tool calls run in the session manager's task group).
CALLER_GROUPS = "ragchains_caller_groups"
# And the caller (a Principal; None on an open path asked without a key).
CALLER = "ragchains_caller"
# And, for nobody on an open path, why a sign-in ended (its ID token expired), else None.
SIGNED_OUT = "ragchains_signed_out"
# RAGCHAINS_API_KEY's holder reads everything and may do everything.
API_KEY_PRINCIPAL = Principal("api-key", None, "admin")
# A server without keys is one person's: whoever reaches it may do everything.
OPEN_SERVER_PRINCIPAL = Principal("local", None, "admin", via="open")
GENERATION_ATTRIBUTE = "ragchains.index.generation"
MISSING_KEY = (
    "missing or wrong API key: send it as 'X-API-Key: <key>' or 'Authorization: Bearer <key>'"
)


class Keys:
    """The keys a server takes: ``api_key`` reads everything; a key of ``keyring`` reads
    what its groups may."""

    def __init__(self, api_key: str | None, keyring: KeyRing | None = None) -> None:
        self.key = api_key.encode() if api_key is not None else None
        self.keyring = keyring

    @classmethod
    def of(cls, settings: Settings, keyring: KeyRing | None) -> Keys | None:
        """The keys ``settings`` ask for; None when they name none."""
        if settings.api_key is None and keyring is None:
            return None
        api_key = settings.api_key.get_secret_value() if settings.api_key is not None else None
        return cls(api_key, keyring)

    def find(self, given: bytes) -> Principal | None:
        """Whose key ``given`` is; None when it is nobody's."""
        if self.key is not None and given and hmac.compare_digest(given, self.key):
            return API_KEY_PRINCIPAL
        return self.keyring.find(given) if self.keyring is not None else None


def presented(headers: Headers) -> tuple[bytes, bool]:
    """What the request presents: ``X-API-Key: <key>``, else ``Authorization: Bearer <key or
    token>`` (what OpenAI SDKs send); and whether it came as a bearer."""
    key = headers.get("x-api-key", "").strip()
    if key:  # an empty one (an unset variable's, a client's default) presents nothing
        return key.encode("latin-1"), False
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return (token.strip().encode("latin-1"), True) if scheme.lower() == "bearer" else (b"", False)


class Callers:
    """Who makes each request: the owner of its key, the person its bearer token names
    (one of the identity provider's access tokens), or the person signed in on its session
    cookie; everyone's on a server with neither keys nor sign-in. Every route but the open
    ones (OPEN_PATHS, and those the settings open) needs one of them: 401 otherwise, saying
    why (a token expired, for another audience, from another issuer)."""

    def __init__(
        self,
        keys: Keys | None,
        signin: SignIn | None = None,
        opened: frozenset[str] = frozenset(),
    ) -> None:
        self.keys = keys
        self.signin = signin
        self.opened = opened | (SIGN_IN_PATHS if signin is not None else frozenset())

    @classmethod
    def of(cls, settings: Settings, keyring: KeyRing | None, signin: SignIn | None) -> Callers:
        # /metrics needs a key unless the settings open it to a scraper that sends none.
        opened = frozenset({"/metrics"}) if settings.metrics_public else frozenset()
        return cls(Keys.of(settings, keyring), signin, opened)

    @property
    def open_to_all(self) -> bool:
        return self.keys is None and self.signin is None

    async def principal(self, scope: MutableMapping[str, Any]) -> Principal | None:
        """The request's caller (None: a path open to all, asked without a key); 401
        without one elsewhere."""
        if self.open_to_all:
            return OPEN_SERVER_PRINCIPAL
        path = scope["path"]
        headers = Headers(scope=scope)
        given, bearer = presented(headers)
        found = self.keys.find(given) if self.keys is not None and given else None
        if (
            found is None
            and given
            and bearer
            and self.signin is not None
            and given.count(b".") == 2  # a JWT's three parts; a key has no dot
        ):
            try:
                found = await self.signin.bearer_principal(given.decode("latin-1"))
            except TokenRefused as exc:
                raise HTTPException(401, str(exc), headers=INVALID_TOKEN) from exc
        session = scope.get("session") if self.signin is not None else None
        if found is None and not given and self.signin is not None:
            found = await self.signin.session_principal(session)
            if found is not None:
                refuse_other_sites(scope, headers, self.signin.public_url)
        if found is None and not (is_open(path) or path in self.opened):
            ended = self.signin is not None and not given
            if ended and await self.signin.session_expired(session):  # type: ignore[union-attr]
                raise HTTPException(401, EXPIRED_SESSION, headers={"WWW-Authenticate": "Bearer"})
            reason = MISSING_KEY if self.signin is None else MISSING_SIGN_IN
            if given and self.signin is not None:  # sent, but neither a key nor a token
                reason = UNKNOWN_KEY
            raise HTTPException(401, reason, headers={"WWW-Authenticate": "Bearer"})
        return found


INVALID_TOKEN = {"WWW-Authenticate": 'Bearer error="invalid_token"'}
MISSING_SIGN_IN = (
    "sign in first (GET /auth/login), or send a key as 'X-API-Key: <key>' or a token as "
    "'Authorization: Bearer <token>'"
)
UNKNOWN_KEY = f"the key sent is not known: {MISSING_SIGN_IN}"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def refuse_other_sites(
    scope: MutableMapping[str, Any], headers: Headers, public: str | None = None
) -> None:
    """403 for a change asked by a page of another origin on the strength of a session
    cookie (a cross-site request forgery): browsers send Origin with every such request.
    SameSite=Lax already keeps the cookie off other sites' requests; this also covers
    another port of the same host, which is the same site. The page's own origin is the
    host the request was sent to, or the server's public address (``public``: behind a
    proxy that ends TLS, the scheme seen here is not the page's)."""
    if scope.get("method", "GET") in SAFE_METHODS:
        return
    # What the browser says of the request's origin (every current one sends it): another
    # site's or another origin of this site's page is refused, whatever Origin says.
    if headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        raise HTTPException(403, "a page of another origin may not act for a signed-in person")
    origin = headers.get("origin")
    if origin is None:
        return
    sent_from = urlsplit(origin).netloc
    own = {headers.get("host", ""), urlsplit(public).netloc if public else ""}
    if not sent_from or sent_from not in own:
        raise HTTPException(403, "a page of another origin may not act for a signed-in person")


def caller(request: Request) -> Principal | None:
    """The caller ``request_guard`` found for ``request``."""
    found = getattr(request.state, CALLER, None)
    return found if isinstance(found, Principal) else None


def requires(role: str) -> Callable[[Request], Principal]:
    """A route's dependency: its caller, who must have ``role`` (ROLES) or above; 403
    naming the role otherwise."""

    def check(request: Request) -> Principal:
        found = caller(request)
        if found is None or not found.may(role):
            held = found.role if found is not None else "no key"
            raise HTTPException(403, f"this needs the {role} role; the key used has {held}")
        return found

    return check


def is_open(path: str) -> bool:
    """Whether a request needs no key (see OPEN_PATHS); whatever its method, the route
    answers reads only."""
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


@contextmanager
def guarded(index: object, groups: frozenset[str] | None) -> Iterator[None]:
    """What a request reads, for as long as it runs (the tasks and threads it starts
    included): what ``groups`` may, of the index generation current now (an index folder's:
    ingests may commit others meanwhile; see ``retrievers.live``)."""
    with caller_groups(groups):
        if not isinstance(index, LiveIndex):
            yield
            return
        with index.pin() as pinned:
            # On the request's span (a no-op when tracing is off): which generation answered.
            trace.get_current_span().set_attribute(GENERATION_ATTRIBUTE, pinned.path.name)
            yield


def request_guard(callers: Callers, index: object) -> Callable[[Request], AsyncIterator[None]]:
    """A dependency of every route (the app's): the caller found first (401), then
    ``guarded`` from there to the response's last byte (FastAPI leaves a dependency's
    ``yield`` once the response is sent, a stream's end included)."""

    async def guard(request: Request) -> AsyncIterator[None]:
        caller = await callers.principal(request.scope)
        groups = caller.groups if caller is not None else None
        setattr(request.state, CALLER, caller)
        setattr(request.state, CALLER_GROUPS, groups)
        if caller is None and callers.signin is not None:
            # On an open path (/me): why nobody is signed in, when a session just ended.
            ended = await callers.signin.session_expired(request.scope.get("session"))
            setattr(request.state, SIGNED_OUT, EXPIRED_SESSION if ended else None)
        with guarded(index, groups):
            yield

    return guard


class Guarded:
    """``request_guard`` for the one route FastAPI's dependencies do not reach (MCP's
    transport, a plain ASGI route): the same callers, the same ``guarded``."""

    def __init__(self, app: Any, callers: Callers, index: object) -> None:
        self.app = app
        self.callers = callers
        self.index = index

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        try:
            caller = await self.callers.principal(scope)
        except HTTPException as refused:
            await refuse(scope, send, refused.status_code, refused.detail, **refused.headers or {})
            return
        groups = caller.groups if caller is not None else None
        scope.setdefault("state", {}).update({CALLER: caller, CALLER_GROUPS: groups})
        with guarded(self.index, groups):
            await self.app(scope, receive, send)
