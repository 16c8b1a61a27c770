"""The PostgreSQL store on a real PostgreSQL 18 + pgvector 0.8 (tests/postgres.py): the same
chunks, filters and chains as the on-disk index, atomic ingests, hostile values."""

from __future__ import annotations

import asyncio
import fnmatch
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest

from ragchains.factory import build_retriever, build_service, open_index
from ragchains.retrievers.access import SIDECAR, AccessRule, caller_groups
from ragchains.retrievers.bm25 import BM25Retriever
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.filters import (
    MAX_GLOB_CHARS,
    MAX_VALUE_CHARS,
    FilterError,
    MetadataFilter,
)
from ragchains.retrievers.fusion import Candidates, FusionConfig, fused_order
from ragchains.retrievers.hybrid import HybridRetriever
from ragchains.retrievers.pgerrors import StoreError
from ragchains.retrievers.pgfilters import glob_regex
from ragchains.retrievers.pgsearch import Hit, PostgresRetriever, hit_documents
from ragchains.retrievers.pgstore import PostgresStore
from ragchains.retrievers.pgwriter import SCHEMA_VERSION, StoreDelta
from ragchains.retrievers.searchindex import load_index
from ragchains.settings import Settings
from tests.conftest import REPO
from tests.postgres import LocalPostgres

QUESTION = "What does the standard health plan cost?"


def store_rows(url: str) -> dict[str, tuple[str, dict[str, Any]]]:
    store = PostgresStore(url)
    try:
        with store.connection() as conn:
            rows = conn.execute(
                f'SELECT id, text, metadata FROM "{store.schema}".chunks'  # test's own schema
            ).fetchall()
    finally:
        store.close()
    return {cid: (text, meta) for cid, text, meta in rows}


def pg_retriever(
    url: str, embedder: SentenceTransformerEmbedder, **kwargs: Any
) -> PostgresRetriever:
    return PostgresRetriever(store=PostgresStore(url), embedder=embedder, **kwargs)


# ----------------------------------------------------------------------------- ingest
def test_the_store_holds_the_index_chunks_ids_metadata_and_labels(
    sample_store: str, sample_index: Path, embedder: SentenceTransformerEmbedder
) -> None:
    index = load_index(sample_index)
    try:
        on_disk = {c.id: (c.text, c.metadata) for c in index.store.iter_chunks()}
        fields = index.fields
    finally:
        index.close()
    assert store_rows(sample_store) == on_disk
    store = PostgresStore(sample_store)
    try:
        info = store.describe()
        assert dict(store.fields) == fields and info["chunks"] == len(on_disk)
        assert info["server_version"].startswith("18")
        major, minor = (int(part) for part in info["pgvector_version"].split(".")[:2])
        assert (major, minor) >= (0, 8)
        assert info["schema_version"] == SCHEMA_VERSION and info["generation"] == 1
    finally:
        store.close()


def test_a_re_run_embeds_only_what_changed(docs_dir: Path, pg_url: str, ingest_into: Any) -> None:
    first = ingest_into(docs_dir, pg_url)
    assert first.wrote and len(first.added) == 6 and first.chunks_embedded == first.chunks_total
    again = ingest_into(docs_dir, pg_url)
    assert not again.wrote and again.chunks_embedded == 0 and len(again.unchanged) == 6

    guide = docs_dir / "guide.md"
    guide.write_text(guide.read_text() + "\n\n## Mulching\n\nMulch keeps the soil moist.\n")
    (docs_dir / "notes.txt").unlink()
    third = ingest_into(docs_dir, pg_url)
    assert third.updated == ["docs/guide.md"] and third.removed == ["docs/notes.txt"]
    assert 0 < third.chunks_embedded < third.chunks_total  # the guide's unchanged chunks kept
    rows = store_rows(pg_url)
    assert len(rows) == third.chunks_total
    assert {meta["source"] for _, meta in rows.values()} == {
        f"docs/{p.name}" for p in docs_dir.iterdir()
    }
    assert any("Mulch keeps the soil moist." in text for text, _ in rows.values())
    store = PostgresStore(pg_url)
    try:
        assert store.generation == 2  # the unchanged run wrote nothing
    finally:
        store.close()


