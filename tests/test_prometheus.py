"""GET /metrics of `ragchains serve` run as a user runs it: scraped before and after a few
requests and parsed with prometheus_client's own parser, each counter moved as the requests
should move it; behind the key unless RAGCHAINS_METRICS_PUBLIC opens it; labels of bounded
cardinality; the ingest runs of another process counted from what they leave in the index.

The chat model is an OpenAI-compatible upstream in this process (tests/servers.FakeOpenAI),
which the tests break or slow for the model failures.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ragchains.factory import run_ingest
from ragchains.observability.metrics import index_generation, ingest_log, requery_outcome
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.pgstore import PostgresStore
from ragchains.settings import Settings
from tests.servers import FakeOpenAI, ragchains_serve, wait_until

pytestmark = pytest.mark.slow

KEY = "metrics-key"
HEADERS = {"X-API-Key": KEY}
QUESTION = "What does the standard plan cost?"
UNANSWERABLE = "What is the capital of Mongolia?"
REPO = Path(__file__).resolve().parent.parent

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(base: str, headers: dict[str, str] | None = None) -> Samples:
    """Every sample of /metrics, by name and labels (checked to parse as Prometheus text)."""
    reply = httpx.get(f"{base}/metrics", headers=HEADERS if headers is None else headers)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(reply.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def label_values(samples: Samples, name: str, label: str) -> set[str]:
    return {dict(labels)[label] for (sample, labels) in samples if sample == name}


def serve_env(upstream: FakeOpenAI, tmp: Path, **extra: str) -> dict[str, str]:
    return {
        "RAGCHAINS_LLM_PROVIDER": "openai",
        "RAGCHAINS_OPENAI_BASE_URL": upstream.base_url,
        "RAGCHAINS_OPENAI_MODEL": "ok-main",
        "RAGCHAINS_LLM_MAX_RETRIES": "0",
        "RAGCHAINS_LLM_TIMEOUT": "1",  # the upstream's "slow" takes 1.5 s
        "RAGCHAINS_FEEDBACK_DB": str(tmp / "feedback.sqlite"),
        **extra,
    }


@pytest.fixture(scope="module")
def keyed(
    sample_index: Path, upstream: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """`ragchains serve` over the samples with an API key; yields its base URL."""
    tmp = tmp_path_factory.mktemp("metrics")
    env = serve_env(upstream, tmp, RAGCHAINS_API_KEY=KEY)
    with ragchains_serve("--index", str(sample_index), **env) as base:
        yield base


def post(base: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{base}{path}", json=body, headers=HEADERS, timeout=120)


def test_each_counter_moves_as_the_requests_say(keyed: str, upstream: FakeOpenAI) -> None:
    before = scrape(keyed)

    abstained = post(keyed, "/chat/invoke", {"input": {"question": UNANSWERABLE}})
    assert abstained.status_code == 200, abstained.text
    turn = abstained.json()["output"]
    assert turn["abstained"] is True
    answered = post(keyed, "/ask/invoke", {"input": {"question": QUESTION}})
    assert answered.status_code == 200, answered.text
    sources = len(answered.json()["output"]["sources"])
    retrieved = post(keyed, "/retrieve/invoke", {"input": {"query": QUESTION}})
    assert retrieved.status_code == 200, retrieved.text
    documents = len(retrieved.json()["output"])
    assert sources and documents
    assert post(keyed, "/ask/invoke", {"input": {"question": ""}}).status_code == 422
    failed: dict[str, int] = {}
    for behaviour in ("down", "slow"):
        upstream.behave_as = behaviour
        try:
            failed[behaviour] = post(
                keyed, "/ask/invoke", {"input": {"question": QUESTION}}
            ).status_code
        finally:
            upstream.behave_as = None
    assert failed["slow"] == 504 and failed["down"] >= 500, failed
    for score in (1, 0):
        vote = {
            "run_id": str(uuid.uuid4()),
            "score": score,
            "mode": "ask",
            "domain": "default",
            "question": QUESTION,
            "answer": "It costs $45.00.",
        }
        assert post(keyed, "/feedback", vote).status_code == 201

    after = scrape(keyed)
    requests = "ragchains_http_requests_total"
    assert moved(before, after, requests, route="/chat/invoke", method="POST", status="200") == 1
    assert moved(before, after, requests, route="/ask/invoke", method="POST", status="200") == 1
    assert moved(before, after, requests, route="/ask/invoke", method="POST", status="422") == 1
    assert moved(before, after, requests, route="/ask/invoke", method="POST", status="504") == 1
    down = str(failed["down"])
    assert moved(before, after, requests, route="/ask/invoke", method="POST", status=down) == 1
    assert moved(before, after, requests, route="/feedback", method="POST", status="201") == 2
    # The scrape before this one: /metrics counts itself too.
    assert moved(before, after, requests, route="/metrics", method="GET", status="200") == 1
    latency = "ragchains_http_request_duration_seconds_count"
    assert moved(before, after, latency, route="/ask/invoke") == 4

    assert moved(before, after, "ragchains_abstentions_total", chain="chat") == 1
    assert moved(before, after, "ragchains_abstentions_total", chain="ask") == 0
    assert moved(before, after, "ragchains_turns_total", chain="chat") == 1
    assert moved(before, after, "ragchains_turns_total", chain="ask") == 1  # failed ones not
    assert moved(before, after, "ragchains_chunks_served_total", chain="ask") == sources
    assert moved(before, after, "ragchains_chunks_served_total", chain="chat") == 0
    assert moved(before, after, "ragchains_chunks_served_total", chain="retrieve") == documents
    assert moved(before, after, "ragchains_model_errors_total", kind="error") == 1
    assert moved(before, after, "ragchains_model_errors_total", kind="timeout") == 1
    assert moved(before, after, "ragchains_feedback_total", vote="up") == 1
    assert moved(before, after, "ragchains_feedback_total", vote="down") == 1

    # The chat turn's re-query, if its first results were weak, counted by outcome.
    requeried = {
        outcome: moved(before, after, "ragchains_requeries_total", outcome=outcome)
        for outcome in ("adopted", "rejected", "refused", "unusable")
    }
    report = turn["requery"]
    assert sum(requeried.values()) == (1 if turn["requeried"] else 0)
    if report is not None:
        assert requeried[requery_outcome(report)] == 1

    stages = "ragchains_stage_duration_seconds_count"
    for stage in ("rewrite", "retrieve", "compress", "requery", "answer"):
        assert moved(before, after, stages, chain="chat", stage=stage) == 1, stage
    for stage in ("retrieve", "compress", "answer"):  # the failed runs' stages too
        assert moved(before, after, stages, chain="ask", stage=stage) >= 1, stage
    assert moved(before, after, stages, chain="ask", stage="rewrite") == 0
    assert moved(before, after, stages, chain="retrieve", stage="retrieve") == 1
    assert moved(before, after, stages, chain="retrieve", stage="compress") == 1

    ready = httpx.get(f"{keyed}/readyz").json()
    fallback = 1.0 if ready["compressor"]["fallback"] else 0.0
    assert value(after, "ragchains_reranker_fallback") == fallback
    assert value(after, "ragchains_index_generation") == 1
    assert value(after, "ragchains_index_age_seconds") >= 0
    assert ("ragchains_index_age_seconds", ()) in after
    assert value(after, "ragchains_ingest_runs_total") == 1  # the session's sample ingest
    assert value(after, "ragchains_ingest_skipped_files_total") == 0


def test_metrics_need_the_key_and_keep_labels_bounded(keyed: str) -> None:
    assert httpx.get(f"{keyed}/metrics").status_code == 401
    assert httpx.get(f"{keyed}/metrics", headers={"X-API-Key": "wrong"}).status_code == 401
    assert httpx.head(f"{keyed}/metrics", headers=HEADERS).status_code == 200
    for n in range(3):
        assert httpx.get(f"{keyed}/no/such/{n}", headers=HEADERS).status_code == 404
        assert httpx.post(f"{keyed}/chat/{n}/invoke", headers=HEADERS).status_code == 404
        httpx.get(f"{keyed}/files/{'0' * 64}{n}", headers=HEADERS)  # a route, its own 404
        # Redirected for its slash, no route ran: "other", not the path sent (a label a
        # Prometheus instrumentation library gives it, one series per path).
        slash = httpx.get(f"{keyed}/files/{'1' * 64}{n}/", headers=HEADERS)
        assert slash.status_code == 307
    samples = scrape(keyed)
    routes = label_values(samples, "ragchains_http_requests_total", "route")
    assert "other" in routes and "/metrics" in routes
    assert not [r for r in routes if "no/such" in r or "000" in r or "111" in r]
    # Each value is a route template of the app, or "other".
    document = httpx.get(f"{keyed}/openapi.json").json()
    templates = {path for path in document["paths"]} | {"other", "/metrics"}
    assert routes <= templates | {route for route in routes if "{" in route}
    # Refused for want of a key: by the route's first dependency, so under its template.
    refused = value(
        samples, "ragchains_http_requests_total", route="/metrics", method="GET", status="401"
    )
    assert refused == 2
    assert label_values(samples, "ragchains_http_requests_total", "method") <= {
        "GET",
        "HEAD",
        "POST",
        "other",
    }


def test_metrics_public_and_ingest_runs_of_another_process(
    sample_index: Path,
    upstream: FakeOpenAI,
    tmp_path: Path,
    settings: Settings,
    embedder: SentenceTransformerEmbedder,
) -> None:
    """Opened by RAGCHAINS_METRICS_PUBLIC (the rest still needs the key); an ingest run by
    another process is counted, its skipped file too, and the new generation it commits is
    the one the gauge says once the server serves it."""
    index = tmp_path / "idx"
    shutil.copytree(sample_index, index)
    env = serve_env(upstream, tmp_path, RAGCHAINS_API_KEY=KEY, RAGCHAINS_METRICS_PUBLIC="true")
    with ragchains_serve("--index", str(index), **env) as base:
        before = scrape(base, headers={})
        body = {"input": {"query": "standard plan"}}
        assert httpx.post(f"{base}/retrieve/invoke", json=body).status_code == 401
        assert value(before, "ragchains_index_generation") == 1
        assert value(before, "ragchains_ingest_runs_total") == 1

        extra = tmp_path / "extra"
        extra.mkdir()
        (extra / "orchard.md").write_text("# Orchard\n\nThe orchard has forty apple trees.\n")
        (extra / "empty.md").write_text("")  # skipped: an empty file
        report = run_ingest(
            settings, [REPO / "samples", extra], index, embedder=embedder, progress=False
        )
        assert report.wrote and report.added == ["extra/orchard.md"], report.as_dict()
        assert [s.source for s in report.skipped] == ["extra/empty.md"]

        def served_anew() -> Samples | None:
            samples = scrape(base, headers={})
            return samples if value(samples, "ragchains_index_generation") == 2 else None

        after = wait_until(served_anew, "the new generation served", timeout=60)
    assert value(after, "ragchains_ingest_runs_total") == 2
    assert value(after, "ragchains_ingest_skipped_files_total") == 1
    assert value(after, "ragchains_ingest_last_skipped_files") == 1
    assert value(after, "ragchains_ingest_last_run_timestamp_seconds") > 0


def test_a_store_logs_its_ingest_runs_for_the_metrics(
    pg_url: str, tmp_path: Path, settings: Settings, embedder: SentenceTransformerEmbedder
) -> None:
    """A PostgreSQL store keeps the ingest log in its meta table, written runs or not; the
    collector reads it, and the generation and build time, from the meta the server holds."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "orchard.md").write_text("# Orchard\n\nThe orchard has forty apple trees.\n")
    run_ingest(settings, [docs], pg_url, embedder=embedder, progress=False)
    (docs / "empty.md").write_text("")
    unchanged = run_ingest(settings, [docs], pg_url, embedder=embedder, progress=False)
    assert not unchanged.wrote and len(unchanged.skipped) == 1

    store = PostgresStore(pg_url)
    try:
        recorded = ingest_log(store)
        generation, built_at = index_generation(store)
    finally:
        store.close()
    assert recorded["runs"] == 2 and recorded["skipped_files"] == 1
    assert recorded["last"]["skipped"] == 1 and recorded["last"]["wrote"] is False
    assert generation == 1 and built_at is not None and built_at <= time.time()


@pytest.mark.parametrize(
    ("report", "outcome"),
    [
        ({"query": None, "kept": False}, "unusable"),
        ({"query": "q", "kept": False, "refused": "it adds a number (10.5)"}, "refused"),
        ({"query": "q", "kept": False, "refused": None}, "rejected"),
        ({"query": "q", "kept": True, "refused": None}, "adopted"),
        (None, None),
    ],
)
def test_a_requery_is_counted_by_its_outcome(report: dict | None, outcome: str | None) -> None:
    assert requery_outcome(report) == outcome
