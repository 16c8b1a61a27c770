"""GET /collection (issue 26): what a caller may ask about, as a user runs the server
(`ragchains serve` as a subprocess over an index `ragchains ingest --access` labelled), for
an index folder and a PostgreSQL store: each key counts only the files its groups may read;
no key gets 401. The counting, the kinds' labels and the domains' part without a server, too;
and the chat page's line that names them, in a real browser."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from ragchains.ingest.report import IngestReport
from ragchains.prompts.registry import PromptRegistry
from ragchains.retrievers.access import SIDECAR
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.formats import FORMATS
from ragchains.retrievers.indexformat import FileRecord
from ragchains.serving.collection import (
    CollectionSummary,
    count_files,
    domain_summaries,
    kind_labels,
    may_read,
)
from ragchains.serving.keys import add_key
from ragchains.settings import Settings
from tests.conftest import FIXTURES
from tests.servers import ragchains_serve
from tests.test_cli import run

# tests/fixtures/docs, which no rule labels: everyone's.
PUBLIC = {"json": 2, "csv": 1, "html": 1, "markdown": 1, "text": 1}


def _record(source: str, fmt: str, *access: str) -> FileRecord:
    return FileRecord(source, "0" * 64, 1, 1, fmt, tuple(access))


def test_files_are_counted_for_the_groups_that_may_read_them() -> None:
    records = [
        _record("a.md", "markdown"),
        _record("b.pdf", "pdf", "hr"),
        _record("c.pdf", "pdf", "hr", "eng"),
        _record("d.csv", "csv", "eng"),
    ]
    assert count_files(records, None) == (4, {"pdf": 2, "csv": 1, "markdown": 1})
    assert count_files(records, frozenset({"hr"})) == (3, {"pdf": 2, "markdown": 1})
    assert count_files(records, frozenset({"eng"})) == (3, {"csv": 1, "markdown": 1, "pdf": 1})
    assert count_files(records, frozenset()) == (1, {"markdown": 1})
    assert may_read((), frozenset()) and not may_read(("hr",), frozenset({"eng"}))


def test_each_known_kind_is_labelled_as_the_format_table_names_it() -> None:
    labels = kind_labels(f.name for f in FORMATS)
    assert list(labels) == [f.name for f in FORMATS]
    for f in FORMATS:
        assert labels[f.name].model_dump() == {"label": f.label, "label_plural": f.label_plural}
    assert labels["docx"].label == "Word document" and labels["pdf"].label_plural == "PDFs"
    # A format another release wrote has no label: the page shows its name.
    assert kind_labels(["rtf", "csv"]).keys() == {"csv"}


def test_domains_come_with_their_description_and_suggestions() -> None:
    domains = domain_summaries(PromptRegistry())
    assert domains[0].name == "default"
    hr = next(d for d in domains if d.name == "hr")
    assert hr.description.startswith("Employee handbook")
    assert hr.suggestions_ref == "hr/suggestions@v1" and 3 <= len(hr.suggestions) <= 4
    assert hr.scoped and hr.documents is None  # not counted: no index


def test_a_domains_questions_are_offered_only_where_their_files_are_readable() -> None:
    def counts(*scopes: Any) -> int:
        """A collection holding the handbook and no product table (the fake of FileCounts)."""
        return 0 if any(s.paths == ("catalog/**",) for s in scopes) else 3

    domains = {d.name: d for d in domain_summaries(PromptRegistry(), counts)}
    assert domains["hr"].suggestions and domains["hr"].documents == 3
    assert domains["catalog"].suggestions == [] and domains["catalog"].documents == 0
    assert domains["default"].suggestions and domains["default"].documents == 3


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    """tests/fixtures/docs plus two HR files (labelled by --access) and an engineering one
    (labelled by the folder's sidecar)."""
    target = tmp_path / "docs"
    shutil.copytree(FIXTURES / "docs", target)
    (target / "hr-salaries.md").write_text("# Salary bands\n\nSenior bands run to 118,000.\n")
    (target / "hr-payroll.csv").write_text("name,salary_band\nAda,7\nGrace,9\n")
    (target / "eng-roadmap.md").write_text("# Roadmap\n\nThe zephyr migration is in March.\n")
    (target / SIDECAR).write_text('[groups]\n"eng-*" = ["eng"]\n', encoding="utf-8")
    return target


def _collection(base: str, key: str | None) -> httpx.Response:
    headers = {"X-API-Key": key} if key else {}
    return httpx.get(f"{base}/collection", headers=headers, timeout=60)


@pytest.mark.e2e
@pytest.mark.slow
def test_each_key_sees_only_the_documents_its_groups_may_read(
    docs: Path, target: list[str], tmp_path: Path
) -> None:
    done = run("ingest", docs, *target, "--access", "docs/hr-*=hr")
    assert done.returncode == 0, done.stderr
    keys = tmp_path / "keys.toml"
    hr, eng = add_key(keys, "hana", ["hr"]), add_key(keys, "erik", ["eng"])
    nobody = add_key(keys, "olga", ["ops"])
    with ragchains_serve(*target, RAGCHAINS_KEYS_FILE=str(keys)) as base:
        as_hr, as_eng, as_ops = (_collection(base, key) for key in (hr, eng, nobody))
        no_key = _collection(base, None)
        wrong_key = _collection(base, "not-a-key")
        document = httpx.get(f"{base}/openapi.json", timeout=60).json()
    for reply in (as_hr, as_eng, as_ops):
        assert reply.status_code == 200, reply.text
        CollectionSummary.model_validate(reply.json())  # the shape the document declares
    hr_out: dict[str, Any] = as_hr.json()
    assert hr_out["documents"] == 8
    assert hr_out["kinds"] == {**PUBLIC, "markdown": 2, "csv": 2}
    assert hr_out["labels"] == {k: v.model_dump() for k, v in kind_labels(PUBLIC).items()}
    assert hr_out["labels"]["html"] == {"label": "web page", "label_plural": "web pages"}
    assert as_eng.json()["documents"] == 7
    assert as_eng.json()["kinds"] == {**PUBLIC, "markdown": 2}
    ops_out = as_ops.json()
    assert {**ops_out, "domains": None} == {
        **hr_out,
        "documents": 6,
        "kinds": PUBLIC,
        "domains": None,
    }
    assert list(hr_out["kinds"].values()) == sorted(hr_out["kinds"].values(), reverse=True)
    # Each domain's files, as each key may read them: default reads every file; the shipped
    # hr and catalog answer from the samples' handbook and tables, which these are not.
    for reply, readable in ((as_hr, 8), (as_eng, 7), (as_ops, 6)):
        domains = {d["name"]: d for d in reply.json()["domains"]}
        assert domains.keys() == {"default", "hr", "catalog"}
        assert (domains["default"]["documents"], domains["default"]["scoped"]) == (readable, False)
        assert domains["hr"]["scoped"] and domains["hr"]["documents"] == 0
        assert domains["catalog"]["description"].startswith("Product catalog")
        # The shipped questions are about the samples' files, none of them here: none offered.
        assert all(
            d["suggestions"] == [] and d["suggestions_ref"] is None for d in domains.values()
        )
    assert no_key.status_code == 401 and wrong_key.status_code == 401
    # In the API's document: its reply's schema, and the key it needs.
    get = document["paths"]["/collection"]["get"]
    ok = get["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/CollectionSummary"}
    assert "401" in get["responses"] and get["security"]
    assert set(document["components"]["schemas"]["CollectionSummary"]["required"]) == {
        "documents",
        "kinds",
        "labels",
        "domains",
    }


# ----------------------------------------------------------------------------- the page
@pytest.mark.slow
@pytest.mark.browser
def test_the_page_names_each_kind_by_the_label_the_summary_gives(
    browser: Any,
    settings: Settings,
    embedder: SentenceTransformerEmbedder,
    ingest_into: Callable[..., IngestReport],
    docs_dir: Path,
    tmp_path: Path,
) -> None:
    """The chat page's empty state counts the documents in the words GET /collection gives
    for each format; a format it gives none for (another release's) is shown by its name."""
    from langchain_core.language_models import FakeListChatModel

    from ragchains.chains.llm import LLM
    from ragchains.server import create_app
    from tests.browser import open_page
    from tests.servers import serving

    index = tmp_path / "index"
    ingest_into(docs_dir, index)
    llm = LLM(model=FakeListChatModel(responses=["unused"]), name="fake")
    app = create_app(settings.model_copy(update={"index": index}), llm=llm, embedder=embedder)
    listed = "2 JSON files, 1 CSV table, 1 web page, 1 Markdown file, 1 text file"
    with serving(app) as base:
        shown = open_page(browser, base, width=1024, height=768)
        try:
            holdings = shown.page.locator(".holdings")
            holdings.wait_for()
            assert holdings.inner_text() == f"6 documents you can ask about: {listed}."

            def with_unknown_format(route: Any) -> None:
                reply = route.fetch()
                summary = reply.json()
                summary["documents"] += 1
                summary["kinds"]["rtf"] = 1
                route.fulfill(response=reply, json=summary)

            shown.page.route("**/collection", with_unknown_format)
            shown.page.reload()
            holdings.filter(has_text="rtf").wait_for()
            assert holdings.inner_text() == f"7 documents you can ask about: {listed}, 1 rtf."
            shown.assert_clean()
        finally:
            shown.page.close()
