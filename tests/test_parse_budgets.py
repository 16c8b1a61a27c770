"""Each file is parsed in a worker process under a memory and a time budget (issue 40): a
file over one is skipped with the reason, the rest is read, and what the index held stays.
Through ``ragchains ingest`` as a user runs it, its processes' memory watched."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from ragchains.ingest.chunking import Chunker
from ragchains.ingest.loaders import load_file
from ragchains.ingest.parsing import ParseBudget, Parsed, ParseJob, parse_files
from ragchains.ingest.parts import LoadOptions
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.searchindex import load_index
from tests.conftest import REPO
from tests.fixtures.make_office import (
    write_long_xlsx,
    write_shared_strings_bomb,
    write_wide_xlsx,
)
from tests.ingestrun import RAGCHAINS, ingest_watched

pytestmark = pytest.mark.e2e

SCAN = REPO / "samples" / "scans" / "office-safety-notice.pdf"


def test_a_shared_strings_bomb_is_skipped_for_memory_and_the_rest_is_read(tmp_path: Path) -> None:
    """A 110 KB workbook whose cells read as 1.6 GB of text: skipped with the memory reason
    within the time budget, the ingest's processes each under 1.5 GB; the file beside it
    read; what an earlier run indexed is kept."""
    folder = tmp_path / "in"
    shutil.copytree(REPO / "samples" / "policies", folder / "policies")
    index = tmp_path / "idx"
    first = ingest_watched(folder, "--index", index, "--json")
    assert first.returncode == 0, first.stderr
    bomb = write_shared_strings_bomb(folder / "expansion.xlsx")
    assert bomb.stat().st_size < 150_000
    (folder / "note.md").write_text("# Note\n\nThe lobby opens at seven.\n")

    run = ingest_watched(folder, "--index", index, "--json", "--workers", "2")

    assert run.returncode == 0, run.stderr
    assert run.reasons() == {"in/expansion.xlsx": "over the 1 GB memory budget while parsing"}
    report = run.report()
    assert report["added"] == 1 and report["unchanged"] == 2  # note.md; the policies kept
    assert run.peak_process_mb < 1536, run
    assert run.peak_total_mb < 1536 + 1024, run  # the run and two workers at their budget
    sources = {chunk.metadata["source"] for chunk in load_index(index).store.iter_chunks()}
    assert sources == {
        "in/note.md",
        *(f"in/policies/{p.name}" for p in folder.glob("policies/*")),
    }


def test_a_file_over_its_time_budget_is_skipped_and_the_others_are_read(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(SCAN, folder / "scan.pdf")  # OCR: seconds a page
    (folder / "note.md").write_text("# Note\n\nThe lobby opens at seven.\n")
    run = ingest_watched(folder, "--index", tmp_path / "idx", "--json", "--file-timeout", "0.5")
    assert run.returncode == 0, run.stderr
    assert run.reasons() == {"in/scan.pdf": "over the 0.5 s time budget while parsing"}
    assert run.report()["added"] == 1


def test_a_worker_killed_mid_parse_fails_only_its_file(tmp_path: Path) -> None:
    """A parsing process killed from outside (as the OOM killer would): that file is
    skipped with the reason, the run goes on and writes the others."""
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(SCAN, folder / "a-scan.pdf")
    for name in ("b", "c"):
        (folder / f"{name}.md").write_text(f"# {name}\n\nText of {name} about the garden.\n")
    killed: list[int] = []

    def kill_the_ocr_worker() -> None:
        # The worker parsing the scan is the one with a tesseract child, forked by this
        # run's forkserver: other tests on the other pytest worker may run tesseract too,
        # and their processes may end while we look at them.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            for process in psutil.process_iter(["name", "ppid"]):
                if process.info["name"] != "tesseract":
                    continue
                try:
                    with_ocr = psutil.Process(process.info["ppid"])
                    ancestors = with_ocr.parents()
                    ours = any(a.pid == os.getpid() for a in ancestors)
                    forked = bool(ancestors) and "forkserver" in " ".join(ancestors[0].cmdline())
                    if ours and forked:
                        with_ocr.send_signal(signal.SIGKILL)
                        killed.append(with_ocr.pid)
                        return
                except psutil.Error:
                    continue
            time.sleep(0.02)

    killer = threading.Thread(target=kill_the_ocr_worker)
    killer.start()
    run = ingest_watched(folder, "--index", tmp_path / "idx", "--json", "--workers", "1")
    killer.join()
    assert killed
    assert run.returncode == 0, run.stderr
    assert run.reasons() == {
        "in/a-scan.pdf": "the parsing process was killed (SIGKILL: the machine out of memory, "
        "or a stop from outside)"
    }
    assert run.report()["added"] == 2


def test_ingest_help_names_the_budgets() -> None:
    shown = subprocess.run(
        [str(RAGCHAINS), "ingest", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for option in ("--workers", "--file-memory", "--file-timeout"):
        assert option in shown


def _parsed(path: Path, seconds: float, embedder: SentenceTransformerEmbedder) -> Parsed | str:
    chunker = Chunker(embedder.token_counter(), chunk_size=200, chunk_overlap=40)
    job = ParseJob(path.name, path, "0" * 64)
    budget = ParseBudget(seconds=seconds, workers=1)
    ((_, outcome),) = parse_files([job], chunker=chunker, options=LoadOptions(), budget=budget)
    return outcome


def test_a_sheet_16384_columns_wide_is_read_within_a_10_s_budget(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    """Its header cells all read 1: named column by column (it was cubic: over an hour),
    in a worker given 10 s."""
    path = write_wide_xlsx(tmp_path / "wide.xlsx")
    outcome = _parsed(path, 10, embedder)
    assert isinstance(outcome, Parsed), outcome
    assert "16,320 columns after the first 64" in outcome.partial[0]
    (row,) = load_file(path).parts
    lines = row.text.splitlines()
    assert len(lines) == 16_384 and lines[1] == "1 (2): 1" and lines[-1] == "1 (16384): 16383"
    assert len(row.fields) == 64


@pytest.mark.long
def test_a_sheet_of_a_million_cells_is_read_within_the_default_budget(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    """10,000 rows of 100 columns, streamed (its XML is over the full-load size)."""
    path = write_long_xlsx(tmp_path / "million.xlsx", 10_000, columns=100)
    outcome = _parsed(path, 120, embedder)  # 12 to 16 s on an idle 2-core machine
    assert isinstance(outcome, Parsed), outcome
    assert {chunk.metadata["location"]["row"] for chunk in outcome.chunks} == set(range(2, 10_002))


def test_a_reports_title_block_is_read_above_its_table(tmp_path: Path) -> None:
    import openpyxl

    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Report"
    sheet["A1"] = "Quarterly sales by region"
    sheet.merge_cells("A1:D1")
    sheet["A2"] = "Fiscal year 2025, figures in EUR"
    sheet.append([])
    sheet.append(["Region", "Q1", "Q2", "Owner"])
    sheet.append(["North", 100, 200, "Ada"])
    sheet.append(["South", 110, 210, "Bo"])
    book.save(tmp_path / "report.xlsx")
    loaded = load_file(tmp_path / "report.xlsx")
    title, north, south = loaded.parts
    assert title.text == "Quarterly sales by region\nFiscal year 2025, figures in EUR"
    assert title.anchor == "sheet=Report&row=1"
    assert north.text == "Region: North\nQ1: 100\nQ2: 200\nOwner: Ada" and north.row == 5
    assert south.fields == {"Region": "South", "Q1": 110, "Q2": 210, "Owner": "Bo"}


def test_budgeted_calls_return_or_say_which_budget_a_call_outgrew() -> None:
    """What the server's file viewer reads a file with: a worker under the budget."""
    from ragchains.ingest.parsing import BudgetedCalls
    from ragchains.ingest.parts import SkipFile
    from tests.costly import allocate, sleep

    calls = BudgetedCalls(ParseBudget(memory_mb=512, seconds=2))
    try:
        assert calls.call(allocate, 64) == 64 * 2**20
        with pytest.raises(SkipFile, match=r"^over the 512 MB memory budget while parsing$"):
            calls.call(allocate, 1024)
        with pytest.raises(SkipFile, match=r"^over the 2 s time budget while parsing$"):
            calls.call(sleep, 30)
        assert calls.call(sleep, 0) == 0  # a fresh worker after the one that was ended
    finally:
        calls.close()


def _excepthook_name() -> str:
    import sys

    return str(sys.excepthook.__qualname__)


def test_a_worker_a_closed_pool_no_longer_wants_ends_without_a_traceback() -> None:
    """A pool may fork a worker just as its last file is done; the pool closes, and the
    worker cannot read what it was sent (its semaphores gone). That once printed a
    traceback in the middle of a good `ragchains ingest` (2 runs in 48, two files each, on
    a busy machine). The workers' forkserver preloads ``workerstart``, whose hook says
    nothing of such a start and passes anything else to Python's."""
    from ragchains.ingest import workerstart
    from ragchains.ingest.parsing import _context

    with _context().Pool(1) as pool:
        assert pool.apply(_excepthook_name) == "_quiet_unwanted_start"
    said: list[object] = []
    original = sys.__excepthook__
    sys.__excepthook__ = lambda *exc: said.append(exc[1])  # type: ignore[assignment]
    try:
        gone = FileNotFoundError(2, "No such file or directory")
        workerstart._quiet_unwanted_start(FileNotFoundError, gone, None)
        bug = ValueError("a real failure")
        workerstart._quiet_unwanted_start(ValueError, bug, None)
    finally:
        sys.__excepthook__ = original
    assert said == [bug]
