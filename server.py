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
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import langserve
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi_offline import FastAPIOffline
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.runnables import Runnable, RunnableConfig, RunnableGenerator
from langserve import add_routes
from opentelemetry.trace import TracerProvider
from starlette import routing
from starlette.middleware.sessions import SessionMiddleware

from ragchains import __version__
from ragchains.chains.llm import LLM
from ragchains.conversations import ConversationStore, open_conversations
from ragchains.factory import (
    Service,
    build_service,
    configure_runtime,
    filterable_fields,
    ingest_jobs,
)
from ragchains.feedback import FeedbackStore, feedback_path
from ragchains.ingest.parsing import BudgetedCalls, ParseBudget
from ragchains.ingestjobs import IngestJobs
from ragchains.models.providers import LLMFailure
from ragchains.models.queue import with_ticket
from ragchains.observability.metrics import Metrics, RequestMetrics, StageMetrics, metrics_router
from ragchains.observability.tracing import RequestSpans, StageSpans, app_tracer
from ragchains.prompts.live import LiveRegistry
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.live import LiveIndex
from ragchains.retrievers.pgstore import PostgresStore
from ragchains.serving.admission import (
    MODEL_ROUTES,
    Ticketed,
    end_model_work,
    langserve_admission,
    model_ticket,
    request_ticket_of,
)
from ragchains.serving.bodies import MALFORMED, BodyLimits, JsonBody, JsonOnly
from ragchains.serving.collection import collection_router, unfound_domains
from ragchains.serving.conversations import conversations_router
from ragchains.serving.departures import CancelOnDisconnect, quiet_departed_work
from ragchains.serving.documents import caller_router, documents_router
from ragchains.serving.errors import add_error_handlers
from ragchains.serving.feedback import feedback_router
from ragchains.serving.guards import Callers, Guarded, add_guards, request_guard
from ragchains.serving.keys import KeyRing
from ragchains.serving.mcp_server import McpEndpoint, RagTools
from ragchains.serving.openai_api import completion_request, openai_router
from ragchains.serving.openapi import truthful_openapi
from ragchains.serving.page import add_page
from ragchains.serving.probes import Health, probes_router
from ragchains.serving.requests import (
    BODY_KEYS,
    Limits,
    Route,
    check_body,
    served_routes,
)
from ragchains.serving.signin import (
    MAX_SESSION_SECONDS,
    SESSION_COOKIE,
    SignIn,
    secure_cookie,
    session_folder,
    session_secret,
)
from ragchains.serving.sourcefiles import source_files_router
from ragchains.serving.threads import run_request, threads_router
from ragchains.sessions import SessionStore
from ragchains.settings import Settings

log = logging.getLogger("ragchains.server")

# How long an idle connection is kept open (uvicorn's default is 5 s). Longer than the idle
# timeout of the proxies and load balancers that keep connections to a server (60 s is
# common): one that reuses a connection just as the server closes it fails the request
# (a 502 at the proxy; a reset at a busy client that read its last reply late).
KEEP_ALIVE_SECONDS = 75

# Route name (also the chain's name on Service.chains) -> what it does.
ROUTES: dict[str, str] = {
    "chat": "A chat turn: rewrite, retrieve, rerank, cited answer.",
    "ask": "One question (no rewrite), with optional filters.",
    "rewrite": "The history-aware query rewriter alone.",
    "retrieve": "Hybrid search and reranking alone: the kept documents.",
}


