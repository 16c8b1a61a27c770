"""The on-disk index: atomic generations, crash safety, and clear refusals to load."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragchains.ingest.errors import IngestError
from ragchains.ingest.report import IngestReport
from ragchains.retrievers.indexformat import (
    EmbedderMismatchError,
    IndexChecksumError,
    IndexDamagedError,
    IndexFormatError,
    IndexNotFoundError,
    current_generation,
)
from ragchains.retrievers.searchindex import load_index
from tests.conftest import REPO

Ingest = Callable[..., IngestReport]

# Runs an ingest in a child process that dies (os._exit, no cleanup, like a kill -9) at a
# chosen step of the write, after the previous index was complete.
CRASHING_INGEST = textwrap.dedent(
    """
    import os, sys
    import faiss
    import ragchains.retrievers.indexwriter as index_module
    from ragchains.factory import configure_runtime, run_ingest
    from ragchains.settings import Settings

    step = sys.argv[3]
    if step == "mid-generation":
        real = faiss.write_index
        def write_then_die(*args, **kwargs):
            real(*args, **kwargs)
            os._exit(9)
        index_module.faiss.write_index = write_then_die
    elif step == "before-switch":
        index_module.os.replace = lambda *a, **k: os._exit(9)
    settings = Settings(_env_file=None)
    configure_runtime(settings)
    run_ingest(settings, [sys.argv[1]], sys.argv[2], progress=False)
    """
)


def _texts(index_dir: Path) -> list[str]:
    index = load_index(index_dir)
    try:
        return [c.text for c in index.store.iter_chunks()]
    finally:
        index.close()


@pytest.mark.slow
@pytest.mark.parametrize("step", ["mid-generation", "before-switch"])
def test_crash_during_write_leaves_previous_index_loadable(
    step: str, docs_dir: Path, tmp_path: Path, ingest_into: Ingest
) -> None:
    index_dir = tmp_path / "idx"
    ingest_into(docs_dir, index_dir)
    before = _texts(index_dir)
    generation = current_generation(index_dir)

    (docs_dir / "notes.txt").write_text("Completely new notes about hedgehogs in the garden.")
    child = subprocess.run(
        [sys.executable, "-c", CRASHING_INGEST, str(docs_dir), str(index_dir), step],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 9, child.stderr
    # The crash left a half-built generation behind ...
    extra = {p.name for p in index_dir.iterdir()} - {
        "CURRENT",
        ".lock",
        "ingests.json",
        generation.name,
    }
    prefix = ".tmp-gen-" if step == "mid-generation" else "gen-"
    assert any(name.startswith(prefix) for name in extra), extra

    # ... but the old generation is still current and whole.
    assert current_generation(index_dir) == generation
    assert _texts(index_dir) == before

    # The next successful run completes the change and clears what the crash left.
    report = ingest_into(docs_dir, index_dir)
    assert report.updated == ["docs/notes.txt"]
    assert sorted(p.name for p in index_dir.iterdir()) == sorted(
        [".lock", "CURRENT", "files", "ingests.json", current_generation(index_dir).name]
    )
    assert any("hedgehogs" in t for t in _texts(index_dir))


def test_second_writer_is_refused(docs_dir: Path, tmp_path: Path, ingest_into: Ingest) -> None:
    from ragchains.retrievers.indexwriter import writer_lock

    index_dir = tmp_path / "idx"
    ingest_into(docs_dir, index_dir)
    with writer_lock(index_dir), pytest.raises(IngestError, match="another ingest is writing"):
        ingest_into(docs_dir, index_dir)
    assert ingest_into(docs_dir, index_dir).counts()["unchanged"] == 6  # lock released


def test_failed_write_cleans_its_temporary_folder(
    docs_dir: Path, tmp_path: Path, ingest_into: Ingest, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ragchains.retrievers.indexwriter as index_module

    index_dir = tmp_path / "idx"
    ingest_into(docs_dir, index_dir)
    generation = current_generation(index_dir)
    (docs_dir / "notes.txt").write_text("Edited.")

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(index_module.faiss, "write_index", disk_full)
    with pytest.raises(OSError, match="No space"):
        ingest_into(docs_dir, index_dir)
    assert sorted(p.name for p in index_dir.iterdir()) == [
        ".lock",
        "CURRENT",
        "files",  # the originals, of the run before (the failed one's are removed)
        generation.name,
        "ingests.json",  # the run before's
    ]


def test_manifest_records_what_was_built(
    docs_dir: Path, tmp_path: Path, ingest_into: Ingest
) -> None:
    ingest_into(docs_dir, tmp_path / "idx")
    manifest = load_index(tmp_path / "idx").manifest
    assert manifest["format_version"] == 1
    assert manifest["embedder"] == {
        "name": "all-MiniLM-L6-v2",
        "dimension": 384,
        "backend": "openvino-int8",
    }
    assert manifest["chunk_count"] == 15 and manifest["file_count"] == 6
    assert manifest["fields"]["price"] == "number"
    assert manifest["fields"]["electric"] == "boolean"
    assert manifest["fields"]["page"] == "number"
    assert manifest["dense"]["kind"] == "flat"
    assert manifest["built_at"]


def test_no_pickle_in_the_index(docs_dir: Path, tmp_path: Path, ingest_into: Ingest) -> None:
    ingest_into(docs_dir, tmp_path / "idx")
    for path in (tmp_path / "idx").rglob("*.npy"):
        # An object array would be pickled; numeric arrays load with pickling refused.
        import numpy as np

        np.load(path, allow_pickle=False)
    assert not list((tmp_path / "idx").rglob("*.pkl")) and not list(
        (tmp_path / "idx").rglob("*.pickle")
    )


@pytest.fixture
def built(docs_dir: Path, tmp_path: Path, ingest_into: Ingest) -> Path:
    ingest_into(docs_dir, tmp_path / "idx")
    return tmp_path / "idx"


def test_missing_index_is_named(tmp_path: Path) -> None:
    with pytest.raises(IndexNotFoundError, match="no index at"):
        load_index(tmp_path / "nothing")
    (tmp_path / "plain").mkdir()
    with pytest.raises(IndexNotFoundError, match="not a ragchains index"):
        load_index(tmp_path / "plain")


def test_unknown_format_version_is_refused(built: Path) -> None:
    manifest_path = current_generation(built) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["format_version"] = 99
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(IndexFormatError, match="format version 99"):
        load_index(built)


def test_other_embedder_is_refused(built: Path) -> None:
    with pytest.raises(EmbedderMismatchError, match="built with embedder 'all-MiniLM-L6-v2'"):
        load_index(built, embedder_name="some/other-model")
    with pytest.raises(EmbedderMismatchError, match="384-dimensional"):
        load_index(built, embedder_dimension=768)


def test_ingest_with_other_embedder_asks_for_rebuild(
    built: Path,
    docs_dir: Path,
    ingest_into: Ingest,
    embedder: object,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(embedder, "name", "some/other-model")
    with pytest.raises(IngestError, match="--rebuild"):
        ingest_into(docs_dir, built)


D, C = IndexDamagedError, IndexChecksumError  # C: a file whose bytes are not those written


@pytest.mark.parametrize(
    ("damage", "error", "message"),
    [
        (lambda g: (g / "dense.faiss").unlink(), D, "dense.faiss is missing"),
        (lambda g: (g / "dense.faiss").write_bytes(b"junk"), D, "dense.faiss does not match"),
        (
            lambda g: (g / "chunks.sqlite").write_bytes(b"not sqlite at all" * 100),
            D,
            "chunks.sqlite",
        ),
        (lambda g: (g / "manifest.json").write_text("{"), D, "manifest.json is not valid JSON"),
        (lambda g: (g / "manifest.json").unlink(), D, "manifest.json is missing"),
        (lambda g: (g / "bm25" / "params.index.json").unlink(), D, "params.index.json is missing"),
        (lambda g: (g.parent / "CURRENT").write_text("gen-missing\n"), D, "names 'gen-missing'"),
        (
            lambda g: (g / "bm25" / "vocab.index.json").write_text("{}"),
            C,
            "bm25/vocab.index.json does not match",
        ),
        (
            lambda g: (g / "bm25" / "data.csc.index.npy").unlink(),
            C,
            "bm25/data.csc.index.npy is missing",
        ),
        (
            lambda g: (g / "chunks.sqlite").write_bytes(b"\0" * 10),
            C,
            "chunks.sqlite does not match",
        ),
    ],
    ids=[
        "no-faiss",
        "bad-faiss",
        "bad-sqlite",
        "bad-manifest",
        "no-manifest",
        "no-bm25",
        "bad-ptr",
        "edited-bm25",
        "missing-bm25",
        "truncated-sqlite",
    ],
)
def test_damaged_index_is_named(
    built: Path, damage: Callable[[Path], object], error: type[Exception], message: str
) -> None:
    damage(current_generation(built))
    with pytest.raises(error, match=message):
        load_index(built)


def test_row_count_mismatch_is_damage(built: Path) -> None:
    manifest_path = current_generation(built) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["chunk_count"] += 1
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(IndexDamagedError, match="row counts disagree"):
        load_index(built)


# ----------------------------------------------------------------------------- building the parts
def test_bm25_build_matches_bm25s_own_index() -> None:
    """build_bm25 makes bm25s's score matrix with array operations: the same scores, bit for
    bit, as bm25s's per-document builder, and the same words."""
    from ragchains.retrievers.bm25 import BM25_PARAMS, bm25_search, build_bm25, tokenize
    from ragchains.retrievers.indexformat import StoredBM25

    words = [
        "the",
        "running",
        "runs",
        "ran",
        "naïve",
        "café",
        "Über",
        "x",
        "a1",
        "__",
        "東京",
        "and",
        "it's",
        "soup",
        "tomato",
        "ÉCOLE",
    ]
    rng = np.random.default_rng(0)
    corpus = ["", "tomato soup", "soup soup soup", "the and of"] + [
        " ".join(rng.choice(words, rng.integers(0, 30))) for _ in range(300)
    ]
    ours = build_bm25(corpus)
    theirs = StoredBM25(method=BM25_PARAMS["method"], k1=BM25_PARAMS["k1"], b=BM25_PARAMS["b"])
    theirs.index([tokenize(t) for t in corpus], show_progress=False)
    assert set(ours.vocab_dict) == set(theirs.vocab_dict)
    assert ours.scores["num_docs"] == theirs.scores["num_docs"] == len(corpus)
    for word, column in theirs.vocab_dict.items():
        if word == "":
            continue
        mine = ours.vocab_dict[word]
        a = slice(*theirs.scores["indptr"][column : column + 2])
        b = slice(*ours.scores["indptr"][mine : mine + 2])
        assert np.array_equal(theirs.scores["indices"][a], ours.scores["indices"][b])
        assert np.array_equal(theirs.scores["data"][a], ours.scores["data"][b])
    for name in ("data", "indices", "indptr"):
        assert ours.scores[name].dtype == theirs.scores[name].dtype
    assert ours.doc_lengths is not None
    assert ours.doc_lengths.tolist() == [len(tokenize(t)) for t in corpus]
    for query in ("soup", "running tomato", "naïve", "the", "unknown"):
        rows, scores = bm25_search(ours, query, 20)
        expected_rows, expected_scores = bm25_search(theirs, query, 20)
        assert rows.tolist() == expected_rows.tolist()
        assert scores.tolist() == expected_scores.tolist()
    empty = build_bm25([])  # bm25s's own builder fails on no rows
    assert bm25_search(empty, "soup", 5)[0].size == 0


