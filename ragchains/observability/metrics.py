"""Prometheus metrics of a running server, served at /metrics.

STUB: to be written (issue 27)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from langchain_core.callbacks import BaseCallbackHandler
from prometheus_client import CollectorRegistry

from ragchains.llms import LLMFailure


class Metrics:
    """One server's metrics, in a registry of its own (two apps in a process never mix)."""

    def __init__(self, service: Any) -> None:
        self.registry = CollectorRegistry()
        self.service = service

    def model_failure(self, failure: LLMFailure) -> None:
        """A chat model call failed (timed out, or answered an error)."""

    def feedback(self, score: int) -> None:
        """A reader voted on an answer: 1 up, 0 down."""


class StageMetrics(BaseCallbackHandler):
    """Stage latencies, abstentions, re-queries and chunks served (LCEL callbacks)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics


class RequestMetrics:
    """ASGI middleware: requests by route and status, latency per route."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


def metrics_router(metrics: Metrics) -> APIRouter:
    """GET /metrics in Prometheus' text format."""
    return APIRouter(tags=["health"])
