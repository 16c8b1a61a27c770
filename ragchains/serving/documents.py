"""The documents API: the documents a caller may read, with each one's state, and the changes
an editor or admin makes to them (upload, replace, re-read, remove), each an ingest job
(``ragchains.ingestjobs``) followed by polling or server-sent events.

Every upload is checked before it is accepted, and refused whole with the reason (nothing
staged is kept): its size, its name and folder (``ingest.uploadnames``), its content against
its name (``ingest.sniffing``, run in a worker process under the parse budget: the server
never parses a file), a document of the same content or a job on the same path, the disk.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, File, Form, HTTPException, Query, Request, UploadFile
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sse_starlette.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool

from ragchains.factory import Service
from ragchains.ingest.details import UPLOADED_BY
from ragchains.ingest.parsing import BudgetedCalls
from ragchains.ingest.parts import SkipFile
from ragchains.ingest.report import SKIPPED, read_ingest_log
from ragchains.ingest.sniffing import UploadContentError, sniff_upload
from ragchains.ingest.uploadnames import UploadNameError, upload_folder, upload_source
from ragchains.ingestjobs import IngestJobs, Job, PathBusy, staged_name
from ragchains.retrievers.access import AccessRuleError, checked_groups
from ragchains.retrievers.formats import format_named
from ragchains.retrievers.indexformat import FileRecord
from ragchains.retrievers.live import LiveIndex
from ragchains.retrievers.pgstore import PostgresStore
from ragchains.serving.collection import may_read
from ragchains.serving.guards import SIGNED_OUT, caller, requires
from ragchains.serving.keys import Principal
from ragchains.settings import Settings

_PROBLEM = {"application/json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
COPY_CHUNK = 1 << 20
DocumentState = Literal["read", "partly read", "skipped", "previous version kept"]


# The caller of a route that changes documents (403 below the editor role). At module level:
# FastAPI reads the routes' annotations from the module's names.
EDITOR = Depends(requires("editor"))


def _problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    reasons = {
        400: "The request names something wrongly (a path, a folder, a group)",
        403: "The key's role or groups do not allow this",
        404: "No document the caller may read has this path, or no such job",
        409: "Another document has this content, a job is already changing this path, or "
        "the path belongs to a document the caller may not change",
        413: "A file is over the upload size limit",
        415: "A file's content is not what its name says, or is of a type not read",
        507: "Not enough disk space to keep the upload",
    }
    return {s: {"description": reasons[s], "content": _PROBLEM} for s in statuses}


# ----------------------------------------------------------------------------- models
class DocumentEntry(BaseModel):
    """One document the caller may read, and what ingestion made of it."""

    path: str = Field(description="its name in the collection: folder/…/file name")
    file_id: str | None = Field(description="its bytes' sha256: GET /files/{file_id} opens it")
    format: str | None = Field(description="pdf, docx, markdown, … (null: skipped)")
    label: str | None = Field(description="what people call the format")
    size: int | None = Field(description="bytes")
    chunks: int = Field(ge=0, description="passages it was cut into")
    pages: int | None = None
    slides: int | None = None
    sheets: int | None = None
    rows: int | None = None
    ocr_confidence: float | None = Field(
        None, description="mean word confidence of its OCRed pages, 0-1"
    )
    ocr_pages: int | None = Field(None, description="pages read by OCR")
    groups: list[str] = Field(description="who may read it ([]: everyone)")
    ingested_at: str | None = Field(description="when it was last read (ISO 8601, UTC)")
    uploaded_by: str | None = Field(description="who uploaded it (null: ingested from disk)")
    state: DocumentState
    left_out: list[str] = Field(description="what was left out of it, and why")
    skipped_reason: str | None = Field(description="why its last version could not be read")
    may_change: bool = Field(description="whether the caller may replace or remove it")


class DocumentList(BaseModel):
    documents: list[DocumentEntry]
    total: int = Field(ge=0, description="documents that match, over all pages")
    offset: int = Field(ge=0)
    limit: int = Field(ge=1)
    folders: list[str] = Field(description="the folders of the documents the caller may read")


class JobProgress(BaseModel):
    stage: Literal["queued", "reading", "embedding", "writing", "done"]
    files_total: int = Field(ge=0)
    files_done: int = Field(ge=0)
    pages: int = Field(ge=0)
    chunks: int = Field(ge=0)
    chunks_to_embed: int = Field(ge=0)
    chunks_embedded: int = Field(ge=0)
    percent: float = Field(ge=0, le=100)
    eta_seconds: float | None = Field(description="an estimate of the time left")


class JobView(BaseModel):
    """An ingest job: a change of documents and how it went."""

    id: str
    kind: Literal["upload", "replace", "remove", "reingest"]
    state: Literal["queued", "running", "done", "failed"]
    by: str = Field(description="who asked for it")
    paths: list[str]
    created_at: str
    started_at: str | None
    finished_at: str | None
    progress: JobProgress
    result: dict[str, Any] | None = Field(
        description="what it did (added, updated, removed, unchanged, skipped with reasons, "
        "partly_read, chunks, notes), as `ragchains ingest --json` reports"
    )
    error: str | None = Field(description="why it failed")
    notes: list[str]


class JobAccepted(BaseModel):
    job: JobView


class JobList(BaseModel):
    jobs: list[JobView]


class Reingest(BaseModel):
    paths: list[str] = Field(min_length=1, max_length=1000, description="documents to read again")


class Caller(BaseModel):
    """Who the key belongs to and what its role lets it do (for a page to show only that)."""

    name: str | None = Field(description="the key's owner or the signed-in person (null: neither)")
    display: str | None = Field(None, description="how to name them on a page")
    via: Literal["key", "oidc", "open"] | None = Field(
        None, description="a key, a sign-in (session or token), or a server open to all"
    )
    role: Literal["reader", "editor", "admin"] | None
    groups: list[str] | None = Field(description="what it reads (null: every document)")
    may_upload: bool
    may_see_all_jobs: bool
    signed_out: str | None = Field(
        None, description="for nobody: why the last sign-in ended (its session expired)"
    )


# ----------------------------------------------------------------------------- rules
def may_change(who: Principal, groups: tuple[str, ...] | list[str]) -> bool:
    """Whether ``who`` may replace or remove a document readable by ``groups``: an admin any,
    an editor one whose groups are all its own (never one everyone reads, nor one of a
    group it is not in), a reader none."""
    if who.may("admin"):
        return True
    if not who.may("editor") or who.groups is None:
        return who.may("editor")
    return bool(groups) and set(groups) <= who.groups


def upload_groups(who: Principal, given: str | None) -> tuple[str, ...]:
    """The groups an upload's documents get: those given (never more than the uploader's
    own), else the uploader's own (an admin's: everyone)."""
    if given is None or not given.strip():
        return tuple(sorted(who.groups)) if who.groups else ()
    try:
        groups = checked_groups(given.split(","), "groups")
    except AccessRuleError as exc:
        raise HTTPException(400, str(exc)) from None
    if not who.may("admin") and who.groups is not None:
        outside = sorted(set(groups) - who.groups)
        if outside:
            raise HTTPException(
                403,
                f"you may give only your own groups ({', '.join(sorted(who.groups))}); not "
                + ", ".join(outside),
            )
    return groups


def _entry(
    path: str,
    record: FileRecord | None,
    skipped: Mapping[str, Any] | None,
    who: Principal | None,
) -> DocumentEntry:
    details = record.details if record is not None else {}
    left_out = [str(r) for r in details.get("left_out") or []]
    reason = str(skipped["reason"]) if skipped else None
    if record is None:
        state: DocumentState = "skipped"
    elif reason is not None:
        state = "previous version kept"
    else:
        state = "partly read" if left_out else "read"
    found = format_named(record.format) if record is not None else None
    groups = list(record.access) if record is not None else list(skipped.get("groups") or [])  # type: ignore[union-attr]
    return DocumentEntry(
        path=path,
        file_id=record.sha256 if record is not None else None,
        format=record.format if record is not None else None,
        label=found.label if found is not None else None,
        size=record.size if record is not None else None,
        chunks=record.chunk_count if record is not None else 0,
        pages=details.get("pages"),
        slides=details.get("slides"),
        sheets=details.get("sheets"),
        rows=details.get("rows"),
        ocr_confidence=details.get("ocr_confidence"),
        ocr_pages=details.get("ocr_pages"),
        groups=groups,
        ingested_at=details.get("ingested_at"),
        uploaded_by=details.get(UPLOADED_BY),
        state=state,
        left_out=left_out,
        skipped_reason=reason,
        # A skipped file may be taken off the list by whoever may change what it would be.
        may_change=who is not None
        and (record is not None or skipped.get("groups") is not None or who.may("admin"))  # type: ignore[union-attr]
        and may_change(who, groups),
    )


class Collection:
    """The served index folder's generation this request reads, or the store."""

    def __init__(self, service: Service) -> None:
        self.index = service.index

    def reader(self) -> Any:
        index = self.index
        return index.pinned() if isinstance(index, LiveIndex) else index

    def files(self) -> dict[str, FileRecord]:
        reader = self.reader()
        return reader.files() if isinstance(reader, PostgresStore) else reader.store.files()

    def skipped(self) -> dict[str, Any]:
        """The files skipped when last tried (the ingest log's), by path."""
        index = self.index
        if isinstance(index, PostgresStore):
            log = index.meta(fresh=True).get("ingests") or {}
        else:
            log = read_ingest_log(index.folder)
        found = log.get(SKIPPED) if isinstance(log, dict) else None
        return found if isinstance(found, dict) else {}

    def original(self, record: FileRecord) -> bytes | Path | None:
        reader = self.reader()
        return reader.original(record.sha256)


