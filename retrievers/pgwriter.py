"""Writing a PostgreSQL store: its tables, created on the first ingest and migrated from older
schema versions, and each ingest run written as one transaction (``StoreWriter``).

Layout (in one schema, ``ragchains`` unless the URL says ``?schema=NAME``)::

    meta    key -> jsonb: schema_version, embedder, chunking, fields (name -> type, as the
            index manifest records them), generation (bumped by every committed ingest),
            access_rules (the last run's), field_readers (which fields whose rows hold),
            ingests (the runs so far and the last one's counts: ``ingest.report.logged``)
    files   one row per ingested file (source, sha256, size, chunk_count, format, access:
            the groups that may read it, {} = everyone)
    chunks  id, source, text, metadata (jsonb), tsv (generated: to_tsvector('english', text)),
            embedding vector(dim), access (its file's groups, for the searches' WHERE);
            GIN on tsv and metadata, HNSW (cosine) on embedding
    originals  sha256 -> content (bytea) and size: each file's original bytes, once for all
            the files holding them (those no file record names are deleted by each write;
            added to older stores by their next ingest, without a new schema version: servers
            of earlier releases read the rest as before and never this table)

An ingest is one transaction (``write``): deleted and changed files' chunks out, new chunks
in, the file records, the originals, the field types and the generation, all committed
together or not at all. The store opens its one writer (``PostgresStore.writer``), so it
imports this module; the writer knows the store only as a ``WritableStore``, and imports
nothing back.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql
from psycopg.types.json import Jsonb

from ragchains.retrievers.access import mixed_type_problem
from ragchains.retrievers.indexformat import Chunk, FileRecord
from ragchains.retrievers.pgerrors import StoreError

SCHEMA_VERSION = 2
# version -> the statements that bring a store of version - 1 to it ({chunks}, {files} and
# {meta} stand for the store's tables).
MIGRATIONS: dict[int, list[str]] = {
    2: [  # per-user access: each file's groups, copied onto its chunks
        "ALTER TABLE {files} ADD COLUMN access text[] NOT NULL DEFAULT ARRAY[]::text[]",
        "ALTER TABLE {chunks} ADD COLUMN access text[] NOT NULL DEFAULT ARRAY[]::text[]",
    ],
}
TEXT_SEARCH_CONFIG = "english"  # the stemmer BM25 uses on disk (PyStemmer's English)
# pgvector's HNSW defaults (m 16, ef_construction 64) lose recall on 100k chunks; these match
# the on-disk FAISS graph's search width. iterative_scan: a filtered search keeps walking the
# graph until it has enough rows that pass (pgvector >= 0.8).
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 100
HNSW_EF_SEARCH = 128
# An original larger than this is not kept (a bytea value travels whole, in memory, and
# PostgreSQL caps one at 1 GB).
MAX_ORIGINAL_BYTES = 256 * 1024 * 1024


def clean_text(text: str) -> str:
    """PostgreSQL text cannot hold NUL characters; they carry nothing a search could use."""
    return text.replace("\x00", " ") if "\x00" in text else text


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(str(k)): _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


@dataclass
class StoreDelta:
    """One ingest run's change: sources whose chunks go, chunks (with vectors) that come,
    and the file records of everything the store holds afterwards."""

    remove_sources: list[str]
    chunks: list[Chunk]
    vectors: np.ndarray
    files: list[FileRecord]
    embedder: dict[str, Any]
    chunking: dict[str, Any]
    rebuild: bool = False
    base_fields: Mapping[str, str] = field(default_factory=dict)
    not_filterable: Collection[str] = ()
    # The run's access rules, kept for the next run (see ingest.accessrules.rules_for_run).
    access_rules: list[dict[str, Any]] = field(default_factory=list)
    # The files whose original bytes to keep, by sha256: (source, path); those the store
    # holds already are not read again. ``keep_originals`` False: the store keeps none.
    originals: Mapping[str, tuple[str, Path]] = field(default_factory=dict)
    keep_originals: bool = True


class WritableStore(Protocol):
    """What a writer uses of its store (``pgstore.PostgresStore``)."""

    schema: str

    @property
    def redacted(self) -> str: ...

    def table(self, name: str) -> sql.Identifier: ...

    def failure(self, exc: BaseException) -> StoreError: ...

    def read_only(self) -> StoreError: ...

    def read_meta(self, conn: psycopg.Connection[Any]) -> dict[str, Any]: ...

    def column_width(
        self, conn: psycopg.Connection[Any], table: str, column: str
    ) -> int | None: ...

    def forget(self) -> None: ...


class StoreWriter:
    """Writes one ingest run to a store, on the connection that holds the writer's lock."""

    def __init__(self, store: WritableStore, conn: psycopg.Connection[Any]) -> None:
        self.store = store
        self.conn = conn
        self.schema = store.schema
        self.redacted = store.redacted
        self.table = store.table

    def write(self, delta: StoreDelta) -> list[str]:
        """Apply ``delta`` in one transaction; return notes for the run's report."""
        try:
            return self._write(delta)
        except psycopg.errors.ReadOnlySqlTransaction as exc:
            raise self.store.read_only() from exc
        except psycopg.Error as exc:  # whatever PostgreSQL refused: one line, no traceback
            raise self.store.failure(exc) from exc

    def set_meta(self, values: Mapping[str, Any]) -> None:
        """Record ``values`` in meta, apart from a run's write (the ingest log)."""
        try:
            self._set_meta(self.conn, values)
        except psycopg.errors.ReadOnlySqlTransaction as exc:
            raise self.store.read_only() from exc
        except psycopg.Error as exc:
            raise self.store.failure(exc) from exc

    def _write(self, delta: StoreDelta) -> list[str]:
        dimension = int(delta.embedder["dimension"])
        if delta.vectors.shape != (len(delta.chunks), dimension):
            raise ValueError(
                f"{len(delta.chunks)} chunks but vectors of shape {delta.vectors.shape}"
            )
        conn = self.conn
        with conn.transaction():
            created = self._ensure_schema(conn, dimension, rebuild=delta.rebuild)
            register_vector(conn)
            meta = self.store.read_meta(conn)
            held = (meta.get("embedder") or {}).get("dimension")
            if held is not None and held != dimension and not delta.rebuild:
                raise StoreError(
                    f"the store at {self.redacted} holds {held}-dimensional vectors; rebuild "
                    "with `ragchains ingest --rebuild` to change the embedder"
                )
            chunks, files = self.table("chunks"), self.table("files")
            if delta.rebuild:
                # DELETE, not TRUNCATE: readers keep reading the old rows until the commit.
                conn.execute(sql.SQL("DELETE FROM {}").format(chunks))
            elif delta.remove_sources:
                conn.execute(
                    sql.SQL("DELETE FROM {} WHERE source = ANY(%s)").format(chunks),
                    (delta.remove_sources,),
                )
            self._copy_chunks(conn, delta)
            if created:
                # A new table: loaded first, indexed after (faster than indexing row by row).
                self._create_vector_index(conn)
            conn.execute(sql.SQL("DELETE FROM {}").format(files))
            with conn.cursor() as cur:
                cur.executemany(
                    sql.SQL(
                        "INSERT INTO {} (source, sha256, size, chunk_count, format, access) "
                        "VALUES (%s, %s, %s, %s, %s, %s)"
                    ).format(files),
                    [
                        (f.source, f.sha256, f.size, f.chunk_count, f.format, list(f.access))
                        for f in delta.files
                    ],
                )
            notes = self._write_originals(conn, delta)
            # New chunks came with their file's groups; a relabelled file's kept ones take them.
            conn.execute(
                sql.SQL(
                    "UPDATE {chunks} c SET access = f.access FROM {files} f "
                    "WHERE c.source = f.source AND c.access IS DISTINCT FROM f.access"
                ).format(chunks=chunks, files=files)
            )
            fields, typed, readers = self._field_types(
                conn, delta.base_fields, delta.not_filterable
            )
            notes.extend(typed)
            counted = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(chunks)).fetchone()
            self._set_meta(
                conn,
                {
                    "schema_version": SCHEMA_VERSION,
                    "embedder": delta.embedder,
                    "chunking": delta.chunking,
                    "fields": fields,
                    "generation": int(meta.get("generation") or 0) + 1,
                    "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
                    "chunks": int(counted[0]) if counted else 0,
                    "access_rules": delta.access_rules,
                    "field_readers": readers,
                },
            )
        self.store.forget()
        return notes

    def _ensure_schema(
        self, conn: psycopg.Connection[Any], dimension: int, *, rebuild: bool
    ) -> bool:
        """Create what is missing; True when the chunks table was created now. A rebuild for
        an embedder of another dimension replaces the chunks table (readers wait for the
        commit); any other rebuild deletes rows, and readers keep reading until it commits."""
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (key text PRIMARY KEY, value jsonb NOT NULL)"
            ).format(self.table("meta"))
        )
        version = conn.execute(
            sql.SQL("SELECT value FROM {} WHERE key = 'schema_version'").format(self.table("meta"))
        ).fetchone()
        if version is not None and version[0] != SCHEMA_VERSION:
            self._migrate(conn, version[0])
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (source text PRIMARY KEY, sha256 text NOT NULL, "
                "size bigint NOT NULL, chunk_count integer NOT NULL, format text NOT NULL, "
                "access text[] NOT NULL DEFAULT ARRAY[]::text[])"
            ).format(self.table("files"))
        )
        conn.execute(
            sql.SQL("CREATE INDEX IF NOT EXISTS files_sha256 ON {} (sha256)").format(
                self.table("files")
            )
        )
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (sha256 text PRIMARY KEY, content bytea NOT NULL, "
                "size bigint NOT NULL)"
            ).format(self.table("originals"))
        )
        held = self.store.column_width(conn, "chunks", "embedding")
        if held is not None:
            if held == dimension or not rebuild:
                return False  # another dimension without --rebuild is refused after this
            conn.execute(sql.SQL("DROP TABLE {}").format(self.table("chunks")))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {chunks} ("
                " id text PRIMARY KEY,"
                " source text NOT NULL,"
                " text text NOT NULL,"
                " metadata jsonb NOT NULL,"
                " tsv tsvector GENERATED ALWAYS AS (to_tsvector({config}::regconfig, text)) STORED,"
                " embedding vector({dim}) NOT NULL,"
                " access text[] NOT NULL DEFAULT ARRAY[]::text[])"
            ).format(
                chunks=self.table("chunks"),
                config=sql.Literal(TEXT_SEARCH_CONFIG),
                dim=sql.Literal(dimension),
            )
        )
        for name, method in (
            ("chunks_tsv", sql.SQL("gin (tsv)")),
            ("chunks_metadata", sql.SQL("gin (metadata jsonb_path_ops)")),
            ("chunks_source", sql.SQL("btree (source)")),
        ):
            conn.execute(
                sql.SQL("CREATE INDEX {} ON {} USING {}").format(
                    sql.Identifier(name), self.table("chunks"), method
                )
            )
        return True

    def _migrate(self, conn: psycopg.Connection[Any], found: Any) -> None:
        """Bring a store of an older schema version up to ``SCHEMA_VERSION`` (in the write's
        transaction: all steps or none); refuse a newer or unknown one."""
        if not isinstance(found, int) or not 1 <= found < SCHEMA_VERSION:
            raise StoreError(
                f"the store at {self.redacted} has schema version {found!r}; this ragchains "
                f"writes version {SCHEMA_VERSION}. Use the release that wrote it, or "
                "re-ingest into a new schema (?schema=NAME)."
            )
        for version in range(found + 1, SCHEMA_VERSION + 1):
            for step in MIGRATIONS[version]:
                conn.execute(
                    sql.SQL(step).format(
                        chunks=self.table("chunks"),
                        files=self.table("files"),
                        meta=self.table("meta"),
                    )
                )

    def _write_originals(self, conn: psycopg.Connection[Any], delta: StoreDelta) -> list[str]:
        """The originals the store lacks added (each checked against its sha256: a file that
        changed since it was read is not kept under a hash it no longer has), and those no
        file record names deleted (all of them without ``keep_originals``); notes for the
        files whose original was not kept."""
        originals, files = self.table("originals"), self.table("files")
        notes: list[str] = []
        if not delta.keep_originals:
            conn.execute(sql.SQL("DELETE FROM {}").format(originals))
            return notes
        wanted = sorted(delta.originals)
        held = {
            sha
            for (sha,) in conn.execute(
                sql.SQL("SELECT sha256 FROM {} WHERE sha256 = ANY(%s)").format(originals),
                (wanted,),
            )
        }
        for sha in wanted:
            if sha in held:
                continue
            source, path = delta.originals[sha]
            problem = None
            try:
                if path.stat().st_size > MAX_ORIGINAL_BYTES:
                    problem = f"over {MAX_ORIGINAL_BYTES // (1024 * 1024)} MB"
                else:
                    data = path.read_bytes()
                    if hashlib.sha256(data).hexdigest() != sha:
                        problem = "the file changed while it was read; the next run reads it again"
            except OSError as exc:
                problem = exc.strerror or str(exc)
            if problem is not None:
                notes.append(f"{source}: original not kept ({problem})")
                continue
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (sha256, content, size) VALUES (%s, %s, %s) "
                    "ON CONFLICT (sha256) DO NOTHING"
                ).format(originals),
                (sha, data, len(data)),
            )
        conn.execute(
            sql.SQL(
                "DELETE FROM {o} o WHERE NOT EXISTS (SELECT 1 FROM {f} f WHERE f.sha256 = o.sha256)"
            ).format(o=originals, f=files)
        )
        return notes

    def _create_vector_index(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute("SET LOCAL maintenance_work_mem = '512MB'")
        conn.execute(
            sql.SQL(
                "CREATE INDEX {} ON {} USING hnsw (embedding vector_cosine_ops) "
                "WITH (m = {}, ef_construction = {})"
            ).format(
                sql.Identifier("chunks_hnsw"),
                self.table("chunks"),
                sql.Literal(HNSW_M),
                sql.Literal(HNSW_EF_CONSTRUCTION),
            )
        )

    def _copy_chunks(self, conn: psycopg.Connection[Any], delta: StoreDelta) -> None:
        statement = sql.SQL(
            "COPY {} (id, source, text, metadata, embedding, access) FROM STDIN "
            "WITH (FORMAT BINARY)"
        ).format(self.table("chunks"))
        groups = {f.source: list(f.access) for f in delta.files}
        with conn.cursor() as cur, cur.copy(statement) as copy:
            copy.set_types(["text", "text", "text", "jsonb", "vector", "text[]"])
            for chunk, vector in zip(delta.chunks, delta.vectors, strict=True):
                source = chunk.metadata["source"]
                copy.write_row(
                    (
                        chunk.id,
                        clean_text(source),
                        clean_text(chunk.text),
                        Jsonb(_clean(chunk.metadata)),
                        np.asarray(vector, dtype=np.float32),
                        groups.get(source, []),
                    )
                )

    def _field_types(
        self,
        conn: psycopg.Connection[Any],
        base_fields: Mapping[str, str],
        not_filterable: Collection[str],
    ) -> tuple[dict[str, str], list[str], dict[str, Any] | None]:
        """One type per field over the whole store, as the on-disk index records them: a
        field typed differently in two files becomes a string field, its values stringified.
        Also returns which fields whose rows hold (see ``field_readers``)."""
        kinds: dict[str, set[str]] = {}
        by_label: dict[str, dict[tuple[str, ...], set[str]]] = {}
        for key, kind, access in conn.execute(
            sql.SQL(
                "SELECT DISTINCT e.key, jsonb_typeof(e.value), c.access "
                "FROM {} c, jsonb_each(c.metadata) e"
                " WHERE jsonb_typeof(e.value) IN ('string', 'number', 'boolean')"
            ).format(self.table("chunks"))
        ):
            if key not in not_filterable:
                kinds.setdefault(key, set()).add(kind)
                by_label.setdefault(key, {}).setdefault(tuple(access), set()).add(kind)
        fields: dict[str, str] = {}
        notes = []
        for key, seen in sorted(kinds.items()):
            if len(seen) == 1:
                fields[key] = next(iter(seen))
                continue
            problem = mixed_type_problem(key, by_label[key])
            if problem:
                raise StoreError(problem)  # the write's transaction is rolled back
            fields[key] = "string"
            notes.append(
                f"field {key!r} holds {' and '.join(sorted(seen))} values in different files; "
                "it is filterable as a string"
            )
            conn.execute(
                sql.SQL(
                    "UPDATE {} SET metadata = jsonb_set(metadata, ARRAY[%(k)s], "
                    "to_jsonb(metadata ->> %(k)s)) "
                    "WHERE jsonb_typeof(metadata -> %(k)s) IN ('number', 'boolean')"
                ).format(self.table("chunks")),
                {"k": key},
            )
        readers = field_readers(by_label)
        for key, kind in base_fields.items():
            fields.setdefault(key, kind)
        return dict(sorted(fields.items())), notes, readers

    def _set_meta(self, conn: psycopg.Connection[Any], values: Mapping[str, Any]) -> None:
        with conn.cursor() as cur:
            cur.executemany(
                sql.SQL(
                    "INSERT INTO {} (key, value) VALUES (%s, %s) "
                    "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
                ).format(self.table("meta")),
                [(k, Jsonb(v)) for k, v in values.items()],
            )


def field_readers(
    by_label: Mapping[str, Mapping[tuple[str, ...], object]],
) -> dict[str, Any] | None:
    """Which fields everyone's rows hold, and which each group's rows hold (from each field's
    value types by the groups of the files holding them), for ``visible_fields``; None when
    no file has groups (every field is everyone's)."""
    public = sorted(key for key, labels in by_label.items() if () in labels)
    by_group: dict[str, set[str]] = {}
    for key, labels in by_label.items():
        for label in labels:
            for group in label:
                by_group.setdefault(group, set()).add(key)
    if not by_group:
        return None
    return {"public": public, "groups": {g: sorted(k) for g, k in sorted(by_group.items())}}
