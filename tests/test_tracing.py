"""OpenTelemetry traces: a span per request, a child span per chain stage, ingest's stages.

In-process, the app records into the SDK's in-memory exporter; on the served path,
`ragchains serve` and `ragchains ingest` export over OTLP/HTTP to a receiver in this process,
configured only by the standard OTEL_* variables.
"""

from __future__ import annotations

import gzip
import shutil
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from pydantic import SecretStr
from starlette.testclient import TestClient

from ragchains.chains.llm import LLM
from ragchains.factory import Service, build_service
from ragchains.observability.tracing import (
    REQUEST_CONTEXT,
    RequestSpans,
    app_tracer,
    exporting,
)
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.server import create_app
from ragchains.settings import Settings
from tests.conftest import REPO
from tests.servers import fake_openai_server, ragchains_serve, wait_until

QUESTION = "what does the standard plan cost?"
ANSWER = "The standard plan costs $45.00 a month [employee-handbook.md#benefit-plans]."
KEY = "tr4ce-s3cret-key"
STAGES = ["rewrite", "retrieve", "compress", "requery", "answer"]
OTEL_VARIABLES = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
)


class UsageModel(BaseChatModel):
    """A chat model that answers each of the turn's prompts as a model would (the rewrite
    with a query, the re-query with another, the answer with a citation), and reports its
    name and token counts like a hosted model. ``fail``: raise this on the answer."""

    model_name: str = "fake-usage-1"
    fail: type[Exception] | None = None

    @property
    def _llm_type(self) -> str:
        return "fake-usage"

    def _reply(self, messages: list[BaseMessage]) -> str:
        system = str(messages[0].content) if messages else ""
        if "write search queries" in system:
            return "search_sources(search_query='standard health plan cost')"
        if "found no good match" in system:
            return "standard health plan price per month"
        if self.fail is not None:
            raise self.fail(f"the model choked on {QUESTION!r}")
        return ANSWER

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        message = AIMessage(
            self._reply(messages),
            usage_metadata={"input_tokens": 100, "output_tokens": 10, "total_tokens": 110},
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _stream(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> Iterator[ChatGenerationChunk]:
        words = self._reply(messages).split(" ")
        for word in words:
            yield ChatGenerationChunk(message=AIMessageChunk(word + " "))
        usage = {"input_tokens": 200, "output_tokens": len(words), "total_tokens": 200}
        yield ChatGenerationChunk(message=AIMessageChunk("", usage_metadata=usage))  # type: ignore[arg-type]


def _service(
    settings: Settings, index: Path, embedder: SentenceTransformerEmbedder, model: BaseChatModel
) -> Service:
    return build_service(settings, index, llm=LLM(model=model, name="fake"), embedder=embedder)


@pytest.fixture(scope="module")
def service(
    settings: Settings, sample_index: Path, embedder: SentenceTransformerEmbedder
) -> Service:
    return _service(settings, sample_index, embedder, UsageModel())


@contextmanager
def traced_app(
    settings: Settings, service: Service, **changes: Any
) -> Iterator[tuple[TestClient, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    configured = settings.model_copy(update={"index": service.index.folder, **changes})
    app = create_app(configured, service=service, tracer_provider=provider)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, exporter


def chat(client: TestClient, **headers: str) -> httpx.Response:
    return client.post(
        "/chat/invoke",
        json={"input": {"question": QUESTION}, "config": {"configurable": {"domain": "hr"}}},
        headers=headers,
    )


def every_text(spans: Sequence[ReadableSpan]) -> list[str]:
    """Every string a trace would carry: names, attribute values, events, statuses."""
    texts: list[str] = []

    def add(attributes: Any) -> None:
        for value in (attributes or {}).values():
            values = value if isinstance(value, tuple | list) else [value]
            texts.extend(str(v) for v in values)

    for span in spans:
        texts.append(span.name)
        texts.append(span.status.description or "")
        add(span.attributes)
        for event in span.events:
            texts.append(event.name)
            add(event.attributes)
        add(span.resource.attributes)
    return texts


def request_span(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    (span,) = [s for s in spans if s.name == name]
    return span


def children(spans: Sequence[ReadableSpan], parent: ReadableSpan) -> dict[str, ReadableSpan]:
    """The direct children of ``parent``, by name (each name once)."""
    found = [s for s in spans if s.parent and s.parent.span_id == parent.context.span_id]
    by_name = {s.name: s for s in found}
    assert len(by_name) == len(found), [s.name for s in found]
    return by_name


# ----------------------------------------------------------------------------- in-process
def test_chat_invoke_is_a_request_span_with_the_five_stages_as_children(
    settings: Settings, service: Service
) -> None:
    with traced_app(settings, service) as (client, exporter):
        response = chat(client)
        assert response.status_code == 200, response.text
        output = response.json()["output"]
    spans = exporter.get_finished_spans()
    request = request_span(spans, "POST /chat/invoke")
    assert request.kind == SpanKind.SERVER and request.parent is None
    attrs = dict(request.attributes or {})
    assert attrs["http.request.method"] == "POST"
    assert attrs["http.route"] == "/chat/invoke" and attrs["url.path"] == "/chat/invoke"
    assert attrs["http.response.status_code"] == 200
    assert request.status.status_code == StatusCode.UNSET
    # The turn's summary on the request's span.
    assert attrs["ragchains.chain"] == "chat" and attrs["ragchains.domain"] == "hr"
    assert attrs["ragchains.abstained"] is False
    assert attrs["ragchains.best_score"] == pytest.approx(output["best_score"])
    assert attrs["ragchains.requeried"] is output["requeried"]

    stages = children(spans, request)
    assert sorted(stages) == sorted(STAGES)
    ordered = sorted(stages.values(), key=lambda s: s.start_time or 0)
    assert [s.name for s in ordered] == STAGES
    for span in ordered:
        assert span.kind == SpanKind.INTERNAL
        assert span.attributes is not None
        assert span.attributes["ragchains.stage"] == span.name
        assert span.attributes["ragchains.domain"] == "hr"
        assert span.status.status_code == StatusCode.UNSET
        assert request.start_time <= span.start_time <= span.end_time <= request.end_time  # type: ignore[operator]

    rewrite = dict(stages["rewrite"].attributes or {})
    assert rewrite["ragchains.filters"] == 0 and rewrite["ragchains.rewrite.fallback"] is False
    assert rewrite["gen_ai.request.model"] == "fake-usage-1"
    assert rewrite["gen_ai.usage.input_tokens"] == 100
    assert rewrite["gen_ai.usage.output_tokens"] == 10
    assert rewrite["ragchains.model_calls"] == 1

    retrieve = dict(stages["retrieve"].attributes or {})
    assert retrieve["ragchains.k"] == settings.k
    assert retrieve["ragchains.filters"] == 0
    assert retrieve["ragchains.chunks.retrieved"] > 0
    assert "gen_ai.request.model" not in retrieve  # no model call in this stage

    compress = dict(stages["compress"].attributes or {})
    assert compress["ragchains.chunks.kept"] > 0
    assert compress["ragchains.threshold"] == pytest.approx(output["compressor"]["threshold"])
    assert 0 < compress["ragchains.best_score"] <= 1  # type: ignore[operator]

    requery = dict(stages["requery"].attributes or {})
    assert requery["ragchains.requeried"] is output["requeried"]
    if output["requeried"]:
        assert requery["ragchains.requery.kept"] is output["requery"]["kept"]
        assert requery["gen_ai.usage.input_tokens"] == 100

    answer = dict(stages["answer"].attributes or {})
    assert answer["ragchains.abstained"] is False
    assert answer["ragchains.citations"] == len(output["citations"]) > 0
    assert answer["ragchains.answer_style"] == output["answer_style"]
    assert answer["ragchains.chunks.kept"] == len(output["sources"])
    assert answer["gen_ai.request.model"] == "fake-usage-1"
    assert answer["gen_ai.usage.input_tokens"] == 200  # streamed: counted on its last chunk

    # No question, query or answer text anywhere by default.
    texts = every_text(spans)
    for secret in (QUESTION, "standard plan monthly cost", ANSWER[:30]):
        assert not [t for t in texts if secret in t], secret


def test_streamed_turns_and_the_other_routes_trace_their_own_stages(
    settings: Settings, service: Service
) -> None:
    """A streamed turn's stages get their input as it streams in: their attributes come
    from the state as it ended. The ask route has no rewrite or re-query; the retrieve
    route's own run (named retrieve) is no stage, its retrieve and compress are."""
    body = {"input": {"question": QUESTION}, "config": {"configurable": {"domain": "hr"}}}
    with traced_app(settings, service) as (client, exporter):
        streamed = client.post("/chat/stream", json=body)
        assert streamed.status_code == 200 and "event: end" in streamed.text
        assert client.post("/ask/invoke", json=body).status_code == 200
        assert (
            client.post("/retrieve/invoke", json={"input": {"query": "standard plan"}}).status_code
            == 200
        )
    spans = exporter.get_finished_spans()
    stream = children(spans, request_span(spans, "POST /chat/stream"))
    assert sorted(stream) == sorted(STAGES)
    retrieve = dict(stream["retrieve"].attributes or {})
    assert retrieve["ragchains.domain"] == "hr" and retrieve["ragchains.k"] == settings.k
    assert dict(stream["answer"].attributes or {})["ragchains.citations"] > 0
    ask = request_span(spans, "POST /ask/invoke")
    assert sorted(children(spans, ask)) == ["answer", "compress", "retrieve"]
    assert dict(ask.attributes or {})["ragchains.chain"] == "ask"
    search = request_span(spans, "POST /retrieve/invoke")
    assert sorted(children(spans, search)) == ["compress", "retrieve"]
    assert dict(search.attributes or {})["ragchains.domain"] == "default"


def test_trace_content_records_the_question_queries_and_answer(
    settings: Settings, service: Service
) -> None:
    with traced_app(settings, service, trace_content=True) as (client, exporter):
        assert chat(client).status_code == 200
    spans = exporter.get_finished_spans()
    stages = children(spans, request_span(spans, "POST /chat/invoke"))
    answer = dict(stages["answer"].attributes or {})
    assert answer["ragchains.question"] == QUESTION
    assert str(answer["ragchains.answer"]).startswith("The standard plan costs")
    assert dict(stages["rewrite"].attributes or {})["ragchains.query"]
    assert dict(stages["retrieve"].attributes or {})["ragchains.query"]
    assert any(QUESTION in t for t in every_text(spans))


def test_api_keys_never_reach_a_span(settings: Settings, service: Service) -> None:
    with traced_app(settings, service, api_key=SecretStr(KEY)) as (client, exporter):
        assert chat(client, **{"X-API-Key": KEY}).status_code == 200
        assert chat(client, Authorization=f"Bearer {KEY}").status_code == 200
        refused = client.get("/chat/input_schema", headers={"X-API-Key": "wrong-" + KEY})
        assert refused.status_code == 401
        assert client.get(f"/healthz?api_key={KEY}").status_code in (200, 401)
    spans = exporter.get_finished_spans()
    assert len([s for s in spans if s.name == "POST /chat/invoke"]) == 2
    assert not [t for t in every_text(spans) if KEY in t]
    # Refused by the route's first dependency: named by its route template.
    (refused_span,) = [
        s for s in spans if (s.attributes or {}).get("url.path") == "/chat/input_schema"
    ]
    assert refused_span.name == "GET /chat/input_schema"
    assert dict(refused_span.attributes or {})["http.response.status_code"] == 401


def test_a_failing_stage_is_an_error_span_named_by_its_type_only(
    settings: Settings, sample_index: Path, embedder: SentenceTransformerEmbedder
) -> None:
    failing = _service(settings, sample_index, embedder, UsageModel(fail=RuntimeError))
    with traced_app(settings, failing) as (client, exporter):
        assert chat(client).status_code == 500
    spans = exporter.get_finished_spans()
    request = request_span(spans, "POST /chat/invoke")
    assert request.status.status_code == StatusCode.ERROR
    assert dict(request.attributes or {})["http.response.status_code"] == 500
    answer = children(spans, request)["answer"]
    assert answer.status.status_code == StatusCode.ERROR
    assert dict(answer.attributes or {})["error.type"] in ("RuntimeError", "LLMFailure")
    assert not [t for t in every_text(spans) if QUESTION in t or "choked" in t]


def test_request_spans_leave_their_context_for_other_tasks() -> None:
    """Work that runs a chain in another task (MCP's tools) attaches the request's context
    from the scope's state; lifespan events get no span."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    seen: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        seen["context"] = scope["state"][REQUEST_CONTEXT]
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    tracer = app_tracer(provider)
    assert tracer is not None
    with TestClient(RequestSpans(app, tracer)) as client:
        assert client.get("/anything?q=secret").status_code == 204
    (span,) = exporter.get_finished_spans()
    assert span.name == "GET"  # no route matched: the method alone (the path is unbounded)
    assert dict(span.attributes or {})["url.path"] == "/anything"
    assert "secret" not in " ".join(every_text([span]))
    from opentelemetry import trace

    assert trace.get_current_span(seen["context"]).get_span_context() == span.context


def test_tracing_is_off_without_the_otel_variables(
    monkeypatch: pytest.MonkeyPatch, settings: Settings, service: Service
) -> None:
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert not exporting() and app_tracer(None) is None
    app = create_app(settings.model_copy(update={"index": service.index.folder}), service=service)
    assert RequestSpans not in [m.cls for m in app.user_middleware]

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    assert exporting()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert not exporting()
    monkeypatch.delenv("OTEL_TRACES_EXPORTER")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not exporting()
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
    monkeypatch.delenv("OTEL_SDK_DISABLED")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:9/v1/traces")
    assert exporting()


# ----------------------------------------------------------------------------- served path
class Received:
    """The spans an OTLP/HTTP receiver was sent: name, ids, attributes, resource."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def named(self, name: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.spans if s["name"] == name]

    def children(self, parent: dict[str, Any]) -> dict[str, dict[str, Any]]:
        with self.lock:
            return {s["name"]: s for s in self.spans if s["parent"] == parent["id"]}


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, Received]]:
    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            spans = []
            for resource_spans in request.resource_spans:
                resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        spans.append(
                            {
                                "name": span.name,
                                "id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex() or None,
                                "kind": span.kind,
                                "status": span.status.code,
                                "attributes": {a.key: _value(a.value) for a in span.attributes},
                                "resource": resource,
                            }
                        )
            with received.lock:
                received.spans.extend(spans)
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


def otel_env(endpoint: str) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}


@pytest.mark.e2e
def test_ragchains_serve_exports_request_and_stage_spans_over_otlp(sample_index: Path) -> None:
    with (
        otlp_receiver() as (endpoint, received),
        fake_openai_server() as upstream,
        ragchains_serve(
            "--index",
            str(sample_index),
            RAGCHAINS_LLM_PROVIDER="openai",
            RAGCHAINS_OPENAI_BASE_URL=upstream.base_url,
            RAGCHAINS_OPENAI_MODEL="ok-traced",
            RAGCHAINS_OPENAI_API_KEY="upstream-" + KEY,
            RAGCHAINS_API_KEY=KEY,
            **otel_env(endpoint),
        ) as base,
    ):
        response = httpx.post(
            f"{base}/chat/invoke",
            json={"input": {"question": QUESTION}},
            headers={"X-API-Key": KEY},
            timeout=120,
        )
        assert response.status_code == 200, response.text
        requests = wait_until(
            lambda: received.named("POST /chat/invoke"), "the request's span exported"
        )
        (request,) = requests
        stages = wait_until(
            lambda: (found := received.children(request)).keys() >= set(STAGES) and found,
            "the stage spans exported",
        )
    assert request["resource"]["service.name"] == "ragchains"
    assert request["attributes"]["http.route"] == "/chat/invoke"
    assert request["attributes"]["http.response.status_code"] == 200
    assert request["attributes"]["ragchains.domain"]
    # The generation that answered (an index folder is served live, pinned per request).
    generations = [p.name for p in sample_index.glob("gen-*")]
    assert request["attributes"]["ragchains.index.generation"] in generations
    assert set(stages) == set(STAGES)
    rewrite = stages["rewrite"]["attributes"]
    assert rewrite["gen_ai.request.model"] == "ok-traced"
    assert rewrite["gen_ai.usage.input_tokens"] == 3  # as the upstream counted them
    assert stages["retrieve"]["attributes"]["ragchains.chunks.retrieved"] > 0
    with received.lock:
        texts = [str(v) for s in received.spans for v in s["attributes"].values()]
    assert not [t for t in texts if KEY in t or QUESTION in t]


@pytest.mark.e2e
def test_ragchains_ingest_exports_its_stages_over_otlp(tmp_path: Path) -> None:
    import subprocess

    from tests.servers import RAGCHAINS, user_env

    docs = tmp_path / "samples"
    shutil.copytree(REPO / "samples", docs)
    with otlp_receiver() as (endpoint, received):
        result = subprocess.run(
            [str(RAGCHAINS), "ingest", str(docs), "--index", str(tmp_path / "index"), "-q"],
            env=user_env(**otel_env(endpoint)),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, result.stderr
        # Sent before the command exits (the provider is flushed at exit).
        (root,) = received.named("ingest")
        stages = received.children(root)
    assert {"discover", "read", "embed", "write"} <= set(stages)
    attrs = root["attributes"]
    assert attrs["ragchains.files.ingested"] == 13 and attrs["ragchains.files.skipped"] == 0
    assert attrs["ragchains.chunks"] > 0
    assert attrs["ragchains.index.generation"]
    assert stages["discover"]["attributes"]["ragchains.files.seen"] == 13
    assert stages["read"]["attributes"]["ragchains.chunks"] == attrs["ragchains.chunks"]
    assert stages["embed"]["attributes"]["ragchains.chunks.embedded"] == attrs["ragchains.chunks"]
    assert (
        stages["write"]["attributes"]["ragchains.index.generation"]
        == (attrs["ragchains.index.generation"])
    )
