"""Upload to answerable: the seconds from the request that uploads a PDF to `ragchains serve`
(``POST /documents``) to the first moment a question about a fact on its last page retrieves a
chunk of that page (``POST /retrieve/invoke``, polled from the job's end), for a PDF of 20
pages and one of 200, each page of its own sentences (fpdf2, a text layer: no OCR).

Baseline, measured in the same run on the same PDF: ``ragchains ingest PDF --index DIR`` into
a fresh index folder from the CLI, the pipeline every job runs (parse in a worker process,
chunk, embed, write), so the ratio says what the API adds. The CLI's wall time includes its
own start (the interpreter, the imports, the embedder, the worker pool), which the server has
paid before the upload: a one-page PDF ingested the same way measures it.

Each upload is followed by its server-sent events (GET /jobs/{id}/events): the moment each
stage is first seen (queued, reading, embedding, writing) splits the time, to the server's
0.25 s between two looks at a job. The job's own duration (finished_at - started_at, whole
seconds) is reported beside. The server serves a small index (samples/), keeps no key, and
has loaded its job embedder before the first timed upload (a warm-up upload, reported);
each measured document is removed again (untimed) before the next, so every upload meets the
same collection. API and CLI alternate in each repeat; medians over repeats.

    python -m bench.upload_answerable                # writes its section of bench/RESULTS.md
    python -m bench.upload_answerable --sizes 20 --repeats 1 --no-write
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
from fpdf import FPDF

from bench.common import REPO, machine_line, write_section
from tests.ingestrun import ingest_watched
from tests.servers import fake_openai_server, ragchains_serve

STAGES = ("queued", "reading", "embedding", "writing")
SENTENCES_PER_PAGE = 9
ANSWERABLE_WITHIN = 120.0  # seconds after the job's end: a failure, not a result
JOB_WITHIN = 1800.0
FOLDER = "bench"

# The words each page's sentences are made of: every sentence names its page and line, so
# no two sentences of a document are the same.
_SUBJECTS = (
    "The harbour office", "The night shift", "Our audit team", "The north warehouse",
    "The payroll desk", "The field crew", "The print room", "The cold store",
    "The visitor centre", "The repair shop", "The courier hub", "The data room",
)  # fmt: skip
_VERBS = (
    "logged", "shipped", "counted", "inspected", "returned", "ordered", "sealed", "weighed",
    "labelled", "archived", "repaired", "cleared",
)  # fmt: skip
_OBJECTS = (
    "crates of copper fittings", "pallets of printer paper", "boxes of safety gloves",
    "rolls of packing tape", "drums of hydraulic oil", "sacks of road salt",
    "cases of spare fuses", "bundles of timber laths", "kegs of wood glue",
    "reels of fibre cable", "trays of seedlings", "tins of floor wax",
)  # fmt: skip
_WHEN = (
    "before the morning briefing", "during the late inventory", "after the fire drill",
    "ahead of the quarterly review", "while the lift was serviced", "on the second pass",
    "under the new rota", "despite the power cut", "at the supplier's request",
)  # fmt: skip
_SYLLABLES = ("vor", "tal", "quen", "dri", "mox", "lek", "zan", "pir", "ub", "syl", "kra", "oth")


@dataclass(frozen=True)
class Pdf:
    path: Path
    pages: int
    question: str  # about the fact only its last page states


def codeword(rng: random.Random) -> str:
    """A made-up word no other document holds (the fact's key for BM25 and the embedder)."""
    return "".join(rng.choice(_SYLLABLES) for _ in range(4))


def write_pdf(path: Path, pages: int, seed: int) -> Pdf:
    """A PDF of ``pages`` pages of distinct sentences, the last page stating one fact."""
    rng = random.Random(seed)
    word = codeword(rng)
    litres, engineer = rng.randint(1000, 9999), rng.choice(("Okafor", "Lindqvist", "Tanaka"))
    pdf = FPDF(format="A4")
    pdf.set_title(f"Operations log {seed}")
    pdf.set_font("Helvetica", size=11)
    for page in range(1, pages + 1):
        lines = [
            f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.randint(2, 999)} "
            f"{rng.choice(_OBJECTS)} {rng.choice(_WHEN)} (log {seed}, page {page}, line {n})."
            for n in range(1, SENTENCES_PER_PAGE + 1)
        ]
        if page == pages:
            lines.append(
                f"The {word} reactor is cooled by {litres} litres of brine an hour, as "
                f"engineer {engineer} measured it."
            )
        pdf.add_page()
        pdf.multi_cell(0, 6, " ".join(lines), new_x="LMARGIN", new_y="NEXT")
    pdf.output(str(path))
    return Pdf(path, pages, f"How many litres of brine cool the {word} reactor?")


