"""A `ragchains serve` killed (SIGKILL, its parse workers with it) while a job reads a scanned
PDF: the collection is still the generation before the job (an index folder's CURRENT, a
store's meta generation and files), and the next start serves that or the job's whole result,
never part of it. The job runs again (its notes say so) and ends done, the document
answerable and cut as a clean upload cuts it; or, its staged files deleted meanwhile, it ends
failed with the reason and the collection is unchanged. For an index folder and a store."""

from __future__ import annotations

import shutil
import subprocess
from contextlib import suppress
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from ragchains.retrievers.indexformat import CURRENT_FILE
from ragchains.retrievers.pgstore import PostgresStore
from ragchains.serving.keys import add_key
from tests.conftest import FIXTURES
from tests.documents import (
    SCAN_LINES,
    documents,
    headers,
    job_of,
    remove,
    retrieved,
    scanned_pdf,
    upload,
    wait_for_job,
)
from tests.servers import ragchains_serve_process, wait_until
from tests.test_cli import run

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PAGES = 6  # of OCR at about a second each: the job is caught reading, pages still to go
SCAN = "scans/vireo-scan.pdf"
SCAN_QUERY = "Vireo warehouse opens weekdays"
RAN_AGAIN = "the server stopped before this job ended; it runs again"
FILES_GONE = (
    "the server stopped during this job and its files are gone; nothing of it was applied: "
    "upload them again"
)


def kill_with_its_workers(process: subprocess.Popen[str]) -> list[psutil.Process]:
    """SIGKILL the server and every process it started (its parse workers, which a killed
    server leaves behind); the processes killed, the server first."""
    server = psutil.Process(process.pid)
    family = [server, *server.children(recursive=True)]
    for member in family:
        with suppress(psutil.NoSuchProcess):
            member.kill()
    process.wait(30)
    _, alive = psutil.wait_procs(family, timeout=30)
    assert not alive, alive
    return family


def on_disk(target: list[str]) -> dict[str, Any]:
    """What the collection is, read from the folder or the store and not from a server: the
    generation named current and the documents it holds."""
    where, location = target
    if where == "--index":
        return {"current": (Path(location) / CURRENT_FILE).read_text(encoding="utf-8").strip()}
    store = PostgresStore(location)
    try:
        files = store.files()
        return {
            "generation": store.meta(fresh=True).get("generation"),
            "files": sorted((path, r.sha256, r.chunk_count) for path, r in files.items()),
        }
    finally:
        store.close()


def the_documents(base: str, key: str) -> dict[str, tuple[str | None, int]]:
    return {d["path"]: (d["file_id"], d["chunks"]) for d in documents(base, key)["documents"]}


def job(base: str, key: str, job_id: str) -> dict[str, Any]:
    reply = httpx.get(f"{base}/jobs/{job_id}", headers=headers(key), timeout=30)
    assert reply.status_code == 200, reply.text
    found: dict[str, Any] = reply.json()
    return found


@pytest.mark.parametrize("files_kept", [True, False], ids=["runs-again", "files-gone"])
def test_a_server_killed_mid_job(target: list[str], tmp_path: Path, files_kept: bool) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(FIXTURES / "docs", docs)
    assert run("ingest", docs, *target).returncode == 0
    keys = tmp_path / "keys.toml"
    editor = add_key(keys, "eddie", ["hr"], "editor")
    env = {"RAGCHAINS_KEYS_FILE": str(keys)}
    if target[0] == "--index":
        jobs = Path(target[1]) / "jobs"  # the default, beside the generations
    else:
        jobs = tmp_path / "jobs"
        env["RAGCHAINS_JOBS_DIR"] = str(jobs)
    (tmp_path / "upload").mkdir()
    scan = scanned_pdf(tmp_path / "upload", pages=PAGES)
    before = on_disk(target)

    with ragchains_serve_process(*target, **env) as (process, base):
        listed = the_documents(base, editor)
        assert SCAN not in listed
        job_id = job_of(upload(base, editor, scan, folder="scans"))["id"]

        def reading() -> dict[str, Any] | None:
            now = job(base, editor, job_id)
            assert now["state"] in ("queued", "running"), now  # not caught: PAGES too few
            progress = now["progress"]
            mid = now["state"] == "running" and progress["stage"] == "reading"
            return now if mid and 1 <= progress["pages"] < PAGES else None

        caught = wait_until(reading, "the job reading the scan", timeout=120, every=0.1)
        killed = kill_with_its_workers(process)
    assert len(killed) > 1, "no parse worker was running: was the job caught reading?"

    # Nothing of the job is in the collection: the same generation, no new document.
    assert on_disk(target) == before
    record = jobs / f"{job_id}.json"
    assert record.is_file() and '"state": "running"' in record.read_text(encoding="utf-8")
    staged = jobs / job_id
    assert staged.is_dir() and any(staged.iterdir())
    if not files_kept:
        shutil.rmtree(staged)

    with ragchains_serve_process(*target, **env) as (_, base):
        first_look = the_documents(base, editor)  # the previous generation, or all of the job
        assert {p: v for p, v in first_look.items() if p != SCAN} == listed
        ended = wait_for_job(base, editor, job_id)
        assert ended["id"] == job_id and ended["created_at"] == caught["created_at"]
        if not files_kept:
            assert ended["state"] == "failed" and ended["error"] == FILES_GONE, ended
            assert the_documents(base, editor) == listed
            assert SCAN not in {
                d["metadata"]["source"] for d in retrieved(base, editor, SCAN_QUERY)
            }
            assert on_disk(target) == before
            assert not staged.exists()
            return

        assert ended["state"] == "done" and RAN_AGAIN in ended["notes"], ended
        assert ended["result"]["added"] == [SCAN] and not ended["result"]["skipped"], ended
        assert not staged.exists()
        rerun = the_documents(base, editor)
        assert {p: v for p, v in rerun.items() if p != SCAN} == listed
        assert SCAN not in first_look or first_look[SCAN] == rerun[SCAN]

        def answerable() -> bool:
            found = retrieved(base, editor, SCAN_QUERY)
            return any(
                d["metadata"]["source"] == SCAN
                and SCAN_LINES[0].split(" at ")[0] in d["page_content"]
                for d in found
            )

        wait_until(answerable, "the scan found after its job ran again", timeout=30)

        # What a clean upload of the same file gives: the same bytes, the same chunks.
        gone = wait_for_job(base, editor, job_of(remove(base, editor, SCAN))["id"])
        assert gone["state"] == "done", gone
        clean = wait_for_job(base, editor, job_of(upload(base, editor, scan, folder="scans"))["id"])
        assert clean["state"] == "done" and RAN_AGAIN not in clean["notes"], clean
        assert the_documents(base, editor)[SCAN] == rerun[SCAN]
        assert clean["result"]["chunks"] == ended["result"]["chunks"]
