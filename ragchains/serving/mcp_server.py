"""MCP: the search and ask chains as tools for assistants and IDEs, through the official
``mcp`` SDK's server, over streamable HTTP at ``/mcp`` (``mcp_endpoint``) and over stdio
(``ragchains mcp``).

Tools: ``search`` (chunks with their citation label, source, location and score), ``ask``
(a cited answer, or an abstention), ``list_domains`` and ``list_fields``. Each tool's input
schema is the JSON schema of the model its HTTP route checks requests with (``/retrieve``'s
and ``/ask``'s, plus the ``configurable`` choices it takes: ``k``, ``domain``), and its
arguments are checked by that same model and by the route's own check of its choices, so a
bad filter gets the words a 422 gives. Tools run the routes' runnables (limits, observers)
as the caller may read: over HTTP the API key's groups, which ``serving.guards`` leaves in
the request's state (tool calls run in the session manager's tasks, which do not inherit
the request's context); over stdio everything, as ``ragchains ask`` reads.

The low-level ``Server`` rather than ``FastMCP``: FastMCP derives a tool's schema from its
function's signature, which would describe the arguments a second time, apart from the
models the routes check.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from io import TextIOWrapper
from typing import Any

import anyio
from fastapi import HTTPException
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from opentelemetry import context as otel_context
from pydantic import BaseModel, Field, ValidationError, create_model
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from ragchains import __version__
from ragchains.chains.answer import Citation
from ragchains.chains.options import problem_text
from ragchains.chains.retrieve import Source, to_source
from ragchains.factory import Service, filterable_fields
from ragchains.models.providers import LLMFailure
from ragchains.models.queue import Ticket, with_ticket
from ragchains.observability.tracing import REQUEST_CONTEXT, StageSpans, app_tracer
from ragchains.prompts.registry import PerLoad, PromptRegistry
from ragchains.retrievers.access import caller_groups, current_groups
from ragchains.retrievers.filters import OPERATORS
from ragchains.serving.admission import check_in, tool_ticket
from ragchains.serving.collection import DomainSummary, FileCounts, domain_summaries
from ragchains.serving.errors import failed
from ragchains.serving.guards import CALLER_GROUPS
from ragchains.serving.requests import Limits, Route, served_routes

log = logging.getLogger("ragchains.mcp")

# The routes the tools run, by route name.
TOOL_ROUTES = ("retrieve", "ask")

INSTRUCTIONS = (
    "Search and ask over the documents this ragchains server holds. `search` returns "
    "chunks, each with a citation label (cite it as given, e.g. [handbook.pdf#page=3]); "
    "`ask` returns an answer whose sentences cite those labels, or says the documents do "
    "not hold it (abstained). `list_fields` names the metadata fields `filters` may use; "
    "`list_domains` the prompt domains `ask` may answer in."
)


# ----------------------------------------------------------------------------- results
class Chunk(BaseModel):
    """A chunk found by ``search``."""

    label: str = Field(description="cite the chunk with this label, e.g. [handbook.pdf#page=3]")
    source: str = Field(description="the file the chunk is from")
    location: dict[str, Any] | None = Field(
        description="where in the file: page, sheet and row, slide, section, ..."
    )
    score: float | None = Field(description="the reranker's score (higher is closer)")
    text: str


class SearchResult(BaseModel):
    chunks: list[Chunk]


class AskResult(BaseModel):
    answer: str
    citations: list[Citation] = Field(description="the sources the answer's sentences cite")
    abstained: bool = Field(description="true: the documents do not answer the question")
    uncited: bool = Field(
        False, description="true: the answer cites no source, so it is not shown to be grounded"
    )
    incomplete: bool = Field(
        False,
        description="true: the model's reply was cut short (it broke off, or reached its token "
        "limit): the answer is the part that arrived, not a finished one",
    )
    sources: list[Chunk] = Field(description="the chunks the answer was written from")


INCOMPLETE = "[incomplete: the model's reply was cut short before it was finished]"


class DomainsResult(BaseModel):
    domains: list[DomainSummary]


class FieldsResult(BaseModel):
    fields: dict[str, str] = Field(description="field name -> type (string, number, boolean)")
    operators: list[str] = Field(description="what a filter's op may be")
    example: list[dict[str, Any]] = Field(description="a filters argument, as search takes it")


# Where a chunk is, as a reader of a tool's result needs it: not the drawing boxes and page
# sizes the passage viewer highlights with.
_DRAWING = {"boxes", "page_width", "page_height", "start", "end"}


def _chunk(source: Source) -> Chunk:
    location = (
        source.location.model_dump(exclude_none=True, exclude=_DRAWING) if source.location else None
    )
    return Chunk(
        label=source.label,
        source=source.source,
        location=location,
        score=source.score,
        text=source.text,
    )


def _shown(chunks: list[Chunk]) -> str:
    """Chunks as a model reads them best: each under its label."""
    if not chunks:
        return "Nothing in the documents matches."
    return "\n\n".join(
        f"[{c.label}]" + (f" (score {c.score:.3f})" if c.score is not None else "") + f"\n{c.text}"
        for c in chunks
    )


class ToolProblem(Exception):
    """A tool call that cannot run or failed: its message is what the caller is told."""


# ----------------------------------------------------------------------------- the tools
def tool_arguments(name: str, route: Route, choices: tuple[str, ...]) -> type[BaseModel]:
    """A tool's arguments: ``route``'s request model plus its configurable ``choices`` (as
    the route's config schema types them), all optional."""
    specs = {spec.id: spec for spec in route.runnable.config_specs}
    extra: dict[str, Any] = {
        key: (specs[key].annotation | None, Field(None, description=specs[key].description))
        for key in choices
    }
    return create_model(name, __base__=route.request_model, **extra)  # type: ignore[call-overload,no-any-return]


# The configurable choices the search tool takes (ask's: the domain).
SEARCH_CHOICES = ("k", "domain")


class RagTools:
    """The tools over one service's routes, on a low-level MCP ``Server``."""

    def __init__(
        self,
        service: Service,
        routes: Mapping[str, Route],
        *,
        on_llm_failure: Callable[[LLMFailure], None] = lambda failure: None,
    ) -> None:
        self.service = service
        self.routes = routes
        self.on_llm_failure = on_llm_failure
        self.counts = FileCounts(service.index)
        self._arguments = PerLoad(self._tool_arguments)
        self.server: Server[Any, Request] = Server(
            "ragchains", version=__version__, instructions=INSTRUCTIONS
        )
        self.server.list_tools()(self.list_tools)
        # Arguments are checked by the routes' models (their words), not by jsonschema's.
        self.server.call_tool(validate_input=False)(self.call_tool)

    @property
    def arguments(self) -> dict[str, type[BaseModel]]:
        """Each tool's arguments, of the prompts' current load: a domain added to a domains
        folder the server follows is offered from the next listing on."""
        return self._arguments.get(self.service.prompts)

    def _tool_arguments(self, _: PromptRegistry) -> dict[str, type[BaseModel]]:
        return {
            "search": tool_arguments("SearchArguments", self.routes["retrieve"], SEARCH_CHOICES),
            "ask": tool_arguments("AskArguments", self.routes["ask"], ("domain",)),
        }

    async def list_tools(self) -> list[types.Tool]:
        def tool(name: str, description: str, arguments: Any, result: Any) -> types.Tool:
            schema = arguments.model_json_schema() if arguments else {"type": "object"}
            return types.Tool(
                name=name,
                description=description,
                inputSchema=schema,
                outputSchema=result.model_json_schema(),
                annotations=types.ToolAnnotations(readOnlyHint=True, openWorldHint=False),
            )

        return [
            tool(
                "search",
                "Search the documents: the chunks that best match the query (hybrid BM25 and "
                "dense search, reranked), each with the label to cite it by, its file, where "
                "in the file it is, and its score. Optional filters on metadata fields "
                "(list_fields names them), k (how many to retrieve before reranking) and "
                "domain (list_domains names them: its glossary and its documents).",
                self.arguments["search"],
                SearchResult,
            ),
            tool(
                "ask",
                "Answer a question from the documents: an answer whose sentences cite the "
                "chunks they come from, or abstained=true when the documents do not say "
                "(incomplete=true: the model's reply was cut short). Optional domain "
                "(list_domains names them) and filters.",
                self.arguments["ask"],
                AskResult,
            ),
            tool(
                "list_domains",
                "The prompt domains ask may answer in, each with its description and "
                "questions its documents answer.",
                None,
                DomainsResult,
            ),
            tool(
                "list_fields",
                "The metadata fields search and ask may filter on, with their types.",
                None,
                FieldsResult,
            ),
        ]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        request = self._request()
        groups = request.scope.get("state", {}).get(CALLER_GROUPS) if request else None
        # The request span's context (RequestSpans): the stages a tool runs nest under it.
        traced = request.scope.get("state", {}).get(REQUEST_CONTEXT) if request else None
        token = otel_context.attach(traced) if traced is not None else None
        try:
            with caller_groups(groups):
                result = await self._call(name, arguments)
        except ToolProblem as exc:
            return _error(str(exc))
        finally:
            if token is not None:
                otel_context.detach(token)
        text = _shown(result.chunks) if isinstance(result, SearchResult) else None
        if isinstance(result, AskResult):
            # The text is what many clients show or hand to their model: it says it too.
            text = f"{result.answer}\n\n{INCOMPLETE}" if result.incomplete else result.answer
        structured = result.model_dump(mode="json")
        shown = text if text is not None else json.dumps(structured, indent=2)
        return [types.TextContent(type="text", text=shown)], structured

    def _request(self) -> Request | None:
        """The HTTP request that carried the call (None over stdio)."""
        try:
            request = self.server.request_context.request
        except LookupError:
            return None
        return request if isinstance(request, Request) else None

    async def _call(self, name: str, arguments: dict[str, Any]) -> BaseModel:
        if name == "list_domains":
            # As /collection tells them: each domain's files the caller may read, and its
            # questions only where the caller may read the files they are about.
            groups = current_groups()

            def summaries() -> list[DomainSummary]:
                return domain_summaries(
                    self.service.prompts, lambda *scopes: self.counts.count(groups, *scopes)[0]
                )

            return DomainsResult(domains=await run_in_threadpool(summaries))
        if name == "list_fields":
            fields = dict(filterable_fields(self.service.index))
            example = [{"field": "filename", "op": "=", "value": "*.pdf"}]
            return FieldsResult(fields=fields, operators=list(OPERATORS), example=example)
        if name == "search":
            return await self._search(arguments)
        if name == "ask":
            return await self._ask(arguments)
        raise ToolProblem(f"no tool named {name!r}: search, ask, list_domains, list_fields")

    async def _search(self, arguments: dict[str, Any]) -> SearchResult:
        route = self.routes["retrieve"]
        given = self._checked("search", arguments)
        configurable = self._choices(route, given, SEARCH_CHOICES)
        inputs = given.model_dump(exclude=set(SEARCH_CHOICES))
        documents = await self._run(route, inputs, configurable)
        return SearchResult(chunks=[_chunk(to_source(doc)) for doc in documents])

    async def _ask(self, arguments: dict[str, Any]) -> AskResult:
        route = self.routes["ask"]
        given = self._checked("ask", arguments)
        configurable = self._choices(route, given, ("domain",))
        # The model's queue takes the call in order of its HTTP request's arrival, or
        # refuses it now when the wait would be too long.
        with tool_ticket(self._request(), self.service.settings.model_queue_wait) as ticket:
            inputs = given.model_dump(exclude={"domain"})
            output = await self._run(route, inputs, with_ticket(configurable, ticket), admit=ticket)
        sources = [_chunk(Source.model_validate(s)) for s in output.get("sources", [])]
        return AskResult(
            answer=output["answer"],
            citations=output.get("citations", []),
            abstained=bool(output.get("abstained")),
            uncited=bool(output.get("uncited")),
            incomplete=bool(output.get("incomplete")),
            sources=sources,
        )

    def _checked(self, tool: str, arguments: dict[str, Any]) -> Any:
        """The arguments checked by the route's request model: its words on failure."""
        try:
            return self.arguments[tool].model_validate(arguments)
        except ValidationError as exc:
            problems = "; ".join(problem_text(err) for err in exc.errors())
            raise ToolProblem(f"invalid arguments: {problems}") from exc

    @staticmethod
    def _choices(route: Route, given: Any, keys: tuple[str, ...]) -> dict[str, Any]:
        """The chosen configurable values, resolved as the route resolves a request's."""
        chosen = {key: getattr(given, key) for key in keys if getattr(given, key) is not None}
        try:
            return route.resolve(chosen)
        except HTTPException as exc:
            raise ToolProblem(str(exc.detail)) from exc

    async def _run(
        self,
        route: Route,
        inputs: dict[str, Any],
        configurable: dict[str, Any],
        *,
        admit: Ticket | None = None,
    ) -> Any:
        """The route's run, its failure told as the HTTP routes tell it; ``admit``'s request
        checked in to the model's queue first (``ModelBusy`` when it would wait too long)."""
        try:
            if admit is not None:
                check_in(admit, self.service.llm)
            return await route.runnable.ainvoke(inputs, {"configurable": configurable})
        except Exception as exc:
            status, reason, failure, retry_after = failed(exc)
            if failure is not None:
                self.on_llm_failure(failure)
                log.warning("MCP %s: %s (%s)", route.name, reason, failure.detail)
            elif retry_after is not None:
                log.info("MCP %s: %s", route.name, reason)
                reason = f"{reason}; try again in {retry_after} s"
            elif status >= 500 and status != 503:
                log.error("MCP %s failed", route.name, exc_info=exc)
            else:
                log.warning("MCP %s: %s", route.name, exc)
            raise ToolProblem(reason) from exc


def _error(message: str) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=message)], isError=True
    )


