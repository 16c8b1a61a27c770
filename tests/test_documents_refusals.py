"""Every bad upload to `ragchains serve` is refused whole, with its status and reason, and
loses nothing: the documents listed, what a fixed query retrieves and the jobs folder (no
job, no staged file) are as they were. For an index folder and a PostgreSQL store, one
server each for most cases (a second for a disk kept free beyond any, a third whose jobs
folder is a tiny tmpfs that really fills)."""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from ragchains.serving.keys import add_key
from tests.conftest import FIXTURES
from tests.documents import (
    documents,
    headers,
    job_of,
    remove,
    replace,
    retrieved,
    scanned_pdf,
    upload,
    wait_for_job,
)
from tests.fixtures.make_office import (
    encrypt_office,
    write_docx,
    write_many_parts,
    write_xlsx,
    write_zip_bomb,
)
from tests.servers import ragchains_serve
from tests.test_cli import run

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

QUERY = "tool shed code garden beds watering"
ADMIN_KEY = "rk-admin-" + secrets.token_hex(8)  # RAGCHAINS_API_KEY: reads all, admin role
PUBLIC = "docs/guide.md"  # ingested by the CLI, readable by everyone: no editor's to change
MB = 2**20


@dataclass(frozen=True)
class Collection:
    """A copy of tests/fixtures/docs ingested by `ragchains ingest` into ``target``."""

    name: str  # folder, postgresql
    target: list[str]
    root: Path
    keys: Path
    editor: str  # eddie, groups hr
    reader: str  # rosa, groups hr
    files: Path  # the files the tests upload


@dataclass(frozen=True)
class Served:
    base: str
    jobs: Path  # the server's jobs folder
    collection: Collection

    @property
    def editor(self) -> str:
        return self.collection.editor


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files the tests upload, written once for both targets (the zip bomb takes
    seconds)."""
    return _bad_files(tmp_path_factory.mktemp("files"))


@pytest.fixture(scope="module", params=["folder", "postgresql"])
def collection(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, bad_files: Path
) -> Collection:
    root = tmp_path_factory.mktemp(f"refusals-{request.param}")
    if request.param == "folder":
        target = ["--index", str(root / "index")]
    else:
        postgres = request.getfixturevalue("postgres")
        target = ["--store", f"{postgres.url}?schema=refusals_{secrets.token_hex(6)}"]
    docs = root / "docs"
    shutil.copytree(FIXTURES / "docs", docs)
    ingested = run("ingest", docs, *target)
    assert ingested.returncode == 0, ingested.stderr
    keys = root / "keys.toml"
    editor = add_key(keys, "eddie", ["hr"], "editor")
    reader = add_key(keys, "rosa", ["hr"])
    return Collection(request.param, target, root, keys, editor, reader, bad_files)


@contextmanager
def serving(collection: Collection, jobs: Path | None = None, **env: str) -> Iterator[Served]:
    """`ragchains serve` over ``collection`` with a 1 MB upload limit; its jobs in ``jobs``
    (RAGCHAINS_JOBS_DIR), else where it keeps them by default for an index folder
    (``<index>/jobs``), else (a store) in a folder of the test's."""
    if jobs is None and collection.name == "folder":
        folder = Path(collection.target[1]) / "jobs"
    else:
        folder = jobs or collection.root / "jobs"
        env["RAGCHAINS_JOBS_DIR"] = str(folder)
    variables: dict[str, Any] = {
        "RAGCHAINS_KEYS_FILE": str(collection.keys),
        "RAGCHAINS_API_KEY": ADMIN_KEY,
        "RAGCHAINS_MAX_UPLOAD_MB": "1",
        **env,
    }
    with ragchains_serve(*collection.target, **variables) as base:
        yield Served(base, folder, collection)


@pytest.fixture(scope="module")
def served(collection: Collection) -> Iterator[Served]:
    with serving(collection) as server:
        yield server


