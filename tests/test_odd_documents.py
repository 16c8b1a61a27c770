"""The robustness corpus (tests/odd_documents/: 156 odd and hostile files from public test
corpora, SOURCES.md) through ``ragchains ingest`` as a user runs it (issue 40): every file is
read, or skipped with the reason expected of it (expected.json); no process of the run grows
past its budget; no file stalls the run; and a file whose XML holds text (counted by
tests/oddtext.py, independently of the loaders) is never skipped as empty.

expected.json is the corpus's record, reviewed by hand: when a loader changes what a file
gives, run this test, read the difference, and mend the loader or the record.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.ingestrun import WatchedRun, ingest_watched
from tests.oddtext import count_words

pytestmark = pytest.mark.e2e

CORPUS = Path(__file__).parent / "odd_documents"
EXPECTED = json.loads((CORPUS / "expected.json").read_text())
# Reasons that say a file has no text: never for a file whose XML holds words.
EMPTY = ("has no text", "is empty", "no rows with text", "has no slides", "empty file")
# Part kinds oddtext counts that a default run does not read (Word comments need
# --word-notes). A file with a single word elsewhere (a notes page's slide-number field)
# holds no text to read.
NOT_READ_BY_DEFAULT = {"comments"}


@pytest.fixture(scope="module")
def corpus_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], WatchedRun]:
    folder = tmp_path_factory.mktemp("odd") / "odd"
    folder.mkdir()
    for name in EXPECTED:
        shutil.copy(CORPUS / name, folder / name)
    index = folder.parent / "idx"
    run = ingest_watched(folder, "--index", index, "--json", "--workers", "2")
    assert run.returncode == 0, run.stderr
    return {source.removeprefix("odd/"): r for source, r in run.reasons().items()}, run


def test_each_file_is_read_or_skipped_with_its_expected_reason(
    corpus_run: tuple[dict[str, str], WatchedRun],
) -> None:
    reasons, run = corpus_run
    report = run.report()
    outcomes = {name: reasons.get(name, "read") for name in EXPECTED}
    wrong = {
        name: outcomes[name]
        for name, expected in EXPECTED.items()
        if not outcomes[name].startswith(expected)
    }
    assert not wrong, wrong
    assert report["added"] == sum(1 for e in EXPECTED.values() if e == "read")
    assert all("\n" not in reason for reason in reasons.values())  # one line each


def test_no_file_outgrows_its_budget_nor_stalls_the_run(
    corpus_run: tuple[dict[str, str], WatchedRun],
) -> None:
    reasons, run = corpus_run
    assert run.peak_process_mb < 1536, run
    assert not [r for r in reasons.values() if "time budget" in r]
    # The one file expected over its memory budget is the shared-strings expansion.
    assert [n for n, r in reasons.items() if "memory budget" in r] == [
        "poi-poc-shared-strings.xlsx"
    ]


def test_a_file_whose_xml_holds_text_is_never_skipped_as_empty(
    corpus_run: tuple[dict[str, str], WatchedRun],
) -> None:
    reasons, _ = corpus_run
    missed = {}
    for name, reason in reasons.items():
        counted = count_words(CORPUS / name)
        if counted is None or not any(marker in reason for marker in EMPTY):
            continue
        words = {
            kind: n
            for kind, n in counted.items()
            if n and kind not in ("total", "skipped_parts", "unreadable_parts")
        }
        if sum(n for kind, n in words.items() if kind not in NOT_READ_BY_DEFAULT) >= 2:
            missed[name] = (reason, words)
        elif words.get("comments"):
            assert "--word-notes" in reason, (name, reason)  # says how to have them read
    assert not missed, missed
