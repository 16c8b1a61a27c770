"""POST /feedback: a reader's thumbs up or down on one answer, kept in the feedback store."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, HTTPException
from starlette.concurrency import run_in_threadpool

from ragchains.feedback import FeedbackIn, FeedbackStore, FeedbackStoreError
from ragchains.serving.bodies import JsonBody, read_model

log = logging.getLogger("ragchains.server")

FEEDBACK_UNSTORED = "feedback cannot be stored now; the server log has the details"


def feedback_router(store: FeedbackStore, on_vote: Callable[[int], None]) -> APIRouter:
    """``on_vote``: told each stored vote's score (1 up, 0 down)."""
    router = APIRouter(tags=["feedback"])

    # The body is read through json_body (FastAPI would parse a body parameter before any
    # dependency could check its text), so its schema is declared here.
    body_schema = {"content": {"application/json": {"schema": FeedbackIn.model_json_schema()}}}

    documented = {"requestBody": {**body_schema, "required": True}}

    @router.post("/feedback", status_code=201, openapi_extra=documented)
    async def feedback(sent: JsonBody) -> dict[str, Any]:
        """A thumbs up (score 1) or down (0) on one answer, with an optional comment; kept
        in the feedback store (`ragchains feedback export` reads it)."""
        body = read_feedback(sent)
        try:
            record = await run_in_threadpool(store.add, body)
        except FeedbackStoreError as exc:  # the file, not the request, is at fault
            # Its reason names the server's file: for the log, not for the caller.
            log.error("feedback not stored: %s", exc)
            raise HTTPException(503, FEEDBACK_UNSTORED) from exc
        on_vote(body.score)
        return {"id": record.id, "created_at": record.created_at}

    return router


def read_feedback(sent: Any) -> FeedbackIn:
    """The body as FeedbackIn, or a 422 naming where it is wrong, as FastAPI reports its own."""
    return read_model(FeedbackIn, sent)
