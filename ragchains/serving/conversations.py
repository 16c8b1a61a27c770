"""The caller's own conversations over HTTP: listed (most recent first), opened, renamed,
deleted and exported, and each finished turn stored as the page shows it. Another person's
conversation answers 404 (as one that never existed); an admin may delete anyone's.

The chains' routes stay stateless: the page runs a turn on /chat/stream as any client does,
then stores what it showed here (``PUT …/turns/{turn_id}``, sent again when its feedback
changes). The threads API (``serving.threads``) stores its runs' turns in the same records.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from ragchains.conversations import (
    MAX_PAGE,
    TITLE_CHARS,
    Conversation,
    ConversationExists,
    ConversationFull,
    ConversationStore,
    ConversationWithTurns,
    DatabaseError,
    Turn,
    TurnIn,
)
from ragchains.serving.errors import problem_responses
from ragchains.serving.guards import requires
from ragchains.serving.keys import Principal
from ragchains.textrules import text_type

log = logging.getLogger("ragchains.server")

# Any caller with a name: every role reads and writes its own conversations.
READER = Depends(requires("reader"))
CONVERSATIONS_UNAVAILABLE = "conversations cannot be read or stored now; the server log says why"
NOT_FOUND = "no conversation of yours has this id"
ConversationId = Annotated[
    str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
]
TurnId = Annotated[str, Path(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
T = TypeVar("T")


class NewConversation(BaseModel):
    title: text_type("title", TITLE_CHARS, blank=True) = ""  # type: ignore[valid-type]


class Rename(BaseModel):
    title: text_type("title", TITLE_CHARS)  # type: ignore[valid-type]


class ConversationList(BaseModel):
    conversations: list[Conversation]
    next_offset: int | None = Field(description="the offset of the next page; null: the last")


_REASONS = {
    404: "No conversation of the caller's has this id",
    409: "A conversation has this id already, or it is full",
    503: "The conversations' database cannot be read or written now",
}


def _problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return problem_responses(_REASONS, *statuses)


async def stored(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``call`` run off the event loop; a database that fails answers 503 (the reason,
    which names the server's file or database, goes to the log only)."""
    try:
        return await run_in_threadpool(call, *args, **kwargs)
    except DatabaseError as exc:
        log.error("%s", exc)
        raise HTTPException(503, CONVERSATIONS_UNAVAILABLE) from exc


async def deleted(store: ConversationStore, who: Principal, conversation_id: str) -> bool:
    """Whether ``who`` deleted the conversation: their own, or anyone's for an admin."""
    owner = None if who.may("admin") else who.name
    return await stored(store.delete, owner, conversation_id)


