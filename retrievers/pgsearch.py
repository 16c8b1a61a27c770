"""Hybrid search in PostgreSQL: full-text and pgvector halves, each filtered inside the half,
fused in the same statement by the project's fusion functions (``retrievers.fusion``).

Filters and the caller's groups are compiled to a WHERE clause of bound parameters
(``retrievers.pgfilters``), shared by both halves.

The lexical half is PostgreSQL's own ranking (``ts_rank``, length-normalised, over an OR of
the query's stemmed words, the ``english`` configuration), not BM25: documents carry its
rank and score under the same ``bm25_rank`` / ``bm25_score`` keys as the on-disk index, so
the compressor, CLI and evaluation read them unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.filters import (
    LiveFields,
    MetadataFilter,
    validate_filters,
)
from ragchains.retrievers.fusion import (
    BM25_LOWER_BOUND,
    COSINE_LOWER_BOUND,
    FusionConfig,
    FusionFields,
)
from ragchains.retrievers.pgfilters import Params, filter_sql, readable_sql
from ragchains.retrievers.pgstore import PostgresStore, visible_fields
from ragchains.retrievers.pgwriter import TEXT_SEARCH_CONFIG, clean_text

SearchMode = Literal["hybrid", "fulltext", "dense"]
# PostgreSQL's frequency ranking, divided by 1 + log(document length) (normalisation 1). On
# SciFact test it scored nDCG@10 0.604 alone (hybrid 0.710) where cover density
# (ts_rank_cd) scored 0.329 (hybrid 0.627): a long query's words rarely sit close together.
LEXICAL_RANK = "ts_rank(c.tsv, q.tsq, 1)"
# As on disk (retrievers.dense): below this many rows passing the filters, the vector half
# scores them exactly.
EXACT_SUBSET_MAX = 20_000


# ----------------------------------------------------------------------------- statements
def tsquery_sql(query: sql.Placeholder) -> sql.Composable:
    """An OR of the query's stemmed words, each quoted as a tsquery lexeme (BM25 scores any
    shared word; ``plainto_tsquery`` would demand all of them)."""
    return sql.SQL(
        "(SELECT coalesce(string_agg("
        "'''' || replace(replace(l, '\\', '\\\\'), '''', '''''') || '''', ' | '), '')::tsquery "
        "FROM unnest(tsvector_to_array(to_tsvector({config}::regconfig, {q}))) AS l)"
    ).format(config=sql.Literal(TEXT_SEARCH_CONFIG), q=query)


def _fused(fusion: FusionConfig, params: Params) -> sql.Composable:
    """The fused score of a row of ``both`` (beside ``bounds``), as ``retrievers.fusion.fuse``
    computes it."""
    if fusion.fusion == "rrf":
        return sql.SQL(
            "coalesce({wb}::float8 / ({k} + lex_rank), 0) "
            "+ coalesce({wd}::float8 / ({k} + sem_rank), 0)"
        ).format(
            wb=params.add(fusion.bm25_weight),
            wd=params.add(fusion.dense_weight),
            k=params.add(fusion.rrf_k),
        )

    def normalised(score: str, top: str, low: sql.Composable) -> sql.Composable:
        # tmm: the function's lowest score and the list's maximum; minmax: the list's own.
        return sql.SQL(
            "CASE WHEN {s} IS NULL THEN 0 "
            "WHEN {top} > {low} THEN least(greatest(({s} - {low}) / ({top} - {low}), 0), 1) "
            "ELSE {flat} END"
        ).format(
            s=sql.Identifier(score),
            top=sql.Identifier(top),
            low=low,
            flat=sql.SQL("1" if fusion.normalization == "minmax" else "0"),
        )

    if fusion.normalization == "tmm":
        lex_low: sql.Composable = sql.Literal(BM25_LOWER_BOUND)
        sem_low: sql.Composable = sql.Literal(COSINE_LOWER_BOUND)
    else:
        lex_low, sem_low = sql.Identifier("lex_min"), sql.Identifier("sem_min")
    alpha = params.add(fusion.alpha)
    return sql.SQL("(1.0::float8 - {a}) * {lex} + {a}::float8 * {sem}").format(
        a=alpha,
        lex=normalised("lex_score", "lex_max", lex_low),
        sem=normalised("sem_score", "sem_max", sem_low),
    )


def search_sql(
    store: PostgresStore,
    *,
    mode: SearchMode,
    query: str,
    vector: np.ndarray | None,
    filters: Sequence[MetadataFilter],
    fields: Mapping[str, str],
    fusion: FusionConfig,
    fetch: int,
    k: int,
    labelled: bool,
) -> tuple[sql.Composed, dict[str, Any]]:
    """One statement returning the top ``k`` rows (id, text, metadata, fused score, each
    half's rank and score) and its parameters; ``filters`` are compiled for the ``fields``
    they were checked against. ``labelled``: some file has groups (as of the meta last read),
    so a caller's view may be narrow; the view is applied either way."""
    params = Params()
    groups = current_groups()
    where = sql.SQL("{} AND {}").format(
        filter_sql(filters, dict(fields), params), readable_sql(groups, params)
    )
    chunks = store.table("chunks")
    lex = sql.SQL(
        "lex AS (SELECT id, score AS lex_score, row_number() OVER (ORDER BY score DESC, id) "
        "AS lex_rank FROM (SELECT c.id, {rank}::float8 AS score "
        "FROM {chunks} c, {tsq} AS q(tsq) WHERE c.tsv @@ q.tsq AND {where} "
        "ORDER BY score DESC, c.id LIMIT {fetch}) t)"
    ).format(
        rank=sql.SQL(LEXICAL_RANK),
        chunks=chunks,
        tsq=sql.SQL("(SELECT {})").format(tsquery_sql(params.add(clean_text(query)))),
        where=where,
        fetch=params.add(fetch),
    )
    sem: sql.Composable = sql.SQL("")
    if mode != "fulltext":
        assert vector is not None
        v = params.add(np.asarray(vector, dtype=np.float32))
        # The ORDER BY ... LIMIT inside: the HNSW index serves it; ranks are numbered after.
        nearest = sql.SQL(
            "SELECT c.id, c.embedding <=> {v} AS distance FROM {chunks} c WHERE {where} "
            "ORDER BY c.embedding <=> {v} LIMIT {fetch}"
        ).format(v=v, chunks=chunks, where=where, fetch=params.add(fetch))
        kept: sql.Composable = sql.SQL("")
        if filters or (groups is not None and labelled):
            # A filter (or a caller's view) that keeps few rows: their exact distances (the
            # filter's own index finds them), faster than a graph walk that skips most nodes
            # and never short.
            # The count stops at EXACT_SUBSET_MAX + 1; each branch runs only when chosen.
            kept = sql.SQL(
                "kept AS (SELECT count(*) AS n FROM (SELECT 1 FROM {chunks} c WHERE {where} "
                "LIMIT {cap}) x), "
            ).format(chunks=chunks, where=where, cap=params.add(EXACT_SUBSET_MAX + 1))
            few = sql.SQL("((SELECT n FROM kept) <= {most})").format(
                most=params.add(EXACT_SUBSET_MAX)
            )
            exact = sql.SQL(
                "SELECT id, distance FROM (SELECT c.id, c.embedding <=> {v} AS distance "
                "FROM {chunks} c WHERE {where} AND {few} OFFSET 0) e "
                "ORDER BY distance LIMIT {fetch}"
            ).format(v=v, chunks=chunks, where=where, few=few, fetch=params.add(fetch))
            nearest = sql.SQL("({exact}) UNION ALL ({graph})").format(
                exact=exact,
                graph=sql.SQL(
                    "SELECT c.id, c.embedding <=> {v} AS distance FROM {chunks} c "
                    "WHERE {where} AND NOT {few} ORDER BY c.embedding <=> {v} LIMIT {fetch}"
                ).format(v=v, chunks=chunks, where=where, few=few, fetch=params.add(fetch)),
            )
        sem = sql.SQL(
            "{kept}sem AS (SELECT id, 1 - distance AS sem_score, row_number() OVER "
            "(ORDER BY distance, id) AS sem_rank FROM ({nearest}) t)"
        ).format(kept=kept, nearest=nearest)
    top = params.add(k)
    columns = sql.SQL("c.id, c.text, c.metadata")
    if mode == "fulltext":
        statement = sql.SQL(
            "WITH {lex} SELECT {columns}, lex_score, lex_rank FROM lex JOIN {chunks} c "
            "USING (id) ORDER BY lex_rank LIMIT {top}"
        ).format(lex=lex, columns=columns, chunks=chunks, top=top)
    elif mode == "dense":
        statement = sql.SQL(
            "WITH {sem} SELECT {columns}, sem_score, sem_rank FROM sem JOIN {chunks} c "
            "USING (id) ORDER BY sem_rank LIMIT {top}"
        ).format(sem=sem, columns=columns, chunks=chunks, top=top)
    else:
        statement = sql.SQL(
            "WITH {lex}, {sem}, "
            "both_halves AS (SELECT coalesce(lex.id, sem.id) AS id, lex_rank, lex_score, "
            "sem_rank, sem_score FROM lex FULL OUTER JOIN sem ON lex.id = sem.id), "
            "bounds AS (SELECT max(lex_score) AS lex_max, min(lex_score) AS lex_min, "
            "max(sem_score) AS sem_max, min(sem_score) AS sem_min FROM both_halves), "
            "fused AS (SELECT b.*, {fused} AS fused FROM both_halves b, bounds) "
            "SELECT {columns}, fused, lex_rank, lex_score, sem_rank, sem_score "
            "FROM fused JOIN {chunks} c USING (id) "
            "ORDER BY fused DESC, lex_rank NULLS LAST, sem_rank LIMIT {top}"
        ).format(
            lex=lex,
            sem=sem,
            fused=_fused(fusion, params),
            columns=columns,
            chunks=chunks,
            top=top,
        )
    return statement, params.values


def documents(rows: Sequence[tuple[Any, ...]], mode: SearchMode, method: str) -> list[Document]:
    """Documents from ``search_sql``'s rows, with the same metadata keys as on disk."""
    out = []
    for row in rows:
        cid, text, metadata = row[0], row[1], dict(row[2])
        metadata["chunk_id"] = cid
        if mode == "fulltext":
            metadata.update(bm25_score=float(row[3]), bm25_rank=int(row[4]))
        elif mode == "dense":
            metadata.update(dense_score=float(row[3]), dense_rank=int(row[4]))
        else:
            fused, lex_rank, lex_score, sem_rank, sem_score = row[3:8]
            metadata.update(
                {
                    f"{method}_score": float(fused),
                    "bm25_rank": None if lex_rank is None else int(lex_rank),
                    "bm25_score": None if lex_score is None else float(lex_score),
                    "dense_rank": None if sem_rank is None else int(sem_rank),
                    "dense_score": None if sem_score is None else float(sem_score),
                }
            )
        out.append(Document(id=cid, page_content=text, metadata=metadata))
    return out


# ----------------------------------------------------------------------------- retriever
class PostgresRetriever(BaseRetriever, FusionFields):
    """Hybrid (or ``fulltext`` / ``dense``) retrieval from a ``PostgresStore``, with the
    same contract as the on-disk ``HybridRetriever``: ``invoke(query, k=..., filters=[...])``,
    filters validated against the store's field types, the same metadata on each document.

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

    def _statement(
        self,
        query: str,
        vector: np.ndarray | None,
        k: int,
        filters: list[MetadataFilter],
        fields: Mapping[str, str],
        meta: Mapping[str, Any],
    ) -> tuple[sql.Composed, dict[str, Any]]:
        return search_sql(
            self.store,
            mode=self.search,
            query=query,
            vector=vector,
            filters=filters,
            fields=fields,
            fusion=self.fusion_config,
            fetch=max(self.candidates, k),
            k=k,
            labelled=bool(meta.get("field_readers")),
        )

    def _vector(self, query: str) -> np.ndarray | None:
        return None if self.search == "fulltext" else self.embedder.encode_query(query)

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
        vector = self._vector(query)
        statement, params = self._statement(query, vector, k, checked, fields, meta)
        with self.store.connection() as conn:
            rows = conn.execute(statement, params).fetchall()
        return documents(rows, self.search, self.fusion_config.fusion)

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
        statement, params = self._statement(query, vector, k, checked, fields, meta)
        async with self.store.aconnection() as conn:
            cursor = await conn.execute(statement, params)
            rows = await cursor.fetchall()
        return documents(rows, self.search, self.fusion_config.fusion)
