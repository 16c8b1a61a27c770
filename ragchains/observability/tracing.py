"""OpenTelemetry traces: a span per HTTP request, a child span per chain stage.

STUB: to be written (issue 27)."""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from opentelemetry.trace import Tracer, TracerProvider


def app_tracer(provider: TracerProvider | None = None) -> Tracer | None:
    """The tracer the app records with: ``provider``'s, else one exporting over OTLP when
    the OTEL_EXPORTER_OTLP_* variables say where, else None (tracing off, nothing added)."""
    return None


class StageSpans(BaseCallbackHandler):
    """A span per chain stage, a child of the request's span (LCEL callbacks)."""

    def __init__(self, tracer: Tracer, *, record_content: bool = False) -> None:
        self.tracer = tracer
        self.record_content = record_content


class RequestSpans:
    """ASGI middleware: a span per HTTP request."""

    def __init__(self, app: Any, tracer: Tracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)
