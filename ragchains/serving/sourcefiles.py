"""The original files behind the citations: each served by its id to callers who may read it,
and what the chat page's viewer needs to show a chunk in place.

A file's id is the sha256 of its bytes (each chunk's ``file_id``); the bytes are those the
ingest read (kept in the index folder's ``files/`` or the store's ``originals``). A caller
gets a file only if it may read one of the files holding those bytes; for any other id
(hidden, unknown, malformed, or an original not kept) every route answers the same 404, so
an answer never tells that a file exists.

An original is served as a download would be, never as part of this site: ``nosniff``, and a
``Content-Security-Policy`` whose ``sandbox`` puts an HTML or SVG file opened directly in an
opaque origin, with no script, no form, no plugin and nothing fetched but inline styles and
``data:`` images; ``Cross-Origin-Resource-Policy: same-origin`` keeps other sites from
embedding it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import IO, Any
from urllib.parse import quote

from cachetools import LRUCache
from fastapi import APIRouter, Query, Request
from fastapi import Path as FastPath
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from ragchains.factory import Service
from ragchains.ingest.parsing import BudgetedCalls
from ragchains.ingest.parts import LoadOptions, SkipFile
from ragchains.retrievers import formats
from ragchains.retrievers.access import current_groups
from ragchains.retrievers.indexformat import FileRecord, is_file_id
from ragchains.retrievers.live import LiveIndex
from ragchains.retrievers.pgstore import PostgresStore
from ragchains.retrievers.searchindex import SearchIndex
from ragchains.serving.fileview import FileView, build_view, image_page_png, pdf_page_png

log = logging.getLogger("ragchains.server")

NO_SUCH_FILE = "no such file"
MAX_AROUND = 50
# Views kept (each a file's parts, or a table's rows: a few MB at most for large ones).
VIEW_CACHE_SIZE = 16
PNG_CACHE_SIZE = 4  # image pages turned into PNG (a 300-dpi A4 scan: about a megabyte)
_READ_BLOCK = 256 * 1024

# How many leading bytes tell a file's media type when its format goes by content (images).
_HEAD_BYTES = 16
# How /files/{id}/image draws a page as PNG, by the view of the file's format.
PAGE_DRAWERS = {"image": image_page_png, "pdf": pdf_page_png}
# Whatever the file holds, opened directly it runs nothing and fetches nothing.
SANDBOX = "sandbox; default-src 'none'; img-src data:; style-src 'unsafe-inline'"
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": SANDBOX,
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "private, no-cache",
}

_PROBLEM = {"application/json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
_NOT_FOUND_DOC = {
    "description": "No such file: hidden from the caller, unknown, malformed, or not kept "
    "(the same reply in every case)",
    "content": _PROBLEM,
}
_STORE_DOWN = {
    "description": "The document store cannot be reached, or an index file was found damaged",
    "content": _PROBLEM,
}
_INVALID = {
    "description": "A query parameter out of range, or a file that cannot be shown (reading "
    "it outgrew the budget files are read under); the reason says which",
    "content": _PROBLEM,
}
_ETAG_HEADER = {"ETag": {"description": "the file's id, quoted", "schema": {"type": "string"}}}


class ViewPart(BaseModel):
    text: str = Field(description="the part's text (Markdown) that its chunks' start/end slice")
    section: str | None = Field(description="the heading path")
    anchor: str = Field(description="the citation's suffix after '#'")
    slide: int | None
    page: int | None
    title: str | None


class ViewRow(BaseModel):
    row: int = Field(description="the row's number as its chunk's location cites it")
    cells: list[str]


class ViewTable(BaseModel):
    sheet: str | None = Field(description="the sheet shown (a workbook's), else null")
    sheets: list[str] = Field(description="a workbook's visible sheets; [] for CSV and JSON")
    columns: list[str]
    rows: list[ViewRow]
    total_rows: int = Field(description="the sheet's rows with text")


class FileViewBody(BaseModel):
    """What the viewer shows of a file: by ``kind``, its pages (pdf, image), its parts
    (text) or a window of its rows (table)."""

    file_id: str
    name: str = Field(description="the file's name")
    source: str = Field(description="the file's source, as its chunks' metadata has it")
    format: str
    title: str
    kind: formats.ViewKind
    pages: int | None = Field(None, description="pdf and image: the page count")
    page_sizes: list[list[float]] | None = Field(
        None,
        description="image: each page's [width, height] in PDF points (the units of its "
        "chunks' boxes, page_width and page_height)",
    )
    parts: list[ViewPart] | None = Field(None, description="text: the loader's parts in order")
    table: ViewTable | None = Field(None, description="table: the header and rows asked for")


@dataclass
class _Found:
    """A file the caller may read: its record (the first readable one holding the bytes),
    and its bytes, in memory or open."""

    record: FileRecord
    size: int
    data: bytes | None = None
    handle: IO[bytes] | None = None

    def read_all(self) -> bytes:
        if self.data is not None:
            return self.data
        assert self.handle is not None
        with self.handle:
            return self.handle.read()

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()


def readable_record(records: list[FileRecord]) -> FileRecord | None:
    """The first record (by source) the caller may read: open to everyone, sharing a group
    with the caller, or any when nothing is hidden from it."""
    groups = current_groups()
    for record in records:
        if groups is None or not record.access or groups.intersection(record.access):
            return record
    return None


def cannot_show(reason: SkipFile) -> JSONResponse:
    return JSONResponse({"detail": f"the file cannot be shown: {reason}"}, status_code=422)


def not_found() -> JSONResponse:
    """The one reply for a file the caller may not have, whatever the reason."""
    return JSONResponse({"detail": NO_SUCH_FILE}, status_code=404)


def media_type(record: FileRecord, head: bytes) -> str:
    """What a file is served as (``head``: its first bytes), by ``retrievers.formats``."""
    return formats.media_type(record.source, record.format, head)


def content_disposition(name: str) -> str:
    """``inline``, the name as UTF-8 (RFC 6266/8187) and an ASCII stand-in for old clients."""
    fallback = (
        "".join(c if 32 <= ord(c) < 127 and c not in '"\\%;' else "_" for c in name) or "file"
    )
    return f"inline; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"


def etag(file_id: str, suffix: str = "") -> str:
    return f'"{file_id}{suffix}"'


def _matches(request: Request, tag: str) -> bool:
    given = request.headers.get("if-none-match")
    if given is None:
        return False
    return given.strip() == "*" or tag in [t.strip().removeprefix("W/") for t in given.split(",")]


def _iterate(handle: IO[bytes]) -> Iterator[bytes]:
    with handle:
        while block := handle.read(_READ_BLOCK):
            yield block


def _load_options(chunking: dict[str, Any]) -> LoadOptions:
    """The options the ingest read files with, as it recorded them (the view's parts must
    be the chunks' parts: Word notes, the sheet row cap)."""
    defaults = LoadOptions()
    columns = chunking.get("text_columns")
    return LoadOptions(
        text_columns=list(columns) if columns else None,
        include_notes=bool(chunking.get("include_notes", defaults.include_notes)),
        max_sheet_rows=int(chunking.get("max_sheet_rows") or defaults.max_sheet_rows),
    )


class _Originals:
    """Finds a file the caller may read, in the generation the request is pinned to (an
    index folder) or in the store."""

    def __init__(self, service: Service) -> None:
        self.index = service.index

    def reader(self) -> SearchIndex | PostgresStore:
        # Read here, in the request's context: the generation its guard pinned (serving.guards).
        index = self.index
        return index.pinned() if isinstance(index, LiveIndex) else index

    @staticmethod
    def find(
        reader: SearchIndex | PostgresStore, file_id: str, *, body: bool = True
    ) -> _Found | None:
        """The caller's file with this id, its bytes opened (``body``), or None."""
        if not is_file_id(file_id):
            return None
        record = readable_record(reader.file_records(file_id))
        if record is None:
            return None
        if isinstance(reader, PostgresStore):
            data = reader.original(file_id)
            return None if data is None else _Found(record, len(data), data=data)
        path = reader.original(file_id)
        if path is None:
            return None
        try:
            # Opened once, now: an ingest may delete it; an open file stays readable.
            handle = open(path, "rb")  # noqa: SIM115 (closed by whoever streams it)
        except FileNotFoundError:
            return None
        size = os.fstat(handle.fileno()).st_size
        return _Found(record, size, handle=handle)

    @staticmethod
    def chunking(reader: SearchIndex | PostgresStore) -> dict[str, Any]:
        if isinstance(reader, PostgresStore):
            return dict(reader.known_meta().get("chunking") or {})
        return dict(reader.manifest.get("chunking") or {})


def example_ids(index: object) -> tuple[str | None, str | None]:
    """Ids of files everyone may read, for the API document's examples (so that "Try it
    out" and clients generated from it reach a real file): any file, and a PDF or image.
    None when there is none, or the store cannot be read now (then no example)."""
    try:
        reader = index.pinned() if isinstance(index, LiveIndex) else index
        if not isinstance(reader, SearchIndex | PostgresStore):
            return None, None
        files = reader.store.files() if isinstance(reader, SearchIndex) else reader.files()
        public = [r for _, r in sorted(files.items()) if not r.access]
    except Exception as exc:  # a store unreachable at start-up: no example, no failure
        log.warning("no file id for the API document's examples: %s", exc)
        return None, None
    paged = [r for r in public if formats.view_of(r.format) in PAGE_DRAWERS]
    return (public[0].sha256 if public else None, paged[0].sha256 if paged else None)


def _file_id(example: str | None) -> Any:
    examples = {"a file": {"value": example}} if example else None
    return FastPath(
        description="the file's id: a chunk's file_id, the sha256 of its bytes",
        openapi_examples=examples,  # type: ignore[arg-type]
    )


def source_files_router(service: Service, files_reader: BudgetedCalls) -> APIRouter:
    """``files_reader``: where a file is read for the viewer (worker processes under a budget: the
    server never parses a file itself)."""
    router = APIRouter(tags=["files"])
    originals = _Originals(service)
    any_file, paged_file = example_ids(service.index)
    # Requests read and fill these from the thread pool; LRUCache is not thread-safe, so each
    # lookup and each store holds the lock (never the reading of a file in between).
    views: LRUCache[tuple[str, str, str], FileView] = LRUCache(maxsize=VIEW_CACHE_SIZE)
    pngs: LRUCache[tuple[str, int], bytes] = LRUCache(maxsize=PNG_CACHE_SIZE)
    caches_lock = threading.Lock()

    @router.get(
        "/files/{file_id}",
        response_class=Response,
        responses={
            200: {
                "description": "The file's bytes as ingested, with its own media type",
                "headers": _ETAG_HEADER,
                "content": {
                    media: {"schema": {"type": "string", "format": "binary"}}
                    for media in sorted(formats.media_types())
                },
            },
            304: {"description": "Not modified (If-None-Match names the file's id)"},
            404: _NOT_FOUND_DOC,
            422: _INVALID,
            503: _STORE_DOWN,
        },
    )
    async def original_file(request: Request, file_id: str = _file_id(any_file)) -> Response:
        """The original file, by its id (a chunk's ``file_id``: the sha256 of its bytes), if
        the caller may read it; 404 otherwise, the same for every reason."""
        reader = originals.reader()
        head_only = request.method == "HEAD"
        found = await run_in_threadpool(originals.find, reader, file_id)
        if found is None:
            return not_found()
        if found.data is not None:
            head = found.data[:_HEAD_BYTES]
        else:
            assert found.handle is not None
            head = await run_in_threadpool(found.handle.read, _HEAD_BYTES)
            await run_in_threadpool(found.handle.seek, 0)
        name = PurePosixPath(found.record.source).name
        headers = {
            **SECURITY_HEADERS,
            "ETag": etag(file_id),
            "Content-Disposition": content_disposition(name),
        }
        if _matches(request, etag(file_id)):
            found.close()
            return Response(status_code=304, headers=headers)
        kind = media_type(found.record, head)
        if head_only:
            found.close()
            headers["Content-Length"] = str(found.size)
            return Response(status_code=200, headers=headers, media_type=kind)
        if found.data is not None:
            return Response(found.data, headers=headers, media_type=kind)
        assert found.handle is not None
        headers["Content-Length"] = str(found.size)
        return StreamingResponse(_iterate(found.handle), headers=headers, media_type=kind)

    router.add_api_route(
        "/files/{file_id}", original_file, methods=["HEAD"], include_in_schema=False
    )

    def view_of(reader: SearchIndex | PostgresStore, file_id: str) -> FileView | None:
        found = originals.find(reader, file_id)
        if found is None:
            return None
        record = found.record
        key = (file_id, record.source, record.format)
        with caches_lock:
            cached = views.get(key)
        if cached is not None:
            found.close()
            return cached
        if formats.view_of(record.format) is None:
            found.close()
            return None
        data = found.read_all()
        options = _load_options(originals.chunking(reader))
        view = files_reader.call(build_view, file_id, record.source, record.format, data, options)
        with caches_lock:
            views[key] = view
        return view

    @router.get(
        "/files/{file_id}/view",
        response_model=FileViewBody,
        response_model_exclude_unset=True,
        responses={404: _NOT_FOUND_DOC, 422: _INVALID, 503: _STORE_DOWN},
    )
    async def file_view(
        file_id: str = _file_id(any_file),
        row: int | None = Query(
            None, ge=0, le=2**31, description="a table: the row to centre on (a chunk's row)"
        ),
        sheet: str | None = Query(
            None, max_length=256, description="a workbook: the sheet (default: the first)"
        ),
        around: int = Query(
            5, ge=0, le=MAX_AROUND, description="a table: rows shown on each side of row"
        ),
    ) -> Any:
        """What the chat page's viewer shows of a file: a PDF's or an image's pages, a text
        file's parts (which its chunks' start/end slice), or a window of a table's rows."""
        reader = originals.reader()
        try:
            view = await run_in_threadpool(view_of, reader, file_id)
        except SkipFile as exc:
            return cannot_show(exc)
        if view is None:
            return not_found()
        try:
            body = view.body(row=row, sheet=sheet, around=around)
        except KeyError:  # a sheet the file does not have is not found, as a page is not
            names = ", ".join(repr(s.name) for s in view.sheets if s.name is not None)
            return JSONResponse(
                {"detail": f"the file has no sheet {sheet!r} (its sheets: {names or 'none'})"},
                status_code=404,
            )
        headers = {"Cache-Control": "private, no-cache", "X-Content-Type-Options": "nosniff"}
        return JSONResponse(body, headers=headers)

    def png_of(reader: SearchIndex | PostgresStore, file_id: str, page: int) -> bytes | None:
        found = originals.find(reader, file_id)
        if found is None:
            return None
        key = (file_id, page)
        with caches_lock:
            cached = pngs.get(key)
        if cached is not None:
            found.close()
            return cached
        view = formats.view_of(found.record.format)
        draw = PAGE_DRAWERS.get(view) if view else None
        if draw is None:
            found.close()
            return None
        png: bytes | None = files_reader.call(draw, found.read_all(), page)
        if png is not None:
            with caches_lock:
                pngs[key] = png
        return png

    @router.get(
        "/files/{file_id}/image",
        response_class=Response,
        responses={
            200: {
                "description": "The page as PNG (an image's at its size, a PDF's at 144 dpi)",
                "content": {"image/png": {"schema": {"type": "string", "format": "binary"}}},
            },
            404: _NOT_FOUND_DOC,
            422: _INVALID,
            503: _STORE_DOWN,
        },
    )
    async def image_page(
        file_id: str = _file_id(paged_file),
        page: int = Query(1, ge=1, le=100_000, description="the page (a TIFF's frame), from 1"),
    ) -> Response:
        """A page of an image file (PNG, JPEG, TIFF: a multi-page TIFF's frame) as PNG, as
        OCR read it, for the viewer to draw its chunks' boxes over; or a PDF's page drawn
        at 144 dpi. 404 for another kind of file or a page it does not have."""
        reader = originals.reader()
        try:
            png = await run_in_threadpool(png_of, reader, file_id, page)
        except SkipFile as exc:
            return cannot_show(exc)
        if png is None:
            return not_found()
        headers = {**SECURITY_HEADERS, "ETag": etag(file_id, f"-{page}")}
        return Response(png, media_type="image/png", headers=headers)

    return router
