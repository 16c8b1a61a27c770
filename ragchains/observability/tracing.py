"""OpenTelemetry traces: a span per HTTP request, a child span per chain stage.

Traces are off unless there is somewhere to send them: a caller's ``TracerProvider`` (tests,
an embedding application), or the standard variables (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``; ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_BSP_*`` as the SDK reads them), exported over
OTLP/HTTP. Off, ``app_tracer`` is None and the app adds neither handler nor middleware.

What spans carry: routes, sizes, counts, scores, model names and token counts. Never header
values (API keys), query strings or bodies; the question, queries and answer only when the
``trace_content`` setting asks (``record_content``); an error as its exception's type only,
since a message may quote the question.

The stage spans come from LCEL's callbacks (``StageSpans``), not from timers in the stages:
each starts when its stage's run starts and ends with it, a child of the span that was
current when the chain's own run started (the request's). A stage's model calls add their
model name and token counts to it (OpenTelemetry's ``gen_ai.*`` attribute names).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from langchain_core.outputs import ChatGeneration, LLMResult
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import (
    INVALID_SPAN,
    Span,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    TracerProvider,
)

from ragchains import __version__
from ragchains.observability.stages import RunFollower, StageTracker

log = logging.getLogger(__name__)

# The key of a request's span context in its ASGI scope's state: code that runs a chain
# outside the request's task (MCP's tools) attaches it, so the stage spans nest under the
# request's span (``opentelemetry.context.attach(scope["state"][REQUEST_CONTEXT])``).
REQUEST_CONTEXT = "ragchains_otel_context"

INSTRUMENTATION = "ragchains"
DEFAULT_SERVICE_NAME = "ragchains"

# ----------------------------------------------------------------------------- the tracer
_provider_lock = threading.Lock()
_exporting: list[SDKTracerProvider] = []  # the process's one OTLP provider, once made


def exporting() -> bool:
    """Whether the standard OTEL_* variables ask for traces sent over OTLP."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if exporters == "none":
        return False
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def _resource() -> Resource:
    # The SDK's own detection first (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES): what an
    # operator set wins over our defaults.
    detected = Resource.create()
    defaults: dict[str, str] = {}
    if str(detected.attributes.get("service.name", "")).startswith("unknown_service"):
        defaults["service.name"] = DEFAULT_SERVICE_NAME
    if "service.version" not in detected.attributes:
        defaults["service.version"] = __version__
    return detected.merge(Resource(defaults))


def otlp_provider() -> SDKTracerProvider | None:
    """The process's provider exporting over OTLP/HTTP, made on first use, when the OTEL_*
    variables ask for it; else None. The SDK flushes and shuts it down at exit."""
    if not exporting():
        return None
    with _provider_lock:
        if not _exporting:
            # Imported here: the exporter pulls in protobuf and requests, which a server
            # without tracing never needs.
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            protocol = os.environ.get(
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            )
            if protocol and protocol != "http/protobuf":
                log.warning("OTLP protocol %r is not supported; sending http/protobuf", protocol)
            provider = SDKTracerProvider(resource=_resource())  # shut down at exit (atexit)
            # The exporter reads the endpoint, headers, timeout and compression itself.
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            _exporting.append(provider)
        return _exporting[0]


def app_tracer(provider: TracerProvider | None = None) -> Tracer | None:
    """The tracer the app records with: ``provider``'s, else one exporting over OTLP when
    the OTEL_EXPORTER_OTLP_* variables say where, else None (tracing off, nothing added)."""
    provider = provider or otlp_provider()
    if provider is None:
        return None
    return provider.get_tracer(INSTRUMENTATION, __version__)