CRASHING_INGEST = """
import sys, time
from pathlib import Path
from ragchains.retrievers import pgwriter
from ragchains.factory import run_ingest
from ragchains.settings import Settings

copy = pgwriter.StoreWriter._copy_chunks

def copy_then_hang(self, conn, delta, *rest):
    copy(self, conn, delta, *rest)  # the new rows are in, uncommitted
    Path(sys.argv[3]).write_text("copied")
    time.sleep(600)

pgwriter.StoreWriter._copy_chunks = copy_then_hang
run_ingest(Settings(_env_file=None), [sys.argv[1]], sys.argv[2], progress=False)
"""


def test_a_crash_mid_ingest_leaves_the_previous_content_whole(
    docs_dir: Path, pg_url: str, ingest_into: Any, tmp_path: Path
) -> None:
    ingest_into(docs_dir, pg_url)
    before = store_rows(pg_url)
    (docs_dir / "guide.md").write_text("# Replaced\n\nEverything here is new.\n")
    (docs_dir / "extra.md").write_text("# Extra\n\nA file the crashed run adds.\n")
    flag = tmp_path / "copied"
    child = subprocess.Popen(
        [sys.executable, "-c", CRASHING_INGEST, str(docs_dir), pg_url, str(flag)],
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if not k.startswith("RAGCHAINS_")},
    )
    try:
        deadline = time.monotonic() + 300
        while not flag.exists():
            assert child.poll() is None, "the ingest ended before it wrote"
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        child.send_signal(signal.SIGKILL)  # the crash (or, when the test failed, clean-up)
        child.wait(60)
    assert store_rows(pg_url) == before
    store = PostgresStore(pg_url)
    try:
        assert store.generation == 1 and set(store.files()) == {
            f"docs/{p.name}" for p in docs_dir.iterdir() if p.name != "extra.md"
        }
    finally:
        store.close()
    # The dead writer's lock went with its connection: the next run goes ahead.
    report = ingest_into(docs_dir, pg_url)
    assert report.added == ["docs/extra.md"] and report.updated == ["docs/guide.md"]


def test_a_second_writer_is_refused_and_an_empty_store_is_explained(
    pg_url: str, docs_dir: Path, ingest_into: Any, embedder: SentenceTransformerEmbedder
) -> None:
    with pytest.raises(StoreError, match="no ragchains store"):
        open_index(pg_url, embedder)
    store = PostgresStore(pg_url)
    try:
        with store.writer(), pytest.raises(ValueError, match="another ingest is writing"):
            ingest_into(docs_dir, pg_url)
    finally:
        store.close()


# ----------------------------------------------------------------------------- search
FILTERS: list[list[dict[str, Any]]] = [
    [{"field": "price", "op": "<", "value": 50}],
    [{"field": "price", "op": "<=", "value": 39}],
    [{"field": "price", "op": ">", "value": 100}],
    [{"field": "price", "op": ">=", "value": 129}],
    [{"field": "price", "op": "=", "value": 19}],
    [{"field": "price", "op": "!=", "value": 19}],
    [{"field": "price", "op": "in", "value": [19, 15, 1000]}],
    [{"field": "in_stock", "op": "=", "value": True}],
    [{"field": "in_stock", "op": "!=", "value": True}],
    [{"field": "category", "op": "=", "value": "Accessories"}],
    [{"field": "category", "op": "!=", "value": "Accessories"}],
    [{"field": "category", "op": "in", "value": ["Accessories", "Sensors", "nothing"]}],
    [{"field": "filename", "op": "=", "value": "*.md"}],
    [{"field": "filename", "op": "!=", "value": "*.md"}],
    [{"field": "source", "op": "=", "value": "samples/*/products.csv"}],
    [{"field": "filename", "op": "in", "value": ["*.pdf", "products.csv"]}],
    [{"field": "filename", "op": "=", "value": "[ep]*-*.md"}],
    [{"field": "filename", "op": "=", "value": "[!e]*.md"}],
    [{"field": "page", "op": "=", "value": 1}],
    [{"field": "price", "op": "<", "value": 50}, {"field": "in_stock", "op": "=", "value": True}],
]


