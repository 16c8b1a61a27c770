"""The server on the PostgreSQL store, over HTTP: one app in-process, then two `ragchains
serve` processes on one database while `ragchains ingest` writes to it."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from tests.postgres import LocalPostgres
from tests.servers import ragchains_serve, wait_until
from tests.test_cli import run

pytestmark = pytest.mark.e2e

Serve = Callable[..., AbstractContextManager[str]]  # the conftest's serve_samples

QUESTION = "What does the standard health plan cost?"


def version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:2])


def with_password(url: str) -> str:
    """The same store with a password in its URL (the test server trusts local users, so it
    is accepted and ignored): what /readyz must never show."""
    return url.replace("postgresql://postgres@", "postgresql://postgres:s3cret-pw@")


def test_the_server_answers_from_the_store(sample_store: str, serve_samples: Serve) -> None:
    with serve_samples(store=with_password(sample_store)) as base:
        ready = httpx.get(f"{base}/readyz", timeout=30)
        assert ready.status_code == 200 and "s3cret" not in ready.text
        index = ready.json()["index"]
        assert index["kind"] == "postgresql" and index["chunks"] == 81
        assert index["server_version"].startswith("18") and version(index["pgvector_version"]) >= (
            0,
            8,
        )
        assert index["url"].startswith("postgresql://postgres:***@127.0.0.1:")

        cheap = {"field": "price", "op": "<", "value": 50}
        found = httpx.post(
            f"{base}/retrieve/invoke",
            # The catalog domain's cut suits short product rows (see test_server).
            json={
                "input": {"query": "sensors", "filters": [cheap]},
                "config": {"configurable": {"domain": "catalog"}},
            },
            timeout=60,
        )
        assert found.status_code == 200, found.text
        documents = found.json()["output"]
        assert documents and all(d["metadata"]["price"] < 50 for d in documents)

        bad = httpx.post(
            f"{base}/retrieve/invoke",
            json={"input": {"query": "sensors", "filters": [{**cheap, "value": "cheap"}]}},
            timeout=60,
        )
        assert bad.status_code == 422 and "expected a number" in bad.text

        asked = httpx.post(
            f"{base}/ask/invoke", json={"input": {"question": QUESTION}}, timeout=120
        )
        assert asked.status_code == 200, asked.text
        labels = [s["label"] for s in asked.json()["output"]["sources"]]
        assert "employee-handbook.md#benefit-plans" in labels

        client = OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=120)
        reply = client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": QUESTION}]
        )
        assert reply.choices[0].message.content


def retrieved(base: str, query: str) -> list[str]:
    reply = httpx.post(f"{base}/retrieve/invoke", json={"input": {"query": query}}, timeout=60)
    assert reply.status_code == 200, reply.text
    return [d["metadata"]["citation"] for d in reply.json()["output"]]


def test_two_servers_on_one_database_see_one_ingest(
    postgres: LocalPostgres, pg_url: str, docs_dir: Path
) -> None:
    url = with_password(pg_url)

    def ingest(*paths: Path) -> None:
        result = run("ingest", *paths, "--store", url, "--quiet")
        assert result.returncode == 0, result.stderr
        assert "s3cret" not in result.stdout + result.stderr

    ingest(docs_dir)
    with ragchains_serve("--store", url) as first, ragchains_serve("--store", url) as second:
        question = "When do the drip lines run?"
        assert retrieved(first, question) == retrieved(second, question) != []

        (docs_dir / "irrigation.md").write_text(
            "# Drip irrigation\n\nZorblatt drip lines water each tomato plant at its roots.\n"
        )
        ingest(docs_dir)  # while both serve: no restart, no reload call
        query = "Zorblatt drip lines water each tomato plant"
        wait_until(
            lambda: (
                [retrieved(base, query)[:1] for base in (first, second)]
                == [["irrigation.md#drip-irrigation"]] * 2
            ),
            "both servers showing the new file",
            every=0.5,
        )
        for base in (first, second):
            ready = httpx.get(f"{base}/readyz", timeout=30)
            assert "s3cret" not in ready.text
            assert ready.json()["index"]["generation"] == 2


def test_eval_retrieval_runs_on_the_store(pg_url: str, tmp_path: Path) -> None:
    from ragchains.evaluation.runs import load_run
    from tests.conftest import FIXTURES

    beir, out = FIXTURES / "eval" / "beir-mini", tmp_path / "runs"
    url = with_password(pg_url)
    args = ("eval", "retrieval", "--dataset", beir, "--store", url, "--out", out, "-q")
    first = run(*args, "--retriever", "bm25", "--retriever", "dense", "--retriever", "hybrid")
    assert first.returncode == 0, first.stderr
    assert "writing the corpus to the store" in first.stderr
    for name in ("bm25", "dense", "hybrid"):
        found = load_run(out / name)
        assert [i["id"] for i in found.items()] == ["q1", "q2", "q3", "q4"]
        assert found.config["documents"] == 8 and "s3cret" not in json.dumps(found.config)
        assert found.config["index"].startswith("postgresql://postgres:***@")
    assert load_run(out / "bm25").config["store"] == "postgresql"
    # Each query has a judged document that shares its words: every half finds something.
    for name in ("bm25", "dense", "hybrid"):
        assert all(i["ndcg@10"] > 0 for i in load_run(out / name).items()), name
    again = run(*args[:-3], "--out", tmp_path / "again", "-q", "--retriever", "hybrid")
    assert again.returncode == 0 and "reusing the store" in again.stderr, again.stderr
    assert "s3cret" not in first.stderr + again.stderr


def test_the_command_line_reads_the_store(sample_store: str) -> None:
    found = run(
        "retrieve", "sensors", "--store", sample_store, "--filter", "price", "<", "50", "--json"
    )
    assert found.returncode == 0, found.stderr
    out = json.loads(found.stdout)
    assert out["filters"] == [{"field": "price", "op": "<", "value": 50}]
    assert out["results"] and all("#row=" in r["citation"] for r in out["results"])
    bad = run("retrieve", "sensors", "--store", sample_store, "--filter", "colour", "=", "red")
    assert bad.returncode != 0 and "unknown filter field 'colour'" in bad.stderr
    missing = run("retrieve", "sensors", "--store", sample_store.replace("samples", "none"))
    assert missing.returncode != 0 and "no ragchains store" in missing.stderr


def test_a_server_reads_a_replica_while_ingestion_writes_to_the_primary(
    postgres: LocalPostgres, pg_url: str, docs_dir: Path
) -> None:
    assert run("ingest", docs_dir, "--store", pg_url, "-q").returncode == 0
    standby = postgres.replica()
    try:
        replica_url = pg_url.replace(f":{postgres.port}/", f":{standby.port}/")
        refused = run("ingest", docs_dir, "--store", replica_url, "--rebuild", "-q")
        assert refused.returncode != 0 and "read-only replica" in refused.stderr
        with ragchains_serve("--store", replica_url) as base:
            ready = httpx.get(f"{base}/readyz", timeout=30).json()["index"]
            assert ready["replica"] is True and ready["generation"] == 1
            assert retrieved(base, "When do the drip lines run?")
            # Conversations cannot be kept on a replica: refused, and the server still up.
            kept = httpx.post(f"{base}/conversations", json={}, timeout=30)
            assert kept.status_code == 503 and "cannot be read or stored" in kept.text
            (docs_dir / "irrigation.md").write_text(
                "# Drip irrigation\n\nZorblatt drip lines water each tomato plant at its roots.\n"
            )
            assert run("ingest", docs_dir, "--store", pg_url, "-q").returncode == 0
            query = "Zorblatt drip lines water each tomato plant"
            wait_until(
                lambda: retrieved(base, query)[:1] == ["irrigation.md#drip-irrigation"],
                "the replica showing the new file",
                every=0.5,
            )
    finally:
        standby.stop()


def test_a_store_that_goes_away_is_a_503_not_a_500(
    docs_dir: Path, ingest_into: Any, serve_samples: Serve
) -> None:
    from tests.postgres import local_postgres

    with local_postgres() as own:
        ingest_into(docs_dir, own.url)
        with serve_samples(store=own.url) as base:
            assert retrieved(base, "When do the drip lines run?")
            own.stop()  # the database goes away under a running server
            reply = httpx.post(
                f"{base}/retrieve/invoke", json={"input": {"query": "drip lines"}}, timeout=60
            )
            assert reply.status_code == 503, reply.text
            assert "document store cannot be reached" in reply.json()["detail"]
            ready = httpx.get(f"{base}/readyz", timeout=60)
            assert ready.status_code == 503 and ready.json()["ready"] is False
