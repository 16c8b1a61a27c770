"""Threads and runs over HTTP: the part of LangGraph's Agent Protocol a chat needs, so that
LangChain's ``langgraph-sdk`` client (``get_client(url=…)``), RemoteGraph and Agent Chat UI
talk to the chat chain as an assistant named ``chat``.

A thread is one of the caller's conversations (``ragchains.conversations``): the page's
conversations are threads, and a thread's runs are turns on the page. Its state is
``{"messages": [...]}`` (LangChain messages as dicts: each turn a ``human`` question and an
``ai`` answer, whose ``response_metadata`` holds the citations and prompt versions); its
history is one checkpoint per turn, the newest first. A run takes the input's last human
message as the question and the thread's earlier turns as the chat history, runs the chat
chain as /chat serves it (the same checks, the same model queue), and stores the turn.

Where the protocol would answer a failed run with 200 and an ``__error__`` body, this server
answers with the failure's status (the SDK raises either way); a streamed run's failure is an
``error`` event, as the protocol has it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Path, Query, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import to_jsonable_python

from ragchains import __version__
from ragchains.chains.options import problem_text
from ragchains.conversations import (
    Conversation,
    ConversationExists,
    ConversationFull,
    ConversationStore,
    ConversationWithTurns,
    Turn,
    TurnIn,
    storable,
)
from ragchains.models.queue import Ticket, with_ticket
from ragchains.serving.admission import admit
from ragchains.serving.bodies import JsonBody, read_model
from ragchains.serving.conversations import READER, ConversationId, TurnId, deleted, stored
from ragchains.serving.errors import failed, problem_responses
from ragchains.serving.keys import Principal
from ragchains.serving.requests import Limits, Route
from ragchains.textrules import json_int, text_type

ASSISTANT = "chat"
# The id the LangGraph server gives the assistant of a graph named "chat" (uuid5 of the
# name in its namespace): clients that looked it up there find it here too.
ASSISTANT_UUID = str(uuid.uuid5(uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8"), ASSISTANT))
log = logging.getLogger("ragchains.server")
BUSY_THREAD = "a run is in progress on this thread: wait for it to end"
_Metadata = Annotated[dict[str, Any], Field(max_length=64)]
_Limit = json_int(ge=1, le=1000)
_Offset = json_int(ge=0, le=1_000_000)


_REASONS = {
    404: "No thread of the caller's has this id (or no such assistant or run)",
    409: "A thread has this id already, or a run is in progress on it",
    422: "The body names no question, or a choice the chat chain does not have",
    503: "The model is busy (Retry-After), or the conversations cannot be stored",
}


def _problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return problem_responses(_REASONS, *statuses)


# ----------------------------------------------------------------------------- bodies
class ThreadCreate(BaseModel):
    model_config = ConfigDict(extra="allow")  # ttl, supersteps, graph_id: accepted, unused
    thread_id: uuid.UUID | None = None
    metadata: _Metadata = Field(default_factory=dict)
    if_exists: Literal["raise", "do_nothing"] = "raise"


class ThreadSearch(BaseModel):
    model_config = ConfigDict(extra="allow")  # values, select, extract: accepted, unused
    limit: _Limit = 10  # type: ignore[valid-type]
    offset: _Offset = 0  # type: ignore[valid-type]
    metadata: _Metadata | None = None
    ids: Annotated[list[str], Field(max_length=1000)] | None = None
    status: Literal["idle", "busy", "interrupted", "error"] | None = None
    sort_by: (
        Literal["thread_id", "status", "created_at", "updated_at", "state_updated_at"] | None
    ) = None
    sort_order: Literal["asc", "desc"] | None = None


class ThreadPatch(BaseModel):
    model_config = ConfigDict(extra="allow")
    metadata: _Metadata


class HistoryRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # metadata, checkpoint, select: accepted, unused
    limit: _Limit = 10  # type: ignore[valid-type]
    before: str | dict[str, Any] | None = None


# The modes a chat has: its state, its updates, and its answer's tokens as message chunks
# (LangGraph's "messages-tuple"; the older "messages" form is not served).
StreamMode = Literal["values", "updates", "messages-tuple"]


def _has_a_question(schema: dict[str, Any]) -> None:
    """The input holds a question (JSON Schema's ``contains``): a message that is one of
    the two human kinds, the first two of its items' kinds."""
    schema["contains"] = {"anyOf": schema["items"]["anyOf"][:2]}


def run_request(limits: Limits) -> type[BaseModel]:
    """The body of a run, within ``limits``: the input's last human message is the
    question (LangChain's ``type`` or OpenAI's ``role``, its text a string or text blocks),
    checked as /chat checks one; other messages are accepted and not read (the thread's own
    turns are the history)."""
    question = text_type("question", limits.question_chars)

    class TextBlock(BaseModel):
        model_config = ConfigDict(extra="allow", title="RunTextBlock")
        type: Literal["text"]
        text: question  # type: ignore[valid-type]

    human_content = question | Annotated[list[TextBlock], Field(min_length=1, max_length=1)]
    other_content = str | list[dict[str, Any]] | None

    class HumanMessage(BaseModel):
        """The question: a message of OpenAI's ``role`` user, or LangChain's ``type``
        human."""

        model_config = ConfigDict(extra="allow", title="RunHumanMessage")
        content: human_content  # type: ignore[valid-type]

        def text(self) -> str:
            if isinstance(self.content, str):
                return self.content
            return str(self.content[0].text)

    class HumanByRole(HumanMessage):
        model_config = ConfigDict(title="RunUserMessage")
        role: Literal["user", "human"]

    class HumanByType(HumanMessage):
        model_config = ConfigDict(title="RunHumanTypedMessage")
        type: Literal["human"]

    class OtherByRole(BaseModel):
        """A message of the model's, the system's or a tool's: accepted, not read."""

        model_config = ConfigDict(extra="allow", title="RunOtherMessage")
        role: Literal["assistant", "ai", "system", "developer", "tool"]
        content: other_content = None  # type: ignore[valid-type]

    class OtherByType(BaseModel):
        model_config = ConfigDict(extra="allow", title="RunOtherTypedMessage")
        type: Literal["ai", "system", "tool"]
        content: other_content = None  # type: ignore[valid-type]

    class RunInput(BaseModel):
        model_config = ConfigDict(extra="allow", title="RunInput")
        # Left to right: a message that is a question and something else is the question.
        messages: list[
            Annotated[
                HumanByRole | HumanByType | OtherByRole | OtherByType,
                Field(union_mode="left_to_right"),
            ]
        ] = Field(
            min_length=1, max_length=limits.history_messages + 1, json_schema_extra=_has_a_question
        )

        @model_validator(mode="after")
        def _has_a_question(self) -> Any:
            if not any(isinstance(m, HumanMessage) for m in self.messages):
                raise ValueError("input.messages holds no human (user) message to answer")
            return self

        def question(self) -> str:
            asked = (m for m in reversed(self.messages) if isinstance(m, HumanMessage))
            return next(asked).text()

    class RunConfig(BaseModel):
        model_config = ConfigDict(extra="allow", title="RunConfig")  # tags, recursion_limit
        configurable: dict[str, Any] = Field(
            default_factory=dict, description="the chat chain's choices, as on /chat"
        )

    class RunCreate(BaseModel):
        """A run of the chat assistant on a thread: ``input.messages``' last human message
        is the question; ``config.configurable`` holds the chat chain's choices (domain,
        prompt versions, k), as on /chat. The protocol's other keys are accepted, unused."""

        model_config = ConfigDict(extra="allow", title="RunCreate")
        assistant_id: Annotated[str, Field(min_length=1, max_length=100)]
        input: RunInput
        stream_mode: StreamMode | Annotated[list[StreamMode], Field(min_length=1, max_length=4)] = (
            "values"
        )
        config: RunConfig = Field(default_factory=RunConfig)
        metadata: _Metadata | None = None

    return RunCreate


# ----------------------------------------------------------------------------- views
def _message(kind: str, content: str, message_id: str, **extra: Any) -> dict[str, Any]:
    message: dict[str, Any] = {
        "type": kind,
        "content": content,
        "id": message_id,
        "name": None,
        "additional_kwargs": {},
        "response_metadata": {},
    }
    if kind in ("ai", "AIMessageChunk"):
        message.update(tool_calls=[], invalid_tool_calls=[], usage_metadata=None)
    message.update(extra)
    return message


def turn_messages(turn: Turn | TurnIn, turn_id: str) -> list[dict[str, Any]]:
    """A turn as the thread's two messages: the question and the answer (with what it
    rests on in ``response_metadata``)."""
    output = turn.output
    details: dict[str, Any] = {
        "status": turn.status,
        "abstained": output.abstained,
        "citations": [c.model_dump() for c in output.citations],
        "prompts": output.prompts,
        "domain": turn.domain,
    }
    earlier = (output.model_extra or {}).get("history_turns")
    if isinstance(earlier, int):
        details["history_turns"] = earlier  # the earlier turns the run was given
    if turn.error:
        details["error"] = turn.error
    return [
        _message("human", turn.question, f"{turn_id}-question"),
        _message("ai", output.answer, turn.run_id or turn_id, response_metadata=details),
    ]


def values_of(turns: Sequence[Turn]) -> dict[str, Any]:
    return {"messages": [m for turn in turns for m in turn_messages(turn, turn.id)]}


def _checkpoint(thread_id: str, checkpoint_id: str | None) -> dict[str, Any] | None:
    if checkpoint_id is None:
        return None
    return {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}


def state_after(conversation: ConversationWithTurns, n: int) -> dict[str, Any]:
    """The thread's state after its turn ``n`` (counted from 0): its checkpoint."""
    turns = conversation.history
    turn = turns[n]
    parent = turns[n - 1].id if n else None
    return {
        "values": values_of(turns[: n + 1]),
        "next": [],
        "tasks": [],
        "metadata": {
            "source": "loop",
            "step": n,
            "parents": {},
            "run_id": turn.run_id,
            "thread_id": conversation.id,
            "graph_id": ASSISTANT,
        },
        "created_at": turn.created_at,
        "checkpoint": _checkpoint(conversation.id, turn.id),
        "parent_checkpoint": _checkpoint(conversation.id, parent),
        "checkpoint_id": turn.id,
        "parent_checkpoint_id": parent,
        "interrupts": [],
    }


def history_page(
    conversation: ConversationWithTurns, before: str | None, limit: int
) -> list[dict[str, Any]]:
    """Up to ``limit`` of the thread's states, the newest first, from the one before the
    checkpoint ``before`` (none: from the newest); only those are built (each holds the
    messages up to it)."""
    ids = [turn.id for turn in conversation.history]
    if before is None:
        start = len(ids) - 1
    elif before in ids:
        start = ids.index(before) - 1
    else:
        return []
    return [state_after(conversation, n) for n in range(start, max(start - limit, -1), -1)]


def empty_state() -> dict[str, Any]:
    return {
        "values": {},
        "next": [],
        "tasks": [],
        "metadata": None,
        "created_at": None,
        "checkpoint": None,
        "parent_checkpoint": None,
        "checkpoint_id": None,
        "parent_checkpoint_id": None,
        "interrupts": [],
    }


def thread_view(
    conversation: Conversation, turns: Sequence[Turn] | None, *, busy: bool
) -> dict[str, Any]:
    return {
        "thread_id": conversation.id,
        "created_at": conversation.created_at,
        "updated_at": conversation.updated_at,
        "state_updated_at": conversation.updated_at,
        "metadata": conversation.metadata,
        "status": "busy" if busy else "idle",
        "config": {},
        "values": values_of(turns) if turns else None,
        "interrupts": {},
        "title": conversation.title,
    }


def assistant_view() -> dict[str, Any]:
    return {
        "assistant_id": ASSISTANT_UUID,
        "graph_id": ASSISTANT,
        "name": ASSISTANT,
        "description": "Grounded, cited answers over the collection, with chat history.",
        "config": {},
        "context": {},
        "metadata": {"created_by": "system"},
        "version": 1,
        "created_at": "1970-01-01T00:00:00+00:00",
        "updated_at": "1970-01-01T00:00:00+00:00",
    }


def sse(event: str, data: Any) -> str:
    return f"event: {event}\r\ndata: {json.dumps(data, ensure_ascii=False)}\r\n\r\n"


# ----------------------------------------------------------------------------- routes
def threads_router(
    store: ConversationStore,
    chat: Route,
    run_model: type[BaseModel],
    limits: Limits,
    llm: Any,
    ticket: Any,
) -> APIRouter:
    """``chat``: the chat chain as /chat serves it (its checks and its resolver);
    ``run_model``: a run's body (``run_request``); ``ticket``: the dependency that gives a
    run its ticket for the model's queue."""
    router = APIRouter(tags=["threads"])
    running = Running()

    async def owned(who: Principal, thread_id: str) -> ConversationWithTurns:
        found = await stored(store.get, who.name, thread_id)
        if found is None:
            raise HTTPException(404, f"no thread of yours has the id {thread_id}")
        return found

    @router.get("/info", summary="What this Agent Protocol server offers")
    async def info() -> dict[str, Any]:
        return {
            "version": __version__,
            "flags": {"assistants": True, "crons": False, "store": False},
            "ragchains": {"assistants": [ASSISTANT]},
        }

    @router.post("/assistants/search", summary="The assistants: the chat chain")
    async def search_assistants() -> list[dict[str, Any]]:
        return [assistant_view()]

    @router.get(
        "/assistants/{assistant_id}", summary="The chat assistant", responses=_problems(404)
    )
    async def get_assistant(assistant_id: Annotated[str, Path(max_length=100)]) -> dict[str, Any]:
        check_assistant(assistant_id)
        return assistant_view()

    @router.post(
        "/threads", summary="Start a thread (a conversation)", responses=_problems(409, 503)
    )
    async def create_thread(
        who: Annotated[Principal, READER], body: ThreadCreate | None = None
    ) -> JSONResponse:
        body = body or ThreadCreate()
        metadata = storable_metadata(body.metadata)
        given = str(body.thread_id) if body.thread_id is not None else None
        try:
            made = await stored(store.create, who.name, id=given, metadata=metadata)
        except ConversationExists as exc:
            if body.if_exists == "do_nothing" and given is not None:
                held = await owned(who, given)  # someone else's id answers 404
                return JSONResponse(thread_view(held, held.history, busy=given in running))
            raise HTTPException(409, f"a thread with the id {given} exists") from exc
        return JSONResponse(thread_view(made, [], busy=False))

    @router.post(
        "/threads/search", summary="Your threads, the most recent first", responses=_problems(503)
    )
    async def search_threads(
        who: Annotated[Principal, READER], body: ThreadSearch | None = None
    ) -> list[dict[str, Any]]:
        body = body or ThreadSearch()
        oldest_first = body.sort_order == "asc"
        found = await stored(
            store.list, who.name, limit=10**9, metadata=body.metadata, oldest_first=oldest_first
        )
        if body.ids is not None:
            wanted = set(body.ids)
            found = [c for c in found if c.id in wanted]
        if body.status is not None:
            found = [c for c in found if ("busy" if c.id in running else "idle") == body.status]
        if body.sort_by in ("thread_id", "created_at"):
            key = "id" if body.sort_by == "thread_id" else "created_at"
            found.sort(key=lambda c: getattr(c, key), reverse=not oldest_first)
        start, count = int(body.offset), int(body.limit)
        page = found[start : start + count]
        views = []
        for conversation in page:
            full = await stored(store.get, who.name, conversation.id)
            if full is not None:
                views.append(thread_view(full, full.history, busy=full.id in running))
        return views

    @router.get(
        "/threads/{thread_id}", summary="One of your threads", responses=_problems(404, 503)
    )
    async def get_thread(
        thread_id: ConversationId, who: Annotated[Principal, READER]
    ) -> dict[str, Any]:
        found = await owned(who, thread_id)
        return thread_view(found, found.history, busy=thread_id in running)

    @router.patch(
        "/threads/{thread_id}", summary="Add to a thread's metadata", responses=_problems(404, 503)
    )
    async def update_thread(
        thread_id: ConversationId, body: ThreadPatch, who: Annotated[Principal, READER]
    ) -> dict[str, Any]:
        metadata = storable_metadata(body.metadata)
        if await stored(store.update, who.name, thread_id, metadata=metadata) is None:
            raise HTTPException(404, f"no thread of yours has the id {thread_id}")
        found = await owned(who, thread_id)
        return thread_view(found, found.history, busy=thread_id in running)

    @router.delete(
        "/threads/{thread_id}",
        status_code=204,
        summary="Delete a thread, for good",
        responses=_problems(404, 503),
    )
    async def delete_thread(
        thread_id: ConversationId, who: Annotated[Principal, READER]
    ) -> Response:
        if not await deleted(store, who, thread_id):
            raise HTTPException(404, f"no thread of yours has the id {thread_id}")
        return Response(status_code=204)

    @router.get(
        "/threads/{thread_id}/state",
        summary="A thread's state: its messages",
        responses=_problems(404, 503),
    )
    async def thread_state(
        thread_id: ConversationId,
        who: Annotated[Principal, READER],
        subgraphs: Annotated[bool, Query()] = False,
    ) -> dict[str, Any]:
        found = await owned(who, thread_id)
        return state_after(found, len(found.history) - 1) if found.history else empty_state()

    @router.post(
        "/threads/{thread_id}/history",
        summary="A thread's states, the newest first",
        responses=_problems(404, 503),
    )
    async def thread_history(
        thread_id: ConversationId,
        who: Annotated[Principal, READER],
        body: HistoryRequest | None = None,
    ) -> list[dict[str, Any]]:
        body = body or HistoryRequest()
        found = await owned(who, thread_id)
        return history_page(found, checkpoint_named(body.before), int(body.limit))

    @router.get(
        "/threads/{thread_id}/runs",
        summary="A thread's runs, the newest first",
        responses=_problems(404, 503),
    )
    async def list_runs(
        thread_id: ConversationId,
        who: Annotated[Principal, READER],
        limit: Annotated[int, Query(ge=1, le=1000)] = 10,
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> list[dict[str, Any]]:
        found = await owned(who, thread_id)
        runs = [run_view(found.id, t) for t in reversed(found.history) if t.run_id]
        return runs[offset : offset + limit]

    @router.get(
        "/threads/{thread_id}/runs/{run_id}",
        summary="One run of a thread",
        responses=_problems(404, 503),
    )
    async def get_run(
        thread_id: ConversationId, run_id: TurnId, who: Annotated[Principal, READER]
    ) -> dict[str, Any]:
        found = await owned(who, thread_id)
        turn = next((t for t in found.history if t.run_id == run_id), None)
        if turn is None:
            raise HTTPException(404, f"the thread has no run {run_id}")
        return run_view(found.id, turn)

    async def start(
        thread_id: str, body: Any, who: Principal, held: Ticket
    ) -> tuple[ConversationWithTurns, Any, Any]:
        """The run's thread, chain input and config, every refusal made before any work."""
        check_assistant(body.assistant_id)
        found = await owned(who, thread_id)
        history = chat_history(found.history, limits)
        try:
            turn = chat.request_model.model_validate(
                {"question": body.input.question(), "chat_history": history}
            )
        except ValidationError as exc:
            raise HTTPException(422, problem_text(exc.errors()[0])) from exc
        configurable = chat.resolve(body.config.configurable)
        admit(held, llm)  # 503 now, not in a started stream
        running.take(thread_id)  # 409 when a run is in progress
        config: Any = {"configurable": with_ticket(configurable, held), "run_name": ASSISTANT}
        return found, turn, config

    async def record(who: Principal, thread_id: str, run_id: str, turn: TurnIn, body: Any) -> None:
        """The run kept as the thread's next turn. Its failure is logged, not raised: the
        answer has been given (a full thread, a database down for a moment)."""
        try:
            if await stored(store.put_turn, who.name, thread_id, run_id, turn) is None:
                log.info("run %s not stored: thread %s was deleted meanwhile", run_id, thread_id)
                return
            await stored(
                store.update,
                who.name,
                thread_id,
                metadata={"graph_id": ASSISTANT, "assistant_id": body.assistant_id},
            )
        except (ConversationFull, HTTPException) as exc:
            log.warning("run %s of thread %s not stored: %s", run_id, thread_id, exc)

    @router.post(
        "/threads/{thread_id}/runs/stream",
        summary="Run the chat assistant on a thread, streamed (server-sent events)",
        responses={200: {"content": {"text/event-stream": {}}}, **_problems(404, 409, 422, 503)},
    )
    async def stream_run(
        thread_id: ConversationId,
        sent: JsonBody,
        who: Annotated[Principal, READER],
        held: Ticket = ticket,
    ) -> StreamingResponse:
        body: Any = read_model(run_model, sent)
        modes = frozenset(
            [body.stream_mode] if isinstance(body.stream_mode, str) else body.stream_mode
        )
        found, turn, config = await start(thread_id, body, who, held)
        run_id = str(uuid.uuid4())
        question = turn.question
        earlier = len(turn.chat_history) // 2

        async def events() -> AsyncIterator[str]:
            out: dict[str, Any] = {"answer": ""}
            before = values_of(found.history)["messages"]
            asked = _message("human", question, f"{run_id}-question")
            try:
                yield sse("metadata", {"run_id": run_id, "attempt": 1})
                if "values" in modes:
                    yield sse("values", {"messages": [*before, asked]})
                async for chunk in chat.runnable.astream(turn, config):
                    merge(out, chunk)
                    if "answer" in chunk and "messages-tuple" in modes:
                        delta = _message("AIMessageChunk", chunk["answer"], run_id)
                        meta = {
                            "run_id": run_id,
                            "thread_id": thread_id,
                            "graph_id": ASSISTANT,
                            "langgraph_node": ASSISTANT,
                        }
                        yield sse("messages", [delta, meta])
            except Exception as exc:  # the headers are sent: the failure is an event
                failure = failed(exc)
                kept = finished(
                    question, out, body, run_id, history_turns=earlier, error=failure.reason
                )
                await record(who, thread_id, run_id, kept, body)
                yield sse(
                    "error",
                    {
                        "error": type(exc).__name__,
                        "message": failure.reason,
                        "status_code": failure.status,
                    },
                )
                return
            except (asyncio.CancelledError, GeneratorExit):
                # The client left: the turn so far is kept as stopped, as the page keeps
                # one, by a task of its own (nothing more can be awaited here).
                stopped = finished(question, out, body, run_id, history_turns=earlier, stopped=True)
                running.later(record(who, thread_id, run_id, stopped, body))
                raise
            finally:
                running.free(thread_id)
            kept = finished(question, out, body, run_id, history_turns=earlier)
            await record(who, thread_id, run_id, kept, body)
            answer = turn_messages(kept, run_id)[1]
            if "updates" in modes:
                yield sse("updates", {ASSISTANT: {"messages": [answer]}})
            if "values" in modes:
                yield sse("values", {"messages": [*before, asked, answer]})

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
                "Content-Location": f"/threads/{thread_id}/runs/{run_id}",
            },
        )

    @router.post(
        "/threads/{thread_id}/runs/wait",
        summary="Run the chat assistant on a thread and wait for its state",
        responses=_problems(404, 409, 422, 503),
    )
    async def wait_run(
        thread_id: ConversationId,
        sent: JsonBody,
        who: Annotated[Principal, READER],
        held: Ticket = ticket,
    ) -> JSONResponse:
        body: Any = read_model(run_model, sent)
        found, turn, config = await start(thread_id, body, who, held)
        run_id = str(uuid.uuid4())
        question = turn.question
        earlier = len(turn.chat_history) // 2
        try:
            result = await chat.runnable.ainvoke(turn, config)
        except Exception as exc:
            failure = failed(exc)
            failure_turn = finished(
                question, {"answer": ""}, body, run_id, history_turns=earlier, error=failure.reason
            )
            await record(who, thread_id, run_id, failure_turn, body)
            raise
        finally:
            running.free(thread_id)
        kept = finished(question, dict(result), body, run_id, history_turns=earlier)
        await record(who, thread_id, run_id, kept, body)
        messages = [*values_of(found.history)["messages"], *turn_messages(kept, run_id)]
        return JSONResponse(
            {"messages": messages},
            headers={"Content-Location": f"/threads/{thread_id}/runs/{run_id}"},
        )

    return router