def _not_kept(exc: OSError) -> HTTPException:
    return HTTPException(
        507, f"the upload could not be kept ({exc.strerror or exc}); nothing was stored"
    )


def _readable_skip(entry: Mapping[str, Any], who: Principal | None) -> bool:
    """A skipped file is listed to whom it would be readable by; one whose groups are not
    known (skipped before its rules applied) to admins only."""
    groups = entry.get("groups")
    if who is not None and who.may("admin"):
        return True
    if groups is None:
        return False
    return may_read(groups, who.groups if who is not None else None)


def caller_router() -> APIRouter:
    """GET /me: who is asking. Open to all, as nobody is an answer too (the page then asks
    for a key or a sign-in); the documents API's routes each need a caller."""
    router = APIRouter(tags=["sign-in"])

    @router.get("/me", response_model=Caller, summary="Who is asking (key or sign-in), their role")
    async def me(request: Request) -> Caller:
        """The key's owner or the signed-in person, their role and groups, and what the
        role allows (the page shows the Documents controls by it); nobody (nulls, and why
        when a sign-in just expired) when neither came."""
        who = caller(request)
        return Caller(
            name=who.name if who else None,
            display=(who.display or who.name) if who else None,
            via=who.via if who else None,  # type: ignore[arg-type]
            role=who.role if who else None,  # type: ignore[arg-type]
            groups=sorted(who.groups) if who and who.groups is not None else None,
            may_upload=bool(who and who.may("editor")),
            may_see_all_jobs=bool(who and who.may("admin")),
            signed_out=getattr(request.state, SIGNED_OUT, None) if who is None else None,
        )

    return router


