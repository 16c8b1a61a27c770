"""Calling the documents API as a client does: multipart uploads, jobs followed to their end
(by polling, or by their server-sent events), and the documents a key is shown."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx

from tests.fixtures.make_office import write_docx
from tests.test_ocr import draw_page, write_pdf

DOCX_TYPE = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"


def headers(key: str | None) -> dict[str, str]:
    return {"X-API-Key": key} if key else {}


def upload(
    base: str,
    key: str | None,
    *files: Path,
    folder: str = "",
    groups: str | None = None,
    names: list[str] | None = None,
) -> httpx.Response:
    """``POST /documents`` with ``files`` (named as given, else by their own names)."""
    data = {"folder": folder, **({"groups": groups} if groups is not None else {})}
    parts = [
        ("files", (name, path.read_bytes(), "application/octet-stream"))
        for name, path in zip(names or [p.name for p in files], files, strict=True)
    ]
    return httpx.post(
        f"{base}/documents", data=data, files=parts, headers=headers(key), timeout=120
    )


def replace(base: str, key: str | None, path: str, file: Path) -> httpx.Response:
    parts = [("file", (file.name, file.read_bytes(), "application/octet-stream"))]
    return httpx.put(f"{base}/documents/{path}", files=parts, headers=headers(key), timeout=120)


def remove(base: str, key: str | None, path: str) -> httpx.Response:
    return httpx.delete(f"{base}/documents/{path}", headers=headers(key), timeout=60)


def job_of(reply: httpx.Response) -> dict[str, Any]:
    assert reply.status_code == 202, reply.text
    job: dict[str, Any] = reply.json()["job"]
    assert reply.headers["location"] == f"/jobs/{job['id']}"
    return job


def wait_for_job(base: str, key: str | None, job_id: str, timeout: float = 300) -> dict[str, Any]:
    """Poll ``GET /jobs/{id}`` until the job ends; its last state."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job: dict[str, Any] = httpx.get(
            f"{base}/jobs/{job_id}", headers=headers(key), timeout=30
        ).json()
        if job["state"] in ("done", "failed"):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not end in {timeout} s")


def job_events(base: str, key: str | None, job_id: str) -> list[tuple[str, dict[str, Any]]]:
    """The job's server-sent events, to its ``end``: (event, job) pairs."""
    events: list[tuple[str, dict[str, Any]]] = []
    with httpx.stream(
        "GET", f"{base}/jobs/{job_id}/events", headers=headers(key), timeout=300
    ) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        event = ""
        for line in stream.iter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                events.append((event, json.loads(line.split(":", 1)[1])))
                if event == "end":
                    break
    return events


def documents(base: str, key: str | None, **params: Any) -> dict[str, Any]:
    reply = httpx.get(f"{base}/documents", params=params, headers=headers(key), timeout=60)
    assert reply.status_code == 200, reply.text
    listed: dict[str, Any] = reply.json()
    return listed


def listed_paths(base: str, key: str | None) -> set[str]:
    return {d["path"] for d in documents(base, key, limit=500)["documents"]}


def retrieved(base: str, key: str | None, query: str) -> list[dict[str, Any]]:
    reply = httpx.post(
        f"{base}/retrieve/invoke",
        json={"input": {"query": query}},
        headers=headers(key),
        timeout=120,
    )
    assert reply.status_code == 200, reply.text
    found: list[dict[str, Any]] = reply.json()["output"]
    return found


def handbook_docx(path: Path, allowance: str) -> Path:
    """A Word handbook whose one fact is the quokka allowance."""
    return write_docx(
        path,
        [
            (1, "Quokka allowance"),
            f"Every employee receives a quokka allowance of {allowance} euros per year for "
            "wildlife photography courses.",
        ],
        table=None,
        title="Quokka handbook",
    )


SCAN_LINES = [
    "The Vireo warehouse opens at 06:45 on weekdays.",
    "Forklift permits are renewed every eighteen months.",
]


def scanned_pdf(folder: Path, name: str = "vireo-scan.pdf", pages: int = 1) -> Path:
    """A PDF of scanned pages (images, no text layer) stating ``SCAN_LINES``."""
    image, _ = draw_page(SCAN_LINES)
    png = folder / f"{name}.png"
    image.save(png, dpi=(300, 300))
    return write_pdf(folder / name, [png] * pages)
