"""`ragchains serve` follows ingests while it runs, as a user runs it: the command in a
subprocess, `ragchains ingest` in another, no restart (issue 24: `serve` built its service
another way than the tests did, and never served a new ingest or a relabel).

For an index folder and for a PostgreSQL store: a new document is found, a new filterable
field is accepted and filters, and a file relabelled for another group is hidden from a
key that could read it, each within 5 s of the ingest's commit.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from ragchains.serving.keys import add_key
from tests.conftest import FIXTURES
from tests.servers import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RAGCHAINS = Path(sys.executable).parent / "ragchains"
SERVED_WITHIN = 5.0  # seconds from an ingest's commit to the server answering from it
NEW_DOC = (
    "# Zanzibarite\n\nZanzibarite is a blue mineral the greenhouse uses as a humidity "
    "indicator; the kit costs 12 dollars.\n"
)
NEW_ROWS = "name,price,warranty_years\nMoisture meter,31,3\nPruning saw,19,1\n"
QUERY = "zanzibarite blue mineral humidity indicator"


def _env(**extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAGCHAINS_")}
    return {**clean, **extra}


def ingest(docs: Path, target: list[str], *more: str) -> None:
    """`ragchains ingest` as a user runs it; returns once it has committed."""
    result = subprocess.run(
        [str(RAGCHAINS), "ingest", str(docs), *target, *more],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def ragchains_serve(target: list[str], keys: Path) -> Iterator[str]:
    """`ragchains serve` in a subprocess until the block ends; yields its base URL."""
    port = _free_port()
    server = subprocess.Popen(
        [str(RAGCHAINS), "serve", *target, "--port", str(port)],
        env=_env(RAGCHAINS_KEYS_FILE=str(keys)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert server.poll() is None, server.stdout.read() if server.stdout else ""
        try:
            return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(up, "ragchains serve answering /healthz", timeout=180, every=0.5)
        yield base
    finally:
        server.send_signal(signal.SIGINT)  # Ctrl-C, as a user stops it
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _found(base: str, key: str, query: str, filters: list[dict[str, Any]] | None = None) -> Any:
    """``POST /retrieve/invoke`` with ``key``: the reply."""
    body = {"input": {"query": query, "filters": filters or []}}
    return httpx.post(f"{base}/retrieve/invoke", json=body, headers={"X-API-Key": key}, timeout=60)


def _sources(reply: Any) -> set[str]:
    assert reply.status_code == 200, reply.text
    return {str(doc["metadata"].get("source", "")) for doc in reply.json()["output"]}


def _served_within(what: str, check: Any) -> None:
    """``check`` holds within ``SERVED_WITHIN`` seconds of now (the ingest just committed)."""
    since = time.monotonic()
    wait_until(check, what, timeout=SERVED_WITHIN, every=0.1)
    assert time.monotonic() - since <= SERVED_WITHIN + 1


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    target = tmp_path / "docs"
    shutil.copytree(FIXTURES / "docs", target)
    return target


@pytest.fixture(params=["folder", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    if request.param == "folder":
        return ["--index", str(tmp_path / "index")]
    return ["--store", request.getfixturevalue("pg_url")]


def test_serve_serves_each_ingest_committed_while_it_runs(
    docs: Path, target: list[str], tmp_path: Path
) -> None:
    keys = tmp_path / "keys.toml"
    hr, eng = add_key(keys, "hana", ["hr"]), add_key(keys, "erik", ["eng"])
    ingest(docs, target)
    with ragchains_serve(target, keys) as base:
        assert not any(s.endswith("zanzibarite.md") for s in _sources(_found(base, hr, QUERY)))

        # A new document, and a table with a new numeric field.
        (docs / "zanzibarite.md").write_text(NEW_DOC, encoding="utf-8")
        (docs / "meters.csv").write_text(NEW_ROWS, encoding="utf-8")
        ingest(docs, target)

        # The new field first: a request refused at validation runs no search, so only
        # the server's own following of the store can make the field known.
        warranty = [{"field": "warranty_years", "op": ">=", "value": 3}]

        def filters_on_the_new_field() -> bool:
            reply = _found(base, eng, "moisture meter", warranty)
            return reply.status_code == 200 and bool(reply.json()["output"])

        _served_within("a filter on the new field", filters_on_the_new_field)

        def finds_the_new_document() -> bool:
            return any(s.endswith("zanzibarite.md") for s in _sources(_found(base, hr, QUERY)))

        _served_within("the new document found", finds_the_new_document)
        rows = _found(base, eng, "moisture meter", warranty).json()["output"]
        assert {doc["metadata"]["source"] for doc in rows} == {"docs/meters.csv"}
        assert all(doc["metadata"]["warranty_years"] >= 3 for doc in rows)

        # The new document relabelled for another group: hidden from both keys at once.
        ingest(docs, target, "--access", "docs/zanzibarite.md=exec")

        def hidden_from_both() -> bool:
            return not any(
                s.endswith("zanzibarite.md")
                for key in (hr, eng)
                for s in _sources(_found(base, key, QUERY))
            )

        _served_within("the relabelled document hidden", hidden_from_both)
