"""The server under hostile input: each case is a reproduction from the probe that found it
(issue 15), sent to the real app under uvicorn; each must get a 4xx with its reason, never a
500 or a stall, and leave the server healthy."""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import gc
import json
import re
import socket
import subprocess
import time
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi import HTTPException
from langchain_core.documents import Document
from langchain_core.runnables import RunnableLambda
from pydantic import SecretStr

from ragchains.chains.retrieve import create_retrieve_chain
from ragchains.retrievers.filters import (
    MAX_GLOB_CHARS,
    MAX_IN_VALUES,
    MAX_VALUE_CHARS,
    FilterError,
    MetadataColumns,
    MetadataFilter,
    validate_filters,
)
from ragchains.serving import bodies
from ragchains.serving.bodies import BodyLimits
from tests.servers import RAGCHAINS, FakeOpenAI, ragchains_serve
from tests.test_filter_globs import hostile_body

pytestmark = pytest.mark.slow


def retrieve(url: str, filters: list[dict[str, object]], query: str = "sensor") -> httpx.Response:
    body = {
        "input": {"query": query, "filters": filters},
        "config": {"configurable": {"domain": "catalog"}},
    }
    return httpx.post(f"{url}/retrieve/invoke", json=body, timeout=60)


# ----------------------------------------------------------------------------- 1. filter size
def test_a_huge_in_list_is_refused_at_once_and_a_full_one_is_answered(sample_server: str) -> None:
    """16,000 values took 37.5 s (the list formatted once per item) and blocked /healthz."""
    huge = retrieve(sample_server, [{"field": "price", "op": "in", "value": list(range(16000))}])
    assert huge.status_code == 422
    assert f"at most {MAX_IN_VALUES} items" in huge.text
    assert len(huge.text) < 2000  # not the list echoed
    full = [*range(MAX_IN_VALUES - 1), 34.0]  # the auger's price, last of 1,000
    in_full = [{"field": "price", "op": "in", "value": full}]
    answered = retrieve(sample_server, in_full, "probe installation auger")
    assert answered.status_code == 200
    assert [d["metadata"]["price"] for d in answered.json()["output"]][:1] == [34.0]
    assert httpx.get(f"{sample_server}/healthz").status_code == 200


def test_a_bad_value_at_the_end_of_a_long_list_is_named_briefly() -> None:
    values: list[object] = [*range(MAX_IN_VALUES - 1), "x"]
    with pytest.raises(FilterError) as caught:
        validate_filters([{"field": "price", "op": "in", "value": values}], {"price": "number"})
    message = str(caught.value)
    assert "expected a number, got 'x'" in message and f"({MAX_IN_VALUES} values)" in message
    assert len(message) < 300
    with pytest.raises(FilterError, match="limit is 16"):
        validate_filters([{"field": "price", "op": ">", "value": 1}] * 17, {"price": "number"})


# ----------------------------------------------------------------------------- 2. glob memory
def test_long_globs_are_refused_and_globs_do_not_grow_fnmatchs_cache(sample_server: str) -> None:
    """30 distinct 200 KB globs kept 34 MB in fnmatch's pattern cache (32,768 entries)."""
    refusals = (
        (200_000, f"at most {MAX_VALUE_CHARS} characters"),
        (MAX_GLOB_CHARS + 1, f"the limit is {MAX_GLOB_CHARS}"),
    )
    for size, reason in refusals:
        glob = "*" + "a" * (size - 1)
        refused = retrieve(sample_server, [{"field": "source", "op": "=", "value": glob}])
        assert refused.status_code == 422 and reason in refused.text, size
        assert len(refused.text) < 2000

    columns = MetadataColumns(
        [{"source": "docs/a.pdf"}, {"source": "docs/b.md"}], {"source": "string"}
    )
    before = fnmatch._compile_pattern.cache_info().currsize  # type: ignore[attr-defined]
    for n in range(50):
        glob = MetadataFilter(field="source", op="=", value=f"docs/*{n}*")
        columns.mask([glob])
    assert fnmatch._compile_pattern.cache_info().currsize == before  # type: ignore[attr-defined]
    pdf = MetadataFilter(field="source", op="=", value="docs/*.pdf")
    assert columns.mask([pdf]).tolist() == [True, False]


