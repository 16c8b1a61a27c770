"""Prometheus metrics of a running server, served at /metrics (behind the API key unless
``metrics_public``).

Three sources, none of them timers in the stages:

- ``RequestMetrics`` (ASGI middleware): requests by route template, method and status, and
  their latency per route;
- ``StageMetrics`` (an LCEL callback handler on every served chain): each stage's latency,
  turns, abstentions, re-queries and chunks served, read from the stages' runs and outputs;
- ``ServiceCollector``, read at scrape time: the reranker's fallback, the served index's
  generation and age, the ingest runs recorded beside the index (``ragchains ingest``
  runs in another process: what it leaves in the index folder or the store is what a
  scrape reads), and the chat model's queue (its length, the wait it means, the waits and
  refusals so far: ``ragchains.models.queue``).

Every label has a bounded set of values: route templates (an unknown path is ``other``),
chain and stage names, fixed outcomes. No question text, no user, no raw path.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from fastapi import APIRouter, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ragchains.chains.graph import PROMPTS_USED
from ragchains.chains.requery import RequeryReport
from ragchains.ingest.report import read_ingest_log
from ragchains.models.providers import LLMFailure
from ragchains.models.queue import first_queue
from ragchains.observability.stages import STAGES, RunFollower, StageTracker
from ragchains.retrievers.pgstore import PostgresStore
from ragchains.serving.departures import CLIENT_GONE, CLIENT_GONE_STATUS

if TYPE_CHECKING:
    from ragchains.factory import Service

log = logging.getLogger("ragchains.server")

# A turn takes milliseconds (retrieval alone) to a minute (a slow model on a CPU).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
OTHER = "other"  # the label value of whatever is not in a label's known set
CHAINS = frozenset(PROMPTS_USED)  # the served chains' run names (chat, ask, rewrite, ...)
TURN_CHAINS = ("chat", "ask")
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
REQUERY_OUTCOMES = ("adopted", "rejected", "refused", "unusable")
FAILURE_KINDS = ("error", "timeout")
VOTES = ("up", "down")


class Metrics:
    """One server's metrics, in a registry of its own (two apps in a process never mix)."""

    def __init__(self, service: Service) -> None:
        self.registry = CollectorRegistry()
        self.service = service
        registry = self.registry
        self.requests = Counter(
            "ragchains_http_requests",
            "HTTP requests answered, by route template (other: no route), method and status",
            ["route", "method", "status"],
            registry=registry,
        )
        self.request_seconds = Histogram(
            "ragchains_http_request_duration_seconds",
            "Time from a request's arrival to its response's last byte (a stream's end)",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.stage_seconds = Histogram(
            "ragchains_stage_duration_seconds",
            "Time each stage of a chain took (failed runs too): rewrite, retrieve, compress, "
            "requery, answer",
            ["chain", "stage"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.turns = Counter(
            "ragchains_turns",
            "Chat and ask turns that answered (abstentions included)",
            ["chain"],
            registry=registry,
        )
        self.abstentions = Counter(
            "ragchains_abstentions",
            "Turns that said they do not know (no source kept)",
            ["chain"],
            registry=registry,
        )
        self.incomplete = Counter(
            "ragchains_incomplete_answers",
            "Turns whose answer the model cut short (its stream broke off, or it reached its "
            "token limit): a model that keeps breaking off shows here, not as errors",
            ["chain"],
            registry=registry,
        )
        self.requeries = Counter(
            "ragchains_requeries",
            "Re-queries asked of the model after weak results, by outcome (adopted: the new "
            "results replaced the first; rejected: they were not clearly better; refused: the "
            "query held something the conversation never said and was not searched; "
            "unusable: the model gave no new query); their sum is the re-queries asked",
            ["outcome"],
            registry=registry,
        )
        self.chunks_served = Counter(
            "ragchains_chunks_served",
            "Chunks served: the sources kept for each turn, the documents /retrieve returned",
            ["chain"],
            registry=registry,
        )
        self.model_errors = Counter(
            "ragchains_model_errors",
            "Chat model calls that failed a request: timed out, or answered an error",
            ["kind"],
            registry=registry,
        )
        self.feedback_votes = Counter(
            "ragchains_feedback",
            "Votes on answers stored through /feedback",
            ["vote"],
            registry=registry,
        )
        # Known series start at 0: a rate over the first event, and a scrape before any,
        # then read as they should.
        for chain in TURN_CHAINS:
            self.turns.labels(chain)
            self.abstentions.labels(chain)
            self.incomplete.labels(chain)
            self.chunks_served.labels(chain)
        self.chunks_served.labels("retrieve")
        for outcome in REQUERY_OUTCOMES:
            self.requeries.labels(outcome)
        for kind in FAILURE_KINDS:
            self.model_errors.labels(kind)
        for vote in VOTES:
            self.feedback_votes.labels(vote)
        registry.register(ServiceCollector(service))

    def model_failure(self, failure: LLMFailure) -> None:
        """A chat model call failed (timed out, or answered an error)."""
        self.model_errors.labels("timeout" if failure.timed_out else "error").inc()

    def feedback(self, score: int) -> None:
        """A reader voted on an answer: 1 up, 0 down."""
        self.feedback_votes.labels("up" if score else "down").inc()

    def request(self, route: str, method: str, status: int, seconds: float) -> None:
        self.requests.labels(route, method, str(status)).inc()
        self.request_seconds.labels(route).observe(seconds)

    def scrape(self) -> bytes:
        return generate_latest(self.registry)


# ----------------------------------------------------------------------------- stages
class StageMetrics(RunFollower):
    """Stage latencies, turns, abstentions, re-queries and chunks served (LCEL callbacks).

    Sees chain and retriever runs only: model and tool runs start no stage, and the
    fewer callbacks a turn makes the less it pays for being measured (about 0.25 ms of a
    chat turn's 56 callbacks). Retriever runs are seen all the same: a chain run inside one
    would otherwise look like a chain's top run.
    """

    ignore_llm = True
    ignore_chat_model = True
    ignore_agent = True  # tools too
    ignore_retry = True
    ignore_custom_event = True

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.tracker = StageTracker()
        self._started: dict[UUID, float] = {}  # each stage's run: when it started
        self._chains: dict[UUID, str] = {}  # each chain's top run: its chain label

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id, outputs, failed=False)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id, None, failed=True)

    def run_ended(self, run_id: UUID) -> None:
        self.tracker.end(run_id)

    def run_started(self, run_id: UUID, parent_run_id: UUID | None, name: str | None) -> None:
        run = self.tracker.start(run_id, parent_run_id, name)
        if run.stage_id == run_id:
            self._started[run_id] = time.perf_counter()
        elif run.top == run_id:
            self._chains[run_id] = chain_label(name)

    def _end(self, run_id: UUID, outputs: Any, *, failed: bool) -> None:
        run = self.tracker.end(run_id)
        if run is None:
            return
        if run.stage_id == run_id:
            started = self._started.pop(run_id, None)
            chain = self._chains.get(run.top)
            if started is None or chain is None or run.stage not in STAGES:
                return
            self.metrics.stage_seconds.labels(chain, run.stage).observe(
                time.perf_counter() - started
            )
            if not failed:
                self._stage_output(chain, run.stage, outputs)
        elif run.top == run_id:
            chain = self._chains.pop(run_id, None)
            if failed or chain is None:
                return
            if chain in TURN_CHAINS:
                self.metrics.turns.labels(chain).inc()
            elif chain == "retrieve" and isinstance(outputs, list):
                self.metrics.chunks_served.labels(chain).inc(len(outputs))

    def _stage_output(self, chain: str, stage: str, outputs: Any) -> None:
        if not isinstance(outputs, Mapping):
            return
        if stage == "answer":  # the turn's merged output (ChatOutput)
            self.metrics.chunks_served.labels(chain).inc(len(outputs.get("sources") or ()))
            if outputs.get("abstained"):
                self.metrics.abstentions.labels(chain).inc()
            if outputs.get("incomplete"):
                self.metrics.incomplete.labels(chain).inc()
        elif stage == "requery":  # the turn's state; a report only when a re-query was asked
            outcome = requery_outcome(outputs.get("requery"))
            if outcome is not None:
                self.metrics.requeries.labels(outcome).inc()


def chain_label(name: str | None) -> str:
    """The chain a top run is: its name, or its route's (LangServe names a run after its
    path, ``/chat``); ``other`` for any other run."""
    chain = (name or "").lstrip("/")
    return chain if chain in CHAINS else OTHER


def requery_outcome(report: Any) -> str | None:
    """adopted, rejected, refused or unusable; None: no re-query was asked."""
    if isinstance(report, RequeryReport):
        query, kept, refused = report.query, report.kept, report.refused
    elif isinstance(report, Mapping):  # a report already dumped
        query, kept, refused = report.get("query"), bool(report.get("kept")), report.get("refused")
    else:
        return None
    if not query:
        return "unusable"
    if refused:
        return "refused"
    return "adopted" if kept else "rejected"


# ----------------------------------------------------------------------------- requests
class RequestMetrics:
    """ASGI middleware: requests by route and status, latency per route.

    Why not a library (tried): prometheus-fastapi-instrumentator 8.1.0 labels a request
    the router redirects for its trailing slash with the raw path (``/files/<anything>/``:
    a series per path sent) and matches every route again on each request;
    starlette-exporter 0.24.0 keeps its metrics in the process's global registry, shared by
    every app in the process and absent from this app's own."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what Starlette answers when the app raises before its response starts

        async def sent(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sent)
        finally:
            if scope.get("state", {}).get(CLIENT_GONE):  # not a failure: nobody waited
                status = CLIENT_GONE_STATUS
            method = scope["method"]
            self.metrics.request(
                route_label(scope),
                method if method in METHODS else OTHER,
                status,
                time.perf_counter() - started,
            )


def route_label(scope: Scope) -> str:
    """The template of the route that answered (``/chat/invoke``, ``/files/{file_id}``), or
    ``other``: never the path itself, whose values are the caller's to choose. A request
    refused before routing (no key, a body too large) is ``other`` too: no route ran, and
    finding the one it was meant for would mean matching every route again."""
    route = scope.get("route")  # the router's match, set on the scope it was handed
    if route is None:
        return OTHER
    return str(getattr(route, "path_format", None) or getattr(route, "path", None) or OTHER)


# ----------------------------------------------------------------------------- scrape time
class ServiceCollector(Collector):
    """What a scrape reads from the service as it is now: the reranker's fallback, the
    served index's generation and age, and the ingest runs recorded with the index.

    A part that cannot be read now (a store out of reach) is left out of that scrape, and
    logged: /metrics still answers, and the gap shows in Prometheus as absent series.
    """

    def __init__(self, service: Service) -> None:
        self.service = service

    def describe(self) -> Iterable[Metric]:
        return ()  # nothing to read at registration (a store may be out of reach)

    def collect(self) -> Iterator[Metric]:
        for part in (self._reranker, self._index, self._ingests, self._model_queue):
            try:
                yield from part()
            except Exception as exc:  # a scrape never fails for one part
                log.warning("metrics: %s not read: %s", part.__name__.lstrip("_"), exc)

    def _reranker(self) -> Iterator[Metric]:
        fallback = bool(self.service.compressor.status()["fallback"])
        yield GaugeMetricFamily(
            "ragchains_reranker_fallback",
            "1 while the reranker's fallback scores chunks (the cross-encoder could not load)",
            value=int(fallback),
        )

    def _index(self) -> Iterator[Metric]:
        generation, built_at = index_generation(self.service.index)
        if generation is not None:
            yield GaugeMetricFamily(
                "ragchains_index_generation",
                "The served index's generation (each ingest that writes adds one)",
                value=generation,
            )
        if built_at is not None:
            yield GaugeMetricFamily(
                "ragchains_index_age_seconds",
                "Seconds since the served index's generation was written",
                value=max(0.0, time.time() - built_at),
            )

    def _ingests(self) -> Iterator[Metric]:
        recorded = ingest_log(self.service.index)
        if not recorded:
            return
        yield CounterMetricFamily(
            "ragchains_ingest_runs",
            "Ingest runs into the served index that finished (writing or not)",
            value=int(recorded.get("runs") or 0),
        )
        yield CounterMetricFamily(
            "ragchains_ingest_skipped_files",
            "Files the ingest runs could not read (each run counts its own)",
            value=int(recorded.get("skipped_files") or 0),
        )
        last = recorded.get("last") or {}
        if "skipped" in last:
            yield GaugeMetricFamily(
                "ragchains_ingest_last_skipped_files",
                "Files the last ingest run could not read",
                value=int(last["skipped"]),
            )
        finished = _timestamp(last.get("finished_at"))
        if finished is not None:
            yield GaugeMetricFamily(
                "ragchains_ingest_last_run_timestamp_seconds",
                "When the last ingest run finished (Unix time)",
                value=finished,
            )

    def _model_queue(self) -> Iterator[Metric]:
        queue = first_queue(self.service.llm.model)  # a fallback shares it, or idles
        if queue is None:
            return
        status = queue.status()
        gauges = (
            ("slots", "slots", "Calls the chat model serves at once"),
            ("busy", "busy_slots", "Calls the chat model is serving now"),
            ("waiting", "waiting", "Calls waiting for a turn on the chat model (queue length)"),
            ("requests", "requests", "Requests admitted to the model's queue and not yet done"),
            (
                "estimated_wait_s",
                "estimated_wait_seconds",
                "The wait for the model a request arriving now is expected to have (over "
                "model_queue_wait: it is refused with 503)",
            ),
            (
                "longest_waiting_s",
                "longest_wait_seconds",
                "How long the call waiting longest has waited so far",
            ),
        )
        for key, name, what in gauges:
            yield GaugeMetricFamily(f"ragchains_model_queue_{name}", what, value=status[key])
        yield SummaryMetricFamily(
            "ragchains_model_queue_wait_seconds",
            "Time each chat model call waited for its turn",
            count_value=status["calls"],
            sum_value=status["wait_seconds"],
        )
        busy = CounterMetricFamily(
            "ragchains_model_busy",
            "Requests answered 503 because the model was too busy: refused on arrival "
            "(admission) or after waiting as long as they may (waiting)",
            labels=["when"],
        )
        busy.add_metric(["admission"], status["refused"])
        busy.add_metric(["waiting"], status["gave_up"])
        yield busy


def index_generation(index: Any) -> tuple[int | None, float | None]:
    """The served generation's number and when it was written (Unix time), as far as the
    index records them."""
    if isinstance(index, PostgresStore):
        meta = index.known_meta()  # kept fresh by the store's watcher; no query per scrape
        number, built_at = meta.get("generation"), meta.get("built_at")
    else:  # a folder's generation: the one new requests read
        manifest = index.pinned().manifest
        number, built_at = manifest.get("generation"), manifest.get("built_at")
    return (int(number) if number is not None else None), _timestamp(built_at)


def ingest_log(index: Any) -> dict[str, Any]:
    """The ingest runs recorded with the index (``ingest.report.IngestLog``); {} when none."""
    if isinstance(index, PostgresStore):
        return dict(index.known_meta().get("ingests") or {})
    return read_ingest_log(index.folder)


def _timestamp(text: Any) -> float | None:
    if not text:
        return None
    stamp = datetime.fromisoformat(str(text))
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


# ----------------------------------------------------------------------------- route
def metrics_router(metrics: Metrics) -> APIRouter:
    """GET (and HEAD) /metrics in Prometheus' text format."""
    router = APIRouter(tags=["health"])

    # A plain function: FastAPI runs it in its thread pool, where reading the index's
    # records (a small file, or the store's cached meta) cannot stall the event loop.
    def scrape() -> Response:
        """Prometheus metrics: requests, latencies per route and per stage, abstentions,
        re-queries, model failures, the model's queue (length, waits, 503s), the reranker's
        fallback, the index's generation and age, ingest runs, feedback votes."""
        return Response(metrics.scrape(), media_type=CONTENT_TYPE_LATEST)

    router.add_api_route(
        "/metrics",
        scrape,
        methods=["GET"],
        summary="Prometheus metrics",
        response_class=PlainTextResponse,
        responses={200: {"description": "The metrics, in Prometheus' text format"}},
    )
    router.add_api_route("/metrics", scrape, methods=["HEAD"], include_in_schema=False)
    return router