def conversations_router(store: ConversationStore) -> APIRouter:
    router = APIRouter(tags=["conversations"])

    @router.get(
        "/conversations",
        response_model=ConversationList,
        summary="Your conversations, the most recent first",
        responses=_problems(503),
    )
    async def list_conversations(
        who: Annotated[Principal, READER],
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
        offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
    ) -> ConversationList:
        found = await stored(store.list, who.name, limit=limit + 1, offset=offset)
        more = len(found) > limit
        return ConversationList(
            conversations=found[:limit], next_offset=offset + limit if more else None
        )

    @router.post(
        "/conversations",
        status_code=201,
        response_model=Conversation,
        summary="Start a conversation",
        responses=_problems(503),
    )
    async def create_conversation(
        who: Annotated[Principal, READER], body: NewConversation | None = None
    ) -> Conversation:
        """A new, empty conversation; untitled, its first question becomes its title."""
        title = body.title.strip() if body is not None else ""
        try:
            return await stored(store.create, who.name, title)
        except ConversationExists as exc:  # a random id taken: not to be seen
            raise HTTPException(409, str(exc)) from exc

    @router.get(
        "/conversations/{conversation_id}",
        response_model=ConversationWithTurns,
        summary="One of your conversations, with its turns",
        responses=_problems(404, 503),
    )
    async def get_conversation(
        conversation_id: ConversationId, who: Annotated[Principal, READER]
    ) -> ConversationWithTurns:
        found = await stored(store.get, who.name, conversation_id)
        if found is None:
            raise HTTPException(404, NOT_FOUND)
        return found

    @router.patch(
        "/conversations/{conversation_id}",
        response_model=Conversation,
        summary="Rename one of your conversations",
        responses=_problems(404, 503),
    )
    async def rename_conversation(
        conversation_id: ConversationId, body: Rename, who: Annotated[Principal, READER]
    ) -> Conversation:
        found = await stored(store.update, who.name, conversation_id, title=body.title.strip())
        if found is None:
            raise HTTPException(404, NOT_FOUND)
        return found

    @router.delete(
        "/conversations/{conversation_id}",
        status_code=204,
        summary="Delete a conversation, for good",
        responses=_problems(404, 503),
    )
    async def delete_conversation(
        conversation_id: ConversationId, who: Annotated[Principal, READER]
    ) -> Response:
        """Deletes the conversation and every turn of it from the database (not hidden:
        gone). An admin may delete anyone's."""
        if not await deleted(store, who, conversation_id):
            raise HTTPException(404, NOT_FOUND)
        return Response(status_code=204)

    @router.put(
        "/conversations/{conversation_id}/turns/{turn_id}",
        response_model=Turn,
        summary="Store a finished turn (again, when its feedback changes)",
        responses={201: {"description": "The turn was new"}, **_problems(404, 409, 503)},
    )
    async def put_turn(
        conversation_id: ConversationId,
        turn_id: TurnId,
        turn: TurnIn,
        who: Annotated[Principal, READER],
    ) -> JSONResponse:
        """The turn as the page showed it: its question, how it ended and what the chain
        returned (the answer, its citations, the prompt versions). A new id adds it last
        (201); a known one replaces it in place (200)."""
        try:
            done = await stored(store.put_turn, who.name, conversation_id, turn_id, turn)
        except ConversationFull as exc:
            raise HTTPException(409, str(exc)) from exc
        if done is None:
            raise HTTPException(404, NOT_FOUND)
        saved, new = done
        return JSONResponse(saved.model_dump(mode="json"), status_code=201 if new else 200)

    @router.get(
        "/conversations/{conversation_id}/export",
        summary="Download one of your conversations as Markdown or JSON",
        responses={
            200: {"content": {"text/markdown": {}, "application/json": {}}},
            **_problems(404, 503),
        },
    )
    async def export_conversation(
        conversation_id: ConversationId,
        who: Annotated[Principal, READER],
        format: Literal["markdown", "json"] = "markdown",
    ) -> Response:
        found = await stored(store.get, who.name, conversation_id)
        if found is None:
            raise HTTPException(404, NOT_FOUND)
        name = file_name(found.title or "conversation")
        if format == "json":
            body = json.dumps(found.model_dump(mode="json"), ensure_ascii=False, indent=2)
            media, suffix = "application/json", "json"
        else:
            body, media, suffix = as_markdown(found), "text/markdown; charset=utf-8", "md"
        disposition = f'attachment; filename="{name}.{suffix}"'
        return Response(body, media_type=media, headers={"Content-Disposition": disposition})

    return router


def file_name(title: str) -> str:
    """A download's name from a title: letters, digits and dashes only (an ASCII header)."""
    name = re.sub(r"[^A-Za-z0-9]+", "-", title).strip("-")[:60]
    return name or "conversation"


def as_markdown(conversation: ConversationWithTurns) -> str:
    """The conversation as a person would read it: each question, its answer with the
    sources it cited, and how the turn ended when it did not answer."""
    lines = [f"# {conversation.title or 'Conversation'}", ""]
    lines.append(f"Started {conversation.created_at}, last turn {conversation.updated_at}.")
    for turn in conversation.history:
        lines += ["", f"## {turn.question}", ""]
        if turn.output.answer:
            lines.append(turn.output.answer)
        if turn.status in ("error", "stopped"):
            why = f": {turn.error}" if turn.error else ""
            lines.append(f"*{'Stopped' if turn.status == 'stopped' else 'Failed'}{why}*")
        labels = list(dict.fromkeys(c.label or c.id for c in turn.output.citations))
        if labels:
            lines += ["", "Sources: " + "; ".join(label for label in labels if label)]
        facts = [f"{turn.mode} mode", f"domain {turn.domain}"]
        facts += [f"{name} {ref}" for name, ref in sorted(turn.output.prompts.items())]
        if turn.feedback.score is not None:
            facts.append("rated helpful" if turn.feedback.score else "rated not helpful")
        lines += ["", f"<sub>{', '.join(facts)}</sub>"]
        if turn.feedback.comment:
            lines += ["", f"> {turn.feedback.comment}"]
    return "\n".join(lines) + "\n"
