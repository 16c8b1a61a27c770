"""The OpenAPI document is what the server does: schemathesis (issues 15 and 30) generates
requests from /openapi.json, valid and hostile, against ``ragchains serve`` as a user starts
it, and checks every reply: never a server error, only declared statuses and content types,
bodies and each streamed event as declared, 405 for a method a route does not take, every
request the document allows accepted and every one it forbids refused.

The documents API (uploads, multipart included, and their ingest jobs) changes the collection:
it is fuzzed against a server of its own over a throwaway index, with an editor's key, an
admin's and none, never against the sample index other tests read.

The chat model is an OpenAI-compatible upstream on this machine (tests/servers.FakeOpenAI):
the subject here is the HTTP surface, and thousands of requests must stay within minutes.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx
import pytest
from pydantic import SecretStr

from ragchains.serving.keys import add_key
from tests.conftest import FIXTURES
from tests.documents import headers as key_header
from tests.documents import job_of, wait_for_job
from tests.fixtures.make_pdf import write_pdf
from tests.servers import FakeOpenAI, ragchains_serve, wait_until
from tests.test_cli import run
from tests.test_ocr import draw_page

pytestmark = pytest.mark.slow

KEY = "fuzz-key"
# What the fuzzer checks of each reply, the request-side checks included: a request the
# document allows is not refused (positive_data_acceptance), one it forbids is
# (negative_data_rejection).
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "unsupported_method",
    "positive_data_acceptance",
    "negative_data_rejection",
)
# A refusal is any 4xx the document declares for it; schemathesis' default list leaves out
# 413, the status of a batch over the limit.
CONFIG = """
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422",
                     "428", "429", "5xx"]
"""
# The whole run's budget; examples and coverage come first, then fuzzing. A 150 s run on 2
# cores (13,421 requests) met every (method, path, status) it ever met within 38 s, but one:
# a batch over the limit, 413 at 137 s, which tests/test_server.py sends on purpose. On a
# loaded machine the budget can run out before the coverage phase reaches the last
# operations: those are then run on their own (``_fuzz``). The suite runs a short budget;
# ``make test-long`` the soak, which also reaches the rare statuses (a batch's 413).
BUDGETS = [
    pytest.param(20, id="20s"),
    pytest.param(150, id="150s", marks=pytest.mark.long),
]
# The documents API's operations (its tag), fuzzed apart from the sample index (see above).
DOCUMENTS_TAG = "documents"
# People's own routes (their conversations, threads, sign-in) are fuzzed apart too, signed
# in with a real identity provider's token, their ids drawn from those that exist.
PEOPLE_TAGS = ("conversations", "threads", "sign-in")
APART = (DOCUMENTS_TAG, *PEOPLE_TAGS)
NOT_DOCUMENTS = tuple(arg for tag in APART for arg in ("--exclude-tag", tag))
ONLY_DOCUMENTS = ("--include-tag", DOCUMENTS_TAG)
ONLY_PEOPLE = tuple(arg for tag in PEOPLE_TAGS for arg in ("--include-tag", tag))
# What the documents run adds to CONFIG (an operation's filters of different kinds match
# any of them: include-name names one operation). A document's path and a job's id are drawn half
# the time from those that exist (a fuzzed one is a 404 all but always); a document is
# removed only from among its own few, never one another reply named (those replaced and
# read again must stay for the next key's run). An upload the
# document allows may still be refused for what no schema says: its file's name (400) or
# content (415) - schemathesis names a file after its field and the format it drew.
DOCUMENTS_CONFIG = """
[dictionaries.documents]
values = {documents}

[dictionaries.replaceable]
values = {replaceable}

[dictionaries.removable]
values = {removable}

[dictionaries.jobs]
values = {jobs}

[[operations]]
include-name = "GET /documents/{{path}}"
parameters = {{ "path.path" = {{ dictionary = "documents", probability = 0.5 }} }}

[[operations]]
include-name = "PUT /documents/{{path}}"
parameters = {{ "path.path" = {{ dictionary = "replaceable", probability = 0.8 }} }}
generation.max-examples = 40