@contextmanager
def command_span(name: str) -> Iterator[Span]:
    """A span around a command's whole run (``ragchains ingest``), when the OTEL_* variables
    ask for traces; else a span that records nothing. The command's stages open spans of
    their own through the API's global tracer, as a library's do (``ragchains.ingest``), so
    the OTLP provider becomes the process's global one here: a command is a process of its
    own, unlike an app, of which a test process builds several."""
    provider = otlp_provider()
    if provider is None:
        yield INVALID_SPAN
        return
    trace.set_tracer_provider(provider)
    tracer = provider.get_tracer(INSTRUMENTATION, __version__)
    # Errors by type only: the span's status and attributes are exported where the
    # terminal's message is not.
    with tracer.start_as_current_span(
        name, record_exception=False, set_status_on_exception=False
    ) as span:
        try:
            yield span
        except BaseException as exc:
            _failed(span, exc)
            raise


def _failed(span: Span, error: BaseException) -> None:
    kind = type(error).__qualname__
    span.set_status(Status(StatusCode.ERROR, kind))
    span.set_attribute("error.type", kind)


# ----------------------------------------------------------------------------- HTTP requests
_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}
)


def _route_template(scope: Mapping[str, Any]) -> str | None:
    """The matched route's path template (``/files/{file_id}``), once routing has run;
    Starlette and FastAPI leave the route they matched in the scope."""
    route = scope.get("route")
    template = getattr(route, "path_format", None) or getattr(route, "path", None)
    if not isinstance(template, str) or not template:
        return None
    return f"{scope.get('root_path', '')}{template}"


def _headers(scope: Mapping[str, Any]) -> dict[str, str]:
    """The W3C trace context headers only: nothing else of a request's headers is read."""
    wanted = (b"traceparent", b"tracestate")
    return {
        name.decode("latin-1"): value.decode("latin-1")
        for name, value in scope.get("headers") or ()
        if name.lower() in wanted
    }


class RequestSpans:
    """ASGI middleware: a span per HTTP request (SERVER kind), current while the app answers
    so the stage spans nest under it, and left in the scope's state (``REQUEST_CONTEXT``)
    for work that runs in another task.

    Named ``METHOD /route/{template}`` with the standard HTTP attributes: the method, the
    path, the route, the status; a 5xx (or an exception) is an error. A caller's
    ``traceparent`` header makes it a child of the caller's span.

    Why not opentelemetry-instrumentation-fastapi (tried at 0.66b2): it writes the
    deprecated attribute names (``http.method``, ``http.status_code``) unless
    ``OTEL_SEMCONV_STABILITY_OPT_IN=http`` is in the environment before any instrumentation
    starts, a process-wide switch an app cannot set for itself; either way it records the
    query string (``http.url``, ``url.query``), an API key sent there included; and it
    patches Starlette's ``BackgroundTask`` for the whole process and matches every route
    again on each request (up to 0.5 ms over LangServe's routes). The router's own match,
    read here from the scope, names the span for nothing."""

    def __init__(self, app: Any, tracer: Tracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # lifespan, websockets: no request to trace
            await self.app(scope, receive, send)
            return
        method = str(scope.get("method", "GET")).upper()
        method = method if method in _METHODS else "_OTHER"
        attributes: dict[str, Any] = {
            "http.request.method": method,
            "url.path": scope.get("path", ""),
            "url.scheme": scope.get("scheme", "http"),
            "network.protocol.version": scope.get("http_version", "1.1"),
        }
        span = self.tracer.start_span(
            method, context=extract(_headers(scope)), kind=SpanKind.SERVER, attributes=attributes
        )
        ctx = trace.set_span_in_context(span)
        scope.setdefault("state", {})[REQUEST_CONTEXT] = ctx
        status: list[int] = []

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))
                span.set_attribute("http.response.status_code", status[0])
            await send(message)

        token = otel_context.attach(ctx)
        try:
            await self.app(scope, receive, sending)
        except BaseException as exc:
            _failed(span, exc)
            raise
        finally:
            otel_context.detach(token)
            route = _route_template(scope)
            if route is not None:
                span.update_name(f"{method} {route}")
                span.set_attribute("http.route", route)
            if status and status[0] >= 500:
                span.set_status(Status(StatusCode.ERROR))
                span.set_attribute("error.type", str(status[0]))
            span.end()