# ----------------------------------------------------------------------------- the API
@dataclass
class Upload:
    """One upload, timed from its request (seconds)."""

    accepted: float = 0.0  # the 202 (the bytes sent, staged and checked)
    stages: dict[str, float] = field(default_factory=dict)  # first seen
    ended: float = 0.0  # the job's end event
    answerable: float = 0.0  # the last page's chunk first retrieved
    polls: int = 0  # retrievals until then
    warm_query: float = 0.0  # the same retrieval once more, the generation loaded
    job_seconds: float = 0.0  # finished_at - started_at, as the job tells it
    job: dict[str, Any] = field(default_factory=dict)
    document: dict[str, Any] = field(default_factory=dict)  # GET /documents/{path}, after

    def pipeline(self) -> float:
        """The job's work as its events show it: from reading to its end event."""
        return self.ended - self.stages.get("reading", self.accepted)

    def split(self) -> dict[str, float]:
        """The time from the request to the answer, by part, each named by where it starts:
        the upload (to the 202), queued (from the 202), each stage the events showed (a
        stage never seen falls into the one before), the end event (to answerable)."""
        marks = [("upload", 0.0), ("queued", self.accepted)]
        marks += [(s, self.stages[s]) for s in STAGES[1:] if s in self.stages]
        marks += [("end", self.ended), ("answerable", self.answerable)]
        return {name: max(0.0, stop - begin) for (name, begin), (_, stop) in pairwise(marks)}


def _seconds_between(started: str, finished: str) -> float:
    return (datetime.fromisoformat(finished) - datetime.fromisoformat(started)).total_seconds()


def upload_until_answerable(base: str, pdf: Pdf) -> Upload:
    source = f"{FOLDER}/{pdf.path.name}"
    timing = Upload()
    data = pdf.path.read_bytes()
    start = time.perf_counter()
    reply = httpx.post(
        f"{base}/documents",
        data={"folder": FOLDER},
        files=[("files", (pdf.path.name, data, "application/pdf"))],
        timeout=600,
    )
    timing.accepted = time.perf_counter() - start
    assert reply.status_code == 202, reply.text
    job_id = reply.json()["job"]["id"]
    for event, job in _events(base, job_id):
        now = time.perf_counter() - start
        timing.stages.setdefault(job["progress"]["stage"], now)
        if event == "end":
            timing.ended, timing.job = now, job
            break
    job = timing.job
    assert job["state"] == "done" and job["result"]["added"] == [source], job
    timing.job_seconds = _seconds_between(job["started_at"], job["finished_at"])
    deadline = time.perf_counter() + ANSWERABLE_WITHIN
    while True:
        timing.polls += 1
        if _retrieves_last_page(base, pdf, source):
            timing.answerable = time.perf_counter() - start
            again = time.perf_counter()
            assert _retrieves_last_page(base, pdf, source)
            timing.warm_query = time.perf_counter() - again
            entry = httpx.get(f"{base}/documents/{source}", timeout=60)
            assert entry.status_code == 200, entry.text
            timing.document = entry.json()
            assert timing.document["pages"] == pdf.pages, timing.document
            return timing
        assert time.perf_counter() < deadline, f"{source}'s last page not found"
        time.sleep(0.05)


def _events(base: str, job_id: str) -> Iterator[tuple[str, dict[str, Any]]]:
    with httpx.stream("GET", f"{base}/jobs/{job_id}/events", timeout=JOB_WITHIN) as stream:
        assert stream.status_code == 200, stream.read()
        event = ""
        for line in stream.iter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                yield event, json.loads(line.split(":", 1)[1])