def checkpoint_named(before: str | dict[str, Any] | None) -> str | None:
    """The checkpoint id ``before`` names: as it is, a checkpoint's dict, or a config's
    (``{"configurable": {"checkpoint_id": …}}``), as the SDKs send it."""
    if isinstance(before, dict):
        named = before.get("checkpoint_id", (before.get("configurable") or {}).get("checkpoint_id"))
        return named if isinstance(named, str) else None
    return before


class Running:
    """The threads with a run in progress on this server, each held by the request that
    started its run: when that request ends, however it ends (its stream never started,
    its client gone), the thread is free again."""

    def __init__(self) -> None:
        self._held: dict[str, asyncio.Task[Any] | None] = {}
        self._later: set[asyncio.Task[Any]] = set()

    def __contains__(self, thread_id: object) -> bool:
        task = self._held.get(str(thread_id))
        return task is not None and not task.done()

    def take(self, thread_id: str) -> None:
        """Holds ``thread_id`` for the current request; 409 when a run holds it."""
        if thread_id in self:
            raise HTTPException(409, BUSY_THREAD)
        self._held[thread_id] = asyncio.current_task()

    def free(self, thread_id: str) -> None:
        self._held.pop(thread_id, None)

    def later(self, work: Any) -> None:
        """``work`` (a coroutine) run by a task of its own, kept until it ends."""
        task = asyncio.get_running_loop().create_task(work)
        self._later.add(task)
        task.add_done_callback(self._later.discard)