# ----------------------------------------------------------------------------- files
def _bad_files(folder: Path) -> Path:
    (folder / "big.txt").write_bytes(b"lorem ipsum " * (2 * MB // 12 + 1))  # 2 MB of text
    (folder / "prog.exe").write_bytes(b"MZ\x90\x00" + bytes(200))
    Image.new("RGB", (24, 24), "white").save(folder / "picture.pdf", format="PNG")
    write_xlsx(folder / "sheet.docx")
    (folder / "pdf.txt").write_bytes(b"%PDF-1.4\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n")
    encrypt_office(write_docx(folder / "plain.docx"), folder / "locked.docx")
    write_zip_bomb(folder / "bomb.docx")
    write_many_parts(folder / "parts.docx")
    shutil.copyfile(FIXTURES / "docs" / "guide.md", folder / "copy-of-guide.md")
    (folder / "note.md").write_text(
        "# Beekeeping note\n\nThe hives behind the shed are opened on Saturdays only.\n",
        encoding="utf-8",
    )
    return folder


def note(served: Served, name: str = "note.md") -> Path:
    """A good Markdown file no test stores (refused beside a bad one, or on a full disk)."""
    return served.collection.files / name


def raw_upload(
    base: str, key: str, *files: tuple[bytes, bytes], folder: str = ""
) -> httpx.Response:
    """``POST /documents`` with a multipart body written by hand, each file's name sent as
    the bytes given: httpx percent-escapes control characters in a part's filename (the
    server would never see them as they are)."""
    boundary = secrets.token_hex(16).encode()
    body = b"--" + boundary + b'\r\nContent-Disposition: form-data; name="folder"\r\n\r\n'
    body += folder.encode() + b"\r\n"
    for name, content in files:
        body += b"--" + boundary + b'\r\nContent-Disposition: form-data; name="files"; '
        body += b'filename="' + name + b'"\r\nContent-Type: application/octet-stream\r\n\r\n'
        body += content + b"\r\n"
    body += b"--" + boundary + b"--\r\n"
    return httpx.post(
        f"{base}/documents",
        content=body,
        headers={
            **headers(key),
            "Content-Type": f"multipart/form-data; boundary={boundary.decode()}",
        },
        timeout=120,
    )


def reingest(base: str, key: str, *paths: str) -> httpx.Response:
    return httpx.post(
        f"{base}/documents/reingest", json={"paths": list(paths)}, headers=headers(key), timeout=60
    )


# ----------------------------------------------------------------------------- the checks
def collection_state(served: Served) -> dict[str, Any]:
    """What a refusal must leave as it was: every document (path, file id, chunks, state),
    what QUERY retrieves, the jobs (as listed and as files: no new record, nothing staged)."""
    listed = documents(served.base, ADMIN_KEY, limit=500)
    found = retrieved(served.base, ADMIN_KEY, QUERY)
    jobs = httpx.get(f"{served.base}/jobs", headers=headers(ADMIN_KEY), timeout=30)
    assert jobs.status_code == 200, jobs.text
    return {
        "documents": [
            (d["path"], d["file_id"], d["chunks"], d["state"]) for d in listed["documents"]
        ],
        "total": listed["total"],
        "retrieved": [(d["metadata"]["source"], d["page_content"]) for d in found],
        "jobs": [(j["id"], j["state"]) for j in jobs.json()["jobs"]],
        "jobs folder": sorted(os.listdir(served.jobs)) if served.jobs.exists() else [],
    }


def staged_leftovers(served: Served) -> list[str]:
    """What the jobs folder holds besides finished jobs' records: staged folders, partial
    records."""
    if not served.jobs.exists():
        return []
    return sorted(
        p.name for p in served.jobs.iterdir() if p.is_dir() or not p.name.startswith("j-")
    )


def refused(served: Served, send: Callable[[], httpx.Response], status: int, *phrases: str) -> str:
    """``send()``'s reply is ``status`` with each of ``phrases`` in its ``detail`` (and no
    trace of the server's insides), and the collection is as it was; the detail."""
    before = collection_state(served)
    reply = send()
    assert reply.status_code == status, reply.text
    assert "Traceback" not in reply.text and 'File "' not in reply.text, reply.text
    detail = reply.json()["detail"]
    assert isinstance(detail, str), detail
    for phrase in phrases:
        assert phrase in detail, detail
    assert collection_state(served) == before
    assert staged_leftovers(served) == []
    return detail


# ----------------------------------------------------------------------------- size, type
def test_a_file_over_the_size_limit(served: Served) -> None:
    big = served.collection.files / "big.txt"
    assert big.stat().st_size > 2 * MB - 100
    refused(
        served,
        lambda: upload(served.base, served.editor, big),
        413,
        "'big.txt' is over the upload limit of 1 MB per file",
    )


@pytest.mark.parametrize(
    ("name", "status", "reason"),
    [
        ("prog.exe", 400, "file name 'prog.exe': unsupported file type '.exe'"),
        ("picture.pdf", 415, "'picture.pdf': this .pdf file is a PNG image; rename it .png"),
        (
            "sheet.docx",
            415,
            "'sheet.docx': this .docx file is an Excel workbook; rename it .xlsx",
        ),
        ("pdf.txt", 415, "'pdf.txt': this .txt file is a PDF; rename it .pdf"),
        (
            "locked.docx",
            415,
            "'locked.docx': password-protected Word file (encrypted); save a copy without a "
            "password",
        ),
        ("bomb.docx", 415, "Word file would unzip to 601 MB, over the cap of 512 MB"),
        ("parts.docx", 415, "Word file has 6,017 parts, over the cap of 5,000"),
    ],
)
def test_a_file_of_a_type_not_read_or_not_what_its_name_says(
    served: Served, name: str, status: int, reason: str
) -> None:
    file = served.collection.files / name
    refused(served, lambda: upload(served.base, served.editor, file), status, reason)


def test_a_new_version_of_another_type_or_mislabelled(served: Served) -> None:
    files = served.collection.files
    refused(
        served,
        lambda: replace(served.base, ADMIN_KEY, PUBLIC, files / "plain.docx"),
        415,
        f"the new version must be of the same type as {PUBLIC!r} (.md)",
    )
    shutil.copyfile(files / "pdf.txt", files / "pdf.md")
    refused(
        served,
        lambda: replace(served.base, ADMIN_KEY, PUBLIC, files / "pdf.md"),
        415,
        # Named by the document's name: the new version is checked as that document.
        "'guide.md': this .md file is a PDF; rename it .pdf",
    )


# ----------------------------------------------------------------------------- names
@pytest.mark.parametrize(
    ("folder", "reason"),
    [
        ("../x", "folder '../x' may not have a '..' part"),
        ("hr/../../x", "folder 'hr/../../x' may not have a '..' part"),
        ("/etc", "folder '/etc' is absolute (starts with '/')"),
    ],
)
def test_a_folder_leaving_the_collection(served: Served, folder: str, reason: str) -> None:
    refused(
        served,
        lambda: upload(served.base, served.editor, note(served), folder=folder),
        400,
        reason,
    )


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        (b"a/../../b.md", "file name 'a/../../b.md' may not contain '/'"),
        (b"../../b.md", "file name '../../b.md' may not contain '/'"),
        (b"..\\..\\b.md", "may not contain a backslash"),
        (
            "bad\u202eexe.md".encode(),
            "file name 'bad\\u202eexe.md' contains a control character (U+202E RIGHT-TO-LEFT "
            "OVERRIDE)",
        ),
        (b"bad\x00nul.md", "file name 'bad\\x00nul.md' contains a control character (U+0000)"),
        (b"bad\nline.md", "file name 'bad\\nline.md' contains a control character (U+000A)"),
        (b"bad\x1b[31m.md", "contains a control character (U+001B)"),
        # A bare CR ends the part's header line: python-multipart's own refusal.
        (b"bad\rreturn.md", "Invalid multipart data"),
    ],
    ids=[
        "dotdot-in-name",
        "leading-dotdot",
        "backslashes",
        "rtl-override",
        "nul",
        "newline",
        "esc",
        "carriage-return",
    ],
)
def test_a_file_name_with_a_path_or_a_control_character(
    served: Served, name: bytes, reason: str
) -> None:
    content = note(served).read_bytes()
    refused(
        served,
        lambda: raw_upload(served.base, served.editor, (name, content), folder="notes"),
        400,
        reason,
    )