# ----------------------------------------------------------------------------- 3. 4xx, not 500
POST_ROUTES = [
    f"/{name}/{endpoint}"
    for name in ("chat", "ask", "rewrite", "retrieve")
    for endpoint in ("invoke", "batch", "stream", "stream_log", "stream_events")
] + ["/v1/chat/completions", "/feedback"]


def post_raw(
    url: str, path: str, content: bytes, content_type: str = "application/json"
) -> httpx.Response:
    return httpx.post(
        f"{url}{path}", content=content, headers={"Content-Type": content_type}, timeout=60
    )


Q = {"query": "x"}
HISTORY_NOT_A_TURN = "is not a turn of the conversation"


def turn_with(message: dict[str, object]) -> dict[str, object]:
    return {"input": {"question": "hi", "chat_history": [message]}}


def configured(**configurable: object) -> dict[str, object]:
    return {"input": Q, "config": {"configurable": configurable}}


@pytest.mark.parametrize(
    ("path", "body", "reason"),
    [
        ("/retrieve/batch", {"inputs": [{"query": ""}]}, "at least 1 character"),
        ("/ask/batch", {"inputs": [{"question": ""}]}, "at least 1 character"),
        ("/chat/batch", {"inputs": [{"question": "x", "chat_history": "no"}]}, "chat_history"),
        ("/retrieve/batch", {"inputs": None}, "inputs must be a list"),
        ("/retrieve/batch", {"inputs": 0}, "inputs must be a list"),
        ("/retrieve/batch", {"inputs": [None]}, "valid dictionary"),
        ("/retrieve/batch", {"inputs": {}}, "inputs must be a list"),
        ("/retrieve/invoke", {"input": Q, "config": None}, "config must be an object"),
        ("/retrieve/stream", {"input": Q, "config": None}, "config must be an object"),
        ("/retrieve/batch", {"inputs": [Q], "config": [None]}, "config must be an object"),
        ("/retrieve/invoke", {"input": Q, "kwargs": 1}, "kwargs must be an object"),
        ("/retrieve/invoke", {"input": Q, "prompt_version": "1; rm"}, "unknown key(s)"),
        ("/retrieve/invoke", {"input": {**Q, "prompt_version": "1; rm"}}, "Extra inputs"),
        ("/retrieve/invoke", {"input": Q, "config": {"prompt_version": "1"}}, "config key(s)"),
        ("/retrieve/invoke", configured(domain=["default"]), "domain"),
        ("/retrieve/invoke", configured(domain={"a": 1}), "domain"),
        ("/retrieve/invoke", configured(k="5"), "k: must be a number"),
        ("/retrieve/invoke", configured(k=True), "k: must be a number"),
        ("/retrieve/invoke", configured(threshold=-1), "threshold: Input should be greater"),
        ("/retrieve/invoke", configured(threshold=2), "threshold: Input should be less"),
        ("/ask/invoke", {"input": {"question": "\u0000"}}, "control characters"),
        ("/chat/invoke", turn_with({"type": "system", "content": "x"}), HISTORY_NOT_A_TURN),
        ("/chat/invoke", turn_with({"role": "tool", "content": "x"}), HISTORY_NOT_A_TURN),
        (
            "/chat/invoke",
            turn_with({"role": "user", "content": [{"type": "text", "text": "x"}]}),
            HISTORY_NOT_A_TURN,
        ),
    ],
)
def test_a_malformed_request_gets_422_with_its_reason(
    sample_server: str, path: str, body: object, reason: str
) -> None:
    reply = httpx.post(f"{sample_server}{path}", json=body, timeout=60)
    assert reply.status_code == 422, (reply.status_code, reply.text)
    assert reason in reply.text, reply.text


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_threshold_that_is_not_a_finite_number_is_refused(
    sample_server: str, number: str
) -> None:
    body = '{"input": {"query": "x"}, "config": {"configurable": {"threshold": NUMBER}}}'
    body = body.replace("NUMBER", number)
    assert post_raw(sample_server, "/retrieve/invoke", body.encode()).status_code == 422


