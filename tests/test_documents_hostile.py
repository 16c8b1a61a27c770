"""Odd and hostile files from public test corpora (tests/odd_documents/, SOURCES.md) uploaded
to `ragchains serve` as a team would, and clients that leave half-way: every file is accepted
and read, accepted and skipped with ingestion's reason, or refused with one, never a 5xx; no
process grows past its budget; questions keep their usual time meanwhile; an upload cut off
mid-body leaves nothing behind, and a job whose follower leaves still ends."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psutil
import pytest

from ragchains.serving.keys import add_key
from tests.conftest import FIXTURES
from tests.documents import headers, job_of, upload, wait_for_job
from tests.servers import ragchains_serve_process
from tests.test_cli import run

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CORPUS = Path(__file__).parent / "odd_documents"
EXPECTED: dict[str, str] = json.loads((CORPUS / "expected.json").read_text())
HOSTILE = ("fuzz", "bomb", "crash", "poc-", "truncated", "cycle", "password", "protected")
# The corpus files uploaded: every hostile one (fuzzer finds, bombs, crashes, encrypted), and
# a few it reads, so an accepted file is seen through to its chunks.
READ = ["oxsdk-sdtContent.docx", "pdfjs-TrueType_without_cmap.pdf", "oxsdk-filter_type.xlsx"]
CHOSEN = [*sorted(n for n in EXPECTED if any(mark in n.lower() for mark in HOSTILE)), *READ]
MEMORY_MB = 1024  # the parse budget each worker runs under (RAGCHAINS_INGEST_FILE_MEMORY_MB)
QUESTION = "watering schedule for tomatoes"


class Peaks:
    """The largest resident size of the server and of any process it started, sampled every
    20 ms while the block runs."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.server_mb = self.child_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                self.server_mb = max(self.server_mb, self.root.memory_info().rss / 2**20)
                for child in self.root.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        self.child_mb = max(self.child_mb, child.memory_info().rss / 2**20)
            except psutil.Error:
                pass
            time.sleep(0.02)

    def __enter__(self) -> Peaks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("hostile")
    docs = root / "docs"
    shutil.copytree(FIXTURES / "docs", docs)
    index = root / "index"
    assert run("ingest", docs, "--index", index).returncode == 0
    keys = root / "keys.toml"
    editor = add_key(keys, "eddie", ["ops"], "editor")
    with ragchains_serve_process(
        "--index",
        str(index),
        RAGCHAINS_KEYS_FILE=str(keys),
        RAGCHAINS_INGEST_FILE_MEMORY_MB=str(MEMORY_MB),
    ) as (process, base):
        yield {"base": base, "key": editor, "pid": process.pid, "jobs": index / "jobs"}


def _asked(base: str, key: str) -> float:
    """Seconds a retrieval takes now."""
    start = time.monotonic()
    reply = httpx.post(
        f"{base}/retrieve/invoke",
        json={"input": {"query": QUESTION}},
        headers=headers(key),
        timeout=120,
    )
    assert reply.status_code == 200, reply.text
    return time.monotonic() - start


def test_hostile_corpus_files_are_read_skipped_or_refused_within_their_budgets(
    server: dict[str, Any],
) -> None:
    base, key = server["base"], server["key"]
    usual = sorted(_asked(base, key) for _ in range(3))[1]
    outcomes: dict[str, str] = {}
    with Peaks(server["pid"]) as peaks:
        for name in CHOSEN:
            reply = upload(base, key, CORPUS / name, folder="odd")
            assert reply.status_code < 500 and "Traceback" not in reply.text, (name, reply.text)
            if reply.status_code != 202:
                assert reply.status_code in (400, 409, 415), (name, reply.text)
                outcomes[name] = f"refused {reply.status_code}: {reply.json()['detail']}"
                continue
            job = wait_for_job(base, key, job_of(reply)["id"], timeout=300)
            assert "inside the server" not in str(job["error"]), (name, job)
            if job["state"] == "done":
                added = job["result"]["added"]
                skipped = {s["source"]: s["reason"] for s in job["result"]["skipped"]}
                assert added == [f"odd/{name}"] or f"odd/{name}" in skipped, (name, job)
                outcomes[name] = "read" if added else f"skipped: {skipped[f'odd/{name}']}"
            else:
                outcomes[name] = f"failed: {job['error']}"
            # Questions keep their usual time while hostile files are read.
            assert _asked(base, key) < max(3 * usual, usual + 3.0), name
    for name, outcome in outcomes.items():
        expected = EXPECTED[name]
        if expected == "read":
            assert outcome == "read", (name, outcome)
        else:  # never read; ingestion's reason, or the upload check's own for its content
            assert outcome != "read", (name, outcome)
            assert outcome.startswith("refused") or expected.lower() in outcome.lower(), (
                name,
                outcome,
            )
    # Each parse worker kept to its budget; the server itself never parsed a file.
    assert peaks.child_mb < MEMORY_MB, peaks.child_mb
    assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
    assert not [p for p in server["jobs"].iterdir() if p.is_dir()]  # nothing staged is left


def _cut_upload(base: str, key: str, sent_share: float) -> None:
    """An upload whose client leaves after ``sent_share`` of its body."""
    boundary = "cutcutcut"
    payload = b"# Cut\n\n" + b"words that never all arrive " * 40_000
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="folder"\r\n\r\ncut\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="cut.md"\r\n'
            "Content-Type: text/markdown\r\n\r\n"
        ).encode()
        + payload
        + f"\r\n--{boundary}--\r\n".encode()
    )
    where = urlsplit(base)
    head = (
        f"POST /documents HTTP/1.1\r\nHost: {where.netloc}\r\nX-API-Key: {key}\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((where.hostname, where.port), timeout=30) as conn:
        conn.sendall(head + body[: int(len(body) * sent_share)])
        time.sleep(0.5)  # the server has read what came


def test_an_upload_cut_off_mid_body_leaves_nothing_and_the_next_answers_as_usual(
    server: dict[str, Any], tmp_path: Path
) -> None:
    base, key = server["base"], server["key"]
    before = httpx.get(f"{base}/jobs", headers=headers(key)).json()["jobs"]
    usual = sorted(_asked(base, key) for _ in range(3))[1]
    for share in (0.01, 0.5, 0.99):
        _cut_upload(base, key, share)
    time.sleep(1)
    assert httpx.get(f"{base}/jobs", headers=headers(key)).json()["jobs"] == before
    assert not [p for p in server["jobs"].iterdir() if p.is_dir()]
    assert _asked(base, key) < max(3 * usual, usual + 3.0)
    # The next upload answers in its usual time, and its follower may leave: the job ends.
    note = tmp_path / "after-cut.md"
    note.write_text("# After\n\nThe parking garage closes at midnight on Sundays.\n")
    start = time.monotonic()
    job = job_of(upload(base, key, note, folder="cut"))
    assert time.monotonic() - start < 30
    with httpx.stream(
        "GET", f"{base}/jobs/{job['id']}/events", headers=headers(key), timeout=60
    ) as stream:
        next(stream.iter_lines())  # one line of the first event, then the follower goes
    ended = wait_for_job(base, key, job["id"])
    assert ended["state"] == "done" and ended["result"]["added"] == ["cut/after-cut.md"]
