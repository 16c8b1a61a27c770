"""Ingest while serving (issue 15, item 9): the server kept answering from the generation it
loaded, already deleted on disk, until restarted. Now each committed generation is served
once loaded, each request keeps to the generation it started on, and /readyz names the one
served."""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest

from ragchains.factory import build_retriever
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.fusion import FusionConfig
from ragchains.retrievers.fusionfile import write_fusion
from ragchains.retrievers.indexformat import CURRENT_FILE
from ragchains.retrievers.live import LiveIndex
from ragchains.settings import Settings
from tests.conftest import sources
from tests.servers import wait_until

pytestmark = pytest.mark.slow

NEW_DOC = (
    "# Zanzibarite\n\nZanzibarite is a blue mineral the greenhouse uses as a humidity "
    "indicator; the kit costs 12 dollars.\n"
)
NEW_ROWS = "name,price,warranty_years\nMoisture meter,31,3\nPruning saw,19,1\n"


@pytest.fixture
def live(
    docs_dir: Path,
    tmp_path: Path,
    embedder: SentenceTransformerEmbedder,
    ingest_into: Callable[..., Any],
) -> Iterator[LiveIndex]:
    """tests/fixtures/docs ingested, served as a LiveIndex (closed after the test)."""
    ingest_into(docs_dir, tmp_path / "idx")
    live = LiveIndex(tmp_path / "idx", embedder_name=embedder.name)
    yield live
    live.close()


def test_a_pinned_search_keeps_its_generation_and_the_next_one_sees_the_ingest(
    live: LiveIndex,
    docs_dir: Path,
    settings: Settings,
    embedder: SentenceTransformerEmbedder,
    ingest_into: Callable[..., Any],
) -> None:
    index = live.folder
    retriever = build_retriever(settings, live, embedder)
    before, first = len(live), live.path.name
    assert live.refresh() is False  # nothing committed since

    (docs_dir / "zanzibarite.md").write_text(NEW_DOC, encoding="utf-8")
    (docs_dir / "meters.csv").write_text(NEW_ROWS, encoding="utf-8")
    with live.pin() as old:
        ingest_into(docs_dir, index)
        assert (index / CURRENT_FILE).read_text().strip() != first  # committed on disk
        assert live.refresh() is True
        # In flight: the generation it started on, though another is current now.
        assert live.path.name == first and len(live) == before
        found = retriever.invoke("zanzibarite blue mineral humidity indicator")
        assert not any(s.endswith("zanzibarite.md") for s in sources(found))
        assert "warranty_years" not in live.pinned().fields
        assert old is live.pinned()

    assert live.path.name != first and len(live) > before
    found = retriever.invoke("zanzibarite blue mineral humidity indicator")
    assert any(s.endswith("zanzibarite.md") for s in sources(found))
    assert live.pinned().fields["warranty_years"] == "number"  # a new field, filterable at once
    kept = retriever.invoke(
        "pruning saw", filters=[{"field": "warranty_years", "op": "<", "value": 2}]
    )
    assert kept and all(d.metadata["warranty_years"] < 2 for d in kept)