def _retrieves_last_page(base: str, pdf: Pdf, source: str) -> bool:
    reply = httpx.post(
        f"{base}/retrieve/invoke", json={"input": {"query": pdf.question}}, timeout=120
    )
    assert reply.status_code == 200, reply.text
    return any(
        d["metadata"].get("source") == source and d["metadata"].get("page") == pdf.pages
        for d in reply.json()["output"]
    )


def remove(base: str, source: str) -> None:
    reply = httpx.delete(f"{base}/documents/{source}", timeout=60)
    assert reply.status_code == 202, reply.text
    for event, job in _events(base, reply.json()["job"]["id"]):
        if event == "end":
            assert job["state"] == "done", job
            return


@contextmanager
def served(index: Path) -> Iterator[str]:
    """``ragchains serve --index INDEX`` as a user starts it (its chat model an
    OpenAI-compatible stand-in: nothing here asks it anything)."""
    with (
        fake_openai_server() as upstream,
        ragchains_serve(
            "--index",
            str(index),
            RAGCHAINS_LLM_PROVIDER="openai",
            RAGCHAINS_OPENAI_BASE_URL=upstream.base_url,
            RAGCHAINS_OPENAI_API_KEY="bench",
            RAGCHAINS_OPENAI_MODEL="ok-bench",
        ) as base,
    ):
        yield base


# ----------------------------------------------------------------------------- the CLI
@dataclass(frozen=True)
class CliRun:
    seconds: float  # start to exit
    chunks: int  # of the fresh index: the PDF's


def cli_ingest(pdf: Path, index: Path) -> CliRun:
    """``ragchains ingest PDF --index INDEX`` into a fresh folder, as a user runs it."""
    run = ingest_watched(pdf, "--index", index, "--json")
    assert run.returncode == 0, run.stderr
    assert run.report()["added"] == 1, run.stdout
    return CliRun(run.seconds, int(run.report()["chunks"]))


# ----------------------------------------------------------------------------- the run
def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="20,200", help="pages of each PDF")
    parser.add_argument("--repeats", type=int, default=3, help="of each size under 100 pages")
    parser.add_argument("--large-repeats", type=int, default=2, help="of 100 pages and more")
    parser.add_argument("--no-write", action="store_true", help="print, leave RESULTS.md alone")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        index = root / "served"
        setup = ingest_watched(REPO / "samples", "--index", index, "--json")
        assert setup.returncode == 0, setup.stderr
        collection = setup.report()
        fresh = iter(range(10**6))

        def fresh_index() -> Path:
            return root / f"cli-{next(fresh)}"

        api: dict[int, list[Upload]] = {n: [] for n in sizes}
        cli: dict[int, list[CliRun]] = {n: [] for n in sizes}
        start_up: list[float] = []
        loads = [os.getloadavg()[0]]
        with served(index) as base:
            warm = write_pdf(root / "warm-up.pdf", 1, seed=1)
            first = upload_until_answerable(base, warm)
            remove(base, f"{FOLDER}/{warm.path.name}")
            for size in sizes:
                repeats = args.repeats if size < 100 else args.large_repeats
                for repeat in range(repeats):
                    pdf = write_pdf(root / f"log-{size}p-{repeat}.pdf", size, seed=size + repeat)
                    one = write_pdf(root / f"one-{size}p-{repeat}.pdf", 1, seed=9000 + repeat)
                    order = ("api", "cli") if repeat % 2 == 0 else ("cli", "api")
                    for side in order:
                        if side == "api":
                            timing = upload_until_answerable(base, pdf)
                            api[size].append(timing)
                            remove(base, f"{FOLDER}/{pdf.path.name}")
                            print(f"{size} pages, API: {timing.answerable:.1f} s", flush=True)
                        else:
                            cli[size].append(cli_ingest(pdf.path, fresh_index()))
                            start_up.append(cli_ingest(one.path, fresh_index()).seconds)
                            print(f"{size} pages, CLI: {cli[size][-1].seconds:.1f} s", flush=True)
                    loads.append(os.getloadavg()[0])

    body = report(sizes, api, cli, start_up, first, collection, loads)
    if args.no_write:
        print(body)
    else:
        write_section("upload_answerable", body)


def _runs(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values)


