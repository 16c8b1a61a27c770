"""The HTTP service: each chain over LangServe, OpenAI-compatible chat completions, health
checks. The composition root for HTTP and the only module that imports langserve.

    ragchains serve --index .index/samples                 # one-line errors and the URLs
    uvicorn --factory ragchains.server:create_app          # settings from RAGCHAINS_*

Routes: the chat page at / (its files under /ui/), /chat, /ask, /rewrite, /retrieve (each
with invoke, batch, stream, stream_log, stream_events, input/output/config schemas and a
playground), /v1/chat/completions, /v1/models, /feedback, /healthz, /readyz.

The chains are built first (models and index load when the app is created) and handed to
``add_routes`` as they are: what a route serves is the same runnable ``ragchains ask`` runs,
with the server's limits on its input type and unknown ``configurable`` keys refused.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import posixpath
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import langserve
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from langchain_core.tracers.log_stream import RunLogPatch
from langserve import add_routes
from langserve.callbacks import AsyncEventAggregatorCallback
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ragchains import __version__
from ragchains.chains.llm import LLM
from ragchains.chains.options import error_message
from ragchains.factory import Service, build_service, configure_runtime, filterable_fields
from ragchains.feedback import FeedbackIn, FeedbackStore, FeedbackStoreError, feedback_path
from ragchains.llms import LLMFailure
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.indexformat import IndexLoadError
from ragchains.retrievers.live import LiveIndex
from ragchains.retrievers.pgstore import PostgresStore
from ragchains.serving.errors import STORE_UNREACHABLE, ErrorMiddleware, error_body
from ragchains.serving.guards import (
    ApiKeyMiddleware,
    BodyMiddleware,
    GenerationMiddleware,
    request_json,
)
from ragchains.serving.keys import KeyRing
from ragchains.serving.openai_api import ChatCompletionRequest, openai_router
from ragchains.serving.openapi import truthful_openapi
from ragchains.serving.requests import (
    BODY_KEYS,
    KnownKeysOnly,
    Limits,
    Route,
    check_body,
    configurable_problem,
    request_models,
)
from ragchains.settings import Settings

log = logging.getLogger("ragchains.server")

# How long an idle connection is kept open (uvicorn's default is 5 s). Longer than the idle
# timeout of the proxies and load balancers that keep connections to a server (60 s is
# common): one that reuses a connection just as the server closes it fails the request
# (a 502 at the proxy; a reset at a busy client that read its last reply late).
KEEP_ALIVE_SECONDS = 75

# The chat page: plain files, no build step; /ui/ serves them, / the page itself.
WEB = Path(str(resources.files("ragchains") / "web"))
# The page loads and calls nothing but this server: no CDN, no inline script, no framing.
PAGE_HEADERS = {
    "Cache-Control": "no-cache",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
}


class _PageFiles(StaticFiles):
    """The page's files, revalidated on each load so an upgrade is seen at once."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers["Cache-Control"] = "no-cache"
        return response


# The metadata key that marks a run the playground asked for.
PLAYGROUND_METADATA = "ragchains_playground"

# Route name (also the chain's name on Service.chains) -> what it does.
ROUTES: dict[str, str] = {
    "chat": "A chat turn: rewrite, retrieve, rerank, cited answer.",
    "ask": "One question (no rewrite), with optional filters.",
    "rewrite": "The history-aware query rewriter alone.",
    "retrieve": "Hybrid search and reranking alone: the kept documents.",
}


