"""/readyz sees damage found after start-up (issue 30, case 5): with ``chunks.sqlite``
truncated under a running server, queries answered 503 while /readyz said ``ready: true``,
and a flipped byte in ``dense.faiss`` went unnoticed (the vectors are served from memory).

Now /readyz answers 503 with ``ready: false`` and names the file (its name only: the path
is in the server log), and a new good generation (an ingest) makes the server ready again.
Each test damages its own copy of the sample index, never the session's."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest

from ragchains.retrievers.indexformat import (
    CHUNKS_FILE,
    DENSE_FILE,
    IndexDamagedError,
    current_generation,
)
from ragchains.retrievers.searchindex import load_index
from tests.conftest import REPO
from tests.servers import ragchains_serve, wait_until
from tests.test_cli import run

pytestmark = pytest.mark.slow


def own_copy(sample_index: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "index"
    shutil.copytree(sample_index, copy)
    return copy


def flip_byte(path: Path, offset: int) -> None:
    """One byte changed in place (same inode and size, as a disk error or a stray write)."""
    with path.open("r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))


def truncate(path: Path) -> None:
    with path.open("r+b") as handle:
        handle.truncate(path.stat().st_size // 3)


def readyz(base: str) -> httpx.Response:
    return httpx.get(f"{base}/readyz", timeout=60)


def retrieve(base: str, query: str = "travel hotel per night") -> httpx.Response:
    return httpx.post(f"{base}/retrieve/invoke", json={"input": {"query": query}}, timeout=60)


def assert_damaged(base: str, name: str, index: Path) -> None:
    reply = readyz(base)
    assert reply.status_code == 503, reply.text
    body = reply.json()
    assert body["ready"] is False
    damage = body["index"]["damage"]
    assert damage["file"] == name and damage["problem"]
    # Which file, never where: the folder is in the server log only.
    assert str(index) not in json_text(damage) and str(index) not in body["detail"]
    assert name in body["detail"]


def json_text(value: Any) -> str:
    return httpx.Response(200, json=value).text


def test_a_changed_file_and_a_damaged_query_make_the_server_unready_until_a_new_generation(
    serve_samples: Callable[..., AbstractContextManager[str]],
    sample_index: Path,
    tmp_path: Path,
    ingest_into: Callable[..., Any],
) -> None:
    index = own_copy(sample_index, tmp_path)
    with serve_samples(index=index) as base:
        assert readyz(base).json()["ready"] is True
        gen = current_generation(index)

        # A flipped byte in the vectors: served from memory, but no longer what was loaded.
        dense = gen / DENSE_FILE
        flip_byte(dense, dense.stat().st_size // 2)
        assert_damaged(base, DENSE_FILE, index)
        assert retrieve(base).status_code == 200  # the loaded copy still answers
        flip_byte(dense, dense.stat().st_size // 2)  # put back: the same bytes again
        wait_until(lambda: readyz(base).status_code == 200, "ready again", timeout=10)

        # chunks.sqlite truncated: queries fail, and /readyz says why.
        truncate(gen / CHUNKS_FILE)
        assert retrieve(base).status_code == 503
        assert_damaged(base, CHUNKS_FILE, index)

        # A new, sound generation is served and the damage of the old one is forgotten.
        ingest_into([REPO / "samples"], index, rebuild=True)
        served = lambda: readyz(base).json()["index"]["generation"] != gen.name  # noqa: E731
        wait_until(served, "the new generation served", timeout=15)
        body = readyz(base).json()
        assert body["ready"] is True and "damage" not in body["index"] and not body["detail"]
        assert retrieve(base).status_code == 200


def test_damage_a_query_meets_is_kept_with_its_generation(
    sample_index: Path, tmp_path: Path
) -> None:
    """What a query found is told as SQLite said it (bit rot shows no change to stat), and
    before what stat shows."""
    index = own_copy(sample_index, tmp_path)
    loaded = load_index(index)
    try:
        assert loaded.damage() is None
        chunks = loaded.path / CHUNKS_FILE
        with chunks.open("r+b") as handle:  # every page after the first zeroed
            handle.seek(4096)
            handle.write(b"\0" * (chunks.stat().st_size - 4096))
        with pytest.raises(IndexDamagedError):
            loaded.store.documents(list(range(len(loaded))))
        found = loaded.damage()
        assert found is not None and found.name == CHUNKS_FILE
        assert "checksum" not in found.problem and str(index) not in found.problem
    finally:
        loaded.close()


@pytest.mark.e2e
def test_ragchains_serve_reports_a_truncated_chunk_store(
    sample_index: Path, tmp_path: Path
) -> None:
    index = own_copy(sample_index, tmp_path)
    with ragchains_serve("--index", str(index)) as base:
        assert readyz(base).json()["ready"] is True
        gen = current_generation(index)
        truncate(gen / CHUNKS_FILE)
        assert retrieve(base).status_code == 503
        assert_damaged(base, CHUNKS_FILE, index)
        # `ragchains ingest` mends it; the running server serves the new generation.
        result = run("ingest", REPO / "samples", "--index", index, "--rebuild")
        assert result.returncode == 0, result.stderr
        served = lambda: readyz(base).json()["index"]["generation"] != gen.name  # noqa: E731
        wait_until(served, "the new generation served", timeout=15)
        assert readyz(base).json()["ready"] is True
        assert retrieve(base).status_code == 200
