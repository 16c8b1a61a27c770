"""The original files behind the citations: each served by its id to callers who may read it,
and what the chat page's viewer needs to show a chunk in place."""

from __future__ import annotations

from fastapi import APIRouter

from ragchains.factory import Service


def source_files_router(service: Service) -> APIRouter:
    return APIRouter(tags=["files"])
