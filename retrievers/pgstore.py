"""The PostgreSQL store: the same chunks, ids, metadata and labels as the on-disk index, in
one database that many servers read while ingestion writes. This module connects to it and
reads it (``PostgresStore``); its tables, and how an ingest writes them, are in
``retrievers.pgwriter``.

Readers never see half a run and need no restart: each search reads the committed state.
A second writer of the same schema fails at once (a transaction-scoped advisory lock).

Over 400 lines: nearly all of it is one class, whose reads share its connection pools and
its cache of meta; cutting the class in two would move lines without separating jobs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

import numpy as np
import psycopg
from pgvector.psycopg import register_vector, register_vector_async
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from ragchains.polling import Poller
from ragchains.retrievers.access import current_groups
from ragchains.retrievers.filters import BASE_FIELDS, LiveFields
from ragchains.retrievers.indexformat import FileRecord, embedder_mismatch, is_file_id
from ragchains.retrievers.pgerrors import StoreBusyError, StoreError
from ragchains.retrievers.pgfilters import Params, scope_sql
from ragchains.retrievers.pgwriter import (
    HNSW_EF_SEARCH,
    SCHEMA_VERSION,
    StoreDelta,
    StoreWriter,
    vector_array,
)
from ragchains.retrievers.scope import DocumentScope
from ragchains.retrievers.storeurl import is_store_url, redact

DEFAULT_SCHEMA = "ragchains"
log = logging.getLogger(__name__)
META_TTL = 1.0  # seconds a reader trusts its copy of meta (field types, generation)
POOL_TIMEOUT = 10.0  # seconds a request waits for a connection before a 503
# Each search connection's settings.
SESSION_SETTINGS = (
    "SELECT set_config('hnsw.ef_search', %s, false), "
    "set_config('hnsw.iterative_scan', 'relaxed_order', false)"
)


def split_schema(url: str) -> tuple[str, str]:
    """(connection URL, schema): ``?schema=NAME`` is ours, not libpq's, so it is taken out."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = next((v for k, v in query if k == "schema"), DEFAULT_SCHEMA)
    # The rest as written: re-encoding would turn %20 into "+", which libpq keeps as "+".
    rest = "&".join(p for p in parts.query.split("&") if p.partition("=")[0] != "schema")
    if not schema or len(schema) > 63:
        raise StoreError(f"schema name {schema!r} must be 1 to 63 characters")
    return urlunsplit(parts._replace(query=rest)), schema


