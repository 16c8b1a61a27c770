"""The documents API under `ragchains serve`, as a team uses it: an editor uploads a Word
file and a scanned PDF, follows the job to its end, finds the new text within 10 s, replaces
and removes a document; a reader may do none of that and never sees a document outside its
groups (in the list, the viewer or search). For an index folder and a PostgreSQL store."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import pytest

from ragchains.serving.keys import add_key
from tests.conftest import FIXTURES
from tests.documents import (
    documents,
    handbook_docx,
    headers,
    job_events,
    job_of,
    listed_paths,
    remove,
    replace,
    retrieved,
    scanned_pdf,
    upload,
    wait_for_job,
)
from tests.servers import ragchains_serve, wait_until
from tests.test_cli import run

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ANSWERABLE_WITHIN = 10.0  # seconds from a job's end to its text being found
ALLOWANCE_QUERY = "quokka allowance euros per year wildlife photography"
SCAN_QUERY = "Vireo warehouse opens weekdays"


def _sources(found: list[dict[str, object]]) -> set[str]:
    return {str(d["metadata"]["source"]) for d in found}  # type: ignore[index]


def _text_of(found: list[dict[str, object]], source: str) -> str:
    return " ".join(
        str(d["page_content"])
        for d in found
        if d["metadata"]["source"] == source  # type: ignore[index]
    )


def test_an_editor_uploads_replaces_and_removes_and_a_reader_sees_only_its_own(
    target: list[str], tmp_path: Path
) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(FIXTURES / "docs", docs)
    assert run("ingest", docs, *target).returncode == 0
    keys = tmp_path / "keys.toml"
    editor = add_key(keys, "eddie", ["hr"], "editor")
    reader = add_key(keys, "rosa", ["eng"])
    files = tmp_path / "upload"
    files.mkdir()
    docx = handbook_docx(files / "quokka.docx", "417")
    scan = scanned_pdf(files)

    # A store's jobs in this test's folder (the default is the user's state folder).
    env = {"RAGCHAINS_KEYS_FILE": str(keys), "RAGCHAINS_JOBS_DIR": str(tmp_path / "jobs")}
    if target[0] == "--index":
        del env["RAGCHAINS_JOBS_DIR"]  # the default: jobs/ in the index folder
    with ragchains_serve(*target, **env) as base:
        me = httpx.get(f"{base}/me", headers=headers(editor)).json()
        assert me["role"] == "editor" and me["may_upload"] and me["groups"] == ["hr"]
        # A reader may not upload (nor learn anything from trying).
        refused = upload(base, reader, docx, folder="handbook")
        assert refused.status_code == 403, refused.text
        assert "editor role" in refused.json()["detail"]

        job = job_of(upload(base, editor, docx, scan, folder="handbook", groups="hr"))
        assert job["state"] in ("queued", "running") and job["by"] == "eddie"
        events = job_events(base, editor, job["id"])
        end = events[-1]
        assert end[0] == "end" and end[1]["state"] == "done", end
        moving = [e for e in events if e[0] == "progress"]
        percents = [e[1]["progress"]["percent"] for e in moving]
        assert percents and percents == sorted(percents) and percents[-1] < 100, percents
        assert end[1]["progress"]["percent"] == 100
        assert sorted(end[1]["result"]["added"]) == [
            "handbook/quokka.docx",
            "handbook/vireo-scan.pdf",
        ]
        done_at = time.monotonic()

        def answerable() -> bool:
            return "handbook/quokka.docx" in _sources(retrieved(base, editor, ALLOWANCE_QUERY))

        wait_until(answerable, "the upload found", timeout=ANSWERABLE_WITHIN, every=0.2)
        assert time.monotonic() - done_at <= ANSWERABLE_WITHIN
        assert "handbook/vireo-scan.pdf" in _sources(retrieved(base, editor, SCAN_QUERY))
        asked = httpx.post(
            f"{base}/ask/invoke",
            json={"input": {"question": "How large is the quokka allowance?"}},
            headers=headers(editor),
            timeout=300,
        )
        assert asked.status_code == 200, asked.text
        cited = {c["source"] for c in asked.json()["output"]["citations"]}
        assert "handbook/quokka.docx" in cited, asked.json()["output"]

        # Listed with their state: chunks, groups, who uploaded, the scan's OCR confidence.
        listed = {d["path"]: d for d in documents(base, editor, folder="handbook")["documents"]}
        word, pdf = listed["handbook/quokka.docx"], listed["handbook/vireo-scan.pdf"]
        assert word["format"] == "docx" and word["chunks"] >= 1 and word["groups"] == ["hr"]
        assert word["uploaded_by"] == "eddie" and word["state"] == "read" and word["may_change"]
        assert pdf["chunks"] >= 1 and pdf["pages"] == 1 and pdf["ocr_pages"] == 1
        assert 0.5 < pdf["ocr_confidence"] <= 1.0

        # The reader: never the hr documents, in the list, the viewer or search.
        seen = listed_paths(base, reader)
        assert not any(p.startswith("handbook/") for p in seen) and seen  # the rest it sees
        assert documents(base, reader, search="quokka")["total"] == 0
        for doc in (word, pdf):
            one = httpx.get(f"{base}/documents/{doc['path']}", headers=headers(reader))
            assert one.status_code == 404
            for route in (f"/files/{doc['file_id']}", f"/files/{doc['file_id']}/view"):
                opened = httpx.get(f"{base}{route}", headers=headers(reader))
                assert opened.status_code == 404, route
        assert not _sources(retrieved(base, reader, ALLOWANCE_QUERY)) & set(listed)
        assert not _sources(retrieved(base, reader, SCAN_QUERY)) & set(listed)
        gone = remove(base, reader, "handbook/quokka.docx")
        assert gone.status_code == 403

        # A new version: the new fact is found, the old one no longer.
        (files / "new").mkdir()
        new = handbook_docx(files / "new" / "quokka.docx", "512")
        replaced = wait_for_job(
            base, editor, job_of(replace(base, editor, "handbook/quokka.docx", new))["id"]
        )
        assert replaced["state"] == "done" and replaced["result"]["updated"] == [
            "handbook/quokka.docx"
        ]

        def says_the_new_amount() -> bool:
            found = retrieved(base, editor, ALLOWANCE_QUERY)
            return "512" in _text_of(found, "handbook/quokka.docx")

        wait_until(says_the_new_amount, "the new version found", timeout=ANSWERABLE_WITHIN)
        assert "417" not in _text_of(
            retrieved(base, editor, ALLOWANCE_QUERY), "handbook/quokka.docx"
        )

        # Removed: no longer found, no longer listed.
        removed = wait_for_job(
            base, editor, job_of(remove(base, editor, "handbook/quokka.docx"))["id"]
        )
        assert removed["state"] == "done" and removed["result"]["removed"] == [
            "handbook/quokka.docx"
        ]

        def unanswerable() -> bool:
            return "handbook/quokka.docx" not in _sources(retrieved(base, editor, ALLOWANCE_QUERY))

        wait_until(unanswerable, "the removed document gone", timeout=ANSWERABLE_WITHIN)
        assert "handbook/quokka.docx" not in listed_paths(base, editor)
        assert "handbook/vireo-scan.pdf" in listed_paths(base, editor)
        # Read again from the copy kept of it: the same chunks, nothing to write.
        again = httpx.post(
            f"{base}/documents/reingest",
            json={"paths": ["handbook/vireo-scan.pdf"]},
            headers=headers(editor),
        )
        reread = wait_for_job(base, editor, job_of(again)["id"])
        assert reread["state"] == "done", reread
        assert reread["result"]["unchanged"] == ["handbook/vireo-scan.pdf"]
        refused_again = httpx.post(
            f"{base}/documents/reingest",
            json={"paths": ["handbook/vireo-scan.pdf"]},
            headers=headers(reader),
        )
        assert refused_again.status_code == 403
        jobs = httpx.get(f"{base}/jobs", headers=headers(editor)).json()["jobs"]
        assert [j["kind"] for j in jobs] == ["reingest", "remove", "replace", "upload"]
        assert httpx.get(f"{base}/jobs", headers=headers(reader)).json()["jobs"] == []
        assert httpx.get(f"{base}/jobs/{job['id']}", headers=headers(reader)).status_code == 404

    # A CLI run over the same folder keeps what was uploaded (only the API removes it).
    assert run("ingest", docs, *target).returncode == 0
    with ragchains_serve(*target, **env) as base:
        assert "handbook/vireo-scan.pdf" in listed_paths(base, editor)
        # The same bytes again under the same path: nothing to change, and said so.
        same = upload(base, editor, scan, folder="handbook")
        assert same.status_code == 409 and "unchanged" in same.json()["detail"]