@pytest.mark.parametrize("filters", FILTERS, ids=lambda f: " & ".join(map(json.dumps, f)))
def test_every_filter_keeps_the_rows_it_keeps_on_disk(
    filters: list[dict[str, Any]],
    sample_store: str,
    sample_index: Path,
    settings: Settings,
    embedder: SentenceTransformerEmbedder,
) -> None:
    index = load_index(sample_index)
    try:
        # k above the corpus size: both return every row that passes (the dense half ranks
        # all of them), so the sets must be equal.
        on_disk = HybridRetriever(index=index, embedder=embedder, k=100, candidates=100)
        expected = {d.id for d in on_disk.invoke("sensor price", filters=filters)}
    finally:
        index.close()
    retriever = pg_retriever(sample_store, embedder, k=100, candidates=100)
    try:
        found = retriever.invoke("sensor price", filters=filters)
    finally:
        retriever.store.close()
    assert {d.id for d in found} == expected and expected


@pytest.mark.parametrize(
    ("flt", "message"),
    [
        ({"field": "colour", "op": "=", "value": "red"}, "unknown filter field"),
        ({"field": "category", "op": "<", "value": "A"}, "does not apply"),
        ({"field": "price", "op": "=", "value": "cheap"}, "expected a number"),
        ({"field": "in_stock", "op": "=", "value": "yes"}, "expected true or false"),
        ({"field": "price", "op": "in", "value": []}, "non-empty list"),
        ({"field": "price", "op": "like", "value": 1}, "malformed filter"),
    ],
)
def test_bad_filters_are_refused_before_any_sql(
    flt: dict[str, Any], message: str, sample_store: str, embedder: SentenceTransformerEmbedder
) -> None:
    retriever = pg_retriever(sample_store, embedder)
    try:
        with pytest.raises(FilterError, match=message):
            retriever.invoke("sensors", filters=[flt])
    finally:
        retriever.store.close()


HOSTILE = [
    "50% off",
    "5_0",
    "O'Brien'; DROP TABLE chunks; --",
    'say "hi"',
    "back\\slash \\' \\%",
    "x" * 100,  # longer columns are prose, not filterable (MAX_FILTERABLE_STRING)
    "a*b?c[d]",
    "tab\there",
    "ünïcödé ✓ 𝄞",
]