@pytest.mark.parametrize("path", POST_ROUTES)
def test_bodies_that_are_not_utf8_or_nest_too_deep_get_400(sample_server: str, path: str) -> None:
    latin = post_raw(sample_server, path, '{"input": {"query": "caf\xe9"}}'.encode("latin-1"))
    assert latin.status_code == 400 and "UTF-8" in latin.text
    deep = post_raw(sample_server, path, b"[" * 1000 + b"]" * 1000)
    assert deep.status_code == 400 and "nests deeper" in deep.text


def test_playground_paths_that_are_no_file_get_404(sample_server: str) -> None:
    for path in (
        "/chat/playground/assets",
        "/chat/playground/assets/",
        "/chat/playground/%00",
        "/chat/playground/a%00b.js",
    ):
        assert httpx.get(f"{sample_server}{path}").status_code == 404, path
    assert httpx.get(f"{sample_server}/chat/playground/").status_code == 200


# ----------------------------------------------------------------------------- 5. Content-Type
@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/json; charset=latin-1",
    ],
)
@pytest.mark.parametrize(
    "path", ["/retrieve/invoke", "/chat/stream", "/v1/chat/completions", "/feedback"]
)
def test_a_body_that_is_not_json_by_its_type_gets_415(
    sample_server: str, path: str, content_type: str
) -> None:
    """A page on another origin can make a browser send text and form bodies without asking
    first: parsed as JSON, they ran the model with no key set."""
    message = {"role": "user", "content": "x"}
    body = json.dumps({"input": {"query": "x"}, "model": "default", "messages": [message]})
    reply = post_raw(sample_server, path, body.encode(), content_type)
    assert reply.status_code == 415 and "application/json" in reply.text


def test_a_body_without_a_type_gets_415_and_no_body_goes_on_to_its_route(
    sample_server: str,
) -> None:
    """No Content-Type is no JSON either; a request with no body at all has nothing to
    parse, so its route answers it (405 for a method it does not take, as OpenAPI
    clients expect, not 415)."""
    untyped = httpx.post(f"{sample_server}/retrieve/invoke", content=b'{"input": {}}')
    assert untyped.status_code == 415 and "application/json" in untyped.text
    for method, path, status in (
        ("PUT", "/chat/input_schema", 405),
        ("POST", "/healthz", 405),
        ("POST", "/retrieve/invoke", 422),
    ):
        reply = httpx.request(method, f"{sample_server}{path}")
        assert reply.status_code == status, (method, path, reply.text)


# ----------------------------------------------------------------------------- 8. HEAD, slow bodies
def test_health_checks_answer_head(sample_server: str) -> None:
    for path in ("/healthz", "/readyz"):
        reply = httpx.head(f"{sample_server}{path}")
        assert reply.status_code == 200, path
        assert reply.headers["content-type"] == "application/json"


JSON = [(b"content-type", b"application/json")]