# ----------------------------------------------------------------------------- HTTP
class McpEndpoint:
    """``/mcp``: streamable HTTP, stateless, answered with JSON. Stateless because every call
    stands alone (no session to keep, any server behind a load balancer answers it), JSON
    because each tool's result is one reply."""

    def __init__(self, tools: RagTools) -> None:
        self.manager = StreamableHTTPSessionManager(
            app=tools.server, json_response=True, stateless=True
        )

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The session manager's tasks, for the app's lifespan."""
        async with self.manager.run():
            yield

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.manager.handle_request(scope, receive, send)


# ----------------------------------------------------------------------------- stdio
def serve_stdio(service: Service) -> None:
    """The tools over stdin and stdout until the client closes stdin (``ragchains mcp``).

    Stdout carries the protocol only: it is moved to a descriptor of its own, and the
    process's stdout then writes to stderr, so a library that prints (a model loader, a
    progress bar) cannot break a message."""
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    limits = Limits.from_settings(service.settings)
    tracer = app_tracer()
    record, model = service.settings.trace_content, service.llm.name
    observers = [StageSpans(tracer, record_content=record, model=model)] if tracer else []
    tools = RagTools(service, served_routes(service, limits, TOOL_ROUTES, observers))

    async def run() -> None:
        stdout = anyio.wrap_file(TextIOWrapper(protocol, encoding="utf-8", write_through=True))
        async with stdio_server(stdout=stdout) as (read, write):
            await tools.server.run(read, write, tools.server.create_initialization_options())

    anyio.run(run)