def documents_router(
    service: Service, settings: Settings, jobs: IngestJobs, files_reader: BudgetedCalls
) -> APIRouter:
    router = APIRouter(tags=["documents"])
    collection = Collection(service)
    max_file = settings.max_upload_mb * 2**20

    def listed(who: Principal | None) -> list[DocumentEntry]:
        groups = who.groups if who is not None else None
        records = collection.files()
        skipped = collection.skipped()
        entries = [
            _entry(path, record, skipped.get(path), who)
            for path, record in records.items()
            if may_read(record.access, groups)
        ]
        entries += [
            _entry(path, None, entry, who)
            for path, entry in skipped.items()
            if path not in records and isinstance(entry, dict) and _readable_skip(entry, who)
        ]
        return sorted(entries, key=lambda e: e.path)

    @router.get(
        "/documents",
        response_model=DocumentList,
        summary="The documents you may read, with each one's state",
        responses=_problems(400),
    )
    async def list_documents(
        request: Request,
        search: Annotated[str, Query(max_length=200, description="part of the path")] = "",
        folder: Annotated[str, Query(max_length=1024, description="a folder's path")] = "",
        format: Annotated[str, Query(max_length=40, description="pdf, docx, …")] = "",
        state: Annotated[DocumentState | None, Query()] = None,
        offset: Annotated[int, Query(ge=0, le=10**7)] = 0,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
    ) -> DocumentList:
        """Each document the caller may read: its format, size, pages (or slides, sheets,
        rows), chunks, groups, when it was ingested, who uploaded it, and what was left out
        of it or why it was skipped (the reasons `ragchains ingest` prints, OCR confidence
        included). Documents outside the caller's groups are never listed."""
        who = caller(request)
        entries = await run_in_threadpool(listed, who)
        folders = sorted({e.path.rsplit("/", 1)[0] for e in entries if "/" in e.path})
        wanted = folder.strip("/")
        needle = search.casefold()
        kept = [
            e
            for e in entries
            if (not wanted or e.path.startswith(f"{wanted}/"))
            and (not needle or needle in e.path.casefold())
            and (not format or e.format == format)
            and (state is None or e.state == state)
        ]
        return DocumentList(
            documents=kept[offset : offset + limit],
            total=len(kept),
            offset=offset,
            limit=limit,
            folders=folders,
        )

    def one(request: Request, path: str) -> tuple[Principal | None, DocumentEntry]:
        who = caller(request)
        record = collection.files().get(path)
        skipped = collection.skipped().get(path)
        if record is not None and may_read(record.access, who.groups if who else None):
            return who, _entry(path, record, skipped, who)
        if record is None and isinstance(skipped, dict) and _readable_skip(skipped, who):
            return who, _entry(path, None, skipped, who)
        raise HTTPException(404, f"no document you may read has the path {path[:200]!r}")

    @router.get(
        "/documents/{path:path}",
        response_model=DocumentEntry,
        summary="One document's state",
        responses=_problems(404),
    )
    async def get_document(request: Request, path: str) -> DocumentEntry:
        """The state of the document at ``path`` (404 when the caller may not read it)."""
        return (await run_in_threadpool(one, request, path))[1]

    # ------------------------------------------------------------------ changes
    def refuse_taken(paths: list[str]) -> None:
        busy = jobs.busy_paths() & set(paths)
        if busy:
            raise HTTPException(
                409,
                f"a job is already changing {sorted(busy)[0]!r}: wait for it to end "
                "(GET /jobs) and try again",
            )

    def queued(job: Job) -> Job:
        try:
            return jobs.submit(job)
        except PathBusy as exc:
            shutil.rmtree(jobs.staging(job.id), ignore_errors=True)
            raise HTTPException(
                409,
                f"a job is already changing {exc.path!r}: wait for it to end (GET /jobs) and "
                "try again",
            ) from None

    def check_disk(needed: int) -> None:
        free = shutil.disk_usage(jobs.folder).free
        if free < needed + settings.upload_min_free_mb * 2**20:
            raise HTTPException(
                507,
                f"not enough disk space to keep the upload ({free // 2**20} MB free, "
                f"{settings.upload_min_free_mb} MB are kept free); nothing was stored",
            )

    async def stage(upload: UploadFile, target: Path, name: str) -> tuple[str, int]:
        """Copy an upload to ``target``, counting its bytes (413 over the limit), and
        return its sha256 and size."""
        digest, size = hashlib.sha256(), 0
        try:
            with open(target, "wb") as out:
                while block := await upload.read(COPY_CHUNK):
                    size += len(block)
                    if size > max_file:
                        raise HTTPException(
                            413,
                            f"{name!r} is over the upload limit of {settings.max_upload_mb} MB "
                            "per file (RAGCHAINS_MAX_UPLOAD_MB)",
                        )
                    digest.update(block)
                    await run_in_threadpool(out.write, block)
        except OSError as exc:
            raise _not_kept(exc) from None
        return digest.hexdigest(), size

    def sniff(path: Path, name: str) -> str:
        try:
            return files_reader.call(sniff_upload, path, name)
        except UploadContentError as exc:
            raise HTTPException(415, str(exc)) from None
        except SkipFile as exc:  # over the budget: a hostile file
            raise HTTPException(415, f"{name!r} cannot be checked: {exc}") from None

    def check_content(
        who: Principal, paths: list[str], digests: list[str], replacing: bool
    ) -> None:
        """409 for content already in the collection (named when the caller may read it),
        twice in one request, or a path held by a document the caller may not change."""
        records = collection.files()
        by_digest = {r.sha256: r for r in records.values()}
        seen: dict[str, str] = {}
        for path, digest in zip(paths, digests, strict=True):
            if digest in seen:
                raise HTTPException(409, f"{path!r} has the same content as {seen[digest]!r}")
            seen[digest] = path
            same = by_digest.get(digest)
            if same is not None and same.source == path:
                raise HTTPException(
                    409, f"{path!r} is unchanged: the collection holds these very bytes already"
                )
            if same is not None:
                shown = (
                    repr(same.source)
                    if may_read(same.access, who.groups)
                    else "a document already in the collection"
                )
                raise HTTPException(
                    409, f"{path!r} has the same content as {shown}; it is not stored twice"
                )
            held = records.get(path)
            if held is not None and not may_change(who, held.access):
                raise HTTPException(
                    409,
                    f"{path!r} is the path of a document you may not change; choose another "
                    "name or folder",
                )
            if held is None and replacing:
                raise HTTPException(404, f"no document you may read has the path {path!r}")

    def refuse_pending(who: Principal, paths: list[str], digests: list[str]) -> None:
        pending = jobs.pending_content()
        for path, digest in zip(paths, digests, strict=True):
            if digest in pending:
                other, groups = pending[digest]
                shown = repr(other) if may_read(groups, who.groups) else "a document"
                raise HTTPException(
                    409,
                    f"{path!r} has the same content as {shown}, which a job is adding; it is "
                    "not stored twice",
                )

    async def accept(
        who: Principal,
        kind: str,
        uploads: list[tuple[str, UploadFile]],
        groups: dict[str, tuple[str, ...]],
        *,
        replacing: bool = False,
    ) -> JSONResponse:
        paths = [p for p, _ in uploads]
        if len(set(paths)) != len(paths):
            raise HTTPException(400, "two files of the request have the same name")
        refuse_taken(paths)
        await run_in_threadpool(check_disk, sum(u.size or 0 for _, u in uploads))
        job_id = jobs.new_id()
        staging = jobs.staging(job_id)
        try:
            staging.mkdir(parents=True)
            staged, digests = {}, []
            for n, (path, upload) in enumerate(uploads):
                name = staged_name(n, path)
                digest, _ = await stage(upload, staging / name, path)
                await run_in_threadpool(sniff, staging / name, path.rsplit("/", 1)[-1])
                staged[path] = name
                digests.append(digest)
            await run_in_threadpool(check_content, who, paths, digests, replacing)
            refuse_taken(paths)  # again: another request may have taken one meanwhile
            # Not yet in the collection, but a job's: the same bytes would be stored twice.
            # Checked with no await before the job is queued, so of two such requests at
            # once one is refused.
            refuse_pending(who, paths, digests)
            job = queued(
                Job(
                    id=job_id,
                    kind=kind,
                    by=who.name,
                    paths=paths,
                    staged=staged,
                    digests=dict(zip(paths, digests, strict=True)),
                    groups={p: list(g) for p, g in groups.items()},
                )
            )
        except OSError as exc:
            # The jobs' disk full after the check (no inode for the staging folder, no room
            # for the job's record): a 507 like the check's, never a 500.
            shutil.rmtree(staging, ignore_errors=True)
            raise _not_kept(exc) from None
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return accepted(job)

    def accepted(job: Job) -> JSONResponse:
        return JSONResponse(
            {"job": job.as_dict()}, status_code=202, headers={"Location": f"/jobs/{job.id}"}
        )

    @router.post(
        "/documents",
        status_code=202,
        response_model=JobAccepted,
        summary="Upload documents into a folder (an ingest job)",
        responses=_problems(400, 403, 409, 413, 415, 507),
    )
    async def upload_documents(
        files: Annotated[list[UploadFile], File(description="one or more files")],
        who: Annotated[Principal, EDITOR],
        folder: Annotated[str, Form(max_length=1024, description="e.g. hr/policies")] = "",
        groups: Annotated[
            str | None,
            Form(
                max_length=2000,
                description="comma-separated groups that may read them (default: yours; "
                "never more than yours)",
            ),
        ] = None,
    ) -> JSONResponse:
        """Add (or replace, same path) the files as documents of ``folder``, readable by
        ``groups``: accepted as a job (202, its URL in Location) once each file has passed
        its checks; refused whole, with the reason, when one does not."""
        if len(files) > settings.max_upload_files:
            raise HTTPException(
                400,
                f"at most {settings.max_upload_files} files per upload "
                + "(RAGCHAINS_MAX_UPLOAD_FILES)",
            )
        try:
            where = upload_folder(folder)
            paths = [upload_source(where, f.filename or "") for f in files]
        except UploadNameError as exc:
            raise HTTPException(400, str(exc)) from None
        given = upload_groups(who, groups)
        return await accept(
            who, "upload", list(zip(paths, files, strict=True)), dict.fromkeys(paths, given)
        )

    @router.post(
        "/documents/reingest",
        status_code=202,
        response_model=JobAccepted,
        summary="Read documents again (an ingest job)",
        responses=_problems(403, 404, 409, 507),
    )
    async def reingest_documents(body: Reingest, who: Annotated[Principal, EDITOR]) -> JSONResponse:
        """Read the documents at ``paths`` again from the copies kept of them (after an
        upgrade, or a change of chunking), as a job."""
        paths = list(dict.fromkeys(body.paths))
        refuse_taken(paths)
        job_id = jobs.new_id()
        staging = jobs.staging(job_id)

        def prepare() -> Job:
            records = collection.files()
            originals = []
            for path in paths:
                record = records.get(path)
                if record is None or not may_read(record.access, who.groups):
                    raise HTTPException(404, f"no document you may read has the path {path!r}")
                if not may_change(who, record.access):
                    raise HTTPException(403, f"you may not change {path!r}")
                kept = collection.original(record)
                if kept is None:
                    raise HTTPException(
                        409,
                        f"no copy of {path!r} is kept (ingested with --no-originals): "
                        "upload it again",
                    )
                originals.append(kept)
            # The copies are staged like an upload's bytes: the same room kept free (507).
            check_disk(sum(records[p].size or 0 for p in paths))
            staging.mkdir(parents=True)
            staged = {}
            for n, (path, kept) in enumerate(zip(paths, originals, strict=True)):
                name = staged_name(n, path)
                try:
                    if isinstance(kept, Path):
                        shutil.copyfile(kept, staging / name)
                    else:
                        (staging / name).write_bytes(kept)
                except OSError as exc:
                    raise HTTPException(507, f"could not stage {path!r}: {exc.strerror}") from None
                staged[path] = name
            return Job(
                id=job_id,
                kind="reingest",
                by=who.name,
                paths=paths,
                staged=staged,
                groups={p: list(records[p].access) for p in paths},
                read_again=paths,
            )

        try:
            job = await run_in_threadpool(prepare)
            refuse_taken(paths)
            queued(job)
        except OSError as exc:  # the jobs' disk full (see accept)
            shutil.rmtree(staging, ignore_errors=True)
            raise _not_kept(exc) from None
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return accepted(job)

    @router.put(
        "/documents/{path:path}",
        status_code=202,
        response_model=JobAccepted,
        summary="Replace a document with a new version (an ingest job)",
        responses=_problems(400, 403, 404, 409, 413, 415, 507),
    )
    async def replace_document(
        request: Request,
        path: str,
        file: Annotated[UploadFile, File(description="the new version")],
        who: Annotated[Principal, EDITOR],
        groups: Annotated[
            str | None, Form(max_length=2000, description="new groups (default: kept)")
        ] = None,
    ) -> JSONResponse:
        """A new version of the document at ``path`` (same path, same groups unless
        given), checked as an upload is."""
        _, current = await run_in_threadpool(one, request, path)
        if not current.may_change:
            raise HTTPException(403, f"you may not change {path!r}")
        folder, _, name = path.rpartition("/")
        try:
            new_name = upload_source(folder, file.filename or name)
        except UploadNameError as exc:
            raise HTTPException(400, str(exc)) from None
        if Path(new_name).suffix.lower() != Path(path).suffix.lower():
            raise HTTPException(
                415, f"the new version must be of the same type as {path!r} ({Path(path).suffix})"
            )
        given = tuple(current.groups) if groups is None else upload_groups(who, groups)
        return await accept(who, "replace", [(path, file)], {path: given}, replacing=True)

    @router.delete(
        "/documents/{path:path}",
        status_code=202,
        response_model=JobAccepted,
        summary="Remove a document (an ingest job)",
        responses=_problems(403, 404, 409),
    )
    async def remove_document(
        request: Request, path: str, who: Annotated[Principal, EDITOR]
    ) -> JSONResponse:
        """Take the document at ``path`` out of the collection (its passages are no longer
        found once the job is done)."""
        _, current = await run_in_threadpool(one, request, path)
        if not current.may_change:
            raise HTTPException(403, f"you may not change {path!r}")
        refuse_taken([path])
        job = queued(
            Job(id=jobs.new_id(), kind="remove", by=who.name, paths=[path], removes=[path])
        )
        return accepted(job)

    # ------------------------------------------------------------------ jobs
    def visible_job(request: Request, job_id: str) -> Job:
        who = caller(request)
        job = jobs.get(job_id)
        if job is None or who is None or not (who.may("admin") or job.by == who.name):
            raise HTTPException(404, f"no job of yours has the id {job_id[:80]!r}")
        return job

    @router.get("/jobs", response_model=JobList, summary="Your ingest jobs, newest first")
    async def list_jobs(
        request: Request, limit: Annotated[int, Query(ge=1, le=500)] = 50
    ) -> JobList:
        """The caller's jobs (an admin's: everyone's), newest first."""
        who = caller(request)
        mine = None if who is not None and who.may("admin") else (who.name if who else "")
        return JobList(jobs=[JobView(**j.as_dict()) for j in jobs.listed(mine)[:limit]])

    @router.get(
        "/jobs/{job_id}",
        response_model=JobView,
        summary="A job's progress and result",
        responses=_problems(404),
    )
    async def get_job(request: Request, job_id: str) -> JobView:
        """The job's state, progress (files, pages, chunks, a percentage and an estimate of
        the time left) and, once it has ended, its result or error."""
        return JobView(**visible_job(request, job_id).as_dict())

    @router.get(
        "/jobs/{job_id}/events",
        summary="A job's progress as server-sent events",
        responses={
            200: {
                "description": "`progress` events (a job each), then one `end`",
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            },
            **_problems(404),
        },
    )
    async def job_events(request: Request, job_id: str) -> EventSourceResponse:
        """Server-sent events: a ``progress`` event with the job (as GET /jobs/{id}) each
        time it changes, then an ``end`` event when it is done or failed."""
        job = visible_job(request, job_id)
        return EventSourceResponse(_follow(job, request.is_disconnected), ping=15)

    return router


async def _follow(
    job: Job, gone: Callable[[], Any], poll: float = 0.25
) -> AsyncIterator[dict[str, str]]:
    seen = -1
    while True:
        version, shown = job.version, job.as_dict()
        if version != seen:
            seen = version
            ended = shown["state"] in ("done", "failed")
            yield {"event": "end" if ended else "progress", "data": json.dumps(shown)}
            if ended:
                return
        if await gone():
            return
        await asyncio.sleep(poll)