class _Served(KnownKeysOnly):  # type: ignore[no-redef]  # pydantic plugin
    """A route's chain, called without LangServe's event aggregator.

    LangServe attaches the aggregator to every call, though it returns the collected events
    only with ``include_callback_events`` (off here). It is an async handler, which LangChain
    runs in a new event loop per event for every step that runs in a worker thread: measured
    (bench.server_overhead), 2.5 ms on each turn and 0.85 s on 64 concurrent streams.
    """

    def _merge_configs(self, *configs: Any) -> Any:
        config = super()._merge_configs(*configs)
        callbacks = config.get("callbacks")
        if isinstance(callbacks, list):
            kept = [h for h in callbacks if not isinstance(h, AsyncEventAggregatorCallback)]
            config = {**config, "callbacks": kept}
        return config

    async def astream_log(  # type: ignore[override]
        self, input: Any, config: Any = None, **kwargs: Any
    ) -> AsyncIterator[RunLogPatch]:
        """For the playground, the run's output as one object that grows as it streams.

        LangServe's playground prints each chunk of a run's ``streamed_output`` as a JSON
        object of its own (it adds up only message chunks), so a turn's answer showed as one
        object per token (``}{"answer": " di"}{"answer": "em"``). The chunks are
        ``AddableDict``s: for a request from the playground, ``streamed_output`` holds their
        sum so far, one element replaced as it grows. Other callers get the chunks as
        streamed.
        """
        patches = super().astream_log(input, config, **kwargs)
        if not ((config or {}).get("metadata") or {}).get(PLAYGROUND_METADATA):
            async for patch in patches:
                yield patch
            return
        output: Any = None
        async for patch in patches:
            ops = []
            for op in patch.ops:
                if op["op"] == "add" and op["path"] == "/streamed_output/-":
                    first = output is None
                    output = op["value"] if first else output + op["value"]
                    path = "/streamed_output/-" if first else "/streamed_output/0"
                    op = {"op": "add" if first else "replace", "path": path, "value": output}
                ops.append(op)
            yield RunLogPatch(*ops)


@dataclass
class _Health:
    """The last chat model failure, for /readyz."""

    llm_failure: dict[str, Any] | None = None

    def record(self, failure: LLMFailure) -> None:
        self.llm_failure = {
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
            "timed_out": failure.timed_out,
            "message": failure.message,
        }


def _config_check(route: Route) -> Any:
    """LangServe's ``per_req_config_modifier``: the request's choices checked in full before
    any work, while a stream can still answer with a status (see Route.check)."""

    def check(config: dict[str, Any], request: Request) -> dict[str, Any]:
        # A body's own configurable was checked as sent (check_body); a config link's
        # (/c/{config_hash}/...) is checked here, merged with it.
        if request.path_params.get("config_hash"):
            route.check(config.get("configurable") or {})
        # A run the playground asked for (its page is the referrer): see _Served.astream_log.
        if urlsplit(request.headers.get("referer", "")).path.endswith("/playground/"):
            config = {
                **config,
                "metadata": {**config.get("metadata", {}), PLAYGROUND_METADATA: True},
            }
        return config

    return check


def _body_check(route: Route, limits: Limits) -> Any:
    """A dependency of every LangServe route: the body's shape checked before LangServe
    reads it (``check_body``); a problem is a 422 naming where (413 for a large batch).

    Starlette keeps the parsed body on the request, so LangServe does not parse it again.
    """

    async def check(request: Request) -> None:
        endpoint = request.url.path.rsplit("/", 1)[-1]
        if request.method != "POST" or endpoint not in BODY_KEYS:
            return
        try:
            body = await request_json(request)
        except ValueError:
            return  # LangServe answers malformed JSON with 422
        check_body(route, endpoint, body, limits)

    return check


# The playground's files as LangServe serves them (the default playground type), by path.
_PLAYGROUND = Path(langserve.__file__).parent / "playground" / "dist"
PLAYGROUND_FILES = frozenset(
    path.relative_to(_PLAYGROUND).as_posix() for path in _PLAYGROUND.rglob("*") if path.is_file()
)


async def _playground_file(request: Request) -> None:
    """A dependency of every LangServe route: a playground path names one of its files, or
    it is 404 (LangServe opens any path under its folder, and a folder or a NUL in the
    name is a 500 there)."""
    name = request.path_params.get("file_path")
    if name and posixpath.normpath(name) not in PLAYGROUND_FILES:
        raise HTTPException(404, f"the playground has no file {name[:100]!r}")


