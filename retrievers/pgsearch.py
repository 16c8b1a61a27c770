"""Hybrid search in PostgreSQL: a BM25 half scored from the store's postings and a pgvector
half, each filtered inside the half, fused in Python by the index folder's own functions
(``retrievers.hybrid.fused_hits``), so both stores rank with the very same fusion.

Filters and the caller's groups are compiled to a WHERE clause of bound parameters
(``retrievers.pgfilters``), shared by both halves.

The lexical half is BM25 as the index folder computes it (``retrievers.bm25``: Lucene's
formula, k1 1.2, b 0.75, the same tokenizer), from the postings an ingest writes
(``retrievers.pgwriter``): the query's terms are looked up in one index that holds every
column a score needs, each term's document frequency is counted in the same pass, and the
collection's size and average length come from per-label totals. A caller with groups gets
the statistics of the chunks it may read only, as from an index folder: neither a score nor
the order tells that a hidden file holds a word.

A hybrid search is two statements: both halves' candidates (keys and scores, no text), then
the text and metadata of the fused top ``k``. Chunk keys are never reused, so a key from the
first names the same chunk in the second; one an ingest deleted in between makes the search
run again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from psycopg import sql
from pydantic import ConfigDict, Field

from ragchains.retrievers.access import current_groups
from ragchains.retrievers.bm25 import BM25_PARAMS, tokenize
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.filters import (
    LiveFields,
    MetadataFilter,
    validate_filters,
)
from ragchains.retrievers.fusion import Candidates, FusionFields
from ragchains.retrievers.hybrid import HybridHit, fused_hits
from ragchains.retrievers.pgfilters import Params, filter_sql, readable_sql
from ragchains.retrievers.pgstore import PostgresStore, visible_fields

SearchMode = Literal["hybrid", "fulltext", "dense"]
LEXICAL_RANK = (
    f"BM25 ({BM25_PARAMS['method']}, k1 {BM25_PARAMS['k1']}, b {BM25_PARAMS['b']}; "
    f"{BM25_PARAMS['tokenizer']}) from the store's postings"
)
# As on disk (retrievers.dense): below this many rows passing the filters, the vector half
# scores them exactly.
EXACT_SUBSET_MAX = 20_000
# A search whose fused chunks an ingest deleted before their text was read runs again, at
# most this many times (then returns what is left).
ATTEMPTS = 3


# ----------------------------------------------------------------------------- statements
@dataclass
class Plan:
    """One search's first statement and what reading its rows needs."""

    statement: sql.Composed
    params: dict[str, Any]
    mode: SearchMode
    k: int
    chunks: sql.Identifier


def lexical_sql(
    store: PostgresStore,
    query: str,
    *,
    where: sql.Composable | None,
    groups: frozenset[str] | None,
    params: Params,
    fetch: int,
) -> sql.Composable:
    """A query of (key, score): the top ``fetch`` chunks by BM25 among those the caller may
    read (and ``where`` keeps, when given: filters), best first, ties by key.

    The statistics (chunk count, average length, each term's document frequency) are those
    of the chunks the caller may read, filters aside, as ``retrievers.bm25.bm25_search``
    computes them; a term repeated in the query counts as often as it occurs, as there."""
    terms = Counter(tokenize(query))
    if not terms or fetch <= 0:
        return sql.SQL("SELECT NULL::bigint AS key, NULL::float8 AS score WHERE false")
    words = params.add(list(terms))
    weights = params.add(list(terms.values()))
    readable_postings: sql.Composable = sql.SQL("TRUE")
    readable_labels: sql.Composable = sql.SQL("TRUE")
    if groups is not None:
        mine = params.add(sorted(groups))
        readable_postings = sql.SQL("(p.access IS NULL OR p.access && {}::text[])").format(mine)
        readable_labels = sql.SQL("(cardinality(s.access) = 0 OR s.access && {}::text[])").format(
            mine
        )
    k1, b = params.add(float(BM25_PARAMS["k1"])), params.add(float(BM25_PARAMS["b"]))
    scored = sql.SQL(
        "WITH p AS MATERIALIZED (SELECT p.term, p.chunk, p.tf, p.length FROM {postings} p "
        "WHERE p.term = ANY({words}::text[]) AND {readable_postings}), "
        "st AS (SELECT sum(s.chunks)::float8 AS n, "
        "sum(s.length)::float8 / greatest(sum(s.chunks), 1) AS avgdl "
        "FROM {stats} s WHERE {readable_labels}), "
        # Lucene's IDF (bm25s's "lucene"), times the term's count in the query.
        "w AS (SELECT q.term, q.weight * ln(1 + (st.n - d.df + 0.5) / (d.df + 0.5)) AS idf "
        "FROM (SELECT term, count(*) AS df FROM p GROUP BY term) d "
        "JOIN unnest({words}::text[], {weights}::int[]) AS q(term, weight) USING (term) "
        "CROSS JOIN st) "
        "SELECT p.chunk AS key, "
        "sum(w.idf * p.tf / (p.tf + {k1}::float8 * (1 - {b}::float8 + {b}::float8 * p.length "
        "/ st.avgdl))) AS score "
        "FROM p JOIN w USING (term) CROSS JOIN st GROUP BY p.chunk"
    ).format(
        postings=store.table("postings"),
        stats=store.table("bm25_stats"),
        words=words,
        weights=weights,
        readable_postings=readable_postings,
        readable_labels=readable_labels,
        k1=k1,
        b=b,
    )
    limit = params.add(fetch)
    if where is None:
        return sql.SQL("{} ORDER BY score DESC, key LIMIT {}").format(scored, limit)
    return sql.SQL(
        "SELECT l.key, l.score FROM ({scored}) l JOIN {chunks} c ON c.key = l.key "
        "WHERE {where} ORDER BY l.score DESC, l.key LIMIT {limit}"
    ).format(scored=scored, chunks=store.table("chunks"), where=where, limit=limit)