def report(
    sizes: list[int],
    api: dict[int, list[Upload]],
    cli: dict[int, list[CliRun]],
    start_up: list[float],
    first: Upload,
    collection: dict[str, Any],
    loads: list[float],
) -> str:
    med = statistics.median
    rows = [
        "| PDF | API: upload → answerable | runs | CLI: `ragchains ingest` | runs | API / CLI |",
        "|---|---:|---|---:|---|---:|",
    ]
    parts_rows = [
        "| PDF | upload → 202 | queued | reading | embedding | writing | end → answerable "
        "(a warm retrieval) | the job's work | its own clock | API adds | chunks (CLI's) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines = []
    for size in sizes:
        answers = [u.answerable for u in api[size]]
        seconds = [c.seconds for c in cli[size]]
        a, c = med(answers), med(seconds)
        rows.append(
            f"| {size} pages | **{a:.1f} s** | {_runs(answers)} | {c:.1f} s | "
            f"{_runs(seconds)} | **{a / c:.2f}** |"
        )
        split = [u.split() for u in api[size]]

        def part(name: str, split: list[dict[str, float]] = split) -> str:
            seen = [s[name] for s in split if name in s]
            return f"{med(seen):.1f} s" if seen else "–"

        work = med([u.pipeline() for u in api[size]])
        adds = med([u.answerable - u.pipeline() for u in api[size]])
        chunks = med([u.document["chunks"] for u in api[size]])
        parts_rows.append(
            f"| {size} pages | {part('upload')} | {part('queued')} | {part('reading')} | "
            f"{part('embedding')} | {part('writing')} | {part('end')} "
            f"({med([u.warm_query for u in api[size]]):.2f} s) | {work:.1f} s | "
            f"{med([u.job_seconds for u in api[size]]):.0f} s | {adds:.1f} s | "
            f"{chunks:.0f} ({med([r.chunks for r in cli[size]]):.0f}) |"
        )
        lines.append(
            f"- {size} pages: upload to answerable takes **{a / c:.2f}×** the CLI's ingest; "
            f"the API adds {adds:.1f} s ({100 * adds / a:.0f} %) to the job's own work "
            f"({work:.1f} s): the upload, the queue, and the end to the first retrieval that "
            "finds the last page."
        )
    repeats = ", ".join(f"{len(api[s])} repeats for {s} pages" for s in sizes)
    return "\n".join(
        [
            "## Upload to answerable (`python -m bench.upload_answerable`)",
            "",
            machine_line(),
            "",
            f"`ragchains serve` over the samples ({collection['added']} files, "
            f"{collection['chunks']} chunks), no key; a PDF of distinct sentences (fpdf2, a "
            "text layer) uploaded with `POST /documents`, timed from the request to the first "
            "`POST /retrieve/invoke` (polled from the job's end event) that returns a chunk "
            "of its last page for a question about the fact only that page states. Baseline: "
            "`ragchains ingest PDF --index DIR` of the same PDF into a fresh folder, in the "
            f"same run, start to exit. Medians of {repeats} (API and CLI alternating); the "
            "uploaded document is removed (untimed) before the next.",
            "",
            *rows,
            "",
            "Where the API's time goes (medians). Each stage runs from the moment the job's "
            "events first show it (to 0.25 s: the server looks at a job that often); queued "
            "includes opening the event stream. The job's work: reading to the end event; "
            "its own clock: finished_at − started_at (whole seconds). API adds: upload to "
            "answerable less the job's work.",
            "",
            *parts_rows,
            "",
            *lines,
            f"- The CLI's time is mostly its own start: a one-page PDF into a fresh folder "
            f"takes {med(start_up):.1f} s (runs {_runs(start_up)}: the interpreter, the "
            "imports, the embedder, the worker pool), which the server paid before the upload.",
            f"- The server's first job loads its own embedder: the warm-up upload (one page) "
            f"took {first.answerable:.1f} s to answerable, before any timed one.",
            f"- Load average (1 min) at the start and after each repeat: "
            f"{min(loads):.1f} to {max(loads):.1f} on {os.cpu_count()} cores (other jobs share "
            "the machine); each side's absolute times grow with it, the ratios less.",
        ]
    )


if __name__ == "__main__":
    main()