[[operations]]
include-name = "DELETE /documents/{{path}}"
parameters = {{ "path.path" = {{ dictionary = "removable", probability = 0.5 }} }}
phases.examples.extra-data-sources.responses = false
phases.coverage.extra-data-sources.responses = false
phases.fuzzing.extra-data-sources.responses = false

[[operations]]
include-path = "/documents/reingest"
parameters = {{ "body.paths[*]" = {{ dictionary = "documents", probability = 0.5 }} }}

[[operations]]
include-path-regex = "^/jobs/"
parameters = {{ "path.job_id" = {{ dictionary = "jobs", probability = 0.5 }} }}

[[operations]]
include-name = ["POST /documents", "PUT /documents/{{path}}"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409",
                                                     "415", "429", "5xx"]
"""
# The throwaway collection: the fixture documents (readable by all: an editor may change
# none of them) and hr's (an editor of hr may change them), a PDF among them for a PDF to
# replace; a job failing inside the server (not for a reason of the file's) is a bug.
HR_DOCUMENTS = ["hr/forms/badges.pdf", "hr/policies/leave.md"]
# A new version is taken only of the same type, and a fuzzed file has a suffix only when
# schemathesis drew one of its sample files (PNG mostly, or a PDF, a JPEG): a PDF and a
# scanned image of hr's (an editor's to replace), and everyone's PDF (an admin's).
REPLACEABLE = ["hr/forms/badges.pdf", "hr/forms/badge.png", "docs/manual.pdf"]
HR_REMOVABLE = ["hr/memos/canteen.txt", "hr/memos/parking.txt", "hr/memos/lockers.txt"]
REMOVABLE = [*HR_REMOVABLE, "docs/tools.csv", "docs/beds.json", "docs/plants.jsonl"]
FAILED_INSIDE = "the job failed inside the server"


def _fuzz(
    base: str,
    workdir: Path,
    seconds: int | None,
    *headers: str,
    operations: Collection[tuple[str, str]] = (),
    select: tuple[str, ...] = NOT_DOCUMENTS,
    config: str = CONFIG,
) -> tuple[str, dict[str, Any]]:
    """schemathesis against ``base`` for ``seconds`` (None: each operation's examples and
    cases, bounded by their count), over the operations ``select`` selects, its exit status
    0; then each of ``operations`` the run did not answer (2xx) runs again alone, its
    examples and fuzzed cases only (bounded by their count, not by time): a budget that ran
    out must not leave an operation unchecked. Returns the output and the HAR record of
    every request and reply."""
    report, har = _schemathesis(base, workdir, seconds, headers, [*select], config)
    answered = _answered_per_operation(har)
    unreached = sorted(op for op in operations if not _answered(answered, op))
    if unreached:
        names = [arg for op in unreached for arg in ("--include-name", " ".join(op))]
        more, rest = _schemathesis(base, workdir, None, headers, names, config, again=True)
        report += f"\nrun again alone: {unreached}\n{more}"
        har["log"]["entries"] += rest["log"]["entries"]
    return report, har


def _schemathesis(
    base: str,
    workdir: Path,
    seconds: int | None,
    headers: tuple[str, ...],
    only: list[str],
    config_text: str,
    *,
    again: bool = False,
) -> tuple[str, dict[str, Any]]:
    # Each run a HAR of its own: a test's second run must not overwrite its first's.
    har = workdir / f"{'again' if again else 'run'}-{len(list(workdir.glob('*.har')))}.har"
    config = workdir / "schemathesis.toml"
    config.write_text(config_text)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "--config-file",
            str(config),
            "run",
            f"{base}/openapi.json",
            "--checks",
            ",".join(CHECKS),
            "--phases",
            "examples,fuzzing" if again else "examples,coverage,fuzzing",
            "--max-examples",
            "8",
            *(("--max-time", str(seconds)) if seconds else ()),
            "--seed",
            "20261124",  # replayable (the count of cases still follows the machine's speed)
            "--request-timeout",
            "60",
            "--no-shrink",
            "--suppress-health-check",
            "all",
            "--report",
            "har",
            "--report-har-path",
            str(har),
            *(arg for header in headers for arg in ("-H", header)),
            *only,
        ],
        capture_output=True,
        text=True,
        timeout=(seconds or 0) + 300,
        cwd=workdir,  # schemathesis keeps its cache folder there
    )
    report = run.stdout[-6000:] + run.stderr[-2000:]
    assert run.returncode == 0, report
    return report, json.loads(har.read_text())


def _answered_per_operation(
    har: dict[str, Any], ok: Callable[[int], bool] = lambda status: 200 <= status < 300
) -> dict[tuple[str, str], int]:
    """How many 2xx replies (or replies whose status is ``ok``) each (method, path) got."""
    answered: dict[tuple[str, str], int] = {}
    for entry in har["log"]["entries"]:
        key = (entry["request"]["method"], unquote(urlsplit(entry["request"]["url"]).path))
        answered[key] = answered.get(key, 0) + ok(entry["response"]["status"])
    return answered


def _matcher(template: str) -> re.Pattern[str]:
    """A path template as a pattern of the paths it stands for."""
    pattern = re.escape(template).replace(r"\{path\}", ".+")
    return re.compile(re.sub(r"\\{[^/]+?\\}", "[^/]+", pattern) + "$")


def _replies(har: dict[str, Any], operation: tuple[str, str]) -> list[tuple[str, int, str]]:
    """The paths, statuses and reasons an operation's requests got (what a failure shows)."""
    method, template = operation
    matches = _matcher(template)
    return [
        (path, entry["response"]["status"], entry["response"]["content"].get("text", "")[:120])
        for entry in har["log"]["entries"]
        if entry["request"]["method"] == method
        and matches.match(path := unquote(urlsplit(entry["request"]["url"]).path))
    ]