def _unit_vectors(rows: int, dim: int = 16, seed: int = 0) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((rows, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_hnsw_parameters_are_recorded_and_kept_by_the_saved_index() -> None:
    import faiss

    from ragchains.retrievers import dense

    vectors = _unit_vectors(2_000)
    index, info = dense.build_faiss(vectors, hnsw_min_chunks=1_000)
    assert info == {
        "kind": "hnsw",
        "metric": "inner_product",
        "storage": "fp16",
        "m": dense.HNSW_M,
        "ef_construction": dense.HNSW_EF_CONSTRUCTION,
        "ef_search": dense.HNSW_EF_SEARCH,
    }
    # The file keeps the beam a search uses, and the vectors as float16 (an ingest carries
    # them over to the next generation instead of embedding again: rounded once, then kept).
    loaded = faiss.deserialize_index(faiss.serialize_index(index))
    assert isinstance(loaded, faiss.IndexHNSWSQ)
    assert loaded.hnsw.efSearch == dense.HNSW_EF_SEARCH
    stored = loaded.reconstruct_n(0, len(vectors))
    assert np.array_equal(stored, vectors.astype(np.float16).astype(np.float32))
    again, _ = dense.build_faiss(stored, hnsw_min_chunks=1_000)
    assert np.array_equal(again.reconstruct_n(0, len(vectors)), stored)
    rows, scores = dense.dense_search(loaded, vectors[7], 5)
    assert rows[0] == 7 and scores[0] == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize("allowed", ["few", "many"])
def test_filtered_hnsw_search_scores_few_allowed_rows_exactly_and_walks_for_many(
    allowed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Few allowed rows (under twice the widened beam): scored exactly, the brute-force top k.
    Many: a graph walk that returns only allowed rows and most of the exact top k."""
    from ragchains.retrievers import dense

    monkeypatch.setattr(dense, "EXACT_SUBSET_MAX", 100)  # the beam rule alone decides
    vectors = _unit_vectors(6_000, seed=3)
    index, _ = dense.build_faiss(vectors, hnsw_min_chunks=1_000)
    if allowed == "few":
        mask = np.zeros(len(vectors), dtype=bool)
        mask[::5] = True  # 1,200 rows; the beam widens fivefold
    else:
        mask = np.ones(len(vectors), dtype=bool)
        mask[3::7] = False  # 5,143 rows; the beam widens by 7/6
    ef = int(dense.HNSW_EF_SEARCH * len(vectors) / mask.sum()) + 10
    assert (mask.sum() <= 2 * ef) == (allowed == "few")
    held = index.reconstruct_n(0, len(vectors))  # as the index stores them (float16)
    for query in vectors[[0, 11, 2_500]]:
        brute = np.flatnonzero(mask)[np.argsort(-(held[mask] @ query), kind="stable")[:10]]
        rows, scores = dense.dense_search(index, query, 10, mask)
        assert mask[rows].all() and len(rows) == 10
        assert np.all(np.diff(scores) <= 1e-6)
        if allowed == "few":
            assert rows.tolist() == brute.tolist()
        else:
            assert len(set(rows.tolist()) & set(brute.tolist())) >= 8


def test_a_search_runs_on_its_own_thread_and_leaves_the_thread_count() -> None:
    import faiss

    from ragchains.retrievers import dense

    vectors = _unit_vectors(500)
    index, _ = dense.build_faiss(vectors, hnsw_min_chunks=10**9)  # exact: OpenMP by default
    before = faiss.omp_get_max_threads()
    during: list[int] = []

    class Watched:
        """The index, with the thread count its search ran under recorded."""

        def search(self, *args: Any, **kwargs: Any) -> Any:
            during.append(faiss.omp_get_max_threads())
            return index.search(*args, **kwargs)

        def __getattr__(self, name: str) -> Any:
            return getattr(index, name)

    rows, _ = dense.dense_search(Watched(), vectors[3], 5)  # type: ignore[arg-type]
    assert rows[0] == 3
    assert during == [1]
    assert faiss.omp_get_max_threads() == before


def test_filtered_bm25_gathers_the_query_words_rows_and_ranks_as_a_full_scan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ragchains.retrievers import bm25

    rng = np.random.default_rng(5)
    words = [f"w{i}" for i in range(4_000)]
    corpus = [" ".join(rng.choice(words, 12)) for _ in range(3_000)]
    model = bm25.build_bm25(corpus)
    ids = model.get_tokens_ids(["w1", "w2"])
    assert bm25._posting_rows(model, ids) is not None  # a few postings each: gathered
    mask = rng.random(len(corpus)) < 0.3
    readers = rng.random(len(corpus)) < 0.8
    queries = ["w1 w2", "w7", "w3 w3 w9 w11", "nothing"]
    found = {}
    for below in (bm25._GATHER_BELOW, 0.0):  # gathered (few postings), then scanned
        monkeypatch.setattr(bm25, "_GATHER_BELOW", below)
        found[below] = [
            bm25.bm25_search(model, q, 20, m, r)
            for q in queries
            for m, r in ((mask, None), (None, readers), (mask, readers), (None, None))
        ]
    for (rows, scores), (scan_rows, scan_scores) in zip(*found.values(), strict=True):
        assert rows.tolist() == scan_rows.tolist()
        assert scores.tolist() == scan_scores.tolist()
    assert any(rows.size for rows, _ in found[0.0])