def create_app(
    settings: Settings | None = None,
    *,
    service: Service | None = None,
    llm: LLM | None = None,
    embedder: SentenceTransformerEmbedder | None = None,
    keyring: KeyRing | None = None,
    tracer_provider: TracerProvider | None = None,
) -> FastAPI:
    """The app, over ``service`` or one built now from ``settings.index`` (models and index
    load here, before any route exists); ``llm`` and ``embedder`` replace the configured
    ones (tests and benchmarks); ``keyring``: the keys of ``settings.keys_file``, when the
    caller has read them already; ``tracer_provider``: where spans go (default: OTLP when
    the OTEL_EXPORTER_OTLP_* variables are set, else no tracing)."""
    settings = settings or Settings()
    configure_runtime(settings)
    service = service or _service(settings, llm, embedder)
    limits = Limits.from_settings(settings)
    keyring = _keyring(settings, keyring)
    health = Health()
    feedback_store = FeedbackStore(feedback_path(settings, service.index.folder))
    store_url = service.index.url if isinstance(service.index, PostgresStore) else None
    conversations = open_conversations(settings, index=service.index.folder, store_url=store_url)
    tracer = app_tracer(tracer_provider)
    metrics = Metrics(service)
    # LCEL callbacks on every served run (and those run for MCP's tools): each stage's span
    # and metrics come from its own run's start and end, never from timers in the stages.
    observers: list[BaseCallbackHandler] = [StageMetrics(metrics)]
    if tracer is not None:
        observers.append(
            StageSpans(tracer, record_content=settings.trace_content, model=service.llm.name)
        )
    routes = served_routes(service, limits, list(ROUTES), observers)

    def on_llm_failure(failure: LLMFailure) -> None:
        health.record(failure)
        metrics.model_failure(failure)

    mcp = McpEndpoint(RagTools(service, routes, on_llm_failure=on_llm_failure))
    # The file viewer reads files in worker processes under the ingest's budget: the server
    # never parses one itself.
    files_reader = BudgetedCalls(
        ParseBudget(settings.ingest_file_memory_mb, settings.ingest_file_timeout)
    )
    signin = (
        SignIn(settings, SessionStore(conversations.engine, where=conversations.where))
        if settings.oidc_issuer is not None
        else None
    )
    callers = Callers.of(settings, keyring, signin)
    jobs = ingest_jobs(settings, service)
    # Every route's first dependency: the key (401), then what the request reads kept to
    # its groups and to the index generation current when it came.
    app = _app(
        service,
        settings,
        mcp,
        files_reader,
        jobs,
        conversations,
        Depends(request_guard(callers, service.index)),
    )
    add_error_handlers(app, service.prompts)
    # Before LangServe's ~100 routes, which each request is otherwise matched against first.
    completion = completion_request(limits)
    # Each request that calls the model holds a ticket for its queue from when its body has
    # arrived and passed its checks (a slow sender does not jump the queue) to its last byte.
    ticket = Depends(model_ticket(settings.model_queue_wait))
    app.include_router(openai_router(service, routes["chat"], completion, ticket))
    _add_langserve_routes(app, routes, limits, service.llm, ticket)
    app.include_router(probes_router(service, health, limits))
    app.include_router(feedback_router(feedback_store, on_vote=metrics.feedback))
    app.include_router(metrics_router(metrics))
    app.include_router(source_files_router(service, files_reader))
    app.include_router(collection_router(service))
    app.include_router(documents_router(service, settings, jobs, files_reader))
    app.include_router(caller_router())
    app.include_router(conversations_router(conversations))
    run_body = run_request(limits)
    app.include_router(
        threads_router(conversations, routes["chat"], run_body, limits, service.llm, ticket)
    )
    if signin is not None:
        app.include_router(signin.router())
    # Any method: the transport answers GET and DELETE itself (405 when stateless).
    mcp_app = Guarded(JsonOnly(Ticketed(mcp, settings.model_queue_wait)), callers, service.index)
    app.router.routes.append(routing.Route("/mcp", mcp_app, include_in_schema=False))
    add_page(app, ROUTES)
    # Innermost: each body's bytes counted and timed as its route reads them (routes check
    # what the bytes say: json_body).
    app.add_middleware(BodyLimits, max_bytes=_body_limit(settings), timeout=settings.body_timeout)
    # Around it: a request whose client goes ends there, its ticket (model_ticket: the
    # model's work for it) with it.
    app.add_middleware(
        CancelOnDisconnect, watched=_ends_with_its_client, on_departure=end_model_work
    )
    add_guards(app, settings, on_llm_failure=on_llm_failure)
    if signin is not None:
        # The signed-in person's session: Starlette's signed cookie (itsdangerous).
        folder = session_folder(settings, service.index.folder, service.index.location)
        app.add_middleware(
            SessionMiddleware,
            secret_key=session_secret(settings, folder),
            session_cookie=SESSION_COOKIE,
            max_age=MAX_SESSION_SECONDS,
            same_site="lax",
            https_only=secure_cookie(settings),
        )
    # Outermost (Starlette runs the last added first): every request is counted and traced,
    # those refused by the guards too.
    app.add_middleware(RequestMetrics, metrics=metrics)
    if tracer is not None:
        app.add_middleware(RequestSpans, tracer=tracer)
    app.openapi = truthful_openapi(  # type: ignore[method-assign]
        app,
        chat_request=completion,
        run_request=run_body,
        prompts=service.prompts,
        keyed=not callers.open_to_all,
        routes=routes,
        limits=limits,
        # With per-user access the document (open to all) does not tell the fields.
        fields=filterable_fields(service.index) if keyring is None else None,
    )
    return app