# ----------------------------------------------------------------------------- chain stages
def _number(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _attr(target: dict[str, Any], key: str, value: Any) -> None:
    """Set ``key`` when ``value`` is one an attribute can hold (None leaves it unset)."""
    if isinstance(value, bool | int | str):
        target[key] = value
    elif value is not None and (number := _number(value)) is not None:
        target[key] = number


def _count(target: dict[str, Any], key: str, values: Any) -> None:
    if isinstance(values, Sequence) and not isinstance(values, str):
        target[key] = len(values)


@dataclass
class _Turn:
    """What a chain's own run (a turn) collects for its stages and its request's span."""

    context: otel_context.Context
    chain: str | None
    question: str | None  # only with record_content
    summary: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Stage:
    name: str
    span: Span
    turn: _Turn
    inputs: Any  # as the stage's run started (a placeholder when its input streams in)
    model_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    counted: bool = False  # a call reported token counts


class StageSpans(RunFollower):
    """A span per chain stage, a child of the request's span (LCEL callbacks).

    Attributes (``ragchains.`` unless standard): every stage its ``stage`` and ``domain``;
    retrieve ``k``, ``filters``, ``alternatives``, ``chunks.retrieved``; compress
    ``chunks.kept``, ``best_score``, ``threshold``; rewrite ``filters``, ``alternatives``,
    ``rewrite.fallback``; requery ``requeried`` (and ``requery.kept``,
    ``requery.best_score``); answer ``abstained``, ``citations``, ``answer_style``,
    ``chunks.kept``; a stage that called a model ``gen_ai.request.model``,
    ``gen_ai.response.model``, ``gen_ai.provider.name``, ``gen_ai.usage.input_tokens``,
    ``gen_ai.usage.output_tokens``, ``model_calls``. With ``record_content``: ``query``
    (rewrite, retrieve, compress), ``requery.query``, ``question`` and ``answer`` (answer).
    The request's span gets the turn's ``chain``, ``domain``, ``best_score``, ``requeried``
    and ``abstained``.
    """

    # (RunFollower's run_inline: the chain's run sees the request's span current; a
    # thread of the pool would see none.)

    def __init__(
        self, tracer: Tracer, *, record_content: bool = False, model: str | None = None
    ) -> None:
        """``model``: the served model's name, for model calls that report none of their own
        (the embedded llama.cpp model's runs carry no ``ls_model_name``)."""
        self.tracer = tracer
        self.record_content = record_content
        self.model = model
        self.runs = StageTracker()
        self._turns: dict[UUID, _Turn] = {}
        self._stages: dict[UUID, _Stage] = {}

    # -- runs of every kind: the tracker must see each to place the runs inside it
    def _start(self, run_id: UUID, parent_run_id: UUID | None, name: str | None) -> _Stage | None:
        """A run that is no chain's (a model's, a retriever's): the stage it is in, if any.
        (Only a chain's own run is a turn: the served runnables are all chains.)"""
        run = self.runs.start(run_id, parent_run_id, name)
        return self._stages.get(run.stage_id) if run.stage_id is not None else None

    def _end(self, run_id: UUID) -> tuple[_Stage | None, bool]:
        """The stage ``run_id`` was in (or is), and whether it is that stage's own run."""
        run = self.runs.end(run_id)
        if run is None or run.stage_id is None:
            return None, False
        if StageTracker.is_stage(run_id, run):
            return self._stages.pop(run_id, None), True
        return self._stages.get(run.stage_id), False

    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        name = kwargs.get("name")
        run = self.runs.start(run_id, parent_run_id, name)
        if StageTracker.is_top(run_id, run):
            question = inputs.get("question") if isinstance(inputs, Mapping) else None
            self._turns[run_id] = _Turn(
                otel_context.get_current(),
                name.lstrip("/") if isinstance(name, str) else None,  # LangServe's: "/chat"
                question if self.record_content and isinstance(question, str) else None,
            )
        elif StageTracker.is_stage(run_id, run) and (turn := self._turns.get(run.top)):
            self._stages[run_id] = self._open(str(run.stage), turn, inputs)

    def on_chain_end(
        self, outputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        stage, own = self._end(run_id)
        if stage is not None and own:
            self._close(stage, outputs, kwargs.get("inputs"))
        elif stage is None and (turn := self._turns.pop(run_id, None)) is not None:
            self._summarise(turn)

    def on_chain_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        stage, own = self._end(run_id)
        if stage is not None and own:
            _failed(stage.span, error)
            stage.span.end()
        elif stage is None:
            self._turns.pop(run_id, None)

    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        stage = self._start(run_id, parent_run_id, kwargs.get("name"))
        if stage is not None:
            self._model_called(stage, metadata or {}, kwargs.get("invocation_params") or {})

    def on_llm_start(
        self,
        serialized: dict[str, Any] | None,
        prompts: list[str],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        stage = self._start(run_id, parent_run_id, kwargs.get("name"))
        if stage is not None:
            self._model_called(stage, metadata or {}, kwargs.get("invocation_params") or {})

    def on_llm_end(
        self, response: LLMResult, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        stage, _ = self._end(run_id)
        if stage is not None:
            self._model_answered(stage, response)

    def on_llm_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        stage, _ = self._end(run_id)
        if stage is not None:
            stage.span.set_attribute("ragchains.model_error", type(error).__qualname__)

    def run_started(self, run_id: UUID, parent_run_id: UUID | None, name: str | None) -> None:
        self._start(run_id, parent_run_id, name)

    def run_ended(self, run_id: UUID) -> None:
        self._end(run_id)

    # -- what each stage's span says
    def _open(self, name: str, turn: _Turn, inputs: Any) -> _Stage:
        span = self.tracer.start_span(
            name,
            context=turn.context,
            kind=SpanKind.INTERNAL,
            attributes={"ragchains.stage": name},
        )
        return _Stage(name, span, turn, inputs)

    def _read_state(
        self, stage: _Stage, state: Mapping[str, Any], attributes: dict[str, Any]
    ) -> None:
        """What the state handed to a stage says: the domain, k, filters, the query."""
        name, turn = stage.name, stage.turn
        options = state.get("options")
        domain = getattr(options, "domain", None)
        if isinstance(domain, str):
            turn.summary.setdefault("ragchains.domain", domain)
        _attr(attributes, "ragchains.domain", turn.summary.get("ragchains.domain"))
        search = state.get("search")
        if name == "retrieve":
            _attr(attributes, "ragchains.k", getattr(options, "k", None))
            _count(attributes, "ragchains.filters", getattr(search, "filters", None))
            _count(attributes, "ragchains.alternatives", getattr(search, "alternatives", None))
        if self.record_content:
            if name in ("retrieve", "compress"):
                _attr(attributes, "ragchains.query", getattr(search, "search_query", None))
            question = state.get("question")
            if turn.question is None and isinstance(question, str):
                turn.question = question

    def _close(self, stage: _Stage, outputs: Any, inputs: Any) -> None:
        name = stage.name
        attributes: dict[str, Any] = {}
        summary = stage.turn.summary
        # A stage's input streams in when the turn does: the state is whole only at its end.
        for state in (inputs, stage.inputs):
            if isinstance(state, Mapping) and "options" in state:
                self._read_state(stage, state, attributes)
                break
        else:
            _attr(attributes, "ragchains.domain", summary.get("ragchains.domain"))
        if name == "rewrite":
            _count(attributes, "ragchains.filters", getattr(outputs, "filters", None))
            _count(attributes, "ragchains.alternatives", getattr(outputs, "alternatives", None))
            _attr(attributes, "ragchains.rewrite.fallback", getattr(outputs, "fallback", None))
            if self.record_content:
                _attr(attributes, "ragchains.query", getattr(outputs, "search_query", None))
        elif name == "retrieve":
            _count(attributes, "ragchains.chunks.retrieved", getattr(outputs, "documents", None))
        elif name == "compress":
            _count(attributes, "ragchains.chunks.kept", getattr(outputs, "documents", None))
            _attr(attributes, "ragchains.best_score", getattr(outputs, "best_score", None))
            _attr(attributes, "ragchains.threshold", getattr(outputs, "threshold", None))
            _attr(summary, "ragchains.best_score", getattr(outputs, "best_score", None))
        elif name == "requery" and isinstance(outputs, Mapping):
            report = outputs.get("requery")
            attributes["ragchains.requeried"] = summary["ragchains.requeried"] = report is not None
            if report is not None:
                _attr(attributes, "ragchains.requery.kept", getattr(report, "kept", None))
                _attr(
                    attributes, "ragchains.requery.best_score", getattr(report, "best_score", None)
                )
                if self.record_content:
                    _attr(attributes, "ragchains.requery.query", getattr(report, "query", None))
        elif name == "answer" and isinstance(outputs, Mapping):
            # The merged stream: the answer stage's chunks add up into the turn's output.
            _attr(attributes, "ragchains.abstained", outputs.get("abstained"))
            _attr(summary, "ragchains.abstained", outputs.get("abstained"))
            _attr(attributes, "ragchains.answer_style", outputs.get("answer_style"))
            _attr(summary, "ragchains.best_score", outputs.get("best_score"))
            _count(attributes, "ragchains.citations", outputs.get("citations"))
            _count(attributes, "ragchains.chunks.kept", outputs.get("sources"))
            if self.record_content:
                _attr(attributes, "ragchains.question", stage.turn.question)
                _attr(attributes, "ragchains.answer", outputs.get("answer"))
        if stage.model_calls:
            attributes["ragchains.model_calls"] = stage.model_calls
        if stage.counted:
            attributes["gen_ai.usage.input_tokens"] = stage.input_tokens
            attributes["gen_ai.usage.output_tokens"] = stage.output_tokens
        stage.span.set_attributes(attributes)
        stage.span.end()

    def _summarise(self, turn: _Turn) -> None:
        """The turn's summary on the span that was current when it started (the request's),
        while that span still records."""
        span = trace.get_current_span(turn.context)
        if span.is_recording():
            summary = dict(turn.summary)
            _attr(summary, "ragchains.chain", turn.chain)
            span.set_attributes(summary)

    # -- the model calls inside a stage
    def _model_called(
        self, stage: _Stage, metadata: Mapping[str, Any], params: Mapping[str, Any]
    ) -> None:
        stage.model_calls += 1
        model = (
            metadata.get("ls_model_name")
            or params.get("model")
            or params.get("model_name")
            or self.model
        )
        attributes: dict[str, Any] = {"gen_ai.operation.name": "chat"}
        _attr(attributes, "gen_ai.request.model", model)
        _attr(attributes, "gen_ai.provider.name", metadata.get("ls_provider"))
        stage.span.set_attributes(attributes)

    @staticmethod
    def _model_answered(stage: _Stage, response: LLMResult) -> None:
        llm_output = response.llm_output or {}
        model = llm_output.get("model_name") or llm_output.get("model")
        counts = None
        for generations in response.generations:
            for generation in generations:
                if not isinstance(generation, ChatGeneration):
                    continue
                message = generation.message
                model = model or message.response_metadata.get("model_name")
                usage = getattr(message, "usage_metadata", None)
                if usage:
                    counts = counts or (0, 0)
                    counts = (
                        counts[0] + int(usage.get("input_tokens", 0)),
                        counts[1] + int(usage.get("output_tokens", 0)),
                    )
        if counts is None and isinstance(usage := llm_output.get("token_usage"), Mapping):
            counts = (int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)))
        if counts is not None:
            stage.counted = True
            stage.input_tokens += counts[0]
            stage.output_tokens += counts[1]
        if isinstance(model, str) and model:
            stage.span.set_attribute("gen_ai.response.model", model)
