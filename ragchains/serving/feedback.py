"""POST /feedback: a reader's thumbs up or down on one answer, kept in the feedback store."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, HTTPException
from starlette.concurrency import run_in_threadpool

from ragchains.feedback import FeedbackIn, FeedbackStore, FeedbackStoreError

log = logging.getLogger("ragchains.server")

FEEDBACK_UNSTORED = "feedback cannot be stored now; the server log has the details"


def feedback_router(store: FeedbackStore, on_vote: Callable[[int], None]) -> APIRouter:
    """``on_vote``: told each stored vote's score (1 up, 0 down)."""
    router = APIRouter(tags=["feedback"])

    @router.post("/feedback", status_code=201)
    async def feedback(body: FeedbackIn) -> dict[str, Any]:
        """A thumbs up (score 1) or down (0) on one answer, with an optional comment; kept
        in the feedback store (`ragchains feedback export` reads it)."""
        try:
            record = await run_in_threadpool(store.add, body)
        except FeedbackStoreError as exc:  # the file, not the request, is at fault
            # Its reason names the server's file: for the log, not for the caller.
            log.error("feedback not stored: %s", exc)
            raise HTTPException(503, FEEDBACK_UNSTORED) from exc
        on_vote(body.score)
        return {"id": record.id, "created_at": record.created_at}

    return router