def dense_sql(
    store: PostgresStore,
    vector: np.ndarray,
    *,
    where: sql.Composable,
    exact_when_few: bool,
    params: Params,
    fetch: int,
) -> tuple[sql.Composable, sql.Composable]:
    """(CTEs to put first, or nothing; a query of (key, distance)): the ``fetch`` nearest
    chunks by cosine distance among those ``where`` keeps, from the HNSW index, or exactly
    when ``exact_when_few`` and at most ``EXACT_SUBSET_MAX`` rows pass."""
    chunks = store.table("chunks")
    v = params.add(np.asarray(vector, dtype=np.float32))
    # The ORDER BY ... LIMIT inside: the HNSW index serves it.
    nearest: sql.Composable = sql.SQL(
        "SELECT c.key, c.embedding <=> {v} AS distance FROM {chunks} c WHERE {where} "
        "ORDER BY c.embedding <=> {v} LIMIT {fetch}"
    ).format(v=v, chunks=chunks, where=where, fetch=params.add(fetch))
    if not exact_when_few:
        return sql.SQL(""), nearest
    # A filter (or a caller's view) that keeps few rows: their exact distances (the filter's
    # own index finds them), faster than a graph walk that skips most nodes and never short.
    # The count stops at EXACT_SUBSET_MAX + 1; each branch runs only when chosen.
    kept = sql.SQL(
        "kept AS (SELECT count(*) AS n FROM (SELECT 1 FROM {chunks} c WHERE {where} "
        "LIMIT {cap}) x), "
    ).format(chunks=chunks, where=where, cap=params.add(EXACT_SUBSET_MAX + 1))
    few = sql.SQL("((SELECT n FROM kept) <= {most})").format(most=params.add(EXACT_SUBSET_MAX))
    exact = sql.SQL(
        "SELECT key, distance FROM (SELECT c.key, c.embedding <=> {v} AS distance "
        "FROM {chunks} c WHERE {where} AND {few} OFFSET 0) e "
        "ORDER BY distance, key LIMIT {fetch}"
    ).format(v=v, chunks=chunks, where=where, few=few, fetch=params.add(fetch))
    graph = sql.SQL(
        "SELECT c.key, c.embedding <=> {v} AS distance FROM {chunks} c "
        "WHERE {where} AND NOT {few} ORDER BY c.embedding <=> {v} LIMIT {fetch}"
    ).format(v=v, chunks=chunks, where=where, few=few, fetch=params.add(fetch))
    return kept, sql.SQL("({}) UNION ALL ({})").format(exact, graph)


