"""What the caller may ask about: the documents they may read (how many, of which kinds) and
each domain's suggested questions, for the chat page's empty state."""

from __future__ import annotations

from fastapi import APIRouter

from ragchains.factory import Service


def collection_router(service: Service) -> APIRouter:
    return APIRouter(tags=["collection"])
