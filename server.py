"""The HTTP service: each graph and stage over LangServe, OpenAI-compatible chat completions,
health checks. The composition root for HTTP and the only module that imports langserve.

    uvicorn --factory server:create_app      # settings from RAGCHAINS_* (RAGCHAINS_INDEX=...)
    ragchains serve --index .index/samples   # the same, with one-line errors and the URLs

Routes: /chat, /ask, /rewrite, /retrieve (each with invoke, batch, stream, stream_log,
stream_events, input/output/config schemas and a playground), /v1/chat/completions,
/v1/models, /healthz, /readyz.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.utils import ConfigurableFieldSpec
from langserve import add_routes
from langserve.callbacks import AsyncEventAggregatorCallback
from langserve.lzstring import LZString
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from chains.graph import CONFIGURABLE_SPECS, AskInput, ChatInput, ChatOutput
from chains.llm import LLM
from chains.retrieve import RetrieveInput, RetrieveOutput
from chains.rewrite import RewriteInput, RewriteOutput
from ragchains import __version__
from ragchains.factory import Service, build_service, configure_runtime
from ragchains.llms import LLMFailure
from ragchains.serving.errors import ErrorMiddleware, error_body
from ragchains.serving.guards import ApiKeyMiddleware, BodyLimitMiddleware
from ragchains.serving.openai_api import openai_router
from ragchains.serving.requests import Limits, request_models, require_configurable
from ragchains.settings import Settings
from retrievers.embeddings import SentenceTransformerEmbedder

log = logging.getLogger("ragchains.server")

# Route name -> (input type, output type, what it does). The route name is also the graph's
# attribute on Service.graphs and the mode check_configurable checks a request for.
ROUTES: dict[str, tuple[type[BaseModel], type[BaseModel], str]] = {
    "chat": (
        ChatInput,
        ChatOutput,
        "A chat turn: rewrite, retrieve, rerank, cited answer.",
    ),
    "ask": (AskInput, ChatOutput, "One question (no rewrite), with optional filters."),
    "rewrite": (RewriteInput, RewriteOutput, "The history-aware query rewriter alone."),
    "retrieve": (RetrieveInput, RetrieveOutput, "Hybrid search and reranking alone."),
}


@dataclass
class _State:
    """What the lifespan loads, and what /readyz reports."""

    service: Service | None = None
    requests: dict[str, type[BaseModel]] = field(default_factory=dict)
    llm_failure: dict[str, Any] | None = None

    def loaded(self) -> Service:
        if self.service is None:
            raise HTTPException(503, "the service is not loaded (starting or stopping)")
        return self.service

    def record(self, failure: LLMFailure) -> None:
        self.llm_failure = {
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
            "timed_out": failure.timed_out,
            "message": failure.message,
        }


class _Served(Runnable[Any, Any]):
    """One of the service's graphs, as LangServe sees it before and after loading.

    LangServe wants a runnable (and its schemas) when routes are added; the models and the
    index load later, in the app's lifespan. Calls go to the loaded graph. The request
    schema becomes the limit- and filter-checking model once the index is known.
    """

    def __init__(self, state: _State, route: str) -> None:
        self.state = state
        self.route = route
        self.name = route
        self._input, self._output, _ = ROUTES[route]

    def _graph(self) -> Runnable[Any, Any]:
        return getattr(self.state.loaded().graphs, self.route)  # type: ignore[no-any-return]

    @property
    def InputType(self) -> Any:
        return self._input

    @property
    def OutputType(self) -> Any:
        return self._output

    def get_input_schema(self, config: RunnableConfig | None = None) -> type[BaseModel]:
        return self.state.requests.get(self.route, self._input)

    def get_output_schema(self, config: RunnableConfig | None = None) -> type[BaseModel]:
        return self._output

    @property
    def config_specs(self) -> list[ConfigurableFieldSpec]:
        return list(CONFIGURABLE_SPECS)

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        return self._graph().invoke(input, _lean(config), **kwargs)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        return await self._graph().ainvoke(input, _lean(config), **kwargs)

    def batch(self, inputs: list[Any], config: Any = None, **kwargs: Any) -> list[Any]:
        configs = [_lean(c) for c in config] if isinstance(config, list) else _lean(config)
        return self._graph().batch(inputs, configs, **kwargs)

    async def abatch(self, inputs: list[Any], config: Any = None, **kwargs: Any) -> list[Any]:
        configs = [_lean(c) for c in config] if isinstance(config, list) else _lean(config)
        return await self._graph().abatch(inputs, configs, **kwargs)

    def stream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        yield from self._graph().stream(input, _lean(config), **kwargs)

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        async for chunk in self._graph().astream(input, _lean(config), **kwargs):
            yield chunk


def _lean(config: Any) -> Any:
    """``config`` without LangServe's event aggregator.

    LangServe attaches it to every call, though it returns the collected events only with
    ``include_callback_events`` (off here). It is an async handler, and LangChain runs an
    async handler called from a stage in a worker thread in a new event loop, once per
    event: a few milliseconds of every turn, for nothing.
    """
    callbacks = config.get("callbacks") if config else None
    if not isinstance(callbacks, list):
        return config
    kept = [h for h in callbacks if not isinstance(h, AsyncEventAggregatorCallback)]
    return {**config, "callbacks": kept}


def _request_configs(body: Any, config_hash: str | None) -> list[Any]:
    """Every config a LangServe request carries: in the path (playground links) and body."""
    configs: list[Any] = []
    if config_hash:
        try:
            configs.append(json.loads(LZString.decompressFromEncodedURIComponent(config_hash)))
        except Exception as exc:
            raise HTTPException(400, "the config hash in the path cannot be decoded") from exc
    if isinstance(body, dict):
        given = body.get("config")
        configs.extend(given if isinstance(given, list) else [given])
    return [c for c in configs if c is not None]


def _check_request(state: _State, route: str, limits: Limits) -> Any:
    """A dependency of every LangServe route: the configurable keys and values, and the
    batch size, are checked before LangServe (which drops unknown keys silently) runs."""

    async def check(request: Request) -> None:
        service = state.loaded()
        body: Any = None
        if request.method == "POST":
            try:
                body = await request.json()  # cached: LangServe reads the same body again
            except ValueError:
                return  # LangServe answers malformed JSON with 422
        inputs = body.get("inputs") if isinstance(body, dict) else None
        if isinstance(inputs, list) and len(inputs) > limits.batch_inputs:
            raise HTTPException(
                413, f"a batch holds {len(inputs)} inputs; the limit is {limits.batch_inputs}"
            )
        for config in _request_configs(body, request.path_params.get("config_hash")):
            if not isinstance(config, dict):
                continue  # LangServe rejects it with 422
            require_configurable(service.prompts, config.get("configurable") or {}, route)

    return check


def _readiness(state: _State) -> tuple[int, dict[str, Any]]:
    service = state.service
    if service is None:
        return 503, {"ready": False, "reason": "the service is not loaded (starting or stopping)"}
    settings, index = service.settings, service.index
    compressor = service.compressor.status()
    return 200, {
        "ready": True,
        "degraded": bool(compressor["fallback"]) or state.llm_failure is not None,
        "llm": {
            "provider": settings.llm_provider,
            "model": service.llm.name,
            "tool_calling": service.llm.tool_calling,
            "grammar": service.llm.grammar,
            "fallback_model": settings.openai_fallback_model
            if settings.llm_provider == "openai"
            else None,
            "last_failure": state.llm_failure,
        },
        "embedder": {"model": service.embedder.name, "dimension": service.embedder.dimension},
        "index": {
            "path": str(index.path.parent),
            "generation": index.path.name,
            "chunks": len(index),
            "fields": index.fields,
        },
        "compressor": compressor,
        "domains": sorted(service.prompts.domains),
    }


def create_app(
    settings: Settings | None = None,
    *,
    service: Service | None = None,
    llm: LLM | None = None,
    embedder: SentenceTransformerEmbedder | None = None,
) -> FastAPI:
    """The app. Models and index load once, when it starts (FastAPI lifespan), from
    ``settings.index``, unless a ready ``service`` is given; ``llm`` and ``embedder``
    replace the configured ones (tests and benchmarks)."""
    settings = settings or Settings()
    limits = Limits.from_settings(settings)
    state = _State()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        configure_runtime(settings)
        # Retrieval and the non-streamed model calls block a thread each; the loop's default
        # pool is what LangChain runs them in.
        pool = ThreadPoolExecutor(settings.worker_threads, thread_name_prefix="ragchains")
        asyncio.get_running_loop().set_default_executor(pool)
        if service is not None:
            state.service = service
        else:
            if settings.index is None:
                raise ValueError("no index to serve: set RAGCHAINS_INDEX (or serve --index)")
            state.service = build_service(settings, settings.index, llm=llm, embedder=embedder)
        state.requests = request_models(limits, state.service.index.fields)
        log.info("ready: %d chunks from %s", len(state.service.index), state.service.index.path)
        try:
            yield
        finally:
            state.service, state.requests = None, {}

    app = FastAPI(
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
        # FastAPI's default echoes each bad input back: not for a 100k-character question.
        problems = [_problem(err) for err in exc.errors()]
        return JSONResponse({"detail": problems}, status_code=422)

    for route in ROUTES:
        add_routes(
            app,
            _Served(state, route),
            path=f"/{route}",
            dependencies=[Depends(_check_request(state, route, limits))],
            enable_feedback_endpoint=False,
        )

    # LangServe prints an ASCII banner at startup; `ragchains serve` prints the URLs itself.
    app.router.on_startup.clear()
    app.include_router(openai_router(state.loaded, lambda: state.requests["chat"]))

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    async def readyz() -> JSONResponse:
        """Models and index are loaded; what each is, and any fallback in use."""
        status, body = _readiness(state)
        return JSONResponse(body, status_code=status)

    @app.get("/", tags=["health"])
    async def index() -> dict[str, Any]:
        return {
            "name": "ragchains",
            "version": __version__,
            "playground": "/chat/playground/",
            "docs": "/docs",
            "routes": {f"/{route}": summary for route, (_, _, summary) in ROUTES.items()},
        }

    # The last added runs first: CORS, then the key, then the size limit, then errors.
    app.add_middleware(ErrorMiddleware, on_llm_failure=state.record)
    app.add_middleware(BodyLimitMiddleware, max_bytes=limits.request_bytes)
    if settings.api_key is not None:
        app.add_middleware(ApiKeyMiddleware, api_key=settings.api_key.get_secret_value())
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
        "msg": str(err.get("msg", "")).removeprefix("Value error, "),
        "type": err.get("type"),
    }