# ----------------------------------------------------------------------------- content
def test_a_copy_of_a_document_under_another_name(served: Served) -> None:
    refused(
        served,
        lambda: upload(served.base, served.editor, served.collection.files / "copy-of-guide.md"),
        409,
        f"'copy-of-guide.md' has the same content as {PUBLIC!r}; it is not stored twice",
    )


def test_the_same_content_twice_in_one_request(served: Served) -> None:
    refused(
        served,
        lambda: upload(
            served.base,
            served.editor,
            note(served),
            note(served),
            folder="notes",
            names=["one.md", "two.md"],
        ),
        409,
        "'notes/two.md' has the same content as 'notes/one.md'",
    )
    refused(
        served,
        lambda: upload(served.base, served.editor, note(served), note(served)),
        400,
        "two files of the request have the same name",
    )


@pytest.mark.parametrize(
    ("bad", "status", "reason"),
    [
        ("picture.pdf", 415, "this .pdf file is a PNG image"),
        ("copy-of-guide.md", 409, f"has the same content as {PUBLIC!r}"),
        ("prog.exe", 400, "unsupported file type '.exe'"),
        ("big.txt", 413, "over the upload limit of 1 MB"),
    ],
)
def test_a_request_with_one_bad_file_is_refused_whole(
    served: Served, bad: str, status: int, reason: str
) -> None:
    """The good file first: staged (and checked) before the bad one is met."""
    files = served.collection.files
    plain = files / "plain.docx"
    refused(
        served,
        lambda: upload(served.base, served.editor, note(served), plain, files / bad),
        status,
        reason,
    )


