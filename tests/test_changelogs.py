"""Release notes rank after the page that explains a feature (issue 45): unit tests of the
rule, and `ragchains ingest` + `ragchains serve`'s /retrieve over a folder of both."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from langchain_core.documents import BaseDocumentCompressor, Document

from ragchains.chains.changelogs import asks_about_versions, is_version_entry, version_entries_last
from ragchains.chains.compress import compression
from ragchains.chains.retrieve import doc_key


def _doc(section: str, text: str = "x") -> Document:
    return Document(page_content=text, metadata={"section": section})


@pytest.mark.parametrize(
    "section",
    [
        "Release Notes > 0.27.1 (2026-08-03) > Features",  # Typer's
        "Release Notes > Version 1.6.1 (2024-08-30) > Fixed",  # MkDocs'
        "Changelog > [2.0.0] - 2023-05-01 > Added",  # Keep a Changelog
        "Changelog > [Unreleased]",
        "History > v3.1",
        "News > 2024-08-30",
        "Changes > pytest 7.4.0 (2023-06-23)",  # towncrier's
        "Changelog > [1.2.3](https://example.org/compare/v1.2.2...v1.2.3) (2023-01-01)",
        "History > 1.0.0rc1",
        "History > Release v1.2.0",
        "History > v1.2.3 (2024-01-01) - Aurora",
    ],
)
def test_a_section_under_a_version_heading_is_an_entry(section: str) -> None:
    assert is_version_entry(_doc(section))


@pytest.mark.parametrize(
    "section",
    [
        "Release Notes",  # the file's introduction
        "Release Notes > Upgrading",  # an upgrade guide explains
        "Manual > 2.1 Getting started",  # a numbered section of a manual
        "Guide > Python 3.10 support",
        "Policy > 2.1: Installing Python 3",
        "Policy > 3.2 - Step 1",
        "Policy > 4.1 (a)",
        "Policy > 3.1",
        "Network > 192.168.0.1",
        "",
    ],
)
def test_other_sections_are_not(section: str) -> None:
    assert not is_version_entry(_doc(section))
    assert not is_version_entry(Document(page_content="x"))  # no section at all


def test_entries_go_after_the_rest_unless_the_question_asks_about_versions() -> None:
    entry, page, other = _doc("Notes > 1.2.0"), _doc("Guide > Completion"), _doc("Guide > Tests")
    assert version_entries_last([entry, page, other], "shell completion") == [page, other, entry]
    for query in ("what changed in 1.2", "when was completion added in", "release notes"):
        assert asks_about_versions(query)
        assert version_entries_last([entry, page], query) == [entry, page]
    assert version_entries_last([page, other], "tests") == [page, other]
    # Any phrasing of the turn may ask: the user's words beside a rewrite.
    assert version_entries_last([entry, page], ["completion", "breaking changes"]) == [entry, page]
    for query in ("how do I test a command", "install shell completion", "password prompt"):
        assert not asks_about_versions(query)


class _Reranker(BaseDocumentCompressor):
    """A reranker that scores the changelog entry best, as a cross-encoder may."""

    top_n: int = 1

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Any = None
    ) -> Sequence[Document]:
        scored = [
            Document(d.page_content, metadata={**d.metadata, "relevance_score": s})
            for d, s in zip(documents, (0.4, 0.9), strict=True)
        ]
        return sorted(scored, key=lambda d: -d.metadata["relevance_score"])[: self.top_n]


def test_a_reranker_does_not_put_the_entry_back_before_the_cut() -> None:
    page, entry = _doc("Guide > Completion", "page"), _doc("Notes > 1.2.0", "entry")
    kept = compression(_Reranker(), [page, entry], "shell completion", key=doc_key).invoke()
    assert [d.page_content for d in kept.documents] == ["page"]
    asked = compression(_Reranker(), [page, entry], "what changed in 1.2", key=doc_key).invoke()
    assert [d.page_content for d in asked.documents] == ["entry"]


FEATURE = """# Shell completion

## Install completion

To install shell completion for your program, run it once with `--install-completion`.
Completion works in Bash, Zsh, Fish and PowerShell; restart the terminal afterwards.
"""


def _release_notes() -> str:
    entries = [
        f"## 0.{n}.0 ({2020 + n // 10}-0{1 + n % 9}-1{n % 10})\n\n"
        f"* Fix shell completion install for Zsh, case {n}. PR #{100 + n}.\n"
        f"* Install completion in PowerShell, part {n}. PR #{200 + n}.\n"
        for n in range(5, 0, -1)
    ]
    return "# Release Notes\n\n" + "\n".join(entries)


@pytest.mark.e2e
def test_retrieve_through_ragchains_serve_puts_the_feature_page_first(tmp_path: Path) -> None:
    from tests.servers import ragchains_serve
    from tests.test_cli import run

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "completion.md").write_text(FEATURE)
    (docs / "release-notes.md").write_text(_release_notes())
    index = tmp_path / "index"
    assert run("ingest", docs, "--index", index, "-q").returncode == 0

    def retrieved(base: str, query: str) -> list[dict]:
        body = {"input": {"query": query}, "config": {"configurable": {"threshold": 0.0}}}
        reply = httpx.post(f"{base}/retrieve/invoke", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        return list(reply.json()["output"])

    with ragchains_serve("--index", str(index)) as base:
        found = retrieved(base, "install shell completion zsh powershell")
        assert found[0]["metadata"]["source"].endswith("completion.md"), [
            (d["metadata"]["source"], d["metadata"].get("section")) for d in found
        ]

        # The entry was fused above the page: the rule, not the search, put the page first.
        def best(name: str) -> float:
            fused = [d["metadata"]["convex_score"] for d in found]
            sources = [d["metadata"]["source"] for d in found]
            return max(s for s, src in zip(fused, sources, strict=True) if src.endswith(name))

        assert best("release-notes.md") > best("completion.md"), found
        versions = retrieved(base, "what changed in 0.5.0 for shell completion")
        assert versions[0]["metadata"]["source"].endswith("release-notes.md"), versions