def check_assistant(assistant_id: str) -> None:
    if assistant_id not in (ASSISTANT, ASSISTANT_UUID):
        raise HTTPException(404, f"no assistant {assistant_id!r}: this server has {ASSISTANT!r}")


def storable_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    try:
        return dict(storable(metadata, "metadata"))
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from exc


def chat_history(turns: Sequence[Turn], limits: Limits) -> list[dict[str, str]]:
    """The newest answered turns that fit the server's history limits, as the page sends
    them: each a user and an assistant message."""
    pairs: list[dict[str, str]] = []
    room = limits.history_chars
    for turn in reversed(turns):
        if turn.status not in ("answered", "abstained"):
            continue
        size = len(turn.question) + len(turn.output.answer)
        if len(pairs) + 2 > limits.history_messages or size > room:
            break
        room -= size
        pairs[:0] = [
            {"role": "user", "content": turn.question},
            {"role": "assistant", "content": turn.output.answer},
        ]
    return pairs


def merge(out: dict[str, Any], chunk: dict[str, Any]) -> None:
    """A streamed chunk added to the turn so far, as LangServe merges a stream: the
    answer's text added up, notes appended, every other key the newest."""
    for name, value in chunk.items():
        if name == "answer":
            out["answer"] = out.get("answer", "") + value
        elif name == "notes":
            out["notes"] = [*out.get("notes", []), *value]
        else:
            out[name] = value