def test_hostile_values_are_matched_literally(
    pg_url: str, tmp_path: Path, ingest_into: Any, embedder: SentenceTransformerEmbedder
) -> None:
    docs = tmp_path / "hostile"
    docs.mkdir()
    rows = [{"label": name, "n": i, "text": f"item {i}"} for i, name in enumerate(HOSTILE)]
    (docs / "items.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (docs / "100%_real.md").write_text("# Real\n\nA file with a percent and an underscore.\n")
    (docs / "1000-real.md").write_text("# Other\n\nA name the SQL wildcards would match.\n")
    ingest_into(docs, pg_url)
    retriever = pg_retriever(pg_url, embedder, k=100, candidates=100)
    try:

        def names(*filters: dict[str, Any], query: str = "item") -> list[str]:
            found = retriever.invoke(query, filters=list(filters))
            return sorted(str(d.metadata.get("label", d.metadata["filename"])) for d in found)

        for value in HOSTILE:
            assert names({"field": "label", "op": "=", "value": value}) == [value]
            others = names({"field": "label", "op": "!=", "value": value})
            assert value not in others and len(others) == len(HOSTILE) - 1
        assert names({"field": "label", "op": "in", "value": HOSTILE[:3]}) == sorted(HOSTILE[:3])
        for wildcard in ("50%", "5%", "%", "_", "5_", "O'Brien%", "50\\% off", "a*b%"):
            assert names({"field": "label", "op": "=", "value": wildcard}) == []
        assert names({"field": "label", "op": "=", "value": "50% off\x00"}) == []
        assert names({"field": "label", "op": "=", "value": "x" * MAX_VALUE_CHARS}) == []
        glob = "*" + "?" * (MAX_GLOB_CHARS - 1)
        assert names({"field": "filename", "op": "=", "value": glob}) == []
        for too_long in ("x" * 100_000, "*" + "?" * 10_000):  # refused before any SQL
            with pytest.raises(FilterError, match="at most"):
                names({"field": "filename", "op": "=", "value": too_long})
        # Globs: only * ? [ ] are special; % and _ are themselves.
        real = {"field": "filename", "op": "=", "value": "100%_*.md"}
        assert names(real, query="real") == ["100%_real.md"]
        assert names({"field": "filename", "op": "=", "value": "100__*"}, query="real") == []
        assert names({"field": "filename", "op": "=", "value": "10?%_real.md"}, query="real") == [
            "100%_real.md"
        ]
        # A hostile query is text to search, never SQL.
        for query in ("'; DROP TABLE chunks; --", "\x00", "\\", "%_%", "a & b | !c <-> d:*"):
            retriever.invoke(query)
        assert len(store_rows(pg_url)) == len(HOSTILE) + 2
    finally:
        retriever.store.close()


GLOBS = [
    "*.md",
    "a?c",
    "[abc]*",
    "[!abc]*",
    "[a-c]x",
    "[z-a]",
    "[!]",
    "[]]",
    "[!]]",
    "[",
    "a[",
    "*[*",
    "[-a]",
    "[a-]",
    "**",
    "%_\\",
    "[\\]",
    "[a-c-e]",
    "é*",
    "*.*.*",
]
NAMES = [
    "a.md",
    "abc",
    "axc",
    "b",
    "bx",
    "dx",
    "]",
    "!",
    "[",
    "a[",
    "x[y",
    "-",
    "a-",
    "%_\\",
    "\\",
    "d",
    "e",
    "é.txt",
    "a.b.c",
    "",
    "\n",
    "a\nb.md",
]


def test_glob_patterns_match_as_fnmatch_does(postgres: LocalPostgres) -> None:
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        for pattern in GLOBS:
            regex = glob_regex(pattern)
            for name in NAMES:
                expected = fnmatch.fnmatchcase(name, pattern)
                if regex is None:
                    assert not expected, (pattern, name)
                    continue
                row = conn.execute("SELECT %s ~ %s", (name, regex)).fetchone()
                assert row is not None and row[0] is expected, (pattern, name, regex)


@pytest.mark.parametrize(
    "fusion",
    [
        FusionConfig(),
        FusionConfig(fusion="convex", normalization="minmax", alpha=0.45),
        FusionConfig(fusion="rrf"),
        FusionConfig(fusion="rrf", bm25_weight=0.5, dense_weight=2.0, rrf_k=5),
    ],
    ids=lambda f: f.describe(),
)
def test_the_hybrid_fuses_its_halves_as_the_index_folder_does(
    fusion: FusionConfig, sample_store: str, embedder: SentenceTransformerEmbedder
) -> None:
    """The store's two halves, fused by retrievers.fusion (the functions the index folder
    and ``ragchains eval tune`` use), give the hybrid's order and scores."""
    settings = fusion.model_dump()
    hybrid = pg_retriever(sample_store, embedder, k=10, candidates=20, **settings)
    try:
        for query in ("sensor under 50 dollars", QUESTION, "travel hotel per night"):
            halves = {}
            for mode in ("fulltext", "dense"):
                side = hybrid.model_copy(update={"search": mode, "k": 20})
                halves[mode] = side.invoke(query)
            ids = sorted({d.id for docs in halves.values() for d in docs})
            row = {cid: n for n, cid in enumerate(ids)}
            candidates = Candidates.from_lists(
                [row[d.id] for d in halves["fulltext"]],
                [d.metadata["bm25_score"] for d in halves["fulltext"]],
                [row[d.id] for d in halves["dense"]],
                [d.metadata["dense_score"] for d in halves["dense"]],
            )
            order, scores = fused_order(candidates, fusion, 10)
            expected = [ids[int(candidates.rows[i])] for i in order]
            found = hybrid.invoke(query)
            assert [d.id for d in found] == expected, query
            fused = [d.metadata[f"{fusion.fusion}_score"] for d in found]
            assert fused == pytest.approx(scores.tolist(), rel=1e-9, abs=1e-12)
    finally:
        hybrid.store.close()


KEYWORD_QUERIES = (
    QUESTION,
    "sensor under 50 dollars",
    "travel hotel per night in Europe",
    "How many vacation days do employees get?",
    "soil moisture sensor battery",
    "the the plan plan cost",  # a stop word and a repeated word, counted as BM25Retriever does
)


def keyword_hits(docs: list[Any]) -> list[tuple[str, float]]:
    return [(d.id, d.metadata["bm25_score"]) for d in docs]


def assert_same_ranking(found: list[tuple[str, float]], expected: list[tuple[str, float]]) -> None:
    """The same chunks with the same scores, in the same order up to ties (bm25s keeps
    float32 scores; a tie at the cut may keep either chunk)."""
    assert [s for _, s in found] == pytest.approx([s for _, s in expected], rel=1e-5)

    def tied(hits: list[tuple[str, float]], score: float) -> list[str]:
        return sorted(c for c, s in hits if math.isclose(s, score, rel_tol=1e-5))

    last = found[-1][1] if found else 0.0
    for _, score in found:
        if not math.isclose(score, last, rel_tol=1e-5):
            assert tied(found, score) == tied(expected, score)


def test_the_stores_keyword_half_ranks_as_the_index_folders_bm25(
    sample_store: str, sample_index: Path, embedder: SentenceTransformerEmbedder
) -> None:
    index = load_index(sample_index)
    fulltext = pg_retriever(sample_store, embedder, search="fulltext", k=10)
    try:
        # The hybrid's documents, too: the same chunks, scores and metadata as on disk.
        on_disk = HybridRetriever(index=index, embedder=embedder).invoke(QUESTION)
        in_store = pg_retriever(sample_store, embedder).invoke(QUESTION)
        assert [d.id for d in in_store] == [d.id for d in on_disk]
        for mine, theirs in zip(in_store, on_disk, strict=True):
            assert mine.metadata.keys() == theirs.metadata.keys()
            for key, value in theirs.metadata.items():
                close = isinstance(value, float) and mine.metadata[key] == pytest.approx(value)
                assert close or mine.metadata[key] == value, key
        for query in KEYWORD_QUERIES:
            expected = keyword_hits(BM25Retriever(index=index, k=10).invoke(query))
            found = keyword_hits(fulltext.invoke(query))
            assert expected and len(found) == len(expected), query
            assert_same_ranking(found, expected)
            # The hybrid's BM25 side: the same ranks and scores.
            hybrid = pg_retriever(sample_store, embedder, k=10, candidates=10).invoke(query)
            sides = {d.metadata["bm25_rank"]: d.metadata["bm25_score"] for d in hybrid}
            for rank, score in sides.items():
                if rank is not None:
                    assert score == pytest.approx(found[rank - 1][1], rel=1e-9)
        assert fulltext.invoke("zzzqqq the and") == []  # no known word: nothing, no error
    finally:
        fulltext.store.close()
        index.close()


def test_keyword_statistics_follow_incremental_ingests(
    docs_dir: Path, pg_url: str, tmp_path: Path, ingest_into: Any, embedder: Any
) -> None:
    """After runs that add, change and remove files, the store scores as an index folder
    built from scratch over the files as they are (its count, lengths and frequencies)."""
    ingest_into(docs_dir, pg_url)
    guide = docs_dir / "guide.md"
    guide.write_text(guide.read_text() + "\n\n## Mulching\n\nMulch keeps the soil moist.\n")
    (docs_dir / "notes.txt").unlink()
    (docs_dir / "extra.md").write_text("# Mulch\n\nMulch, mulch and more mulch for the soil.\n")
    report = ingest_into(docs_dir, pg_url)
    assert report.removed == ["docs/notes.txt"] and "docs/guide.md" in report.updated
    fresh = tmp_path / "fresh"
    ingest_into(docs_dir, fresh)
    index = load_index(fresh)
    fulltext = pg_retriever(pg_url, embedder, search="fulltext", k=20)
    try:
        for query in ("mulch soil", "water the garden in the morning", "soil", "tool shed"):
            expected = keyword_hits(BM25Retriever(index=index, k=20).invoke(query))
            assert expected, query
            assert_same_ranking(keyword_hits(fulltext.invoke(query)), expected)
        schema = fulltext.store.schema
        with fulltext.store.connection() as conn:
            totals = conn.execute(f'SELECT sum(chunks) FROM "{schema}".bm25_stats').fetchone()
            orphans = conn.execute(
                f'SELECT count(*) FROM "{schema}".postings p WHERE NOT EXISTS '
                f'(SELECT 1 FROM "{schema}".chunks c WHERE c.key = p.chunk)'
            ).fetchone()
        assert totals == (len(index),) and orphans == (0,)
    finally:
        fulltext.store.close()
        index.close()


def test_a_callers_keyword_scores_use_only_what_it_may_read(
    docs_dir: Path,
    pg_url: str,
    tmp_path: Path,
    ingest_into: Any,
    embedder: SentenceTransformerEmbedder,
) -> None:
    """As in an index folder (tests/test_access.py): a caller's BM25 statistics are those of
    the chunks it may read, so neither a score nor the order tells of hidden files."""
    from tests.test_access import HR_RULE, _labelled_docs

    ingest_into(_labelled_docs(docs_dir), pg_url, access=[AccessRule.parse(HR_RULE)])
    alone_dir = tmp_path / "eng-only" / "docs"
    shutil.copytree(docs_dir, alone_dir, ignore=shutil.ignore_patterns("hr-*", SIDECAR))
    ingest_into(alone_dir, tmp_path / "alone")
    alone = load_index(tmp_path / "alone")
    query = "quokka salary band zephyr migration water beds tool shed garden morning timer"

    def scores(docs: list[Any]) -> dict[tuple[str, str], float]:
        return {
            (d.metadata["source"], d.page_content): d.metadata["bm25_score"]
            for d in docs
            if d.metadata["bm25_score"] is not None  # the hybrid's dense-only hits
        }

    expected = scores(BM25Retriever(index=alone, k=50).invoke(query))
    fulltext = pg_retriever(pg_url, embedder, search="fulltext", k=50)
    try:
        for retriever in (fulltext, fulltext.model_copy(update={"search": "hybrid"})):
            with caller_groups(frozenset({"eng"})):
                as_eng = scores(retriever.invoke(query))
            assert any("eng-roadmap" in source for source, _ in as_eng)
            assert not any("hr-" in source for source, _ in as_eng)
            shared = as_eng.keys() & expected.keys()
            assert len(shared) >= 3 and shared == as_eng.keys()
            assert as_eng == pytest.approx({k: expected[k] for k in shared}, rel=1e-5)
        everyone = scores(fulltext.invoke(query))  # no access control: the whole store's
        assert {k: everyone[k] for k in shared} != pytest.approx(as_eng, rel=1e-5)
    finally:
        fulltext.store.close()
        alone.close()


def test_a_hit_whose_chunk_an_ingest_deleted_runs_the_search_again() -> None:
    """Between a search's two statements an ingest may delete a fused chunk: the search runs
    again (the keys of its next candidates name live chunks), and the last attempt keeps
    what is left."""
    hits = [Hit(7, {"bm25_rank": 1}), Hit(9, {"bm25_rank": 2})]
    rows = [(9, "c9", "text nine", {"source": "a.md"})]
    assert hit_documents(hits, rows, last=False) is None
    kept = hit_documents(hits, rows, last=True)
    assert kept is not None and [d.id for d in kept] == ["c9"]
    assert kept[0].metadata == {"source": "a.md", "chunk_id": "c9", "bm25_rank": 2}


def test_async_search_is_the_same_search(
    sample_store: str, embedder: SentenceTransformerEmbedder
) -> None:
    cheap = [MetadataFilter(field="price", op="<", value=50)]
    retriever = pg_retriever(sample_store, embedder, filters=cheap)

    async def concurrently() -> list[list[str]]:
        try:
            batch = await retriever.abatch(["soil sensor"] * 8, {"max_concurrency": 8})
        finally:
            await retriever.store.aclose()
        return [[d.id for d in docs] for docs in batch]

    try:
        found = asyncio.run(concurrently())
        expected = [d.id for d in retriever.invoke("soil sensor")]
    finally:
        retriever.store.close()
    assert expected and all(ids == expected for ids in found)


# ----------------------------------------------------------------------------- chains
def test_the_chat_and_ask_graphs_run_on_the_store(
    sample_store: str, settings: Settings, smollm: Any, embedder: SentenceTransformerEmbedder
) -> None:
    service = build_service(settings, sample_store, llm=smollm, embedder=embedder)
    try:
        asked = service.chains.ask.invoke({"question": QUESTION})
        labels = [s["label"] for s in asked["sources"]]
        assert "employee-handbook.md#benefit-plans" in labels
        assert asked["citations"] and not asked["abstained"]
        history = [("human", QUESTION), ("ai", asked["answer"])]
        streamed: dict[str, Any] = {}

        async def chat() -> None:
            async for event in service.chains.chat.astream(
                {"question": "And the premium plan?", "chat_history": history}
            ):
                for key, value in event.items():
                    streamed[key] = streamed.get(key, "") + value if key == "answer" else value
            await service.index.aclose()  # type: ignore[union-attr]

        asyncio.run(chat())
        assert streamed["answer"].strip() and streamed["sources"]
        sensors = service.chains.chat.invoke(
            {"question": "which sensors cost less than 50 dollars?"},
            {"configurable": {"domain": "catalog"}},
        )
        prices = [f for f in sensors["filters"] if f["field"] == "price"]
        assert prices in ([], [{"field": "price", "op": "<", "value": 50}]), sensors["filters"]
        assert sensors["sources"], sensors["notes"]
        if prices:
            assert all(price_of(s) < 50 for s in sensors["sources"]), sensors["sources"]
        # A filter given with the question is applied inside the store's search.
        cheap = service.chains.ask.invoke(
            {"question": "sensors", "filters": [{"field": "price", "op": "<", "value": 50}]},
            {"configurable": {"domain": "catalog"}},
        )
        assert cheap["sources"] and all(price_of(s) < 50 for s in cheap["sources"])
    finally:
        service.index.close()


def price_of(source: dict[str, Any]) -> float:
    """The price a product row's text states ("price: 19.00")."""
    found = re.search(r"^price: \$?([\d.,]+)$", source["text"], re.MULTILINE)
    assert found, source
    return float(found.group(1).replace(",", ""))


def test_build_retriever_picks_the_store_by_its_url(
    sample_store: str,
    sample_index: Path,
    settings: Settings,
    embedder: SentenceTransformerEmbedder,
) -> None:
    store = open_index(sample_store, embedder)
    try:
        retriever = build_retriever(settings, store, embedder)
        assert isinstance(retriever, PostgresRetriever)
        # The fields a filter may name: the same as the index folder of the same files.
        assert retriever.fields == load_index(sample_index).fields
    finally:
        store.close()


def test_an_older_store_is_migrated_and_a_newer_one_refused(
    pg_url: str, docs_dir: Path, ingest_into: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ragchains.retrievers import pgwriter

    ingest_into(docs_dir, pg_url)
    newer = SCHEMA_VERSION + 1
    monkeypatch.setattr(pgwriter, "SCHEMA_VERSION", newer)
    monkeypatch.setattr(
        pgwriter,
        "MIGRATIONS",
        {**pgwriter.MIGRATIONS, newer: ["ALTER TABLE {chunks} ADD COLUMN reviewed boolean"]},
    )
    (docs_dir / "new.md").write_text("# New\n\nA file that makes the run write.\n")
    assert ingest_into(docs_dir, pg_url).wrote  # migrated in the write's transaction
    store = PostgresStore(pg_url)
    try:
        assert store.meta(fresh=True)["schema_version"] == newer
        with store.connection() as conn:
            conn.execute(f'SELECT reviewed FROM "{store.schema}".chunks LIMIT 1')
        monkeypatch.setattr(pgwriter, "SCHEMA_VERSION", newer - 1)
        with pytest.raises(StoreError, match=f"schema version {newer}"):
            store.check()
    finally:
        store.close()
    (docs_dir / "newer.md").write_text("# Newer\n\nAnother.\n")
    with pytest.raises(ValueError, match=f"schema version {newer}"):
        ingest_into(docs_dir, pg_url)


def written_as_version_2(store: PostgresStore) -> None:
    """Turn a store into one as the release before BM25 postings wrote it: ranked by
    full-text search over a generated tsvector, no chunk keys, lengths or postings."""
    with store.connection() as conn:
        schema = f'"{store.schema}"'
        for statement in (
            f"DROP TABLE {schema}.postings",
            f"DROP TABLE {schema}.bm25_stats",
            f"ALTER TABLE {schema}.chunks DROP COLUMN key, DROP COLUMN length",
            f"ALTER TABLE {schema}.chunks ADD COLUMN tsv tsvector GENERATED ALWAYS AS "
            "(to_tsvector('english'::regconfig, text)) STORED",
            f"CREATE INDEX chunks_tsv ON {schema}.chunks USING gin (tsv)",
            f"UPDATE {schema}.meta SET value = '2' WHERE key = 'schema_version'",
        ):
            conn.execute(statement)


def test_a_store_of_full_text_ranking_is_migrated_to_bm25_by_a_plain_re_run(
    pg_url: str,
    docs_dir: Path,
    tmp_path: Path,
    ingest_into: Any,
    embedder: SentenceTransformerEmbedder,
) -> None:
    ingest_into(docs_dir, pg_url)
    store = PostgresStore(pg_url)
    try:
        written_as_version_2(store)
        with pytest.raises(StoreError, match=r"version 2; .* run `ragchains ingest` on it"):
            store.check(embedder_name=embedder.name)
        (docs_dir / "notes.txt").unlink()  # the run's own change applies after the migration
        report = ingest_into(docs_dir, pg_url)
        assert report.wrote and report.chunks_embedded == 0
        store.forget()
        store.check(embedder_name=embedder.name)
    finally:
        store.close()
    fresh = tmp_path / "fresh"
    ingest_into(docs_dir, fresh)
    index = load_index(fresh)
    fulltext = pg_retriever(pg_url, embedder, search="fulltext", k=20)
    try:
        for query in ("water the garden in the morning", "soil sensor", "tool shed"):
            expected = keyword_hits(BM25Retriever(index=index, k=20).invoke(query))
            assert_same_ranking(keyword_hits(fulltext.invoke(query)), expected)
    finally:
        fulltext.store.close()
        index.close()


def test_a_store_written_before_access_labels_is_migrated_by_a_plain_re_run(
    pg_url: str, docs_dir: Path, ingest_into: Any, embedder: SentenceTransformerEmbedder
) -> None:
    # A version 1 store, as the release before access labels wrote it.
    ingest_into(docs_dir, pg_url)
    store = PostgresStore(pg_url)
    try:
        written_as_version_2(store)
        with store.connection() as conn:
            for table in ("chunks", "files"):
                conn.execute(f'ALTER TABLE "{store.schema}".{table} DROP COLUMN access')
            conn.execute(
                f"UPDATE \"{store.schema}\".meta SET value = '1' WHERE key = 'schema_version'"
            )
        with pytest.raises(StoreError, match="run `ragchains ingest` on it to migrate it"):
            store.check(embedder_name=embedder.name)
        report = ingest_into(docs_dir, pg_url)  # nothing changed: written all the same
        assert report.wrote and report.chunks_embedded == 0
        store.forget()
        store.check(embedder_name=embedder.name)
        assert {f.access for f in store.files().values()} == {()}
        assert len(store_rows(pg_url)) == report.chunks_total
    finally:
        store.close()


def test_a_rebuild_for_another_embedder_replaces_the_vectors(
    pg_url: str, docs_dir: Path, ingest_into: Any
) -> None:
    """A store written by an 8-dimensional embedder: re-ingesting with this one (384) is
    refused with the way out, and --rebuild takes it."""
    from ragchains.retrievers.indexformat import Chunk

    store = PostgresStore(pg_url)
    try:
        store.write(
            StoreDelta(
                remove_sources=[],
                chunks=[Chunk("c1", "old text", {"source": "old.md", "filename": "old.md"})],
                vectors=np.ones((1, 8), dtype=np.float32) / np.sqrt(8),
                files=[],
                embedder={"name": "small-embedder", "dimension": 8},
                chunking={},
            )
        )
    finally:
        store.close()
    with pytest.raises(ValueError, match="small-embedder"):
        ingest_into(docs_dir, pg_url)
    report = ingest_into(docs_dir, pg_url, rebuild=True)
    assert report.wrote and len(report.added) == 6
    rows = store_rows(pg_url)
    assert "c1" not in rows and len(rows) == report.chunks_total


def test_a_store_urls_own_settings_reach_libpq_as_written() -> None:
    """Only ?schema= is ours: the rest of the query goes to libpq untouched (re-encoded, a
    space became "+", which libpq keeps), and a shown URL keeps an IPv6 host's brackets."""
    from psycopg.conninfo import conninfo_to_dict

    from ragchains.retrievers.pgstore import split_schema
    from ragchains.retrievers.storeurl import redact

    query = "options=-c%20statement_timeout%3D5000&schema=s1&application_name=my%20app"
    url, schema = split_schema(f"postgresql://u:p@db.example/rag?{query}")
    settings = conninfo_to_dict(url)
    assert schema == "s1" and "schema" not in settings
    assert settings["options"] == "-c statement_timeout=5000"
    assert settings["application_name"] == "my app"
    assert redact("postgresql://u:secret@[::1]:5432/db") == "postgresql://u:***@[::1]:5432/db"
