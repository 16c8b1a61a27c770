"""Writing a PostgreSQL store: its tables, created on the first ingest and migrated from older
schema versions, and each ingest run written as one transaction (``StoreWriter``).

Layout (in one schema, ``ragchains`` unless the URL says ``?schema=NAME``)::

    meta    key -> jsonb: schema_version, embedder, chunking, fields (name -> type, as the
            index manifest records them), generation (bumped by every committed ingest),
            access_rules (the last run's), field_readers (which fields whose rows hold),
            ingests (the runs so far and the last one's counts: ``ingest.report.logged``)
    files   one row per ingested file (source, sha256, size, chunk_count, format, access:
            the groups that may read it, {} = everyone)
    chunks  id, key (a number, never reused, that postings name it by), source, text,
            metadata (jsonb), length (its BM25 tokens), embedding vector(dim), access (its
            file's groups, for the searches' WHERE); GIN on metadata, HNSW (cosine) on
            embedding
    postings  term, chunk (key), tf (how often the term is in it), length and access (the
            chunk's; access NULL when everyone may read it): the BM25 index, tokenised by
            ``retrievers.bm25.tokenize`` as the index folder's; one index on term that holds
            every column (the lexical search reads the index alone), one on chunk (deletes)
    bm25_stats  access -> chunks, length (their count and total length by group label: the
            collection statistics a caller's BM25 scores use, summed over what it may read)
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
import logging
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
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
from ragchains.retrievers.bm25 import tokenize
from ragchains.retrievers.indexformat import Chunk, FileRecord
from ragchains.retrievers.pgerrors import StoreError

log = logging.getLogger(__name__)
SCHEMA_VERSION = 3
# version -> the steps that bring a store of version - 1 to it: statements ({chunks},
# {files} and {meta} stand for the store's tables), or functions of the writer and its
# connection, for what SQL alone cannot do.
MigrationStep = str | Callable[["StoreWriter", psycopg.Connection[Any]], None]
MIGRATIONS: dict[int, list[MigrationStep]] = {
    2: [  # per-user access: each file's groups, copied onto its chunks
        "ALTER TABLE {files} ADD COLUMN access text[] NOT NULL DEFAULT ARRAY[]::text[]",
        "ALTER TABLE {chunks} ADD COLUMN access text[] NOT NULL DEFAULT ARRAY[]::text[]",
    ],
    # BM25 from postings, in place of full-text ranking (which had no IDF): the chunks are
    # set aside, and the write carries them into tables of this version (``_carry_over``).
    3: [lambda writer, conn: writer.set_aside_chunks(conn)],
}
# pgvector's HNSW defaults (m 16, ef_construction 64) lose recall on 100k chunks; these match
# the on-disk FAISS graph's search width. iterative_scan: a filtered search keeps walking the
# graph until it has enough rows that pass (pgvector >= 0.8).
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 100
HNSW_EF_SEARCH = 128
# An original larger than this is not kept (a bytea value travels whole, in memory, and
# PostgreSQL caps one at 1 GB).
MAX_ORIGINAL_BYTES = 256 * 1024 * 1024
# The suffix of a chunks table (and its indexes) a migration set aside for the write to carry
# over.
SET_ASIDE = "before_v3"


def clean_text(text: str) -> str:
    """PostgreSQL text cannot hold NUL characters; they carry nothing a search could use."""
    return text.replace("\x00", " ") if "\x00" in text else text


def vector_array(vector: Any) -> np.ndarray:
    """A stored vector as float32 (pgvector reads text as numpy, binary as ``Vector``)."""
    values = vector.to_numpy() if hasattr(vector, "to_numpy") else vector
    return np.asarray(values, dtype=np.float32)


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
        self._bulk = False  # this run writes the postings anew (see ``_settle``)
        self._fresh = False  # and the chunks into a new table
        self._set_aside = False  # a migration set the chunks aside (see ``_carry_over``)

    def write(self, delta: StoreDelta) -> list[str]:
        """Apply ``delta`` in one transaction; return notes for the run's report."""
        self._bulk = self._fresh = False
        try:
            notes = self._write(delta)
            if self._bulk:
                self._settle()
            return notes
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
            self._bulk |= created or delta.rebuild
            self._fresh = created
            register_vector(conn)
            meta = self.store.read_meta(conn)
            held = (meta.get("embedder") or {}).get("dimension")
            if held is not None and held != dimension and not delta.rebuild:
                raise StoreError(
                    f"the store at {self.redacted} holds {held}-dimensional vectors; rebuild "
                    "with `ragchains ingest --rebuild` to change the embedder"
                )
            chunks, files = self.table("chunks"), self.table("files")
            postings = self.table("postings")
            if self._set_aside:
                self._carry_over(conn, keep=not delta.rebuild)
            if delta.rebuild:
                # DELETE, not TRUNCATE: readers keep reading the old rows until the commit.
                conn.execute(sql.SQL("DELETE FROM {}").format(postings))
                conn.execute(sql.SQL("DELETE FROM {}").format(chunks))
            elif delta.remove_sources:
                conn.execute(
                    sql.SQL(
                        "DELETE FROM {p} WHERE chunk IN "
                        "(SELECT key FROM {c} WHERE source = ANY(%s))"
                    ).format(p=postings, c=chunks),
                    (delta.remove_sources,),
                )
                conn.execute(
                    sql.SQL("DELETE FROM {} WHERE source = ANY(%s)").format(chunks),
                    (delta.remove_sources,),
                )
            groups = {f.source: list(f.access) for f in delta.files}
            access = [groups.get(chunk.metadata["source"], []) for chunk in delta.chunks]
            self._add_chunks(conn, delta.chunks, delta.vectors, access)
            if created:
                # New tables: loaded first, indexed after (faster than indexing row by row).
                self._create_vector_index(conn)
                self._index_postings(conn)
            conn.execute(sql.SQL("DELETE FROM {}").format(files))
            with conn.cursor() as cur:
                cur.executemany(
                    sql.SQL(
                        "INSERT INTO {} (source, sha256, size, chunk_count, format, access, "
                        "details) VALUES (%s, %s, %s, %s, %s, %s, %s)"
                    ).format(files),
                    [
                        (
                            f.source,
                            f.sha256,
                            f.size,
                            f.chunk_count,
                            f.format,
                            list(f.access),
                            Jsonb(f.details),
                        )
                        for f in delta.files
                    ],
                )
            notes = self._write_originals(conn, delta)
            # New chunks came with their file's groups; a relabelled file's kept ones take them,
            # and so do their postings.
            conn.execute(
                sql.SQL(
                    "WITH moved AS (UPDATE {chunks} c SET access = f.access FROM {files} f "
                    "WHERE c.source = f.source AND c.access IS DISTINCT FROM f.access "
                    "RETURNING c.key, c.access) "
                    "UPDATE {postings} p SET access = nullif(m.access, ARRAY[]::text[]) "
                    "FROM moved m WHERE p.chunk = m.key"
                ).format(chunks=chunks, files=files, postings=postings)
            )
            self._count_collection(conn)
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
        # Each file's details (what the documents API shows), added to older stores in place.
        conn.execute(
            sql.SQL(
                "ALTER TABLE {} ADD COLUMN IF NOT EXISTS details jsonb NOT NULL DEFAULT '{{}}'"
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
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (access text[] PRIMARY KEY, chunks bigint NOT NULL, "
                "length bigint NOT NULL)"
            ).format(self.table("bm25_stats"))
        )
        held = self.store.column_width(conn, "chunks", "embedding")
        if held is not None:
            if held == dimension or not rebuild:
                return False  # another dimension without --rebuild is refused after this
            conn.execute(sql.SQL("DROP TABLE {}").format(self.table("chunks")))
            conn.execute(sql.SQL("DROP TABLE {}").format(self.table("postings")))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {chunks} ("
                " id text PRIMARY KEY,"
                " key bigint GENERATED BY DEFAULT AS IDENTITY,"
                " source text NOT NULL,"
                " text text NOT NULL,"
                " metadata jsonb NOT NULL,"
                " length integer NOT NULL DEFAULT 0,"
                " embedding vector({dim}) NOT NULL,"
                " access text[] NOT NULL DEFAULT ARRAY[]::text[])"
            ).format(chunks=self.table("chunks"), dim=sql.Literal(dimension))
        )
        self._create_postings(conn)
        for name, method in (
            ("chunks_key", sql.SQL("btree (key)")),
            ("chunks_metadata", sql.SQL("gin (metadata jsonb_path_ops)")),
            ("chunks_source", sql.SQL("btree (source)")),
        ):
            conn.execute(
                sql.SQL("CREATE {} {} ON {} USING {}").format(
                    sql.SQL("UNIQUE INDEX" if name == "chunks_key" else "INDEX"),
                    sql.Identifier(name),
                    self.table("chunks"),
                    method,
                )
            )
        return True

    def _create_postings(self, conn: psycopg.Connection[Any]) -> None:
        """The postings table, without its indexes (``_index_postings``, once loaded)."""
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (term text NOT NULL, chunk bigint NOT NULL, "
                "tf integer NOT NULL, length integer NOT NULL, access text[])"
            ).format(self.table("postings"))
        )

    def _index_postings(self, conn: psycopg.Connection[Any]) -> None:
        postings = self.table("postings")
        # Every column in the term's index: a search reads the index alone, never the table
        # (once VACUUM has marked its pages all-visible).
        conn.execute(
            sql.SQL(
                "CREATE INDEX postings_term ON {} (term) INCLUDE (chunk, tf, length, access)"
            ).format(postings)
        )
        conn.execute(sql.SQL("CREATE INDEX postings_chunk ON {} (chunk)").format(postings))

    def _settle(self) -> None:
        """After a run that wrote the postings anew (a first ingest, a rebuild, a migration):
        their pages marked all-visible, so searches read the term index alone from the
        first query (else each posting is looked up in the table until autovacuum comes),
        and both tables' statistics for the planner. A new chunks table is vacuumed too (its
        rows' commit status recorded once, not by the first searches to read them); one a
        rebuild emptied and filled only analysed, as vacuuming its HNSW index's dead entries
        is slow, autovacuum's job. After the commit: VACUUM runs in no transaction. The run
        is committed whatever happens here."""
        chunks = sql.SQL("VACUUM (ANALYZE) {}" if self._fresh else "ANALYZE {}")
        try:
            self.conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(self.table("postings")))
            self.conn.execute(chunks.format(self.table("chunks")))
        except psycopg.Error as exc:
            log.warning("%s: not vacuumed after the write: %s", self.redacted, exc)

    def _reserve_keys(self, conn: psycopg.Connection[Any], n: int) -> list[int]:
        """``n`` chunk keys from the table's own sequence: never one a deleted chunk had, so
        a key a reader got from an earlier snapshot never names another chunk."""
        if n == 0:
            return []
        row = conn.execute(
            "SELECT nextval(pg_get_serial_sequence(format('%%I.%%I', %s::text, 'chunks'), 'key'))",
            (self.schema,),
        ).fetchone()
        assert row is not None
        first = int(row[0])
        # The writer holds the store's lock: nothing else draws from the sequence meanwhile.
        conn.execute(
            "SELECT setval(pg_get_serial_sequence(format('%%I.%%I', %s::text, 'chunks'), 'key'), "
            "%s)",
            (self.schema, first + n - 1),
        )
        return list(range(first, first + n))

    def _copy_postings(
        self,
        conn: psycopg.Connection[Any],
        keys: Iterable[int],
        tokens: Iterable[list[str]],
        access: Iterable[list[str]],
    ) -> None:
        """Each chunk's postings: its terms, how often each occurs, its length and groups."""
        statement = sql.SQL(
            "COPY {} (term, chunk, tf, length, access) FROM STDIN WITH (FORMAT BINARY)"
        ).format(self.table("postings"))
        with conn.cursor() as cur, cur.copy(statement) as copy:
            copy.set_types(["text", "int8", "int4", "int4", "text[]"])
            for key, words, groups in zip(keys, tokens, access, strict=True):
                length, label = len(words), groups or None
                for term, tf in Counter(words).items():
                    copy.write_row((term, key, tf, length, label))

    def _count_collection(self, conn: psycopg.Connection[Any]) -> None:
        """The chunks' count and total length by group label, for BM25's statistics."""
        stats, chunks = self.table("bm25_stats"), self.table("chunks")
        conn.execute(sql.SQL("DELETE FROM {}").format(stats))
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (access, chunks, length) "
                "SELECT access, count(*), coalesce(sum(length), 0) FROM {} GROUP BY access"
            ).format(stats, chunks)
        )

    def set_aside_chunks(self, conn: psycopg.Connection[Any]) -> None:
        """Rename the chunks table of a store of version 2, and its indexes (the names of the
        new table's), for ``_carry_over``: tables of this version are then created as for
        a first ingest."""
        for (name,) in conn.execute(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE i.indrelid = to_regclass(format('%%I.%%I', %s::text, 'chunks'))",
            (self.schema,),
        ).fetchall():
            conn.execute(
                sql.SQL("ALTER INDEX {} RENAME TO {}").format(
                    self.table(name), sql.Identifier(f"{name}_{SET_ASIDE}")
                )
            )
        conn.execute(
            sql.SQL("ALTER TABLE {} RENAME TO {}").format(
                self.table("chunks"), sql.Identifier(f"chunks_{SET_ASIDE}")
            )
        )
        self._set_aside = True

    def _carry_over(self, conn: psycopg.Connection[Any], *, keep: bool) -> None:
        """The chunks set aside by a migration, into the new tables (``keep`` False: a
        rebuild, which replaces them all), each tokenised as an ingest tokenises new ones;
        then their old table goes. Written as new chunks are, before the new tables'
        indexes are built: one bulk build of the HNSW index, as for a first ingest (setting
        each row's new columns in place would re-insert each into the old one)."""
        old = self.table(f"chunks_{SET_ASIDE}")
        if keep:
            with conn.cursor(name="set_aside_chunks") as cur:
                cur.execute(
                    sql.SQL("SELECT id, text, metadata, embedding, access FROM {}").format(old)
                )
                while batch := cur.fetchmany(2000):
                    self._add_chunks(
                        conn,
                        [Chunk(cid, text, metadata) for cid, text, metadata, _, _ in batch],
                        np.stack([vector_array(row[3]) for row in batch]),
                        [list(row[4]) for row in batch],
                    )
        conn.execute(sql.SQL("DROP TABLE {}").format(old))
        self._bulk = True

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
                if not isinstance(step, str):
                    step(self, conn)
                    continue
                conn.execute(
                    sql.SQL(step).format(  # type: ignore[arg-type]  # our own constants
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

    def _add_chunks(
        self,
        conn: psycopg.Connection[Any],
        chunks: list[Chunk],
        vectors: np.ndarray,
        access: list[list[str]],
    ) -> None:
        """Chunks in (each with its vector and groups), with their postings."""
        tokens = [tokenize(chunk.text) for chunk in chunks]
        keys = self._reserve_keys(conn, len(chunks))
        self._copy_chunks(conn, chunks, vectors, keys, tokens, access)
        self._copy_postings(conn, keys, tokens, access)

    def _copy_chunks(
        self,
        conn: psycopg.Connection[Any],
        chunks: list[Chunk],
        vectors: np.ndarray,
        keys: list[int],
        tokens: list[list[str]],
        access: list[list[str]],
    ) -> None:
        statement = sql.SQL(
            "COPY {} (id, key, source, text, metadata, length, embedding, access) FROM STDIN "
            "WITH (FORMAT BINARY)"
        ).format(self.table("chunks"))
        with conn.cursor() as cur, cur.copy(statement) as copy:
            copy.set_types(["text", "int8", "text", "text", "jsonb", "int4", "vector", "text[]"])
            rows = zip(chunks, keys, tokens, vectors, access, strict=True)
            for chunk, key, words, vector, groups in rows:
                copy.write_row(
                    (
                        chunk.id,
                        key,
                        clean_text(chunk.metadata["source"]),
                        clean_text(chunk.text),
                        Jsonb(_clean(chunk.metadata)),
                        len(words),
                        np.asarray(vector, dtype=np.float32),
                        groups,
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
