"""Health probes: /healthz (the process is up) and /readyz (what is loaded, what is degraded,
503 when the store cannot be reached), each for GET and HEAD."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from ragchains.factory import Service
from ragchains.models.providers import LLMFailure
from ragchains.prompts.live import LiveRegistry
from ragchains.retrievers.indexformat import IndexLoadError
from ragchains.retrievers.live import LiveIndex
from ragchains.retrievers.searchindex import SearchIndex
from ragchains.serving.admission import queue_status
from ragchains.serving.errors import STORE_UNREACHABLE
from ragchains.serving.requests import Limits

log = logging.getLogger("ragchains.server")


@dataclass
class Health:
    """The last chat model failure, for /readyz."""

    llm_failure: dict[str, Any] | None = None

    def record(self, failure: LLMFailure) -> None:
        self.llm_failure = {
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
            "timed_out": failure.timed_out,
            "message": failure.message,
        }


def probes_router(service: Service, health: Health, limits: Limits) -> APIRouter:
    router = APIRouter(tags=["health"])

    @router.get("/healthz")
    async def healthz() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @router.get("/readyz")
    async def readyz() -> JSONResponse:
        """Models and index are loaded; what each is, and any fallback in use (503 when the
        store cannot be reached)."""
        body = await run_in_threadpool(readiness, service, health, limits)
        return JSONResponse(body, status_code=200 if body["ready"] else 503)

    # Load balancers probe with HEAD as often as with GET (one operation each in the docs).
    for path, probe in (("/healthz", healthz), ("/readyz", readyz)):
        router.add_api_route(path, probe, methods=["HEAD"], include_in_schema=False)
    return router


def readiness(service: Service, health: Health, limits: Limits) -> dict[str, Any]:
    settings, index = service.settings, service.index
    # With per-user access callers see only some documents: counts are not told (to anyone:
    # /readyz needs no key).
    hidden = settings.keys_file is not None
    compressor = service.compressor.status()
    reason: str | None = None
    try:
        index_info, ready = index.describe(), True
    except IndexLoadError as exc:  # a store that cannot be reached now (/readyz needs no key:
        log.warning("readiness: %s", exc)  # the reason goes to the log, not to callers)
        index_info, ready, reason = {"error": STORE_UNREACHABLE}, False, STORE_UNREACHABLE
    # Damage found since the generation was loaded: a query that could not read it, or a
    # file changed on disk (a stat per file here; a hash only of a changed one). The file's
    # name only: its path is in the log.
    damage = index.damage() if isinstance(index, SearchIndex | LiveIndex) else None
    if damage is not None:
        index_info["damage"] = {"file": damage.name, "problem": damage.problem}
        ready = False
        reason = f"the index is damaged: {damage.name} {damage.problem}"
    if hidden:  # counts and field names would tell of files the caller may not read
        index_info.pop("chunks", None)
        index_info.pop("fields", None)
    prompts = service.prompts
    problems = prompts.problems_shown() if isinstance(prompts, LiveRegistry) else []
    return {
        "ready": ready,
        "detail": reason,  # why not ready (the chat page shows it), else None
        "degraded": bool(compressor["fallback"])
        or bool(problems)
        or health.llm_failure is not None
        or "refused" in index_info,  # a newer generation committed but not served
        "llm": {
            "provider": settings.llm_provider,
            "model": service.llm.name,
            "tool_calling": service.llm.tool_calling,
            "grammar": service.llm.grammar,
            "fallback_model": settings.openai_fallback_model
            if settings.llm_provider == "openai"
            else None,
            "last_failure": health.llm_failure,
            # Calls waiting for the model and the wait a request arriving now would have.
            "queue": queue_status(service.llm, settings.model_queue_wait),
        },
        "embedder": {
            "model": service.embedder.name,
            "dimension": service.embedder.dimension,
            "backend": service.embedder.backend,
        },
        "index": index_info,
        "compressor": compressor,
        "domains": sorted(service.prompts.domains),
        # A domains folder edited into something that does not load: the last good load
        # still serves; each problem is its file (inside the folder), line and reason.
        "domains_problems": problems,
        # The chat page asks for a key only when one is needed, and keeps within the limits.
        "api_key_required": settings.api_key is not None or hidden,
        # With an identity provider, the page offers sign-in (and a key field beside it when
        # keys are taken too).
        "sign_in": {"url": "/auth/login"} if settings.oidc_issuer is not None else None,
        "limits": asdict(limits),
    }