def _readiness(service: Service, health: _Health, limits: Limits) -> dict[str, Any]:
    settings, index = service.settings, service.index
    # With per-user access callers see only some documents: counts are not told (to anyone:
    # /readyz needs no key).
    hidden = settings.keys_file is not None
    compressor = service.compressor.status()
    try:
        index_info, ready = index.describe(), True
    except IndexLoadError as exc:  # a store that cannot be reached now (/readyz needs no key:
        log.warning("readiness: %s", exc)  # the reason goes to the log, not to callers)
        index_info, ready = {"error": STORE_UNREACHABLE}, False
    if hidden:  # counts and field names would tell of files the caller may not read
        index_info.pop("chunks", None)
        index_info.pop("fields", None)
    return {
        "ready": ready,
        "degraded": bool(compressor["fallback"])
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
        },
        "embedder": {"model": service.embedder.name, "dimension": service.embedder.dimension},
        "index": index_info,
        "compressor": compressor,
        "domains": sorted(service.prompts.domains),
        # The chat page asks for a key only when one is needed, and keeps within the limits.
        "api_key_required": settings.api_key is not None or hidden,
        "limits": asdict(limits),
    }


def create_app(
    settings: Settings | None = None,
    *,
    service: Service | None = None,
    llm: LLM | None = None,
    embedder: SentenceTransformerEmbedder | None = None,
    keyring: KeyRing | None = None,
) -> FastAPI:
    """The app, over ``service`` or one built now from ``settings.index`` (models and index
    load here, before any route exists); ``llm`` and ``embedder`` replace the configured
    ones (tests and benchmarks); ``keyring``: the keys of ``settings.keys_file``, when the
    caller has read them already."""
    settings = settings or Settings()
    configure_runtime(settings)
    if service is None:
        target = settings.store or settings.index
        if target is None:
            raise ValueError(
                "no index to serve: set RAGCHAINS_INDEX or RAGCHAINS_STORE (or serve --index)"
            )
        service = build_service(settings, target, llm=llm, embedder=embedder, live=True)
    limits = Limits.from_settings(settings)
    # Keys with groups: each caller reads only what its groups may (retrievers.access).
    if keyring is None and settings.keys_file is not None:
        keyring = KeyRing(settings.keys_file)
    keyed = settings.api_key is not None or keyring is not None
    if keyring is not None and settings.api_key is not None:
        log.warning(
            "RAGCHAINS_API_KEY is set beside RAGCHAINS_KEYS_FILE: whoever holds it reads every "
            "document, whatever its groups"
        )
    requests = request_models(limits, filterable_fields(service.index))
    health = _Health()
    feedback_store = FeedbackStore(feedback_path(settings, service.index.folder))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The stages are async (the model through its async API, retrieval's CPU work in a
        # pool of its own); the loop's default pool runs what has no async path: a sync-only
        # model, retriever or callback handler, which may block a thread each for seconds.
        pool = ThreadPoolExecutor(settings.worker_threads, thread_name_prefix="ragchains")
        asyncio.get_running_loop().set_default_executor(pool)
        # Everything loaded so far (models, index, libraries: millions of objects) lives as
        # long as the process. Left in the collector's oldest generation, each full
        # collection scans all of it with the event loop stopped: 0.8 s, once in every
        # 64-stream burst (bench.server_overhead), every turn stalled. Frozen, it is never
        # scanned; a full collection then takes milliseconds.
        gc.collect()
        gc.freeze()
        log.info("ready: %d chunks from %s", len(service.index), service.index.location)
        # Ingests are served as they commit, without a restart: an index folder's new
        # generation, a store's new fields and groups' fields.
        if isinstance(service.index, LiveIndex | PostgresStore):
            service.index.watch()
        yield
        gc.unfreeze()
        if isinstance(service.index, LiveIndex):
            service.index.close()
        if isinstance(service.index, PostgresStore):
            await service.index.aclose()
            service.index.close()

    # The API docs (/docs) from files served here: no CDN, the machine may be offline. (No
    # /redoc: its page loads its logo from Redocly's CDN.)
    app = FastAPIOffline(
        redoc_url=None,
        title="ragchains",
        version=__version__,
        description="Grounded, cited answers over your own documents.",
        lifespan=lifespan,
    )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        body = error_body(request.url.path, exc.status_code, str(exc.detail))
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_input(request: Request, exc: RequestValidationError) -> JSONResponse:
        config_errors = [
            err
            for err in exc.errors()
            if isinstance(err, dict) and tuple(err.get("loc") or ())[:1] == ("configurable",)
        ]
        if config_errors:
            return await http_error(request, configurable_problem(service.prompts, config_errors))
        # FastAPI's default echoes each bad input back: not for a 100k-character question.
        problems = [_problem(err) for err in exc.errors()]
        return JSONResponse({"detail": problems}, status_code=422)

    routes = {
        name: Route(name, service.chains[name], requests[name], service.prompts, binding=_Served)
        for name in ROUTES
    }
    # Before LangServe's ~100 routes, which each request is otherwise matched against first.
    app.include_router(openai_router(service, routes["chat"]))
    for name, route in routes.items():
        add_routes(
            app,
            route.runnable,
            path=f"/{name}",
            per_req_config_modifier=_config_check(route),
            dependencies=[Depends(_body_check(route, limits)), Depends(_playground_file)],
            enable_feedback_endpoint=False,
            # Token feedback needs LangSmith, which this server never talks to.
            # (LangServe accepts the name but leaves it out of its Literal type.)
            disabled_endpoints=["token_feedback"],  # type: ignore[list-item]
        )

    app.state.service = service  # what `ragchains serve` announces (domains, index)

    app.openapi = truthful_openapi(  # type: ignore[method-assign]
        app,
        chat_request=ChatCompletionRequest,
        domains=service.prompts.domains,
        keyed=keyed,
    )

    # LangServe prints an ASCII banner at startup; `ragchains serve` prints the URLs itself.
    app.router.on_startup.clear()

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    async def readyz() -> JSONResponse:
        """Models and index are loaded; what each is, and any fallback in use (503 when the
        store cannot be reached)."""
        body = await run_in_threadpool(_readiness, service, health, limits)
        return JSONResponse(body, status_code=200 if body["ready"] else 503)

    # Load balancers probe with HEAD as often as with GET (one operation each in the docs).
    for path, probe in (("/healthz", healthz), ("/readyz", readyz)):
        app.add_api_route(path, probe, methods=["HEAD"], include_in_schema=False)

    @app.post("/feedback", tags=["feedback"], status_code=201)
    async def feedback(body: FeedbackIn) -> dict[str, Any]:
        """A thumbs up (score 1) or down (0) on one answer, with an optional comment; kept
        in the feedback store (`ragchains feedback export` reads it)."""
        try:
            record = await run_in_threadpool(feedback_store.add, body)
        except FeedbackStoreError as exc:  # the file, not the request, is at fault
            log.error("feedback not stored: %s", exc)
            raise HTTPException(503, f"feedback cannot be stored now: {exc}") from exc
        return {"id": record.id, "created_at": record.created_at}

    @app.get("/", include_in_schema=False)
    async def index(request: Request) -> Response:
        """The chat page for browsers; for other clients, what is served where."""
        if "text/html" in request.headers.get("accept", ""):
            return FileResponse(WEB / "index.html", headers=PAGE_HEADERS)
        return JSONResponse(
            {
                "name": "ragchains",
                "version": __version__,
                "page": "/",
                "playground": "/chat/playground/",
                "docs": "/docs",
                "routes": {f"/{route}": summary for route, summary in ROUTES.items()},
            }
        )

    app.mount("/ui", _PageFiles(directory=WEB), name="ui")

    # The last added runs first: CORS, then the key, then the body's checks, then errors,
    # then (an index folder) the generation each request keeps to.
    if isinstance(service.index, LiveIndex):
        app.add_middleware(GenerationMiddleware, index=service.index)
    app.add_middleware(ErrorMiddleware, on_llm_failure=health.record)
    app.add_middleware(
        BodyMiddleware, max_bytes=limits.request_bytes, timeout=settings.body_timeout
    )
    if keyed:
        api_key = settings.api_key.get_secret_value() if settings.api_key is not None else None
        app.add_middleware(ApiKeyMiddleware, api_key=api_key, keyring=keyring)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
        )
    return app


def _problem(err: Any) -> Any:
    if not isinstance(err, dict):
        return {"msg": str(err)}
    return {
        "loc": err.get("loc"),
        "msg": error_message(err),
        "type": err.get("type"),
    }