def test_a_generation_that_cannot_be_loaded_is_not_served_and_the_current_one_stays(
    live: LiveIndex,
    docs_dir: Path,
    ingest_into: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    index = live.folder
    first, count = live.path.name, len(live)
    (docs_dir / "zanzibarite.md").write_text(NEW_DOC, encoding="utf-8")
    ingest_into(docs_dir, index)
    refused = (index / CURRENT_FILE).read_text().strip()
    damaged = index / refused / "dense.faiss"
    damaged.write_bytes(damaged.read_bytes()[:-64] + b"\xff" * 64)
    loads = []
    real_load = live._load
    live._load = lambda gen=None: loads.append(1) or real_load(gen)  # type: ignore[method-assign]
    assert live.refresh() is False
    assert live.refresh() is False  # not loaded (and hashed) again until CURRENT changes
    assert len(loads) == 1
    assert live.path.name == first and len(live) == count
    assert "not serving generation" in caplog.text and "dense.faiss" in caplog.text
    assert live.describe()["refused"]["generation"] == refused  # /readyz says so
    ingest_into(docs_dir, index, rebuild=True)  # the next ingest mends it
    assert live.refresh() is True and "refused" not in live.describe()


def _open_files(folder: Path) -> list[str]:
    """The files of ``folder`` this process holds open."""
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # closed meanwhile (the listing's own descriptor)
            continue
    return [link for link in links if str(folder) in link]


def test_a_replaced_generation_is_closed_once_no_request_holds_it(
    live: LiveIndex,
    docs_dir: Path,
    ingest_into: Callable[..., Any],
) -> None:
    """Its deleted chunks.sqlite would keep its disk space while the server runs: freed
    only by the cycle collector, never for the generation loaded before gc.freeze()."""
    index = live.folder
    old = live.path
    (docs_dir / "zanzibarite.md").write_text(NEW_DOC, encoding="utf-8")
    gc.freeze()  # as the server does once loaded
    try:
        with live.pin():
            ingest_into(docs_dir, index)
            assert live.refresh() is True
            assert _open_files(old), "a request in flight still reads its generation"
        assert not _open_files(old)
    finally:
        gc.unfreeze()


def test_new_fusion_settings_are_served_with_the_filter_columns_kept(
    live: LiveIndex,
    docs_dir: Path,
    ingest_into: Callable[..., Any],
) -> None:
    index = live.folder
    columns = live.pinned().columns
    write_fusion(index, FusionConfig(fusion="rrf", rrf_k=10))
    assert live.refresh() is True
    assert live.fusion is not None and live.fusion.fusion == "rrf"
    assert live.pinned().columns is columns  # not built again by the first filtered request


def test_the_server_serves_an_ingest_committed_while_it_runs_without_an_error(
    serve_samples: Callable[..., AbstractContextManager[str]],
    docs_dir: Path,
    tmp_path: Path,
    ingest_into: Callable[..., Any],
) -> None:
    """Clients keep searching while the ingest runs: none gets an error; once committed,
    /readyz names the new generation and the new document and field are found."""
    index = tmp_path / "idx"
    ingest_into(docs_dir, index)
    with serve_samples(index=index) as base:
        ready = httpx.get(f"{base}/readyz").json()["index"]
        assert ready["generation"] == (index / CURRENT_FILE).read_text().strip()
        new_field = {"field": "warranty_years", "op": "<", "value": 2}
        body = {"input": {"query": "pruning saw", "filters": [new_field]}}
        assert httpx.post(f"{base}/retrieve/invoke", json=body).status_code == 422  # unknown

        failures: list[str] = []
        stop = threading.Event()

        def search() -> None:
            with httpx.Client(base_url=base, timeout=60) as client:
                while not stop.is_set():
                    reply = client.post(
                        "/retrieve/invoke", json={"input": {"query": "garden tools"}}
                    )
                    if reply.status_code != 200:
                        failures.append(f"{reply.status_code} {reply.text[:200]}")

        clients = [threading.Thread(target=search) for _ in range(4)]
        for client in clients:
            client.start()
        try:
            (docs_dir / "zanzibarite.md").write_text(NEW_DOC, encoding="utf-8")
            (docs_dir / "meters.csv").write_text(NEW_ROWS, encoding="utf-8")
            ingest_into(docs_dir, index)
            committed = (index / CURRENT_FILE).read_text().strip()
            wait_until(
                lambda: httpx.get(f"{base}/readyz").json()["index"]["generation"] == committed,
                "the new generation served",
            )
            time.sleep(0.5)  # some searches on the new generation too
        finally:
            stop.set()
            for client in clients:
                client.join()

        query = {"input": {"query": "zanzibarite blue mineral humidity indicator"}}
        found = httpx.post(f"{base}/retrieve/invoke", json=query).json()["output"]
        filtered = httpx.post(f"{base}/retrieve/invoke", json=body)
        chunks = httpx.get(f"{base}/readyz").json()["index"]["chunks"]
    assert failures == []
    assert any(d["metadata"]["source"].endswith("zanzibarite.md") for d in found)
    assert filtered.status_code == 200, filtered.text
    assert [d["metadata"]["warranty_years"] for d in filtered.json()["output"]] == [1]
    assert chunks > ready["chunks"]
