"""Release notes after the pages that explain: a changelog entry outranks no other result
unless the question asks about versions or changes.

A changelog is a long list of one-line entries that name nearly every feature, so a
question about a feature matches its entry ("Add support for X") as well as the page that
explains X, and often better: on Typer's and MkDocs' documentation the release notes were
the first kept source for 4 and 10 of 35 questions (issue 45). An entry is told by its
section, not its file's name: a heading on its section path that is a version ("0.9.1
(2024-01-02)", "Version 1.6.0", "[2.0.0] - 2023-05-01", "v3.1") or "Unreleased" (Keep a
Changelog's). The explaining sections of the same file (an upgrade guide under "Release
Notes > Upgrading") are not entries.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from langchain_core.documents import Document

_PRERELEASE = r"(?:[-.]?(?:a|b|rc|alpha|beta|dev|post|pre)\.?\d*)?"
_NUMBER = rf"\d+(?:\.\d+)+{_PRERELEASE}"
_DATE = r"\d{4}-\d{2}-\d{2}"
# What may follow a version: a dated tail ("(2026-08-03)", "- 2023-05-01", "(January 5,
# 2021)"): a tail holding a year. A bare "3.2 - Step 1" or "4.1 (a)" has none.
_DATED = r"(?:\s*\((?=[^)]*\b\d{4}\b)[^)]*\)|\s*[-\u2013\u2014/:]\s*(?=.*\b\d{4}\b).+)"
# A release's name after it: "v1.2.3 (2024-01-01) - Aurora" (never after a bare x.y).
_NAMED = r"(?:\s*[-\u2013\u2014:]\s*.+)?"
# A heading that is a release and nothing more but its date: "Version 1.6.1 (2024-08-30)",
# "v3.1", "Release 2", "1.6.0", "0.27.1 (2026-08-03)", "[2.0.0] - 2023-05-01",
# "[1.2.3](https://...) (2023-01-01)", "pytest 7.4.0 (2023-06-23)" (towncrier's), a dated
# entry, "Unreleased". A numbered section of a manual ("2.1 Getting started", "3.1") is not:
# a bare two-part number must carry a date, a project's name before it too.
_VERSION_HEADING = re.compile(
    r"^\s*(?:"
    rf"\[?(?:v|version\s+|release\s+v?)\d+(?:\.\d+)*{_PRERELEASE}\]?(?:\([^)]*\))?{_DATED}?{_NAMED}"
    rf"|\[?\d+\.\d+\.\d+{_PRERELEASE}\]?(?:\([^)]*\))?{_DATED}?{_NAMED}"
    rf"|\[?{_NUMBER}\]?(?:\([^)]*\))?{_DATED}"
    rf"|[\w.-]+\s+v?{_NUMBER}{_DATED}"
    rf"|\[?{_DATE}\]?{_DATED}?"
    r"|\[?unreleased\]?"
    r")\s*$",
    re.IGNORECASE,
)
# A question that asks about versions or changes wants the entries where they rank.
_ASKS_ABOUT_VERSIONS = re.compile(
    r"\d+\.\d+|\bchange ?logs?\b|\breleases?\b|\breleased\b|\bversions?\b|\bdeprecat"
    r"|\bwhat'?s new\b|\bchange[sd]?\b|\bbreaking\b|\badded\b|\bintroduced\b|\bupgrad",
    re.IGNORECASE,
)
SECTION_SEPARATOR = " > "


def is_version_entry(doc: Document) -> bool:
    """Whether ``doc`` is a section of release notes about one version (or the next)."""
    section = doc.metadata.get("section")
    if not isinstance(section, str) or not section:
        return False
    return any(_VERSION_HEADING.match(part) for part in section.split(SECTION_SEPARATOR))


def asks_about_versions(queries: str | Sequence[str]) -> bool:
    """Whether any of ``queries`` (a turn's phrasings) asks about versions or changes."""
    asked = [queries] if isinstance(queries, str) else queries
    return any(_ASKS_ABOUT_VERSIONS.search(query) for query in asked)


def version_entries_last(docs: Sequence[Document], queries: str | Sequence[str]) -> list[Document]:
    """``docs`` in their order, the changelog entries after the rest (in their own order),
    unless one of ``queries`` asks about versions or changes."""
    if asks_about_versions(queries):
        return list(docs)
    entries = [is_version_entry(doc) for doc in docs]
    if not any(entries):
        return list(docs)
    return [d for d, e in zip(docs, entries, strict=True) if not e] + [
        d for d, e in zip(docs, entries, strict=True) if e
    ]