# ----------------------------------------------------------------------------- who
def test_a_reader_may_change_nothing(served: Served) -> None:
    reader, base, file = served.collection.reader, served.base, note(served)
    needs = "this needs the editor role; the key used has reader"
    refused(served, lambda: upload(base, reader, file), 403, needs)
    refused(served, lambda: replace(base, reader, PUBLIC, file), 403, needs)
    refused(served, lambda: remove(base, reader, PUBLIC), 403, needs)
    refused(served, lambda: reingest(base, reader, PUBLIC), 403, needs)
    refused(served, lambda: upload(base, None, file), 401)


def test_an_editor_may_give_only_its_own_groups(served: Served) -> None:
    refused(
        served,
        lambda: upload(served.base, served.editor, note(served), groups="hr,eng"),
        403,
        "you may give only your own groups (hr); not eng",
    )
    refused(
        served,
        lambda: upload(served.base, served.editor, note(served), groups="hr, bad group!"),
        400,
    )


def test_an_editor_may_not_change_a_document_everyone_reads(served: Served) -> None:
    base, editor = served.base, served.editor
    listed = {d["path"]: d for d in documents(base, editor, limit=500)["documents"]}
    assert listed[PUBLIC]["groups"] == [] and not listed[PUBLIC]["may_change"]
    mine = f"you may not change {PUBLIC!r}"
    refused(served, lambda: replace(base, editor, PUBLIC, note(served, "note.md")), 403, mine)
    refused(served, lambda: remove(base, editor, PUBLIC), 403, mine)
    refused(served, lambda: reingest(base, editor, PUBLIC), 403, mine)


# ----------------------------------------------------------------------------- jobs
def test_a_second_upload_of_a_path_a_job_is_changing(served: Served, tmp_path: Path) -> None:
    """The first a scan of a few pages (seconds of OCR): the second, sent at once, is
    refused naming the path; so is its content under another name while the first is
    queued or running (it is not stored twice). The first ends done."""
    base, editor = served.base, served.editor
    before = collection_state(served)
    scan = scanned_pdf(tmp_path, "busy-scan.pdf", pages=3)
    first = job_of(upload(base, editor, scan, folder="scans"))
    again = upload(base, editor, scan, folder="scans")
    elsewhere = upload(base, editor, scan, folder="elsewhere")
    assert httpx.get(f"{base}/jobs/{first['id']}", headers=headers(editor)).json()["state"] in (
        "queued",
        "running",
    )
    assert again.status_code == 409, again.text
    assert again.json()["detail"] == (
        "a job is already changing 'scans/busy-scan.pdf': wait for it to end (GET /jobs) and "
        "try again"
    )
    assert elsewhere.status_code == 409, elsewhere.text
    assert elsewhere.json()["detail"] == (
        "'elsewhere/busy-scan.pdf' has the same content as 'scans/busy-scan.pdf', which a job "
        "is adding; it is not stored twice"
    )

    ended = wait_for_job(base, editor, first["id"])
    assert ended["state"] == "done" and ended["result"]["added"] == ["scans/busy-scan.pdf"]
    after = collection_state(served)
    assert [d for d in after["documents"] if d[0] != "scans/busy-scan.pdf"] == before["documents"]
    assert after["total"] == before["total"] + 1
    assert [j for j in after["jobs"] if j[0] != first["id"]] == before["jobs"]
    assert staged_leftovers(served) == []


