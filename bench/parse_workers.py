"""Ingest throughput of a mixed Office/PDF folder with 1 and with 2 parsing worker processes,
in the same run, and the peak memory of the run's processes (issue 40).

The folder: the samples' PDF (one of them scanned, so OCR), Word, PowerPoint and Excel files,
and the files of the robustness corpus (tests/odd_documents) that are read, each copied
``--copies`` times under new names. Two measures, medians over ``--repeats`` with the worker
counts alternating:
- parsing alone (``ingest.parsing.parse_files``: load and chunk, every file, in workers under
  the default budget), files per second;
- ``ragchains ingest --rebuild`` end to end (parse, embed, write), seconds, and the peak RSS of
  its largest process and of all its processes at once (tests/ingestrun.py samples them).
Ratios are against one worker, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import REPO, machine_line, write_section
from ragchains.factory import build_embedder
from ragchains.ingest.chunking import Chunker
from ragchains.ingest.parsing import ParseBudget, Parsed, ParseJob, parse_files
from ragchains.ingest.parts import LoadOptions
from ragchains.settings import Settings
from tests.ingestrun import ingest_watched

MIXED = (".pdf", ".docx", ".pptx", ".xlsx", ".docm", ".pptm", ".xlsm")
CORPUS = REPO / "tests" / "odd_documents"


def build_folder(folder: Path, copies: int) -> list[Path]:
    expected = json.loads((CORPUS / "expected.json").read_text())
    sources = [p for p in sorted((REPO / "samples").rglob("*")) if p.suffix in MIXED]
    sources += [CORPUS / n for n, outcome in sorted(expected.items()) if outcome == "read"]
    sources = [p for p in sources if p.suffix.lower() in MIXED]
    written = []
    for copy in range(copies):
        for number, source in enumerate(sources):
            target = folder / f"{copy:02d}-{number:03d}-{source.name}"
            shutil.copy(source, target)
            written.append(target)
    return written


def parse_seconds(files: list[Path], workers: int, chunker: Chunker) -> tuple[float, int]:
    jobs = [ParseJob(p.name, p, f"{i:064d}") for i, p in enumerate(files)]
    start = time.perf_counter()
    outcomes = list(
        parse_files(
            jobs, chunker=chunker, options=LoadOptions(), budget=ParseBudget(workers=workers)
        )
    )
    return time.perf_counter() - start, sum(isinstance(o, Parsed) for _, o in outcomes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--copies", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    settings = Settings()
    embedder = build_embedder(settings)
    chunker = Chunker(
        embedder.token_counter(),
        chunk_size=settings.chunk_size,
        chunk_overlap=settings.chunk_overlap,
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "mixed"
        folder.mkdir()
        files = build_folder(folder, args.copies)
        size_mb = sum(p.stat().st_size for p in files) / 2**20
        parse: dict[int, list[float]] = {1: [], 2: []}
        ingest: dict[int, list[float]] = {1: [], 2: []}
        peak_one: dict[int, list[float]] = {1: [], 2: []}
        peak_all: dict[int, list[float]] = {1: [], 2: []}
        read = 0
        for repeat in range(args.repeats):
            for workers in (1, 2) if repeat % 2 == 0 else (2, 1):
                seconds, read = parse_seconds(files, workers, chunker)
                parse[workers].append(seconds)
                run = ingest_watched(
                    folder, "--index", Path(tmp) / "idx", "--rebuild", "--json",
                    "--workers", str(workers),
                )  # fmt: skip
                assert run.returncode == 0, run.stderr
                ingest[workers].append(run.seconds)
                peak_one[workers].append(run.peak_process_mb)
                peak_all[workers].append(run.peak_total_mb)

    med = {name: {w: statistics.median(v[w]) for w in (1, 2)} for name, v in
           (("parse", parse), ("ingest", ingest), ("one", peak_one), ("all", peak_all))}  # fmt: skip
    rows = [
        "| workers | parse: s (files/s) | ingest end to end: s | peak RSS, largest process | "
        "peak RSS, all processes |",
        "|---|---|---|---|---|",
    ]
    for w in (1, 2):
        rows.append(
            f"| {w} | {med['parse'][w]:.1f} ({len(files) / med['parse'][w]:.1f}) | "
            f"{med['ingest'][w]:.1f} | {med['one'][w]:.0f} MB | {med['all'][w]:.0f} MB |"
        )
    body = "\n".join(
        [
            "## Ingest: parsing in 1 and 2 worker processes (`python -m bench.parse_workers`)",
            "",
            f"{machine_line()}",
            "",
            f"A mixed folder of {len(files)} files ({size_mb:.1f} MB): the samples' PDF (one "
            "scanned), Word, PowerPoint and Excel files and the robustness corpus's readable "
            f"Office and PDF files, {args.copies} copies each; {read} read. Medians of "
            f"{args.repeats} repeats, worker counts alternating. Each file parsed under the "
            "default budget (1 GB, 120 s).",
            "",
            *rows,
            "",
            f"Two workers against one: parsing **{med['parse'][1] / med['parse'][2]:.2f}x** "
            f"as fast, the whole ingest **{med['ingest'][1] / med['ingest'][2]:.2f}x** "
            "(embedding runs in the ingest's own process, after parsing, and is the same "
            "for both).",
        ]
    )
    write_section("parse_workers", body)


if __name__ == "__main__":
    main()