# The routes that run chains: their work is for the client alone, and stops when it goes.
_CHAIN_PATHS = (*(f"/{name}/" for name in ROUTES), "/v1/chat/completions", "/mcp", "/threads/")


def _body_limit(settings: Settings) -> Callable[[str], int]:
    """The bytes a request's body may have: an upload's files (each checked again against
    the per-file limit as it is read), else ``max_request_bytes``."""
    uploads = settings.max_upload_mb * 2**20 * settings.max_upload_files + 2**20

    def limit(path: str) -> int:
        return uploads if path.startswith("/documents") else settings.max_request_bytes

    return limit


def _ends_with_its_client(path: str) -> bool:
    return path.startswith(_CHAIN_PATHS)


def _service(
    settings: Settings, llm: LLM | None, embedder: SentenceTransformerEmbedder | None
) -> Service:
    """The models and the index of ``settings``, loaded, and the chains over them."""
    target = settings.store or settings.index
    if target is None:
        raise ValueError(
            "no index to serve: set RAGCHAINS_INDEX or RAGCHAINS_STORE (or serve --index)"
        )
    return build_service(settings, target, llm=llm, embedder=embedder, live=True)


def _keyring(settings: Settings, keyring: KeyRing | None) -> KeyRing | None:
    """Keys with groups: each caller reads only what its groups may (retrievers.access)."""
    if keyring is None and settings.keys_file is not None:
        keyring = KeyRing(settings.keys_file)
    if keyring is not None and settings.api_key is not None:
        log.warning(
            "RAGCHAINS_API_KEY is set beside RAGCHAINS_KEYS_FILE: whoever holds it reads every "
            "document, whatever its groups"
        )
    return keyring


def _app(
    service: Service,
    settings: Settings,
    mcp: McpEndpoint,
    files_reader: BudgetedCalls,
    jobs: IngestJobs,
    conversations: ConversationStore,
    guard: Any,
) -> FastAPI:
    # The API docs (/docs) from files served here: no CDN, the machine may be offline. (No
    # /redoc: its page loads its logo from Redocly's CDN.)
    app = FastAPIOffline(
        redoc_url=None,
        title="ragchains",
        version=__version__,
        description="Grounded, cited answers over your own documents.",
        lifespan=_lifespan(service, settings, mcp, files_reader, jobs, conversations),
        dependencies=[guard],
    )
    app.state.service = service  # what `ragchains serve` announces (domains, index)
    return app


