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

_VERSION = r"(?:v|version\s+|release\s+)?\d+(?:\.\d+)+"  # 1.6.0, v1.6, Version 1.6
_DATE = r"\d{4}-\d{2}-\d{2}"
# A heading that is a version and nothing more but its date ("0.27.1 (2026-08-03)",
# "[2.0.0] - 2023-05-01"), a dated entry, or the next release's: never a numbered
# section of a manual ("2.1 Getting started").
_VERSION_HEADING = re.compile(
    rf"^\s*\[?(?:{_VERSION}|{_DATE}|unreleased)\]?"
    r"(?:\s*\([^)]*\)|\s*[-\u2013\u2014/:]\s*[^\s].*\d.*)?\s*$",
    re.IGNORECASE,
)
# A question that asks about versions or changes wants the entries where they rank.
_ASKS_ABOUT_VERSIONS = re.compile(
    r"\d+\.\d+|\bchange ?logs?\b|\breleases?\b|\breleased\b|\bversions?\b|\bdeprecat"
    r"|\bwhat'?s new\b|\b(?:new|added|removed|changed|introduced) in\b|\bupgrad",
    re.IGNORECASE,
)
SECTION_SEPARATOR = " > "


def is_version_entry(doc: Document) -> bool:
    """Whether ``doc`` is a section of release notes about one version (or the next)."""
    section = doc.metadata.get("section")
    if not isinstance(section, str) or not section:
        return False
    return any(_VERSION_HEADING.match(part) for part in section.split(SECTION_SEPARATOR))


def asks_about_versions(query: str) -> bool:
    return bool(_ASKS_ABOUT_VERSIONS.search(query))


def version_entries_last(docs: Sequence[Document], query: str) -> list[Document]:
    """``docs`` in their order, the changelog entries after the rest (in their own order),
    unless ``query`` asks about versions or changes."""
    if asks_about_versions(query):
        return list(docs)
    entries = [is_version_entry(doc) for doc in docs]
    if not any(entries):
        return list(docs)
    return [d for d, e in zip(docs, entries, strict=True) if not e] + [
        d for d, e in zip(docs, entries, strict=True) if e
    ]
