"""Request bodies: how many bytes and how long (for every route), and JSON text every JSON
route can take (per route, as a FastAPI dependency; ``JsonOnly`` for /mcp, which is an ASGI
app of the MCP SDK's).

The two parts are apart so that a route may take another kind of body (a file upload):
``BodyLimits`` only counts and times the bytes as the route reads them, it neither reads
ahead nor parses. ``json_body`` parses the body once, through Starlette's
``Request.json()``, which keeps the value on the request: LangServe's handlers, which read
the body themselves with ``await request.json()``, get that same value without parsing it
again.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ragchains.serving.errors import refuse

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# How deep a JSON body may nest: requests nest a few levels (a filter in a list in the
# input); a body nested a thousand deep only exhausts the parsers' recursion.
MAX_JSON_DEPTH = 64
NOT_JSON = "send the request body as JSON, with 'Content-Type: application/json'"


def too_large(max_bytes: int) -> str:
    return f"the request body is larger than {max_bytes} bytes"


class BodyLimits:
    """ASGI middleware: a request body is at most ``max_bytes(path)`` bytes (413) and
    arrives whole within ``timeout`` seconds of its first read (408, and the connection is
    closed). A declared length over the limit is refused at once; otherwise the bytes are
    counted as the route reads them, and going over raises the HTTPException there, which
    FastAPI answers (it re-raises an HTTPException met while reading a body)."""

    def __init__(self, app: ASGIApp, max_bytes: Callable[[str], int], timeout: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes(scope["path"])
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            await refuse(scope, send, 413, too_large(limit))
            return
        await self.app(scope, _bounded(receive, limit, self.timeout), send)


def _bounded(receive: Receive, limit: int, timeout: float) -> Receive:
    size = 0
    deadline: float | None = None  # for the whole body, not each chunk

    async def bounded() -> Message:
        nonlocal size, deadline
        loop = asyncio.get_running_loop()
        if deadline is None:
            deadline = loop.time() + timeout
        try:
            async with asyncio.timeout_at(deadline):
                message = await receive()
        except TimeoutError:
            reason = f"the request body did not arrive within {timeout:g} seconds"
            raise HTTPException(408, reason, headers={"Connection": "close"}) from None
        if message["type"] == "http.request":
            size += len(message.get("body", b""))
            if size > limit:
                raise HTTPException(413, too_large(limit), headers={"Connection": "close"})
            if not message.get("more_body"):
                deadline = float("inf")  # the body is whole: what follows is a disconnect
        return message

    return bounded


def is_json_type(content_type: str | None) -> bool:
    """``application/json`` or ``application/...+json``, in UTF-8 if a charset is named."""
    if content_type is None:
        return False
    media, _, params = content_type.partition(";")
    media = media.strip().lower()
    if media != "application/json" and not (
        media.startswith("application/") and media.endswith("+json")
    ):
        return False
    # Parameters other than charset say nothing about how to read the body.
    for param in params.split(";"):
        name, _, value = param.strip().lower().partition("=")
        if name == "charset" and value.strip('" ') not in ("utf-8", "utf8"):
            return False
    return True


# ----------------------------------------------------------------------------- JSON text
# A \uD800-\uDFFF escape: only through one can a JSON string hold a surrogate (UTF-8 text
# cannot). Bodies without one, nearly all, are not searched for lone surrogates.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_NOT_UTF8 = "the request body is not UTF-8 text (it begins as UTF-16 or UTF-32 does)"
_LONE_SURROGATE = (
    "a string in the JSON body holds a lone surrogate (an escape in \\ud800-\\udfff "
    "without its pair): not Unicode text"
)
_TOO_DEEP = f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels"


def text_problem(body: bytes) -> str | None:
    """Why ``body`` is not UTF-8 text, if it is not. ``json.loads(bytes)`` (Starlette's
    ``Request.json()``, the MCP SDK) guesses UTF-16 or UTF-32 from NUL bytes at the start,
    which JSON text in UTF-8 never has, so such a body is refused too."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"the request body is not UTF-8 text (a bad byte at position {exc.start})"
    if json.detect_encoding(body) not in ("utf-8", "utf-8-sig"):
        return _NOT_UTF8
    return None