def finished(
    question: str,
    out: dict[str, Any],
    body: Any,
    run_id: str,
    *,
    history_turns: int,
    error: str | None = None,
    stopped: bool = False,
) -> TurnIn:
    """The run as a stored turn (what the page stores for one of its own), with how many
    earlier turns it was given as its chat history."""
    domain = body.config.configurable.get("domain")
    output = to_jsonable_python(out, fallback=str)  # models and documents as their fields
    output["history_turns"] = history_turns
    status = (
        "error"
        if error
        else "stopped"
        if stopped
        else "abstained"
        if out.get("abstained")
        else "answered"
    )
    return TurnIn.model_validate(
        {
            "question": question,
            "mode": "chat",
            "domain": domain if isinstance(domain, str) and domain else "default",
            "status": status,
            "output": output,
            "run_id": run_id,
            "error": error,
        }
    )


def run_view(thread_id: str, turn: Turn) -> dict[str, Any]:
    return {
        "run_id": turn.run_id,
        "thread_id": thread_id,
        "assistant_id": ASSISTANT_UUID,
        "created_at": turn.created_at,
        "updated_at": turn.created_at,
        "status": "error" if turn.status == "error" else "success",
        "metadata": {"graph_id": ASSISTANT},
        "multitask_strategy": "reject",
        "kwargs": {},
    }