def search_sql(
    store: PostgresStore,
    *,
    mode: SearchMode,
    query: str,
    vector: np.ndarray | None,
    filters: Sequence[MetadataFilter],
    fields: Mapping[str, str],
    fetch: int,
    k: int,
    labelled: bool,
) -> Plan:
    """The first statement of a search: for ``fulltext`` and ``dense``, the top ``k`` rows
    (id, text, metadata, score); for ``hybrid``, each half's top ``fetch`` candidates (half:
    0 BM25, 1 dense; key; score). ``filters`` are compiled for the ``fields`` they were
    checked against. ``labelled``: some file has groups (as of the meta last read), so a
    caller's view may be narrow; the view is applied either way."""
    params = Params()
    groups = current_groups()
    readable = readable_sql(groups, params)
    where = sql.SQL("{} AND {}").format(filter_sql(filters, dict(fields), params), readable)
    chunks = store.table("chunks")
    lexical: sql.Composable = sql.SQL("")
    sem: sql.Composable = sql.SQL("")
    kept: sql.Composable = sql.SQL("")
    if mode != "dense":
        lexical = lexical_sql(
            store,
            query,
            # The caller's view is applied to the postings themselves.
            where=where if filters else None,
            groups=groups,
            params=params,
            fetch=k if mode == "fulltext" else fetch,
        )
    if mode != "fulltext":
        assert vector is not None
        kept, sem = dense_sql(
            store,
            vector,
            where=where,
            exact_when_few=bool(filters) or (groups is not None and labelled),
            params=params,
            fetch=k if mode == "dense" else fetch,
        )
    columns = sql.SQL("c.id, c.text, c.metadata")
    if mode == "fulltext":
        statement = sql.SQL(
            "WITH lex AS ({lexical}) SELECT {columns}, l.score FROM lex l "
            "JOIN {chunks} c ON c.key = l.key ORDER BY l.score DESC, l.key"
        ).format(lexical=lexical, columns=columns, chunks=chunks)
    elif mode == "dense":
        statement = sql.SQL(
            "WITH {kept}sem AS ({sem}) SELECT {columns}, 1 - s.distance FROM sem s "
            "JOIN {chunks} c ON c.key = s.key ORDER BY s.distance, s.key"
        ).format(kept=kept, sem=sem, columns=columns, chunks=chunks)
    else:
        statement = sql.SQL(
            "WITH {kept}lex AS ({lexical}), sem AS ({sem}) "
            "SELECT 0, key, score FROM lex UNION ALL SELECT 1, key, 1 - distance FROM sem"
        ).format(kept=kept, lexical=lexical, sem=sem)
    return Plan(statement, params.values, mode, k, chunks)


def candidates(rows: Sequence[tuple[int, int, float]]) -> Candidates:
    """Both halves' lists from a hybrid plan's rows, each best first (ties by key, as the
    statement orders them)."""
    halves: tuple[list[tuple[float, int]], list[tuple[float, int]]] = ([], [])
    for half, key, score in rows:
        halves[half].append((-float(score), int(key)))
    lex, sem = (sorted(h) for h in halves)
    return Candidates.from_lists(
        [key for _, key in lex],
        [-score for score, _ in lex],
        [key for _, key in sem],
        [-score for score, _ in sem],
    )


def fetch_sql(chunks: sql.Identifier, keys: Sequence[int]) -> tuple[sql.Composed, list[Any]]:
    """The second statement of a hybrid search: these chunks' key, id, text and metadata."""
    return (
        sql.SQL("SELECT key, id, text, metadata FROM {} WHERE key = ANY(%s)").format(chunks),
        [list(keys)],
    )


def single_documents(rows: Sequence[tuple[Any, ...]], mode: SearchMode) -> list[Document]:
    """Documents from a ``fulltext`` or ``dense`` plan's rows, with the same metadata keys as
    on disk."""
    name = "bm25" if mode == "fulltext" else "dense"
    out = []
    for rank, (cid, text, metadata, score) in enumerate(rows, start=1):
        meta = {**metadata, "chunk_id": cid, f"{name}_score": float(score), f"{name}_rank": rank}
        out.append(Document(id=cid, page_content=text, metadata=meta))
    return out


def fused_documents(
    hits: Sequence[HybridHit], rows: Sequence[tuple[Any, ...]], method: str, *, last: bool
) -> list[Document] | None:
    """The fused hits as documents (metadata as ``HybridRetriever``'s), or None when a hit's
    chunk is gone (an ingest committed between the two statements) and this is not the
    ``last`` attempt (which returns those that are left)."""
    found = {int(key): (cid, text, metadata) for key, cid, text, metadata in rows}
    out = []
    for hit in hits:
        if hit.row not in found:
            if last:
                continue
            return None
        cid, text, metadata = found[hit.row]
        meta = {
            **metadata,
            "chunk_id": cid,
            f"{method}_score": hit.score,
            "bm25_rank": hit.bm25_rank,
            "bm25_score": hit.bm25_score,
            "dense_rank": hit.dense_rank,
            "dense_score": hit.dense_score,
        }
        out.append(Document(id=cid, page_content=text, metadata=meta))
    return out