def parse_problem(exc: Exception) -> str | None:
    """Why ``json.loads`` failed, when no route can take the body (a 400's reason); None
    for malformed JSON, which each route reports in its own words (422)."""
    if isinstance(exc, RecursionError):
        return _TOO_DEEP
    if isinstance(exc, json.JSONDecodeError):
        return None
    if isinstance(exc, ValueError):  # int("9" * 5000): json's only other ValueError
        limit = sys.get_int_max_str_digits()
        return f"a number in the JSON body has more than {limit} digits"
    raise exc


def value_problem(body: bytes, value: Any) -> str | None:
    """Why a parsed body cannot be taken: nested deeper than MAX_JSON_DEPTH, or a lone
    surrogate escape in a string or key (it parses into a str that cannot be encoded again:
    in a reply, a log line, a tokenizer). Cheap tests on the bytes come first."""
    if body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH and _depth(value) > MAX_JSON_DEPTH:
        return _TOO_DEEP
    if _SURROGATE_ESCAPE.search(body) and _has_surrogate(value):
        return _LONE_SURROGATE
    return None


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


def check_json_bytes(body: bytes) -> str | None:
    """Why no JSON route can take ``body`` (the reply's 400 reason, which never quotes the
    body), parsing it once; None when it can (malformed JSON included: see
    ``parse_problem``)."""
    problem = text_problem(body)
    if problem is not None:
        return problem
    try:
        value = json.loads(body)
    except (RecursionError, ValueError) as exc:
        return parse_problem(exc)
    return value_problem(body, value)


ModelT = TypeVar("ModelT", bound=BaseModel)

# What json_body gives for a body that is not JSON at all: its route answers it (422,
# naming where) when it reads the body itself.
MALFORMED: Any = object()


async def json_body(request: Request) -> Any:
    """A FastAPI dependency of a route that takes JSON: the body parsed once (Starlette keeps
    the value on the request: the route and LangServe's handler read it again for free), or
    None when there is none (the route says what is missing), or MALFORMED. Refused: another
    media type (415: a page on another origin can send text or form bodies without asking
    first, JSON it cannot), and text no route can take (400, see ``check_json_bytes``)."""
    if request.method not in BODY_METHODS:
        return None
    content_type = request.headers.get("content-type")
    if content_type is not None and not is_json_type(content_type):
        raise HTTPException(415, NOT_JSON)
    body = await request.body()
    if not body:
        return None
    if content_type is None:
        raise HTTPException(415, NOT_JSON)
    problem = text_problem(body)
    if problem is None:
        try:
            value = await request.json()
        except (RecursionError, ValueError) as exc:
            problem = parse_problem(exc)
            if problem is None:
                return MALFORMED
        else:
            problem = value_problem(body, value)
    if problem is not None:
        raise HTTPException(400, problem)
    return value


# A route's parameter for its JSON body, read as ``json_body`` says.
JsonBody = Annotated[Any, Depends(json_body)]


class JsonOnly:
    """An ASGI app that takes JSON bodies only, in front of one that reads them itself (the
    MCP SDK's transport): the same refusals as ``json_body``, then the bytes handed on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        content_type = dict(scope["headers"]).get(b"content-type")
        if content_type is not None and not is_json_type(content_type.decode("latin-1")):
            await refuse(scope, send, 415, NOT_JSON)
            return
        chunks: list[bytes] = []
        try:
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client went away
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    break
        except HTTPException as exc:  # BodyLimits: too large or too slow
            await refuse(scope, send, exc.status_code, str(exc.detail), **(exc.headers or {}))
            return
        body = b"".join(chunks)
        problem = check_json_bytes(body) if body else None
        if body and content_type is None:
            problem = NOT_JSON
        if problem is not None:
            await refuse(scope, send, 415 if problem == NOT_JSON else 400, problem)
            return
        replay = [{"type": "http.request", "body": body, "more_body": False}]

        async def replayed() -> Message:
            return replay.pop() if replay else await receive()

        await self.app(scope, replayed, send)


def read_model(model: type[ModelT], sent: Any) -> ModelT:
    """A JSON body (``json_body``'s) as ``model``, or a 422 naming where it is wrong, as
    FastAPI reports its own: for a route whose body model is built at run time (within the
    server's limits), which FastAPI's annotations cannot name."""
    if sent is MALFORMED:
        problem = {"loc": ("body",), "msg": "the body is not valid JSON", "type": "json_invalid"}
        raise RequestValidationError([problem])
    try:
        return model.model_validate(sent)
    except ValidationError as exc:
        errors = [{**err, "loc": ("body", *err["loc"])} for err in exc.errors()]
        raise RequestValidationError(errors) from exc