class PostgresStore:
    """A ragchains store in PostgreSQL (see the module docstring). Thread-safe; the sync and
    async connection pools open on first use."""

    def __init__(self, url: str, *, max_connections: int = 10) -> None:
        if not is_store_url(url):
            raise StoreError(f"not a PostgreSQL URL: {redact(url)!r} (postgresql://…)")
        self.url = url
        self.conninfo, self.schema = split_schema(url)
        self.max_connections = max_connections
        self._pool: ConnectionPool | None = None
        self._apool: AsyncConnectionPool | None = None
        self._lock = threading.Lock()
        self._meta: dict[str, Any] = {}
        self._meta_at = -1.0
        self._watcher = Poller(
            lambda: self.meta(fresh=True),
            META_TTL,
            name="ragchains-store-watch",
            # Unreachable for now: the last meta read stands.
            failed=lambda exc: log.warning("store %s: meta not re-read: %s", self.redacted, exc),
        )

    # ------------------------------------------------------------------ connections
    @property
    def redacted(self) -> str:
        return redact(self.url)

    def failure(self, exc: BaseException) -> StoreError:
        """What went wrong talking to PostgreSQL, in one line that never holds the password."""
        text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        password = urlsplit(self.url).password
        if password:
            text = text.replace(password, "***").replace(unquote(password), "***")
        return StoreError(f"PostgreSQL at {self.redacted}: {text}")

    def read_only(self) -> StoreError:
        return StoreError(f"{self.redacted} is a read-only replica; ingest into the primary")

    def table(self, name: str) -> sql.Identifier:
        return sql.Identifier(self.schema, name)

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        conn.autocommit = True
        with suppress(psycopg.ProgrammingError):  # no vector type yet: no store written
            register_vector(conn)
        conn.execute(SESSION_SETTINGS, (str(HNSW_EF_SEARCH),))

    async def _aconfigure(self, conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.set_autocommit(True)
        with suppress(psycopg.ProgrammingError):
            await register_vector_async(conn)
        await conn.execute(SESSION_SETTINGS, (str(HNSW_EF_SEARCH),))

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection in autocommit mode (each statement sees the last commit)."""
        with self._lock:
            if self._pool is None:
                self._pool = ConnectionPool(
                    self.conninfo,
                    min_size=1,
                    max_size=self.max_connections,
                    configure=self._configure,
                    open=True,
                    timeout=POOL_TIMEOUT,
                )
        try:
            with self._pool.connection() as conn:
                yield conn
        except psycopg.OperationalError as exc:
            raise self.failure(exc) from exc

    @asynccontextmanager
    async def aconnection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """``connection`` for async callers (the async pool)."""
        pool = await self.apool()
        try:
            async with pool.connection() as conn:
                yield conn
        except psycopg.OperationalError as exc:
            raise self.failure(exc) from exc

    async def apool(self) -> AsyncConnectionPool:
        if self._apool is None:
            pool = AsyncConnectionPool(
                self.conninfo,
                min_size=1,
                max_size=self.max_connections,
                configure=self._aconfigure,
                open=False,
                timeout=POOL_TIMEOUT,
            )
            await pool.open()
            if self._apool is None:
                self._apool = pool
            else:  # another task opened one meanwhile
                await pool.close()
        return self._apool

    def watch(self) -> None:
        """Re-read meta every ``META_TTL`` seconds in a thread of its own, until ``close``:
        what request validation reads (``known_meta``: fields, each group's fields) then
        follows committed ingests even when no search runs to refresh it, and the event loop
        never waits on the database for it."""
        self._watcher.start()

    def close(self) -> None:
        self._watcher.stop()
        self._close_pools()

    def _close_pools(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        # The async pool closes with its event loop; closing it here would need that loop.
        self._apool = None

    def forget(self) -> None:
        """After a write: re-read meta, and open new connections (those opened before the
        vector type existed cannot read it)."""
        self._close_pools()
        self._meta_at = -1.0

    async def aclose(self) -> None:
        if self._apool is not None:
            await self._apool.close()
            self._apool = None

    # ------------------------------------------------------------------ reading
    def meta(self, *, fresh: bool = False) -> dict[str, Any]:
        """The meta table as a dict; {} for a store no ingest has written yet."""
        now = time.monotonic()
        if fresh or now - self._meta_at > META_TTL:
            with self.connection() as conn:
                self._meta = self.read_meta(conn)
            self._meta_at = now
        return self._meta

    async def ameta(self, *, fresh: bool = False) -> dict[str, Any]:
        """``meta`` for async callers: read through the async pool, never blocking the loop;
        while ``watch``ed, the copy its thread keeps fresh (no round trip per search)."""
        if not fresh and self._watcher.running and self._meta_at > 0:
            return self._meta
        now = time.monotonic()
        if fresh or now - self._meta_at > META_TTL:
            async with self.aconnection() as conn:
                cursor = await conn.execute(
                    sql.SQL("SELECT key, value FROM {}").format(self.table("meta"))
                )
                self._meta = dict(await cursor.fetchall())
            self._meta_at = now
        return self._meta

    def known_meta(self) -> dict[str, Any]:
        """The meta last read (read now only if never read): what request validation uses,
        without a round trip per request. ``watch``, or else searches, refresh it (``META_TTL``)."""
        return self._meta if self._meta_at > 0 else self.meta()

    def read_meta(self, conn: psycopg.Connection[Any]) -> dict[str, Any]:
        if self.column_width(conn, "meta", "value") is None:
            return {}
        rows = conn.execute(sql.SQL("SELECT key, value FROM {}").format(self.table("meta")))
        return dict(rows.fetchall())

    def column_width(self, conn: psycopg.Connection[Any], table: str, column: str) -> int | None:
        """The type modifier of ``table.column`` in this store's schema (a vector's
        dimension; -1 for types without one), or None when the table does not exist."""
        row = conn.execute(
            "SELECT a.atttypmod FROM pg_attribute a "
            "WHERE a.attrelid = to_regclass(format('%%I.%%I', %s::text, %s::text)) "
            "AND a.attname = %s",
            (self.schema, table, column),
        ).fetchone()
        return None if row is None else int(row[0])

    def check(
        self,
        *,
        embedder_name: str | None = None,
        dimension: int | None = None,
        writing: bool = False,
    ) -> None:
        """Refuse a store that is empty, of another schema version or another embedder. A
        writer accepts an older version: its write migrates it."""
        meta = self.meta(fresh=True)
        if not meta or "embedder" not in meta:
            raise StoreError(
                f"no ragchains store at {self.redacted} (schema {self.schema}): run "
                f"`ragchains ingest PATH --store {self.redacted}`"
            )
        version = meta.get("schema_version")
        older = isinstance(version, int) and 1 <= version < SCHEMA_VERSION
        if version != SCHEMA_VERSION and not (writing and older):
            advice = (
                "run `ragchains ingest` on it to migrate it"
                if older
                else "use the ragchains release that wrote it"
            )
            raise StoreError(
                f"the store at {self.redacted} has schema version {version!r}; this ragchains "
                f"reads version {SCHEMA_VERSION}: {advice}"
            )
        problem = embedder_mismatch(
            f"the store at {self.redacted}", meta["embedder"], embedder_name, dimension
        )
        if problem:
            raise StoreError(problem)

    @property
    def folder(self) -> None:
        """A store has no index folder (see ``SearchIndex.folder``)."""
        return None

    @property
    def location(self) -> str:
        return f"{self.redacted} (schema {self.schema})"

    @property
    def fields(self) -> Mapping[str, str]:
        # Follows committed ingests: the meta last read, re-read at most once per META_TTL.
        return LiveFields(lambda: self.known_meta().get("fields") or {})

    def visible_fields(self) -> dict[str, str]:
        """The fields this request's caller may filter on (as ``SearchIndex.visible_fields``),
        from the meta last read."""
        return visible_fields(self.known_meta())

    @property
    def generation(self) -> int:
        return int(self.meta().get("generation") or 0)

    def __len__(self) -> int:
        return self._chunks(self.meta())

    def count(self) -> int:
        with self.connection() as conn:
            row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(self.table("chunks")))
            return int(row.fetchone()[0])  # type: ignore[index]

    def files(self) -> dict[str, FileRecord]:
        if not self.meta(fresh=True):
            return {}
        with self.connection() as conn:
            rows = conn.execute(
                sql.SQL("SELECT source, sha256, size, chunk_count, format, {} FROM {}").format(
                    self._labels(conn), self.table("files")
                )
            ).fetchall()
        return {
            source: FileRecord(source, sha, size, count, fmt, tuple(access), dict(details))
            for source, sha, size, count, fmt, access, details in rows
        }

    def _labels(self, conn: psycopg.Connection[Any]) -> sql.Composable:
        """The files table's access and details columns, as a store of any version has them:
        one written before access labels (version 1) has no access column (everyone's), and
        one written before details none of those."""
        labelled = self.column_width(conn, "files", "access") is not None
        detailed = self.column_width(conn, "files", "details") is not None
        return sql.SQL(", ").join(
            [
                sql.SQL("access" if labelled else "ARRAY[]::text[]"),
                sql.SQL("details" if detailed else "'{}'::jsonb"),
            ]
        )

    def file_records(self, file_id: str) -> list[FileRecord]:
        """The records of the files whose bytes have this sha256, by source ([]: none); who
        may read them is the caller's to check (``FileRecord.access``)."""
        if not is_file_id(file_id) or not self.known_meta():
            return []
        with self.connection() as conn:
            rows = conn.execute(
                sql.SQL(
                    "SELECT source, sha256, size, chunk_count, format, {} FROM {} "
                    "WHERE sha256 = %s ORDER BY source"
                ).format(self._labels(conn), self.table("files")),
                (file_id,),
            ).fetchall()
        return [
            FileRecord(source, sha, size, count, fmt, tuple(groups), dict(details))
            for source, sha, size, count, fmt, groups, details in rows
        ]

    def original(self, file_id: str) -> bytes | None:
        """The original bytes of a file with this sha256, or None (not kept: a store written
        before originals were, or by ``ingest --no-originals``, or one over the size cap)."""
        if not is_file_id(file_id) or not self.known_meta():
            return None
        with self.connection() as conn:
            if self.column_width(conn, "originals", "content") is None:
                return None
            row = conn.execute(
                sql.SQL("SELECT content FROM {} WHERE sha256 = %s").format(self.table("originals")),
                (file_id,),
            ).fetchone()
        return bytes(row[0]) if row is not None else None

    def missing_originals(self, ids: Sequence[str]) -> set[str]:
        """The file ids among ``ids`` whose original the store does not hold."""
        wanted = {i for i in ids if is_file_id(i)}
        if not wanted or not self.meta(fresh=True):
            return wanted
        with self.connection() as conn:
            if self.column_width(conn, "originals", "content") is None:
                return wanted
            rows = conn.execute(
                sql.SQL("SELECT sha256 FROM {} WHERE sha256 = ANY(%s)").format(
                    self.table("originals")
                ),
                (sorted(wanted),),
            ).fetchall()
        return wanted - {r[0] for r in rows}

    def scope_sources(self, scope: DocumentScope) -> set[str] | None:
        """The source names of the files with a chunk within a domain's ``scope`` (see
        ``retrievers.scope``), as committed now; None: every file (no scope)."""
        if scope.everything:
            return None
        if not self.meta(fresh=True):
            return set()
        params = Params()
        where = scope_sql(scope, dict(self.fields), params)
        with self.connection() as conn:
            rows = conn.execute(
                sql.SQL("SELECT DISTINCT c.source FROM {} c WHERE {}").format(
                    self.table("chunks"), where
                ),
                params.values,
            ).fetchall()
        return {r[0] for r in rows}

    def chunk_ids(self, sources: Sequence[str]) -> set[str]:
        if not sources or not self.meta(fresh=True):
            return set()
        with self.connection() as conn:
            rows = conn.execute(
                sql.SQL("SELECT id FROM {} WHERE source = ANY(%s)").format(self.table("chunks")),
                (list(sources),),
            ).fetchall()
        return {r[0] for r in rows}

    def stored_vectors(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        """The embeddings stored for these chunk ids (those the store holds)."""
        if not ids or not self.meta():
            return {}
        with self.connection() as conn:
            rows = conn.execute(
                sql.SQL("SELECT id, embedding FROM {} WHERE id = ANY(%s)").format(
                    self.table("chunks")
                ),
                (list(ids),),
            ).fetchall()
        return {cid: vector_array(vec) for cid, vec in rows}

    def describe(self) -> dict[str, Any]:
        """What /readyz reports: the server, pgvector and the contents; never the password."""
        with self.connection() as conn:
            server, standby, vector = conn.execute(  # type: ignore[misc]
                "SELECT current_setting('server_version'), pg_is_in_recovery(), "
                "(SELECT extversion FROM pg_extension WHERE extname = 'vector')"
            ).fetchone()
            # Read now, not the copy searches validate against (up to META_TTL old): a probe
            # reports the generation the tables hold.
            meta = self.read_meta(conn)
        return {
            "kind": "postgresql",
            "url": self.redacted,
            "schema": self.schema,
            "server_version": server,
            "pgvector_version": vector,
            "replica": bool(standby),  # a read-only standby
            "schema_version": meta.get("schema_version"),
            "generation": meta.get("generation"),
            "built_at": meta.get("built_at"),
            "chunks": self._chunks(meta),
            "fields": dict(meta.get("fields") or {}),
        }

    def _chunks(self, meta: Mapping[str, Any]) -> int:
        """The chunk count the last write recorded with its rows (a probe need not count
        them); counted for a store written before it was recorded."""
        if not meta:
            return 0
        recorded = meta.get("chunks")
        return int(recorded) if recorded is not None else self.count()

    # ------------------------------------------------------------------ writing
    @contextmanager
    def writer(self) -> Iterator[StoreWriter]:
        """The store's one writer: a connection holding the schema's advisory lock for the
        whole run (a second writer fails at once with ``StoreBusyError``)."""
        try:
            conn = psycopg.connect(self.conninfo, autocommit=True)
        except psycopg.Error as exc:  # unreachable, refused, or a malformed URL
            raise self.failure(exc) from exc
        lock = f"ragchains:{self.schema}"
        got = None
        try:
            standby = conn.execute("SELECT pg_is_in_recovery()").fetchone()
            if standby and standby[0]:
                raise self.read_only()
            got = conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (lock,)).fetchone()
            if not got or not got[0]:
                raise StoreBusyError(
                    f"another ingest is writing {self.redacted} (schema {self.schema}); wait "
                    "for it to finish"
                )
            yield StoreWriter(self, conn)
        finally:
            if got and got[0]:
                # Released now: a closed session's backend releases it only once it has exited,
                # which a busy machine may delay past the next run's start.
                with suppress(psycopg.Error):
                    conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (lock,))
            conn.close()  # ends the session: the lock goes with it, as on a crash

    def write(self, delta: StoreDelta) -> list[str]:
        """Apply one ingest run (taking the writer's lock); return the run's notes."""
        with self.writer() as writer:
            return writer.write(delta)


def visible_fields(meta: Mapping[str, Any]) -> dict[str, str]:
    """The fields (name -> type) this request's caller may filter on: those some row it may
    read holds (a field only hidden files have is not told of, even in an error)."""
    fields = dict(meta.get("fields") or {})
    groups = current_groups()
    readers = meta.get("field_readers")
    if groups is None or not readers:
        return fields
    names = set(readers["public"]) | BASE_FIELDS.keys()
    for group in groups:
        names.update(readers["groups"].get(group, ()))
    return {name: kind for name, kind in fields.items() if name in names}