# ----------------------------------------------------------------------------- the disk
def test_an_upload_that_would_leave_too_little_disk(collection: Collection, tmp_path: Path) -> None:
    if collection.name != "folder":
        pytest.skip(
            "the check reads only the jobs folder's disk, a store's as a folder's: one server"
        )
    with serving(collection, tmp_path / "jobs", RAGCHAINS_UPLOAD_MIN_FREE_MB=str(10**9)) as server:
        refused(
            server,
            lambda: upload(server.base, server.editor, note(server)),
            507,
            "not enough disk space to keep the upload",
            "1000000000 MB are kept free); nothing was stored",
        )
        refused(
            server,
            lambda: reingest(server.base, ADMIN_KEY, PUBLIC),
            507,
            "not enough disk space",
        )


@contextmanager
def tiny_tmpfs(where: Path) -> Iterator[Path]:
    """A tmpfs of 1 MB and 64 inodes mounted at ``where`` (root only)."""
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("a real ENOSPC needs a tmpfs mounted for the test: not root here")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,nr_inodes=64,mode=0700", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"a real ENOSPC needs `mount -t tmpfs`, refused here: {mounted.stderr}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(mount: Path, *, inodes: int | None = None, pages: int | None = None) -> Path:
    """Files in ``mount``/fill until only ``inodes`` inodes or ``pages`` blocks are free."""
    filler = mount / "fill"
    filler.mkdir()
    if inodes is not None:
        n = 0
        while os.statvfs(mount).f_ffree > inodes:
            (filler / str(n)).touch()
            n += 1
        assert os.statvfs(mount).f_ffree == inodes
    if pages is not None:
        size = os.statvfs(mount).f_frsize
        with open(filler / "blocks", "wb") as out:
            while os.statvfs(mount).f_bavail > pages:
                out.write(bytes(size))
                out.flush()
        assert os.statvfs(mount).f_bavail == pages
    return filler


def test_a_disk_that_really_fills(collection: Collection, tmp_path: Path) -> None:
    """The jobs folder on a tmpfs of 1 MB and 64 inodes, the free-space check off: no inode
    left for the staging folder, for the staged file, for the job's record; one block left
    for the staged file and none for the record. Each is ENOSPC, refused with 507 and
    nothing left behind; then, the disk emptied, the same upload is accepted and done."""
    with tiny_tmpfs(tmp_path / "mnt") as mount:
        jobs = mount / "jobs"
        with serving(collection, jobs, RAGCHAINS_UPLOAD_MIN_FREE_MB="0") as server:
            assert jobs.is_dir()
            for full in ({"inodes": 0}, {"inodes": 1}, {"inodes": 2}, {"pages": 1}):
                filler = fill(mount, **full)
                try:
                    refused(
                        server,
                        lambda: upload(server.base, server.editor, note(server), folder="full"),
                        507,
                        f"the upload could not be kept ({os.strerror(errno.ENOSPC)}); "
                        "nothing was stored",
                    )
                finally:
                    shutil.rmtree(filler)
            accepted = job_of(upload(server.base, server.editor, note(server), folder="full"))
            ended = wait_for_job(server.base, server.editor, accepted["id"])
            assert ended["state"] == "done", ended
            assert ended["result"]["added"] == ["full/note.md"]
            assert staged_leftovers(server) == []
            gone = wait_for_job(
                server.base,
                server.editor,
                job_of(remove(server.base, server.editor, "full/note.md"))["id"],
            )
            assert gone["state"] == "done", gone
