"""Glob lists on ``filename``/``source`` (issue 30, case 2): 16 filters of 1,000 globs took
12.5-15.6 s over 2,051 files and held every other caller's /retrieve. A request now carries
at most ``MAX_GLOBS`` globs (refused at once beyond, as a 422 with the reason), and the
globs it may carry keep fnmatch's meaning on disk and in PostgreSQL."""

from __future__ import annotations

import fnmatch
import itertools

import httpx
import psycopg
import pytest

from ragchains.retrievers.filters import (
    MAX_FILTERS,
    MAX_GLOBS,
    MAX_IN_VALUES,
    FilterError,
    MetadataColumns,
    MetadataFilter,
    validate_filters,
)
from ragchains.retrievers.pgfilters import any_of, glob_regex
from tests.postgres import LocalPostgres

NAMES = [
    "a.pdf",
    "A.PDF",
    "report.md",
    "Report.MD",
    "docs/a.pdf",
    "docs/sub/b.md",
    "docs\\win.txt",
    ".hidden",
    "x?y",
    "x[y",
    "b-c.txt",
    "ab",
    "",
    "é.txt",
    "line\nbreak.md",
]
PATTERNS = [
    "*.pdf",  # case-sensitive: not A.PDF
    "*.PDF",
    "?.pdf",
    "docs/*",  # * crosses path separators, as in fnmatch
    "docs/?.pdf",
    "*/*/*.md",
    "docs\\*",
    "[ab]*",
    "[!a]*.md",
    "[a-c]-*",
    "[]x]*",
    "x[?]y",
    "x[[]y",
    "*.*",
    "?",
    "??",
    "*",
    "*break*",
    "[z-a]*",  # a reversed range matches nothing
]


@pytest.mark.parametrize("size", [1, 2, 5])
def test_glob_lists_match_as_fnmatch_does(size: int) -> None:
    """Every combination of ``size`` patterns, as ``in`` (any of them) and as ``=`` / ``!=``
    for one, against fnmatch.fnmatchcase: ``*``, ``?``, ``[...]``, ``[!...]``, case and
    path separators kept."""
    columns = MetadataColumns(
        [{"filename": n} for n in NAMES] + [{}],  # a row without the field never matches
        {"filename": "string"},
    )
    combos = list(itertools.combinations(PATTERNS, size))[:200]
    for combo in combos:
        listed = [*combo, "report.md"] if size > 1 else list(combo)  # a literal among globs
        expected = [any(fnmatch.fnmatchcase(n, p) for p in listed) for n in NAMES] + [False]
        got = columns.mask([MetadataFilter(field="filename", op="in", value=listed)])
        assert got is not None and got.tolist() == expected, listed
        if size == 1:
            (pattern,) = combo
            same = columns.mask([MetadataFilter(field="filename", op="=", value=pattern)])
            other = columns.mask([MetadataFilter(field="filename", op="!=", value=pattern)])
            assert same is not None and same.tolist() == expected, pattern
            assert other is not None and other.tolist() == [not e for e in expected[:-1]] + [False]


def test_more_globs_than_the_limit_are_refused_and_exact_lists_are_not() -> None:
    schema = {"filename": "string", "source": "string"}
    half = MAX_GLOBS // 2
    at_limit = [
        {"field": "filename", "op": "in", "value": [f"*{n}.md" for n in range(half)]},
        {"field": "source", "op": "in", "value": [f"x/{n}*" for n in range(half)]},
    ]
    assert len(validate_filters(at_limit, schema)) == 2
    over = [*at_limit, {"field": "filename", "op": "=", "value": "*.pdf"}]
    with pytest.raises(FilterError, match=f"the limit is {MAX_GLOBS}") as caught:
        validate_filters(over, schema)
    assert len(str(caught.value)) < 200 and "\n" not in str(caught.value)
    # Exact names are not globs: the full lists stay allowed.
    exact = [
        {"field": "filename", "op": "in", "value": [f"{n}.md" for n in range(MAX_IN_VALUES)]}
    ] * MAX_FILTERS
    assert len(validate_filters(exact, schema)) == MAX_FILTERS


def hostile_body() -> dict[str, object]:
    """The probe's request: 16 filters of 1,000 distinct globs on filename."""
    filters = [
        {"field": "filename", "op": "in", "value": [f"*{f:02d}-{n:04d}*.md" for n in range(1000)]}
        for f in range(16)
    ]
    return {"input": {"query": "travel policy", "filters": filters}}


def test_sixteen_lists_of_a_thousand_globs_are_refused_at_once(sample_server: str) -> None:
    """16 lists of 1,000 globs took 12-16 s over 2,000 files (bench.hostile_filters times
    the refusal); the refusal's reason shows no glob was matched."""
    body = hostile_body()
    refused = httpx.post(f"{sample_server}/retrieve/invoke", json=body, timeout=120)
    assert refused.status_code == 422, refused.text[:300]
    assert f"the limit is {MAX_GLOBS}" in refused.text and len(refused.text) < 1000
    # The globs a request may carry are answered, with the documents they name.
    decoys = [f"*zz{n:03d}*" for n in range(MAX_GLOBS - 2)]
    allowed = [
        {"field": "filename", "op": "in", "value": [*decoys, "travel-*.pdf", "*-policy.p?f"]},
    ]
    found = httpx.post(
        f"{sample_server}/retrieve/invoke",
        json={"input": {"query": "travel hotel per night", "filters": allowed}},
        timeout=60,
    )
    assert found.status_code == 200, found.text[:300]
    names = {d["metadata"]["filename"] for d in found.json()["output"]}
    assert names and names <= {"travel-policy.pdf", "security-policy.pdf"}
    assert "travel-policy.pdf" in names
    assert httpx.get(f"{sample_server}/healthz").status_code == 200


def test_a_glob_list_is_one_expression_in_postgresql(postgres: LocalPostgres) -> None:
    """The list's patterns joined into one expression match what any of them matches, as
    fnmatch does (PostgreSQL then compiles the list once, not once per row)."""
    patterns = [p for p in PATTERNS if glob_regex(p) is not None]
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        for size in (1, 3, len(patterns)):
            for combo in list(itertools.combinations(patterns, size))[:40]:
                joined = any_of([r for p in combo if (r := glob_regex(p)) is not None])
                for name in (n for n in NAMES if "\x00" not in n):
                    row = conn.execute("SELECT %s ~ %s", (name, joined)).fetchone()
                    expected = any(fnmatch.fnmatchcase(name, p) for p in combo)
                    assert row is not None and row[0] is expected, (combo, name)