def _answered(answered: dict[tuple[str, str], int], operation: tuple[str, str]) -> int:
    """The 2xx replies an operation got; a path with parameters (/files/{file_id}) counts
    those of every path it matches (a document's {path} holds slashes)."""
    method, template = operation
    if "{" not in template:
        return answered.get(operation, 0)
    pattern = _matcher(template)
    return sum(n for (m, path), n in answered.items() if m == method and pattern.match(path))


def _operations(document: dict[str, Any], *, tags: Collection[str] = ()) -> set[tuple[str, str]]:
    """The document's (method, path) pairs: those of ``tags``, or (none given) all those
    not fuzzed apart (APART)."""

    def wanted(operation: dict[str, Any]) -> bool:
        own = set(operation.get("tags", ()))
        return bool(own & set(tags)) if tags else not own & set(APART)

    return {
        (method.upper(), path)
        for path, methods in document["paths"].items()
        for method, operation in methods.items()
        if wanted(operation)
    }


def served(sample_index: Path, upstream: FakeOpenAI, workdir: Path, **env: str) -> Any:
    """``ragchains serve`` over the sample index, its chat model ``upstream``."""
    return ragchains_serve(
        "--index",
        str(sample_index),
        RAGCHAINS_LLM_PROVIDER="openai",
        RAGCHAINS_OPENAI_BASE_URL=upstream.base_url,
        RAGCHAINS_OPENAI_API_KEY="upstream-key",
        RAGCHAINS_OPENAI_MODEL="ok-fuzz",
        RAGCHAINS_LLM_MAX_RETRIES="0",
        RAGCHAINS_FEEDBACK_DB=str(workdir / "feedback.sqlite"),
        RAGCHAINS_CONVERSATIONS_DB=str(workdir / "conversations.sqlite"),
        **env,
    )


@pytest.mark.parametrize("seconds", BUDGETS)
def test_schemathesis_finds_no_server_error_and_no_reply_the_document_does_not_declare(
    sample_index: Path, upstream: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory, seconds: int
) -> None:
    """And every operation is answered for real (2xx) at least once: a run where every
    request was refused would prove nothing."""
    workdir = tmp_path_factory.mktemp("schemathesis")
    with served(sample_index, upstream, workdir) as base:
        document = httpx.get(f"{base}/openapi.json").json()
        operations = _operations(document)
        report, har = _fuzz(base, workdir, seconds, operations=operations)
        healthy = httpx.get(f"{base}/healthz").status_code
    answered = _answered_per_operation(har)
    assert not [op for op in operations if not _answered(answered, op)], (answered, report)
    assert healthy == 200