def through_body_check(
    chunks: list[bytes], *, max_bytes: int = 100, timeout: float = 5.0, pause: float = 0.0
) -> tuple[int | None, bytes | None]:
    """``chunks`` sent as one request body (no Content-Length: as a chunked upload, each
    after ``pause`` seconds) through BodyLimits to a route that reads it whole: the status
    answered, and the body the route read (None when it read none)."""
    read: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        body, status = b"", 200
        try:
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client went away: nobody to answer
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            read.append(body)
        except HTTPException as exc:  # what FastAPI answers when reading a body raises it
            status = exc.status_code
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    messages = [
        {"type": "http.request", "body": chunk, "more_body": n < len(chunks) - 1}
        for n, chunk in enumerate(chunks)
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(pause)
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/retrieve/invoke", "headers": JSON}
    asyncio.run(BodyLimits(app, lambda path: max_bytes, timeout)(scope, receive, send))
    status = next((m["status"] for m in sent if m["type"] == "http.response.start"), None)
    return status, read[0] if read else None


def test_a_chunked_body_is_read_whole_bounded_and_handed_on() -> None:
    assert through_body_check([b'{"a": ', b"[1, 2]", b"}"]) == (200, b'{"a": [1, 2]}')
    assert through_body_check([b"[" + b"1," * 30, b"1," * 30, b"1]"]) == (413, None)


def test_the_body_timeout_is_for_the_whole_body_not_each_chunk() -> None:
    """A client sending a chunk just before each timeout would hold the request forever."""
    chunks = [b"[1", b",2", b",3", b",4", b"]"]
    assert through_body_check(chunks, timeout=0.5, pause=0.2) == (408, None)
    assert through_body_check(chunks, timeout=5.0, pause=0.01) == (200, b"[1,2,3,4]")


def test_a_client_that_goes_away_mid_body_gets_nothing_and_reaches_no_route() -> None:
    assert through_body_check([]) == (None, None)


def test_a_body_shorter_than_its_length_is_cut_off_with_408(
    serve_samples: Callable[..., AbstractContextManager[str]],
) -> None:
    with serve_samples(body_timeout=0.5) as base:
        where = urlsplit(base)
        with socket.create_connection((where.hostname, where.port), timeout=10) as conn:
            conn.sendall(
                b"POST /retrieve/invoke HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 100\r\n\r\n{"input":'
            )
            reply = b""
            while chunk := conn.recv(4096):  # the server closes the connection after it
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 408") and b"did not arrive within 0.5 seconds" in reply


_PRICES = {"field": "price", "op": "in", "value": list(range(1000))}
_LONG = "x " * 10_000
LARGE_BODIES = {
    "/retrieve/invoke": {"input": {"query": "auger", "filters": [_PRICES] * 5}},
    "/v1/chat/completions": {
        "model": "default",
        "messages": [{"role": "user", "content": _LONG}, {"role": "user", "content": "q"}],
    },
    "/rewrite/invoke": {
        "input": {
            "question": "and the premium?",
            "chat_history": [{"type": "human", "content": _LONG}, {"type": "ai", "content": "ok"}],
        }
    },
}


@pytest.mark.parametrize("path", list(LARGE_BODIES))
def test_a_large_body_is_parsed_once_through_the_real_app(sample_server: str, path: str) -> None:
    """A body is parsed once, by json_body, and its route (LangServe's handler, /v1) reads
    the value Starlette keeps: a 10,000-value filter list took half a millisecond of the
    event loop to parse, and was parsed twice (bench.hostile_filters)."""
    raw = json.dumps(LARGE_BODIES[path]).encode()
    assert len(raw) > 16_384
    parses: list[int] = []
    real_loads = json.loads

    def loads(text: Any, *args: Any, **kwargs: Any) -> Any:
        if len(text) == len(raw):
            parses.append(1)
        return real_loads(text, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(json, "loads", loads)
        reply = post_raw(sample_server, path, raw)
    assert reply.status_code in (200, 422), reply.text[:300]
    assert len(parses) == 1


# ============================================================================ issue 30
# One check reads every JSON body (serving.bodies) and refuses, with
# 400 and a reason that quotes nothing of the body, what no route can take.
HUGE = "1" + "0" * 5000  # past Python's int-conversion limit (4,300 digits)
UNFIT_BODIES = {
    "huge integer": (
        '{"input": {"query": "plan"}, "config": {"configurable": {"k": ' + HUGE + "}}}",
        "digits",
    ),
    "lone surrogate in a value": ('{"input": {"query": "plan cost \\ud800"}}', "surrogate"),
    "lone surrogate as a key": ('{"input": {"query": "x"}, "\\ud800": 1}', "surrogate"),
    "lone low surrogate deep down": ('{"a": [{"b": ["x", "\\uDC00y"]}]}', "surrogate"),
}


def _refused_with_400(reply: httpx.Response, path: str, word: str) -> None:
    assert reply.status_code == 400, (path, reply.status_code, reply.text[:300])
    reason = reply.json()["error"]["message"] if path.startswith("/v1/") else reply.json()["detail"]
    assert word in reason and "\n" not in reason, reason
    assert HUGE[:50] not in reply.text and "plan cost" not in reply.text  # nothing echoed


@pytest.mark.parametrize("case", list(UNFIT_BODIES))
@pytest.mark.parametrize("path", [*POST_ROUTES, "/mcp"])
def test_numbers_and_text_no_route_can_take_get_400_on_every_post_route(
    sample_server: str, path: str, case: str
) -> None:
    """Issue 30, case 1: a 5,001-digit integer was a 500 on every POST route ("Exceeds the
    limit (4300 digits)"); a lone surrogate escape a 500 wherever it reached a reply, a
    log line or the tokenizer."""
    body, word = UNFIT_BODIES[case]
    _refused_with_400(post_raw(sample_server, path, body.encode()), path, word)


@pytest.mark.parametrize("provider", ["embedded", "openai"])
def test_the_four_500s_of_issue_30_are_400s_with_either_model_provider(
    serve_samples: Callable[..., AbstractContextManager[str]],
    serve_upstream: Callable[..., AbstractContextManager[str]],
    provider: str,
) -> None:
    """Issue 30, case 1, as reported: each reproduction, on the routes it broke."""
    surrogate_turn = (
        '{"input": {"question": "and the premium?", "chat_history": '
        '[{"type": "human", "content": "plan cost \\ud800"}]}}'
    )
    surrogate_v1 = (
        '{"model": "default", "messages": [{"role": "user", "content": "plan cost \\ud800"}, '
        '{"role": "assistant", "content": "ok"}, {"role": "user", "content": "and?"}]}'
    )
    cases = [
        ("/chat/invoke", surrogate_turn, "surrogate"),
        ("/v1/chat/completions", surrogate_v1, "surrogate"),
        ("/retrieve/invoke", '{"input": {"query": "x"}, "\\ud800": 1}', "surrogate"),
        (
            "/retrieve/invoke",
            '{"input": {"query": "plan", "alternatives": ["\\ud800 plan"]}}',
            "surrogate",
        ),
        *((path, UNFIT_BODIES["huge integer"][0], "digits") for path in POST_ROUTES[::5]),
    ]
    server = serve_samples() if provider == "embedded" else serve_upstream()
    with server as base:
        for path, body, word in cases:
            _refused_with_400(post_raw(base, path, body.encode()), path, word)
        assert httpx.get(f"{base}/healthz").status_code == 200


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be"])
@pytest.mark.parametrize("path", ["/retrieve/invoke", "/v1/chat/completions", "/feedback", "/mcp"])
def test_a_utf16_or_utf32_body_without_a_bom_is_not_taken_for_json(
    sample_server: str, path: str, encoding: str
) -> None:
    """Issue 30, case 7 (one of its items): json.loads(bytes) guesses UTF-16 and UTF-32 from
    NUL bytes, and NUL-laden UTF-16LE is valid UTF-8: such a body was answered as JSON."""
    body = {
        "input": {"query": "plan"},
        "model": "default",
        "messages": [{"role": "user", "content": "plan"}],
    }
    reply = post_raw(sample_server, path, json.dumps(body).encode(encoding))
    assert reply.status_code == 400, (reply.status_code, reply.text[:300])
    assert "not UTF-8" in reply.text


def test_what_every_route_can_take_still_reaches_it(sample_server: str) -> None:
    """Malformed JSON stays the route's 422, naming where; a surrogate pair, an escaped
    backslash before 'ud800', a UTF-8 byte-order mark and a 4,300-digit integer parse."""
    for path in ("/retrieve/invoke", "/v1/chat/completions"):
        malformed = post_raw(sample_server, path, b'{"input": ')
        assert malformed.status_code == 422, (path, malformed.text)
    taken = [
        '{"input": {"query": "plan \\ud83d\\ude00"}}',
        '{"input": {"query": "plan \\\\ud800"}}',
        '\ufeff{"input": {"query": "plan"}}',
    ]
    for body in taken:
        reply = post_raw(sample_server, "/retrieve/invoke", body.encode())
        assert reply.status_code == 200, (body, reply.text[:300])
    limit = '{"input": {"query": "plan"}, "config": {"configurable": {"k": ' + "9" * 4300 + "}}}"
    within = post_raw(sample_server, "/retrieve/invoke", limit.encode())
    assert within.status_code == 422 and "k:" in within.text  # the route's own bound


def test_parsing_every_body_once_gives_the_routes_the_same_value() -> None:
    """What the body check takes is what json.loads(bytes) reads (Starlette, the MCP SDK):
    the same text parses, and malformed JSON is left to its route."""
    accented = '[1, {"\u00e9": "\u00e9"}]'.encode()
    taken = [b'{"a": [1, 2.5, "\\u00e9"]}', b'\xef\xbb\xbf{"a": 1}', accented, b'{"a": ']
    for body in taken:
        assert bodies.check_json_bytes(body) is None, body


# Issue 30, case 8: the smaller ones.
ODD_METHODS = ("TRACE", "CONNECT", "PUT", "DELETE", "PROPFIND")


def test_a_method_no_route_takes_is_405_not_401_with_a_key_set(
    serve_upstream: Callable[..., AbstractContextManager[str]],
) -> None:
    """Issue 30, case 8: with a key set, an unusual method got 401, a key no help to it;
    the router's 405 is the answer, on open paths and keyed ones alike."""
    paths = ["/healthz", "/readyz", "/", "/docs", "/openapi.json", "/favicon.ico"]
    paths += ["/v1/models", "/chat/invoke", "/retrieve/input_schema", "/feedback", "/metrics"]
    with serve_upstream(api_key=SecretStr("k30")) as base:
        for method in ODD_METHODS:
            for path in paths:
                reply = httpx.request(method, f"{base}{path}")
                assert reply.status_code == 405, (method, path, reply.status_code)
        # What a key would open still asks for one.
        assert httpx.get(f"{base}/v1/models").status_code == 401
        assert httpx.post(f"{base}/chat/invoke", json={"input": {}}).status_code == 401
        assert httpx.get(f"{base}/chat/playground/").status_code == 401
        assert httpx.request("TRACE", f"{base}/mcp").status_code == 401  # MCP's own methods
        # No route: nothing a key would open (and /openapi.json, open to all, lists them).
        assert httpx.request("TRACE", f"{base}/nowhere").status_code == 404


def test_a_feedback_store_503_does_not_show_the_servers_file(
    serve_upstream: Callable[..., AbstractContextManager[str]], tmp_path: Path
) -> None:
    folder = tmp_path / "secret-place" / "votes"
    folder.mkdir(parents=True)
    vote = {"run_id": "0b6f3c3e-9a51-4e3f-8c7e-2f1f5d1c9a10", "score": 1, "question": "q?"}
    with serve_upstream(feedback_db=folder) as base:
        reply = httpx.post(f"{base}/feedback", json=vote)
    assert reply.status_code == 503
    assert "secret-place" not in reply.text and str(tmp_path) not in reply.text
    assert "server log" in reply.json()["detail"]


def test_a_stream_cut_short_leaves_no_stage_failing_unseen() -> None:
    """Issue 30, case 8: "Task exception was never retrieved … KeyError: 'retrieved'" in the
    server log. A client that goes away mid-stream cancels the run; LangChain's
    RunnableAssign leaves its mapper's task running on the state cut short
    (langchain-ai/langchain#40508), and the compress stage read a key that never came.
    Every point of a short stream is cut here, through astream and astream_events."""

    async def search(query: str) -> list[Document]:
        await asyncio.sleep(0)
        return [Document(f"{query} {n}", id=str(n)) for n in range(3)]

    chain = create_retrieve_chain(retriever=RunnableLambda(lambda q: [], afunc=search))
    ours = str(Path(create_retrieve_chain.__code__.co_filename).parent)
    unseen: list[str] = []

    def report(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        frames = traceback.extract_tb(error.__traceback__) if error is not None else []
        if any(frame.filename.startswith(ours) for frame in frames):
            unseen.append(f"{error!r} in {frames[-1].filename}:{frames[-1].lineno}")

    async def consume(kind: str) -> None:
        inputs = {"query": "plan"}
        stream: Any = (
            chain.astream(inputs)
            if kind == "astream"
            else chain.astream_events(inputs, version="v2")
        )
        async for _ in stream:
            pass

    async def cut_everywhere() -> None:
        asyncio.get_running_loop().set_exception_handler(report)
        for kind in ("astream", "astream_events"):
            for steps in range(120):
                task = asyncio.create_task(consume(kind))
                for _ in range(steps):
                    await asyncio.sleep(0)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                for _ in range(20):  # the orphaned tasks finish
                    await asyncio.sleep(0)
                gc.collect()  # and report what nobody retrieved

    # What this process holds already (models, indexes: millions of objects) is frozen, as
    # the server freezes it: each full collection then scans only what the cuts left, in
    # milliseconds rather than most of a second, 240 times.
    gc.collect()
    gc.freeze()
    try:
        asyncio.run(cut_everywhere())
        gc.collect()
    finally:
        gc.unfreeze()
    assert not unseen, unseen[:3]


# Issue 30, case 6, with cases 1 and 8 where users meet them: `ragchains serve`.
def _closed_by(conn: socket.socket, deadline: float) -> bytes | None:
    """What the server sent before closing ``conn``, or None when it was still open at
    ``deadline`` (time.monotonic())."""
    conn.settimeout(max(deadline - time.monotonic(), 0.01))
    got = b""
    try:
        while chunk := conn.recv(4096):
            got += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return got


def test_ragchains_serve_closes_connections_that_never_finish_their_headers(
    sample_index: Path, upstream: FakeOpenAI
) -> None:
    """1,000 connections that never finished their headers were all still open after 65 s
    under `ragchains serve`. Now each is closed after RAGCHAINS_HEADER_TIMEOUT (408 to one
    that began a request), while the server answers everyone else."""
    env = {
        "RAGCHAINS_HEADER_TIMEOUT": "2",
        "RAGCHAINS_API_KEY": "k30",
        "RAGCHAINS_LLM_PROVIDER": "openai",
        "RAGCHAINS_OPENAI_BASE_URL": upstream.base_url,
        "RAGCHAINS_OPENAI_API_KEY": "upstream-key",
    }
    with ragchains_serve("--index", str(sample_index), **env) as base:
        where = urlsplit(base)
        address = (where.hostname, where.port)
        slow = [socket.create_connection(address, timeout=10) for _ in range(200)]
        for conn in slow:
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        silent = [socket.create_connection(address, timeout=10) for _ in range(20)]
        # Kept alive after a reply, then the next request's headers never end.
        kept = socket.create_connection(address, timeout=10)
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while not first.endswith(b"}"):  # the reply's head, then its JSON body
            first += kept.recv(4096)
        assert first.startswith(b"HTTP/1.1 200")
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHo")
        started = time.monotonic()
        for _ in range(5):  # the server answers meanwhile
            assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
        # Within the deadline plus a generous margin for a shared machine.
        deadline = started + 25
        endings = [_closed_by(conn, deadline) for conn in [*slow, kept]]
        quiet = [_closed_by(conn, deadline) for conn in silent]
        for conn in [*slow, *silent, kept]:
            conn.close()
        unended = [end for end in endings if not (end or b"").startswith(b"HTTP/1.1 408")]
        assert not unended, unended[:3]  # None: still open at the deadline
        assert b"did not arrive within 2 seconds" in (endings[0] or b"")
        assert quiet == [b""] * len(silent)  # closed without a word: nothing was asked
        assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
        # A request answered before its body arrived (401: no key), the body after: the
        # connection stays kept alive for the next request, with no 408 nobody asked for.
        early = socket.create_connection(address, timeout=10)
        early.sendall(
            b"POST /retrieve/invoke HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n"
        )
        refused = _reply(early)
        assert refused.startswith(b"HTTP/1.1 401"), refused
        early.sendall(b"{}")
        time.sleep(2 * 2)  # twice the header deadline
        early.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        again = _reply(early)
        early.close()
        assert again.startswith(b"HTTP/1.1 200"), again
        # Case 1 and case 8 on the served process.
        body = UNFIT_BODIES["huge integer"][0].encode()
        keyed = {"X-API-Key": "k30", "Content-Type": "application/json"}
        huge = httpx.post(f"{base}/retrieve/invoke", content=body, headers=keyed)
        assert huge.status_code == 400 and "digits" in huge.text
        # Case 2 on the served process: 16 lists of 1,000 globs are refused at once.
        globs = httpx.post(
            f"{base}/retrieve/invoke", json=hostile_body(), headers={"X-API-Key": "k30"}
        )
        assert globs.status_code == 422 and "glob patterns" in globs.text
        assert httpx.request("TRACE", f"{base}/healthz").status_code == 405
        assert httpx.request("TRACE", f"{base}/v1/models").status_code == 405


def _reply(conn: socket.socket) -> bytes:
    """One reply read from ``conn``: its head, then as many bytes as its Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(4096)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"content-length: (\d+)", head, re.IGNORECASE)[1])  # type: ignore[index]
    while len(body) < length:
        body += conn.recv(4096)
    return head + b"\r\n\r\n" + body


def test_serve_help_names_the_header_timeout() -> None:
    shown = subprocess.run(
        [str(RAGCHAINS), "serve", "--help"], capture_output=True, text=True, check=True
    )
    assert "RAGCHAINS_HEADER_TIMEOUT" in shown.stdout
