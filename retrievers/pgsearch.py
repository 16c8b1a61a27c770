"""Hybrid search in PostgreSQL: a BM25 half from the postings the store keeps and a pgvector
half, each filtered inside the half, fused in Python by the index folder's own functions
(``retrievers.hybrid.fused_hits``), so both stores rank with the very same fusion.

Filters and the caller's groups are compiled to a WHERE clause of bound parameters
(``retrievers.pgfilters``), shared by both halves.

The lexical half is BM25 as the index folder computes it (``retrievers.bm25``: Lucene's
formula, k1 1.2, b 0.75, the same tokenizer). The store keeps the statistics (each chunk's
postings: term, frequency, the chunk's length and groups; chunk counts and total lengths
by group label, ``retrievers.pgwriter``); a search reads the query terms' postings from one
index that holds every column it needs, with each term's document frequency and the
collection's size counted among the chunks the caller may read, and scores them here, with
numpy (PostgreSQL's per-row arithmetic cost more than the rest of the search). A caller with
groups so gets the statistics of what it may read, as from an index folder: neither a score
nor the order tells that a hidden file holds a word.

Two round trips: one statement returns both halves' candidates (keys and scores, no text:
one snapshot), a second the text and metadata of the fused top ``k``. Chunk keys are never
reused, so a key read by the first names the same chunk in the second; one an ingest deleted
in between makes the search run again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

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
from ragchains.retrievers.bm25 import BM25_PARAMS, idf, term_frequency_part, tokenize
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.filters import (
    LiveFields,
    MetadataFilter,
    validate_filters,
)
from ragchains.retrievers.fusion import Candidates, FusionConfig, FusionFields
from ragchains.retrievers.hybrid import fused_hits
from ragchains.retrievers.pgfilters import Params, filter_sql, readable_sql, scope_sql
from ragchains.retrievers.pgstore import PostgresStore, visible_fields
from ragchains.retrievers.scope import DocumentScope

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
class Statement(NamedTuple):
    query: sql.Composed
    params: dict[str, Any]


@dataclass
class Plan:
    """One search's first statement (None: nothing to search, a query of no known word in
    the ``fulltext`` mode) and how to read its rows: for the ``dense`` mode the documents'
    (id, text, metadata, cosine), best first; else the candidates: a row per query term
    found (``lexical_sql``'s columns and a NULL), and for ``hybrid`` one more of the dense
    half's (NULL term, ..., its keys and their distances, nearest first)."""

    mode: SearchMode
    k: int
    fetch: int
    chunks: sql.Identifier
    terms: Counter[str]
    statement: Statement | None


def lexical_sql(
    store: PostgresStore,
    terms: Sequence[str],
    *,
    where: sql.Composable | None,
    groups: frozenset[str] | None,
    params: Params,
) -> sql.Composed:
    """The postings of ``terms`` among the chunks the caller may read: one row per term found,
    (term, document frequency, keys, term frequencies, lengths of the chunks ``where`` keeps
    (all when None: no filters), chunk count, total length). Frequency, count and length
    are over every chunk the caller may read, filters aside, as ``bm25.bm25_search`` counts
    them."""
    readable_postings: sql.Composable = sql.SQL("TRUE")
    readable_labels: sql.Composable = sql.SQL("TRUE")
    if groups is not None:
        mine = params.add(sorted(groups))
        readable_postings = sql.SQL("(p.access IS NULL OR p.access && {}::text[])").format(mine)
        readable_labels = sql.SQL("(cardinality(s.access) = 0 OR s.access && {}::text[])").format(
            mine
        )
    kept: sql.Composable = sql.SQL("")
    joined: sql.Composable = sql.SQL("")
    if where is not None:
        # A filter keeps the postings of the chunks it keeps; the counts keep them all.
        kept = sql.SQL(" FILTER (WHERE c.key IS NOT NULL)")
        joined = sql.SQL(" LEFT JOIN {} c ON c.key = p.chunk AND {}").format(
            store.table("chunks"), where
        )
    return sql.SQL(
        "WITH st AS (SELECT coalesce(sum(s.chunks), 0)::float8 AS n, "
        "coalesce(sum(s.length), 0)::float8 AS total FROM {stats} s WHERE {readable_labels}) "
        "SELECT p.term, count(*), array_agg(p.chunk){kept}, array_agg(p.tf){kept}, "
        "array_agg(p.length){kept}, st.n, st.total "
        "FROM {postings} p CROSS JOIN st{joined} "
        "WHERE p.term = ANY({terms}::text[]) AND {readable_postings} "
        "GROUP BY p.term, st.n, st.total"
    ).format(
        stats=store.table("bm25_stats"),
        readable_labels=readable_labels,
        kept=kept,
        postings=store.table("postings"),
        joined=joined,
        terms=params.add(list(terms)),
        readable_postings=readable_postings,
    )


def bm25_top(
    rows: Sequence[tuple[Any, ...]], terms: Mapping[str, int], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The top ``k`` (keys, scores) of ``lexical_sql``'s rows, best first, ties by key:
    Lucene's BM25 as bm25s computes it, each term counted as often as the query holds it."""
    k1, b = float(BM25_PARAMS["k1"]), float(BM25_PARAMS["b"])
    keys, parts = [], []
    for term, df, chunks, tfs, lengths, n, total in rows:
        if not chunks:
            continue
        tf = np.asarray(tfs, dtype=np.float64)
        length = np.asarray(lengths, dtype=np.float64)
        weight = terms[term] * idf(df, n)
        parts.append(weight * term_frequency_part(tf, length, total / n, k1, b))
        keys.append(np.asarray(chunks, dtype=np.int64))
    if not keys:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
    held, at = np.unique(np.concatenate(keys), return_inverse=True)
    scores = np.bincount(at, weights=np.concatenate(parts))
    order = np.lexsort((held, -scores))[:k]
    return held[order], scores[order]


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
    scope: DocumentScope | None = None,
) -> Plan:
    """The first statement of one search (see ``Plan``); ``fetch`` rows per half for ``hybrid``,
    ``k`` for a half alone. ``filters`` are compiled for the ``fields`` they were checked
    against, as is the domain's ``scope``. ``labelled``: some file has groups (as of the
    meta last read), so a caller's view may be narrow; the view is applied either way."""
    groups = current_groups()
    terms = Counter(tokenize(query))
    fetch = k if mode != "hybrid" else fetch
    chunks = store.table("chunks")
    params = Params()
    parts: list[sql.Composable] = []
    scoped = scope is not None and not scope.everything
    where = sql.SQL("{} AND {} AND {}").format(
        filter_sql(filters, dict(fields), params),
        readable_sql(groups, params),
        scope_sql(scope, dict(fields), params),
    )
    if mode != "dense" and terms and fetch > 0:
        # The caller's view applies to the postings themselves; filters (and a scope) need
        # the chunks.
        lexical = lexical_sql(
            store,
            list(terms),
            where=where if filters or scoped else None,
            groups=groups,
            params=params,
        )
        parts.append(sql.SQL("SELECT *, NULL::float8[] FROM ({}) lex").format(lexical))
    if mode == "fulltext":
        statement = sql.SQL("").join(parts)
        return Plan(
            mode, k, fetch, chunks, terms, Statement(statement, params.values) if parts else None
        )
    assert vector is not None
    kept, nearest = dense_sql(
        store,
        vector,
        where=where,
        exact_when_few=bool(filters) or scoped or (groups is not None and labelled),
        params=params,
        fetch=fetch,
    )
    if mode == "dense":
        statement = sql.SQL(
            "WITH {kept}sem AS ({nearest}) SELECT c.id, c.text, c.metadata, "
            "1 - s.distance FROM sem s JOIN {chunks} c ON c.key = s.key "
            "ORDER BY s.distance, s.key"
        ).format(kept=kept, nearest=nearest, chunks=chunks)
        return Plan(mode, k, fetch, chunks, terms, Statement(statement, params.values))
    # Both halves in one statement: one round trip, one snapshot.
    parts.append(
        sql.SQL(
            "SELECT NULL::text, NULL::bigint, array_agg(key ORDER BY distance, key), "
            "NULL::int[], NULL::int[], NULL::float8, NULL::float8, "
            "array_agg(distance ORDER BY distance, key) FROM sem"
        )
    )
    statement = sql.SQL("WITH {}sem AS ({}) {}").format(
        kept, nearest, sql.SQL(" UNION ALL ").join(parts)
    )
    return Plan(mode, k, fetch, chunks, terms, Statement(statement, params.values))


def fetch_sql(chunks: sql.Identifier, keys: Sequence[int]) -> Statement:
    """These chunks' key, id, text and metadata."""
    statement = sql.SQL("SELECT key, id, text, metadata FROM {} WHERE key = ANY(%(keys)s)")
    return Statement(statement.format(chunks), {"keys": list(keys)})


@dataclass
class Hit:
    """A chunk found, by key, with the metadata the search adds to it."""

    key: int
    metadata: dict[str, Any]


def ranked_hits(plan: Plan, rows: Sequence[tuple[Any, ...]], fusion: FusionConfig) -> list[Hit]:
    """The search's top ``k`` from its candidates' rows (``fulltext`` and ``hybrid`` modes),
    with the same metadata as on disk: each half's rank and score, the fused score."""
    lexical = [row[:7] for row in rows if row[0] is not None]
    nearest = [row for row in rows if row[0] is None]
    keys, scores = bm25_top(lexical, plan.terms, plan.fetch)
    if plan.mode == "fulltext":
        return [
            Hit(key, {"bm25_score": score, "bm25_rank": rank})
            for rank, (key, score) in enumerate(zip(keys.tolist(), scores.tolist(), strict=True), 1)
        ]
    dense_keys, distances = (nearest[0][2] or [], nearest[0][7] or []) if nearest else ([], [])
    candidates = Candidates.from_lists(
        keys, scores, dense_keys, [1 - distance for distance in distances]
    )
    # As HybridRetriever's documents carry them.
    return [Hit(hit.row, hit.metadata(fusion)) for hit in fused_hits(candidates, fusion, plan.k)]


def hit_documents(
    hits: Sequence[Hit], rows: Sequence[tuple[Any, ...]], *, last: bool
) -> list[Document] | None:
    """The hits as documents, from ``fetch_sql``'s rows; None when a hit's chunk is gone (an
    ingest committed meanwhile) and this is not the ``last`` attempt (which returns those
    that are left)."""
    found = {int(row[0]): row[1:] for row in rows}
    out = []
    for hit in hits:
        if hit.key not in found:
            if last:
                continue
            return None
        cid, text, metadata = found[hit.key]
        meta = {**metadata, "chunk_id": cid, **hit.metadata}
        out.append(Document(id=cid, page_content=text, metadata=meta))
    return out


def dense_documents(rows: Sequence[tuple[Any, ...]]) -> list[Document]:
    """Documents from the ``dense`` mode's rows, with the same metadata keys as on disk."""
    out = []
    for rank, (cid, text, metadata, score) in enumerate(rows, start=1):
        meta = {**metadata, "chunk_id": cid, "dense_score": float(score), "dense_rank": rank}
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
        scope: DocumentScope | None,
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
            scope=scope,
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
        scope: DocumentScope | None = None,
    ) -> list[Document]:
        # Field types as of the last commit (re-read once per META_TTL), read once: the
        # filters are checked and compiled against the same ones.
        meta = self.store.meta()
        fields = visible_fields(meta)
        checked, k = self._checked(filters, fields), k or self.k
        vector = None if self.search == "fulltext" else self.embedder.encode_query(query)
        plan = self._plan(query, vector, k, checked, fields, meta, scope)
        fusion = self.fusion_config
        if plan.statement is None:
            return []
        with self.store.connection() as conn:
            for attempt in range(ATTEMPTS):
                rows = conn.execute(*plan.statement, binary=True).fetchall()
                if plan.mode == "dense":
                    return dense_documents(rows)
                hits = ranked_hits(plan, rows, fusion)
                if not hits:
                    return []
                found = conn.execute(*fetch_sql(plan.chunks, [h.key for h in hits])).fetchall()
                docs = hit_documents(hits, found, last=attempt + 1 == ATTEMPTS)
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
        scope: DocumentScope | None = None,
    ) -> list[Document]:
        meta = await self.store.ameta()
        fields = visible_fields(meta)
        checked, k = self._checked(filters, fields), k or self.k
        vector = (
            None
            if self.search == "fulltext"
            else await self.embedder.aencode_query(query, self.executor)
        )
        plan = self._plan(query, vector, k, checked, fields, meta, scope)
        fusion = self.fusion_config
        if plan.statement is None:
            return []
        async with self.store.aconnection() as conn:
            for attempt in range(ATTEMPTS):
                cursor = await conn.execute(*plan.statement, binary=True)
                rows = await cursor.fetchall()
                if plan.mode == "dense":
                    return dense_documents(rows)
                hits = ranked_hits(plan, rows, fusion)
                if not hits:
                    return []
                cursor = await conn.execute(*fetch_sql(plan.chunks, [h.key for h in hits]))
                docs = hit_documents(hits, await cursor.fetchall(), last=attempt + 1 == ATTEMPTS)
                if docs is not None:
                    return docs
        raise AssertionError("unreachable: the last attempt returns")
