"""The HTTP service when things go wrong upstream, and its access checks.

The app runs under uvicorn on a free port with the openai provider pointed at a stand-in
upstream (tests/servers.py) that can be told to fail or stall; an API key and CORS are on.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import openai
import pytest
from langserve import RemoteRunnable
from pydantic import SecretStr

from tests.servers import FakeOpenAI

pytestmark = pytest.mark.slow

QUESTION = "what does the standard plan cost?"
KEY = "s3cret-key"


@pytest.fixture(scope="module")
def guarded_url(serve_upstream: Callable[..., AbstractContextManager[str]]) -> Iterator[str]:
    """The openai provider against the stand-in upstream, with a key and CORS (and no key
    for the upstream: its default must never reach a log)."""
    with serve_upstream(
        openai_model="ok-main",
        openai_api_key=None,
        llm_timeout=0.5,
        api_key=SecretStr(KEY),
        cors_origins=["http://app.example"],
    ) as base:
        yield base


def test_api_key_is_required_except_for_health_checks(guarded_url: str) -> None:
    body = {"input": {"query": "standard plan"}}
    assert httpx.post(f"{guarded_url}/retrieve/invoke", json=body).status_code == 401
    wrong = httpx.post(f"{guarded_url}/retrieve/invoke", json=body, headers={"X-API-Key": "no"})
    assert wrong.status_code == 401 and "API key" in wrong.json()["detail"]
    right = httpx.post(f"{guarded_url}/retrieve/invoke", json=body, headers={"X-API-Key": KEY})
    assert right.status_code == 200
    assert httpx.get(f"{guarded_url}/healthz").status_code == 200
    assert httpx.get(f"{guarded_url}/readyz").status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{guarded_url}/v1", api_key="wrong").models.list()
    assert openai.OpenAI(base_url=f"{guarded_url}/v1", api_key=KEY).models.list().data


def test_cors_preflight_for_an_allowed_origin(guarded_url: str) -> None:
    headers = {
        "Origin": "http://app.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,x-api-key",
    }
    allowed = httpx.options(f"{guarded_url}/chat/invoke", headers=headers)
    assert allowed.headers["access-control-allow-origin"] == "http://app.example"
    other = httpx.options(
        f"{guarded_url}/chat/invoke", headers={**headers, "Origin": "http://evil"}
    )
    assert "access-control-allow-origin" not in other.headers


def ask(base: str) -> httpx.Response:
    return httpx.post(
        f"{base}/ask/invoke", json={"input": {"question": QUESTION}}, headers={"X-API-Key": KEY}
    )


def streamed_error(base: str) -> httpx.HTTPStatusError:
    """What RemoteRunnable raises when an /ask stream fails (its status is already sent:
    the error event carries the real one)."""
    remote = RemoteRunnable(f"{base}/ask/", headers={"X-API-Key": KEY})
    with pytest.raises(httpx.HTTPStatusError) as streamed:
        list(remote.stream({"question": QUESTION}))
    return streamed.value


def sdk_stream_status(base: str) -> int:
    """The status the OpenAI SDK raises for a failed streamed /v1 chat completion."""
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.APIStatusError) as sdk:
        client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": QUESTION}], stream=True
        )
    return sdk.value.status_code


def last_failure(base: str) -> str:
    return str(httpx.get(f"{base}/readyz").json()["llm"]["last_failure"]["message"])


def test_failing_llm_is_502_and_the_next_request_is_served(
    guarded_url: str, upstream: FakeOpenAI
) -> None:
    upstream.behave_as = "down"
    try:
        failed = ask(guarded_url)
        assert failed.status_code == 502
        assert failed.json() == {"detail": "the chat model's server failed (503)"}
        assert streamed_error(guarded_url).response.status_code == 502
        assert sdk_stream_status(guarded_url) == 502
        assert "503" in last_failure(guarded_url)
    finally:
        upstream.behave_as = None
    served = ask(guarded_url)
    assert served.status_code == 200
    assert served.json()["output"]["answer"].strip() == "answer from ok-main"


@pytest.mark.parametrize("behaviour", ["garbled", "hollow"])
def test_an_upstream_200_that_is_no_chat_completion_is_502_and_recorded(
    guarded_url: str, upstream: FakeOpenAI, behaviour: str
) -> None:
    """An HTML page (a proxy's login) or JSON without choices, answered 200: it was a 500."""
    upstream.behave_as = behaviour
    try:
        plain = ask(guarded_url)
        assert plain.status_code == 502
        assert "not a chat completion" in plain.json()["detail"]
        assert sdk_stream_status(guarded_url) == 502
        assert "not a chat completion" in last_failure(guarded_url)
    finally:
        upstream.behave_as = None


def test_an_upstream_error_that_echoes_credentials_reaches_no_caller(
    guarded_url: str, upstream: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    """An upstream 401 echoing 'Authorization: Bearer ...' reached the caller and /readyz
    (which needs no key): callers get the status and what it means, the log the rest with
    the credential masked."""
    upstream.behave_as = "leaky"
    try:
        with caplog.at_level(logging.WARNING, logger="ragchains.server"):
            plain = ask(guarded_url)
            streamed = streamed_error(guarded_url)
        ready = httpx.get(f"{guarded_url}/readyz").text
    finally:
        upstream.behave_as = None
    assert plain.status_code == 502
    assert plain.json() == {
        "detail": "the chat model's server refused the server's credentials (401)"
    }
    said = [plain.text, streamed.response.text, str(streamed), ready]
    assert not [text for text in said if "Bearer" in text or "bad credentials" in text]
    logged = [r.getMessage() for r in caplog.records if "bad credentials" in r.getMessage()]
    assert logged and all("Bearer ***" in line for line in logged)
    assert not [line for line in logged if "not-needed" in line]  # the key the server sent


def test_llm_timeout_is_504(guarded_url: str, upstream: FakeOpenAI) -> None:
    upstream.behave_as = "slow"
    try:
        response = httpx.post(
            f"{guarded_url}/chat/invoke",
            json={"input": {"question": QUESTION}},
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=30,
        )
    finally:
        upstream.behave_as = None
    assert response.status_code == 504
    assert json.loads(response.text)["detail"] == "the chat model did not answer in time"


def test_an_index_file_found_damaged_by_a_query_is_503_and_the_log_names_it(
    serve_samples: Callable[..., AbstractContextManager[str]],
    sample_index: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Damage after the load (a stray write to chunks.sqlite) reaches the first query that
    reads it: a 503 saying the index cannot be read, the file named in the log only."""
    index = tmp_path / "idx"
    shutil.copytree(sample_index, index)
    with serve_samples(index=index) as base:
        body = {"input": {"query": "soil moisture sensor"}}
        assert httpx.post(f"{base}/retrieve/invoke", json=body).status_code == 200
        chunks = next(index.glob("gen-*")) / "chunks.sqlite"
        chunks.write_bytes(b"\xff" * chunks.stat().st_size)  # every page garbage
        with caplog.at_level(logging.WARNING, logger="ragchains.server"):
            damaged = httpx.post(f"{base}/retrieve/invoke", json={"input": {"query": "auger"}})
    assert damaged.status_code == 503, damaged.text
    assert damaged.json() == {"detail": "the index cannot be read; the server log has the details"}
    assert "chunks.sqlite" in caplog.text