def test_schemathesis_with_a_key_required(
    sample_index: Path, upstream: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """With the key sent, as a client generated from the document sends it; without it
    every closed route is a declared 401."""
    workdir = tmp_path_factory.mktemp("schemathesis-keyed")
    with served(sample_index, upstream, workdir, RAGCHAINS_API_KEY=KEY) as base:
        closed = {("POST", "/chat/invoke"), ("POST", "/v1/chat/completions")}
        _, har = _fuzz(base, workdir, 10, f"X-API-Key: {KEY}", operations=closed)
        _, refused = _fuzz(base, workdir, 5)
    answered = _answered_per_operation(har)  # closed routes answered with the key sent
    assert answered.get(("POST", "/chat/invoke")) and answered.get(("POST", "/v1/chat/completions"))
    statuses = {e["response"]["status"] for e in refused["log"]["entries"]}
    assert 401 in statuses


def test_the_document_lists_what_works_and_declares_each_reply(
    serve_upstream: Callable[..., AbstractContextManager[str]],
) -> None:
    """With a key required: 401 declared with the key's schemes on every closed route; no
    playground share links, no token feedback (it needs LangSmith); streams as events;
    /v1/chat/completions with its body and its models; errors in the format each route
    sends them, and a real reply of each kind matching its declaration."""
    with serve_upstream(openai_model="ok-fuzz", api_key=SecretStr(KEY)) as base:
        headers = {"X-API-Key": KEY}
        document = httpx.get(f"{base}/openapi.json").json()  # open: a browser opens /docs
        docs_page = httpx.get(f"{base}/docs")
        bad_json = httpx.post(
            f"{base}/chat/invoke",
            content=b"{",
            headers={**headers, "content-type": "application/json"},
        )
        no_key = httpx.post(f"{base}/v1/chat/completions", json={})
        text = httpx.post(f"{base}/ask/invoke", content=b"x", headers=headers)
        put = httpx.put(f"{base}/chat/input_schema", headers=headers)
    assert docs_page.status_code == 200
    paths = document["paths"]
    assert "502" not in paths["/retrieve/invoke"]["post"]["responses"]  # calls no model
    assert not [p for p in paths if "config_hash" in p or "token_feedback" in p]
    schemes = document["components"]["securitySchemes"]
    assert schemes["apiKey"] == {"type": "apiKey", "in": "header", "name": "X-API-Key"}
    assert "401" in paths["/chat/invoke"]["post"]["responses"]
    assert "401" not in paths["/healthz"]["get"]["responses"]
    stream = paths["/chat/stream"]["post"]
    assert list(stream["responses"]["200"]["content"]) == ["text/event-stream"]
    assert not stream.get("parameters")  # LangServe's unused config_hash query parameter
    completions = paths["/v1/chat/completions"]["post"]
    body = completions["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    model = document["components"]["schemas"][body.rsplit("/", 1)[-1]]["properties"]["model"]
    assert model["enum"] == ["catalog", "default", "hr"]
    assert set(completions["responses"]["200"]["content"]) == {
        "application/json",
        "text/event-stream",
    }
    error = completions["responses"]["502"]["content"]["application/json"]["schema"]["$ref"]
    assert error.endswith("/OpenAIError")
    assert "HTTPValidationError" not in document["components"]["schemas"]

    assert bad_json.status_code == 422 and isinstance(bad_json.json()["detail"], list)
    assert no_key.status_code == 401 and no_key.json()["error"]["code"] == 401
    assert text.status_code == 415 and "application/json" in text.json()["detail"]
    assert put.status_code == 405  # no body: the route answers, not the body's checks
    for reply, path in ((bad_json, "/chat/invoke"), (text, "/ask/invoke")):
        assert str(reply.status_code) in paths[path]["post"]["responses"]


@dataclass(frozen=True)
class DocumentsServer:
    base: str
    editor: str  # eddie's key: an editor of hr
    admin: str  # ada's key
    workdir: Path


@pytest.fixture(scope="module")
def documents_server(
    upstream: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DocumentsServer]:
    """``ragchains serve`` with keys over an index of its own, ingested by the CLI from the
    fixture documents and hr's (readable by hr only), for uploads to change as they may."""
    workdir = tmp_path_factory.mktemp("schemathesis-documents")
    corpus = workdir / "corpus"
    shutil.copytree(FIXTURES / "docs", corpus / "docs")
    write_pdf(corpus / "docs" / "manual.pdf", ["The Vireo manual: the kiln heats to 1200 C."])
    for folder in ("forms", "policies", "memos"):
        (corpus / "hr" / folder).mkdir(parents=True)
    write_pdf(
        corpus / "hr" / "forms" / "badges.pdf",
        ["The Vireo handbook: staff badges are renewed every March.", "Lockers close at 20:00."],
    )
    scan, _ = draw_page(["Badge photos are taken on Mondays."], size=(1400, 300), left=40, top=80)
    scan.save(corpus / "hr" / "forms" / "badge.png", dpi=(300, 300))
    (corpus / "hr" / "policies" / "leave.md").write_text(
        "# Leave\n\nParental leave lasts sixteen weeks at full pay.\n"
    )
    for path in HR_REMOVABLE:
        topic = Path(path).stem
        (corpus / path).write_text(f"The {topic} memo: the {topic} rules changed in May.\n")
    index = workdir / "index"
    ingested = run(
        "ingest", corpus / "docs", corpus / "hr", "--index", index, "--access", "hr/*=hr"
    )
    assert ingested.returncode == 0, ingested.stderr
    keys = workdir / "keys.toml"
    editor = add_key(keys, "eddie", ["hr"], "editor")
    admin = add_key(keys, "ada", ["hr"], "admin")
    with served(index, upstream, workdir, RAGCHAINS_KEYS_FILE=str(keys)) as base:
        yield DocumentsServer(base, editor, admin, workdir)


def _a_job(server: DocumentsServer, key: str, name: str) -> str:
    """The id of a job of ``key``'s that has ended: an upload of a small text file."""
    reply = httpx.post(
        f"{server.base}/documents",
        data={"folder": "hr/seeded"},
        files=[("files", (name, f"The {name} note says the seeded job ran.".encode()))],
        headers=key_header(key),
        timeout=60,
    )
    job = wait_for_job(server.base, key, job_of(reply)["id"], timeout=120)
    assert job["state"] == "done", job
    return str(job["id"])


def _jobs(server: DocumentsServer) -> list[dict[str, Any]]:
    reply = httpx.get(
        f"{server.base}/jobs", params={"limit": 500}, headers=key_header(server.admin)
    )
    assert reply.status_code == 200, reply.text
    jobs: list[dict[str, Any]] = reply.json()["jobs"]
    return jobs


def test_schemathesis_over_the_documents_api_with_an_editor_an_admin_and_no_key(
    documents_server: DocumentsServer,
) -> None:
    """Uploads (multipart), replacements, re-reads, removals, the list and the jobs, each
    reply checked as the other routes' are; with an editor's key and an admin's every
    operation answered for real (2xx) at least once, without a key each a declared 401.
    And every job the run started ends, none of them failing inside the server."""
    server = documents_server
    jobs = [_a_job(server, server.editor, "eddie.txt"), _a_job(server, server.admin, "ada.txt")]
    config = CONFIG + DOCUMENTS_CONFIG.format(
        documents=json.dumps(["docs/guide.md", "docs/notes.txt", *HR_DOCUMENTS]),
        replaceable=json.dumps(REPLACEABLE),
        removable=json.dumps(REMOVABLE),
        jobs=json.dumps(jobs),
    )
    document = httpx.get(f"{server.base}/openapi.json").json()
    operations = _operations(document, tags=[DOCUMENTS_TAG])
    assert len(operations) == 9, operations
    answered: dict[tuple[str, str], int] = {}
    statuses: dict[tuple[str, str], set[int]] = {}
    for key in (server.editor, server.admin):
        _, har = _fuzz(
            server.base,
            server.workdir,
            None,
            f"X-API-Key: {key}",
            select=ONLY_DOCUMENTS,
            config=config,
        )
        for operation, count in _answered_per_operation(har).items():
            answered[operation] = answered.get(operation, 0) + count
        for entry in har["log"]["entries"]:
            request = entry["request"]
            sent = (request["method"], unquote(urlsplit(request["url"]).path))
            statuses.setdefault(sent, set()).add(entry["response"]["status"])
    unanswered = sorted(op for op in operations if not _answered(answered, op))
    assert not unanswered, (unanswered, {op: statuses[op] for op in statuses if op[0] != "GET"})

    _, refused = _fuzz(server.base, server.workdir, None, select=ONLY_DOCUMENTS, config=config)
    no_key = _answered_per_operation(refused, lambda status: status == 401)
    assert not [op for op in operations if not _answered(no_key, op)], no_key
    assert not any(_answered_per_operation(refused).values())  # nothing answered without it

    def ended() -> bool:
        return all(job["state"] in ("done", "failed") for job in _jobs(server))

    wait_until(ended, "every job of the run ended", timeout=120, every=0.5)
    inside = [job for job in _jobs(server) if FAILED_INSIDE in (job["error"] or "")]
    assert not inside, inside
    assert httpx.get(f"{server.base}/healthz").status_code == 200


def _schema(document: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = document["components"]["schemas"][ref["$ref"].rsplit("/", 1)[-1]]
    return found


def test_the_document_declares_the_documents_api_as_it_answers(
    documents_server: DocumentsServer,
) -> None:
    """Multipart bodies with their files as binary (at least one file per upload), 202 with
    the job and its Location, refusals as problems, a job's events as an event stream only,
    401 on every route of the API, and every reference resolved; and real replies as
    declared."""
    server = documents_server
    document = httpx.get(f"{server.base}/openapi.json").json()
    text = json.dumps(document)
    schemas = document["components"]["schemas"]
    assert not set(re.findall(r"#/components/schemas/([\w.-]+)", text)) - set(schemas)
    paths = document["paths"]
    problem = {"$ref": "#/components/schemas/Problem"}
    for method, path in _operations(document, tags=[DOCUMENTS_TAG]):
        operation = paths[path][method.lower()]
        responses = operation["responses"]
        assert "401" in responses and operation["security"], (method, path)
        for status, response in responses.items():
            if status.startswith(("4", "5")):
                assert response["content"] == {"application/json": {"schema": problem}}, (
                    method,
                    path,
                    status,
                )
    upload = paths["/documents"]["post"]
    body = _schema(document, upload["requestBody"]["content"]["multipart/form-data"]["schema"])
    files = body["properties"]["files"]
    assert files["type"] == "array" and files["minItems"] == 1
    assert files["items"] == {"type": "string", "format": "binary"}
    for status in ("400", "403", "409", "413", "415", "507"):
        assert status in upload["responses"], status
    accepted = upload["responses"]["202"]
    assert accepted["content"]["application/json"]["schema"]["$ref"].endswith("/JobAccepted")
    assert accepted["headers"]["Location"]["required"] is True
    replace = paths["/documents/{path}"]["put"]
    part = _schema(document, replace["requestBody"]["content"]["multipart/form-data"]["schema"])
    assert part["properties"]["file"]["format"] == "binary"
    assert "404" in replace["responses"] and "202" in replace["responses"]
    assert "/" in paths["/documents/{path}"]["get"]["parameters"][0]["example"]
    events = paths["/jobs/{job_id}/events"]["get"]["responses"]["200"]["content"]
    assert list(events) == ["text/event-stream"]

    # Real replies: a job accepted with its Location, a refused upload's problem.
    reply = httpx.post(
        f"{server.base}/documents",
        data={"folder": "hr/declared"},
        files=[("files", ("declared.txt", b"The declared note: reply as declared."))],
        headers=key_header(server.editor),
    )
    job = job_of(reply)
    assert str(reply.status_code) in upload["responses"]
    refused = httpx.post(
        f"{server.base}/documents",
        files=[("files", ("fake.pdf", b"not a PDF at all"))],
        headers=key_header(server.editor),
    )
    assert refused.status_code == 415 and isinstance(refused.json()["detail"], str)
    no_key = httpx.get(f"{server.base}/jobs/{job['id']}")
    assert no_key.status_code == 401 and "401" in paths["/jobs/{job_id}"]["get"]["responses"]
    wait_for_job(server.base, server.editor, job["id"], timeout=120)


# What the people run adds to CONFIG: ids drawn from the seeded conversations (a delete
# from its own few), runs and the assistant.
PEOPLE_CONFIG = """
[dictionaries.conversations]
values = {conversations}

[dictionaries.removable]
values = {removable}

[dictionaries.removable_threads]
values = {removable_threads}

[dictionaries.runs]
values = {runs}

[dictionaries.assistants]
values = ["chat"]

[[operations]]
include-path-regex = "^/(conversations|threads)/"
exclude-method = "DELETE"
parameters = {{ "path.conversation_id" = {{ dictionary = "conversations", probability = 0.6 }}, \
"path.thread_id" = {{ dictionary = "conversations", probability = 0.6 }}, \
"path.run_id" = {{ dictionary = "runs", probability = 0.6 }} }}

[[operations]]
include-path-regex = "^/conversations/"
include-method = "DELETE"
parameters = {{ "path.conversation_id" = {{ dictionary = "removable", probability = 0.5 }} }}

[[operations]]
include-path-regex = "^/threads/"
include-method = "DELETE"
parameters = {{ "path.thread_id" = {{ dictionary = "removable_threads", probability = 0.5 }} }}

[[operations]]
include-path-regex = "^/assistants/"
parameters = {{ "path.assistant_id" = {{ dictionary = "assistants", probability = 0.5 }} }}
"""


def test_schemathesis_over_conversations_threads_and_sign_in(
    sample_index: Path, upstream: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """People's own routes with a real identity provider's bearer token: every reply as
    declared, every operation answered for real (2xx; the sign-in's redirect) at least once;
    without the token each closed one a declared 401."""
    from tests.oidc import oidc_provider

    workdir = tmp_path_factory.mktemp("schemathesis-people")
    with oidc_provider() as provider:
        token = provider.token("fuzzer", groups=["hr"])
        auth = {"Authorization": f"Bearer {token}"}
        env = {"RAGCHAINS_OIDC_ISSUER": provider.issuer, "RAGCHAINS_OIDC_CLIENT_ID": "ragchains"}
        with served(sample_index, upstream, workdir, **env) as base:
            seeded = []
            # Six to read and write, three for DELETE /conversations/{id} and three for
            # DELETE /threads/{id}: one pool for both let the first remove them all, and
            # the other then met only 404s.
            for n in range(12):
                made = httpx.post(f"{base}/conversations", json={}, headers=auth).json()
                turn = {"question": f"Seeded question {n}?", "output": {"answer": "Seeded."}}
                put = httpx.put(
                    f"{base}/conversations/{made['id']}/turns/t{n}", json=turn, headers=auth
                )
                assert put.status_code == 201, put.text
                seeded.append(made["id"])
            ran = httpx.post(
                f"{base}/threads/{seeded[0]}/runs/wait",
                json={
                    "assistant_id": "chat",
                    "input": {
                        "messages": [
                            {"role": "user", "content": "What does the standard plan cost?"}
                        ]
                    },
                },
                headers=auth,
                timeout=120,
            )
            assert ran.status_code == 200, ran.text
            runs = [
                r["run_id"]
                for r in httpx.get(f"{base}/threads/{seeded[0]}/runs", headers=auth).json()
            ]
            config = CONFIG + PEOPLE_CONFIG.format(
                conversations=json.dumps(seeded[:6]),
                removable=json.dumps(seeded[6:9]),
                removable_threads=json.dumps(seeded[9:]),
                runs=json.dumps(runs),
            )
            document = httpx.get(f"{base}/openapi.json").json()
            operations = _operations(document, tags=PEOPLE_TAGS)
            assert ("POST", "/threads/{thread_id}/runs/stream") in operations
            assert ("GET", "/auth/login") in operations
            _, har = _fuzz(
                base,
                workdir,
                30,
                f"Authorization: Bearer {token}",
                operations=operations,
                select=ONLY_PEOPLE,
                config=config,
            )
            _, refused = _fuzz(base, workdir, None, select=ONLY_PEOPLE, config=config)
            healthy = httpx.get(f"{base}/healthz").status_code
    answered = _answered_per_operation(har, lambda status: 200 <= status < 400)
    unanswered = [op for op in operations if not _answered(answered, op)]
    assert not unanswered, {op: _replies(har, op) for op in unanswered}
    no_token = _answered_per_operation(refused, lambda status: status == 401)
    closed = [op for op in operations if not op[1].startswith("/auth/") and op[1] != "/me"]
    assert not [op for op in closed if not _answered(no_token, op)], no_token
    assert healthy == 200