# ----------------------------------------------------------------------------- retriever
class PostgresRetriever(BaseRetriever, FusionFields):
    """Hybrid (or ``fulltext`` / ``dense``) retrieval from a ``PostgresStore``, with the
    same contract as the on-disk ``HybridRetriever``: ``invoke(query, k=..., filters=[...])``,
    filters validated against the store's field types, the same metadata on each document,
    the same fusion.

    Async calls are async all the way (psycopg's async pool); only the query's embedding
    runs in ``executor`` (CPU work)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    store: PostgresStore
    embedder: SentenceTransformerEmbedder
    k: int = Field(10, ge=1)
    filters: list[MetadataFilter] = Field(default_factory=list)
    candidates: int = Field(50, ge=1)
    search: SearchMode = "hybrid"
    executor: Any = Field(None, exclude=True, description="where query embedding runs")

    @property
    def fields(self) -> Mapping[str, str]:
        """The metadata fields (name -> type) ``filters`` may name: the caller's."""
        return LiveFields(self.store.visible_fields)

    def _plan(
        self,
        query: str,
        vector: np.ndarray | None,
        k: int,
        filters: list[MetadataFilter],
        fields: Mapping[str, str],
        meta: Mapping[str, Any],
    ) -> Plan:
        return search_sql(
            self.store,
            mode=self.search,
            query=query,
            vector=vector,
            filters=filters,
            fields=fields,
            fetch=max(self.candidates, k),
            k=k,
            labelled=bool(meta.get("field_readers")),
        )

    def _checked(self, filters: Any, fields: Mapping[str, str]) -> list[MetadataFilter]:
        return validate_filters(self.filters if filters is None else filters, fields)

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        k: int | None = None,
        filters: Any = None,
    ) -> list[Document]:
        # Field types as of the last commit (re-read once per META_TTL), read once: the
        # filters are checked and compiled against the same ones.
        meta = self.store.meta()
        fields = visible_fields(meta)
        checked, k = self._checked(filters, fields), k or self.k
        vector = None if self.search == "fulltext" else self.embedder.encode_query(query)
        plan = self._plan(query, vector, k, checked, fields, meta)
        fusion = self.fusion_config
        with self.store.connection() as conn:
            for attempt in range(ATTEMPTS):
                rows = conn.execute(plan.statement, plan.params).fetchall()
                if plan.mode != "hybrid":
                    return single_documents(rows, plan.mode)
                hits = fused_hits(candidates(rows), fusion, plan.k)
                statement, params = fetch_sql(plan.chunks, [h.row for h in hits])
                found = conn.execute(statement, params).fetchall()
                docs = fused_documents(hits, found, fusion.fusion, last=attempt + 1 == ATTEMPTS)
                if docs is not None:
                    return docs
        raise AssertionError("unreachable: the last attempt returns")

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        k: int | None = None,
        filters: Any = None,
    ) -> list[Document]:
        meta = await self.store.ameta()
        fields = visible_fields(meta)
        checked, k = self._checked(filters, fields), k or self.k
        vector = (
            None
            if self.search == "fulltext"
            else await self.embedder.aencode_query(query, self.executor)
        )
        plan = self._plan(query, vector, k, checked, fields, meta)
        fusion = self.fusion_config
        async with self.store.aconnection() as conn:
            for attempt in range(ATTEMPTS):
                cursor = await conn.execute(plan.statement, plan.params)
                rows = await cursor.fetchall()
                if plan.mode != "hybrid":
                    return single_documents(rows, plan.mode)
                hits = fused_hits(candidates(rows), fusion, plan.k)
                statement, params = fetch_sql(plan.chunks, [h.row for h in hits])
                cursor = await conn.execute(statement, params)
                found = await cursor.fetchall()
                docs = fused_documents(hits, found, fusion.fusion, last=attempt + 1 == ATTEMPTS)
                if docs is not None:
                    return docs
        raise AssertionError("unreachable: the last attempt returns")