def _lifespan(
    service: Service,
    settings: Settings,
    mcp: McpEndpoint,
    files_reader: BudgetedCalls,
    jobs: IngestJobs,
    conversations: ConversationStore,
) -> Callable[[FastAPI], Any]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The stages are async (the model through its async API, retrieval's CPU work in a
        # pool of its own); the loop's default pool runs what has no async path: a sync-only
        # model, retriever or callback handler, which may block a thread each for seconds.
        pool = ThreadPoolExecutor(settings.worker_threads, thread_name_prefix="ragchains")
        loop = asyncio.get_running_loop()
        loop.set_default_executor(pool)
        loop.set_exception_handler(quiet_departed_work)
        # Everything loaded so far (models, index, libraries: millions of objects) lives as
        # long as the process. Left in the collector's oldest generation, each full
        # collection scans all of it with the event loop stopped: 0.8 s, once in every
        # 64-stream burst (bench.server_overhead), every turn stalled. Frozen, it is never
        # scanned; a full collection then takes milliseconds.
        gc.collect()
        gc.freeze()
        log.info("ready: %d chunks from %s", len(service.index), service.index.location)
        for problem in await asyncio.to_thread(unfound_domains, service):
            log.warning("%s", problem)
        # Ingests are served as they commit, without a restart: an index folder's new
        # generation, a store's new fields and groups' fields.
        if isinstance(service.index, LiveIndex | PostgresStore):
            service.index.watch()
        # A team's domains folder: its edits are served as they are saved.
        if isinstance(service.prompts, LiveRegistry):
            service.prompts.watch()
        # The documents API's jobs, those an earlier run left unfinished first.
        jobs.start()
        async with mcp.running():
            yield
        gc.unfreeze()
        await asyncio.to_thread(jobs.close)
        if isinstance(service.prompts, LiveRegistry):
            await asyncio.to_thread(service.prompts.close)
        await asyncio.to_thread(files_reader.close)
        await asyncio.to_thread(conversations.close)
        if isinstance(service.index, PostgresStore):
            await service.index.aclose()
        if isinstance(service.index, LiveIndex | PostgresStore):
            # In a thread: closing waits for the watching thread (up to 10 s on a stalled
            # database), which would stop the event loop meanwhile.
            await asyncio.to_thread(service.index.close)

    return lifespan


# ----------------------------------------------------------------------------- LangServe
# add_routes, not APIHandler with routes of our own: see _add_langserve_routes.


def _add_langserve_routes(
    app: FastAPI, routes: dict[str, Route], limits: Limits, llm: LLM, ticket: Any
) -> None:
    """Each chain at /<name>: invoke, batch, stream, stream_log, stream_events, the input,
    output and config schemas, the playground, and the playground's share links.

    LangServe's ``APIHandler`` with routes of our own was weighed and not taken: it would
    drop only the ASCII banner (which never prints anyway: LangServe registers it with the
    deprecated ``on_event("startup")``, and FastAPI runs no such handler for an app with a
    lifespan) and the dependency on every route (each of our routes would call the same
    checks instead). The workarounds below sit inside APIHandler (the event aggregator,
    ``await request.json()``, the 500 error event, the bare-typed config payload) and stay,
    and ~250 lines of LangServe's route and documentation definitions (the stand-in
    handlers that give the OpenAPI document its request bodies) would be copied here.
    """
    for name, route in routes.items():
        # After the body's checks: a run that calls the model takes its ticket, and is
        # checked in to the model's queue (503 + Retry-After while a stream can still
        # answer with a status).
        admission = (
            [ticket, Depends(langserve_admission(route, llm))] if name in MODEL_ROUTES else []
        )
        add_routes(
            app,
            _served(route),
            path=f"/{name}",
            per_req_config_modifier=_config_check(route),
            dependencies=[
                Depends(_body_check(route, limits)),
                Depends(_playground_file),
                *admission,
            ],
            enable_feedback_endpoint=False,
            # Token feedback needs LangSmith, which this server never talks to.
            # (LangServe accepts the name but leaves it out of its Literal type.)
            disabled_endpoints=["token_feedback"],  # type: ignore[list-item]
        )


# The metadata key that marks a run the playground asked for.
PLAYGROUND_METADATA = "ragchains_playground"
# Where a request's resolved choices wait for LangServe's config hook, in the request's
# state: one per config LangServe reads, in its order (see check_body).
RESOLVED_CONFIGS = "ragchains_resolved_configs"


def _served(route: Route) -> Runnable[Any, Any]:
    """A route's chain as LangServe serves it: for a run the playground asked for, its
    streamed output added up into one object (``playground_output``); the types are the
    route's, so every schema LangServe publishes stays the chain's."""
    summed: Any = playground_output  # typed as LangChain types a transform with no config
    return (route.runnable | RunnableGenerator(summed)).with_types(
        input_type=route.request_model, output_type=route.runnable.OutputType
    )


async def playground_output(
    chunks: AsyncIterator[Any], config: RunnableConfig
) -> AsyncIterator[Any]:
    """The chunks as streamed, or for the playground one object, their sum.

    Works around LangServe's playground printing each chunk of a run's ``streamed_output``
    as a JSON object of its own (it adds up only message chunks): a turn's answer showed as
    one object per token (``}{"answer": " di"}{"answer": "em"``). The chunks are
    ``AddableDict``s, so their sum is the output; the playground shows it when the run ends,
    and its steps as they run."""
    if not (config.get("metadata") or {}).get(PLAYGROUND_METADATA):
        async for chunk in chunks:
            yield chunk
        return
    total: Any = None
    async for chunk in chunks:
        total = chunk if total is None else total + chunk
    if total is not None:
        yield total


def _config_check(route: Route) -> Any:
    """LangServe's ``per_req_config_modifier``, the one hook that sees a request's config
    after LangServe has merged a share link's (/c/{config_hash}/..., decoded inside
    LangServe) with the body's, and before any work, while a stream can still answer with a
    status. Hands the run the choices ``_body_check`` resolved (a share link's are resolved
    here, merged with the body's), and marks a run the playground asked for."""

    def check(config: dict[str, Any], request: Request) -> dict[str, Any]:
        pending = getattr(request.state, RESOLVED_CONFIGS, None)
        if request.path_params.get("config_hash") or not pending:
            configurable = route.resolve(config.get("configurable") or {})
        else:
            configurable = pending.pop(0)
        # The request's ticket for the model's queue (model_ticket), for the run's model calls.
        config = {**config, "configurable": with_ticket(configurable, request_ticket_of(request))}
        # The playground's page is the referrer of the runs it asks for, through stream_log
        # (the only endpoint that reads the mark: elsewhere it would reach events' metadata).
        playground = urlsplit(request.headers.get("referer", "")).path.endswith("/playground/")
        if playground and request.url.path.endswith("/stream_log"):
            config = {
                **config,
                "metadata": {**config.get("metadata", {}), PLAYGROUND_METADATA: True},
            }
        return config

    return check


def _body_check(route: Route, limits: Limits) -> Any:
    """A dependency of every LangServe route: the body's shape checked before LangServe
    reads it (``check_body``); a problem is a 422 naming where (413 for a large batch).

    Works around LangServe ignoring body keys it does not know, and checking batch items
    and configs only as it runs them (a bad one is a 500). A dependency is the one place
    add_routes offers that runs before its handler reads the body; Starlette keeps the
    parsed body on the request, so LangServe does not parse it again.
    """

    async def check(request: Request, body: JsonBody) -> None:
        endpoint = request.url.path.rsplit("/", 1)[-1]
        if request.method != "POST" or endpoint not in BODY_KEYS or body in (None, MALFORMED):
            return  # LangServe answers malformed JSON with 422
        # A share link's configurable is resolved once merged with the link's (_config_check).
        shared = bool(request.path_params.get("config_hash"))
        resolved = check_body(route, endpoint, body, limits, resolve=not shared)
        setattr(request.state, RESOLVED_CONFIGS, [] if shared else resolved)

    return check


# The playground's files as LangServe serves them (the default playground type), by path.
_PLAYGROUND = Path(langserve.__file__).parent / "playground" / "dist"
PLAYGROUND_FILES = frozenset(
    path.relative_to(_PLAYGROUND).as_posix() for path in _PLAYGROUND.rglob("*") if path.is_file()
)


async def _playground_file(request: Request) -> None:
    """A dependency of every LangServe route: a playground path names one of its files, or
    it is 404. Works around LangServe's ``serve_playground`` opening any path under its
    folder: a folder, or a NUL in the name, is a 500 there."""
    name = request.path_params.get("file_path")
    if name and posixpath.normpath(name) not in PLAYGROUND_FILES:
        raise HTTPException(404, f"the playground has no file {name[:100]!r}")
