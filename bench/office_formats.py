"""Retrieval quality and ingest throughput of the same documents as Markdown, PDF, Word,
PowerPoint and Excel files (issue 25, "Measured").

A subset of SciFact (test split): ``--queries`` judged queries chosen with a fixed seed, their
judged abstracts, and random other abstracts up to ``--docs`` in all. Every abstract is
written five ways into a folder outside the repository:

- Markdown: one file per abstract, ``# title`` then the abstract's paragraphs;
- PDF (fpdf2, with a text layer): the same, title in bold, one file per abstract;
- Word (python-docx): one file per abstract, the title as Heading 1, then paragraphs;
- PowerPoint (python-pptx): decks of ``--slides-per-deck`` papers, as a reading group's deck
  is: a title slide, then one slide per paper, its title the slide title and its
  paragraphs the body;
- Excel (openpyxl): one workbook, one row per paper, columns ``title`` and ``abstract``.

Paragraphs are the abstract's sentences in groups of four, the same in every format. Each
folder is ingested by ``ragchains ingest`` (a subprocess, default settings, timed) and
searched by the shipped hybrid retriever, through ``ragchains eval``'s own code
(``evaluation.retrieval.build_setup``: the 100 best chunks of each query). Each chunk is
mapped back to its abstract by its file, slide or row; the ranking keeps each abstract at its
best chunk's rank, and nDCG@10 is ``evaluation.metrics``'. Target: Word, PowerPoint and Excel
each at least 0.95 x Markdown.

Throughput: reading and chunking alone (in this process, ``load_file`` + ``chunk_file``,
median over ``--repeats``, the formats interleaved) and the whole ``ragchains ingest`` (load,
chunk, embed, BM25 + FAISS, write; process start and model load included, and measured apart
on a one-file folder). Units: documents for Markdown and Word, pages for PDF, slides for
PowerPoint, rows for Excel.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import (
    REPO,
    SHARED_DATA,
    cache_dir,
    machine_line,
    median_of,
    peak_rss_mb,
    write_section,
)
from ragchains.evaluation.datasets import load_beir
from ragchains.evaluation.retrieval import build_setup, score_ranking
from ragchains.factory import build_embedder, build_retriever, configure_runtime, open_index
from ragchains.ingest.chunking import chunk_file
from ragchains.ingest.discovery import discover
from ragchains.ingest.loaders import load_file
from ragchains.ingest.parts import LoadOptions
from ragchains.ingest.runsetup import run_setup
from ragchains.settings import Settings

FORMATS = ("markdown", "pdf", "docx", "pptx", "xlsx")
OFFICE = ("docx", "pptx", "xlsx")
TARGET = 0.95  # of Markdown's nDCG@10
DEPTH = 100  # chunks fetched per query, as `ragchains eval retrieval` does
SENTENCES_PER_PARAGRAPH = 4
WRITER_VERSION = 1  # bump when the writers change: the cached folders are written anew
BOOTSTRAP = 2000
UNITS = {
    "markdown": "documents",
    "pdf": "pages",
    "docx": "documents",
    "pptx": "slides",
    "xlsx": "rows",
}
# The chunk metadata that tells apart abstracts within one file (None: one file each).
LOCATOR = {"pptx": "slide", "xlsx": "row"}
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(\[])")
_FONTS = Path("/usr/share/fonts/truetype/dejavu")


@dataclass
class Subset:
    doc_ids: list[str]  # in the order they are written
    titles: dict[str, str]
    texts: dict[str, str]
    queries: dict[str, str]
    qrels: dict[str, dict[str, float]]

    def paragraphs(self, doc_id: str) -> list[str]:
        sentences = _SENTENCE_END.split(self.texts[doc_id].strip())
        return [
            " ".join(sentences[i : i + SENTENCES_PER_PARAGRAPH])
            for i in range(0, len(sentences), SENTENCES_PER_PARAGRAPH)
        ]


def choose_subset(queries: int, docs: int, seed: int) -> Subset:
    """``queries`` judged test queries, their judged documents, random others up to ``docs``."""
    dataset = load_beir(SHARED_DATA / "scifact", "test")
    rng = random.Random(seed)
    chosen = sorted(rng.sample(sorted(dataset.queries), min(queries, len(dataset.queries))))
    qrels = {qid: dataset.qrels[qid] for qid in chosen}
    judged = sorted({doc for rel in qrels.values() for doc in rel})
    others = sorted(set(dataset.doc_ids) - set(judged))
    picked = judged + rng.sample(others, max(docs - len(judged), 0))
    rng.shuffle(picked)  # judged abstracts spread over the decks and the workbook
    rows = {doc: i for i, doc in enumerate(dataset.doc_ids)}
    return Subset(
        doc_ids=picked,
        titles={d: dataset.titles[rows[d]].strip() or f"Document {d}" for d in picked},
        texts={d: dataset.texts[rows[d]] for d in picked},
        queries={qid: dataset.queries[qid] for qid in chosen},
        qrels=qrels,
    )


# ----------------------------------------------------------------------------- writing
@dataclass
class Written:
    """One format's folder: which abstract each file (and slide or row) holds, and its units."""

    folder: Path
    doc_of: dict[tuple[str, int | None], str] = field(default_factory=dict)
    files: int = 0
    units: int = 0
    seconds: float = 0.0
    cached: bool = False


def write_markdown(folder: Path, subset: Subset) -> Written:
    out = Written(folder)
    for doc in subset.doc_ids:
        body = "\n\n".join(subset.paragraphs(doc))
        name = f"{doc}.md"
        (folder / name).write_text(f"# {subset.titles[doc]}\n\n{body}\n", encoding="utf-8")
        out.doc_of[(name, None)] = doc
    out.files = out.units = len(subset.doc_ids)
    return out


def write_pdf(folder: Path, subset: Subset) -> Written:
    from fpdf import FPDF

    unicode_font = (_FONTS / "DejaVuSans.ttf").is_file() and (
        _FONTS / "DejaVuSans-Bold.ttf"
    ).is_file()
    out = Written(folder)
    for doc in subset.doc_ids:
        pdf = FPDF(format="A4")
        pdf.set_title(subset.titles[doc])
        if unicode_font:
            pdf.add_font("DejaVu", "", str(_FONTS / "DejaVuSans.ttf"))
            pdf.add_font("DejaVu", "B", str(_FONTS / "DejaVuSans-Bold.ttf"))
            family = "DejaVu"

            def text(s: str) -> str:
                return s
        else:  # the core fonts hold Latin-1 only
            family = "Helvetica"

            def text(s: str) -> str:
                return s.encode("latin-1", "replace").decode("latin-1")

        pdf.add_page()
        pdf.set_font(family, "B", 14)
        pdf.multi_cell(0, 7, text(subset.titles[doc]), new_x="LMARGIN", new_y="NEXT")
        pdf.ln(4)
        pdf.set_font(family, "", 11)
        for paragraph in subset.paragraphs(doc):
            pdf.multi_cell(0, 5.5, text(paragraph), new_x="LMARGIN", new_y="NEXT")
            pdf.ln(2.5)
        name = f"{doc}.pdf"
        pdf.output(str(folder / name))
        out.doc_of[(name, None)] = doc
        out.units += pdf.pages_count
    out.files = len(subset.doc_ids)
    return out


def write_docx(folder: Path, subset: Subset) -> Written:
    import docx

    out = Written(folder)
    for doc in subset.doc_ids:
        document = docx.Document()
        document.add_heading(subset.titles[doc], 1)
        for paragraph in subset.paragraphs(doc):
            document.add_paragraph(paragraph)
        name = f"{doc}.docx"
        document.save(str(folder / name))
        out.doc_of[(name, None)] = doc
    out.files = out.units = len(subset.doc_ids)
    return out


def write_pptx(folder: Path, subset: Subset, per_deck: int) -> Written:
    from pptx import Presentation

    out = Written(folder)
    for first in range(0, len(subset.doc_ids), per_deck):
        papers = subset.doc_ids[first : first + per_deck]
        number = first // per_deck + 1
        deck = Presentation()
        deck.core_properties.title = f"Reading group, session {number}"
        opening = deck.slides.add_slide(deck.slide_layouts[0])  # Title Slide
        opening.shapes.title.text = f"Reading group, session {number}"
        opening.placeholders[1].text = f"{len(papers)} papers"
        name = f"session-{number:03d}.pptx"
        for slide_number, doc in enumerate(papers, start=2):
            slide = deck.slides.add_slide(deck.slide_layouts[1])  # Title and Content
            slide.shapes.title.text = subset.titles[doc]
            body = slide.placeholders[1].text_frame
            paragraphs = subset.paragraphs(doc)
            body.text = paragraphs[0]
            for paragraph in paragraphs[1:]:
                body.add_paragraph().text = paragraph
            out.doc_of[(name, slide_number)] = doc
        deck.save(str(folder / name))
        out.files += 1
        out.units += len(papers) + 1
    return out


def write_xlsx(folder: Path, subset: Subset) -> Written:
    import openpyxl

    out = Written(folder, files=1, units=len(subset.doc_ids))
    book = openpyxl.Workbook()
    sheet = book.active
    assert sheet is not None
    sheet.title = "Papers"
    sheet.append(["title", "abstract"])
    name = "papers.xlsx"
    for row, doc in enumerate(subset.doc_ids, start=2):
        sheet.append([subset.titles[doc], "\n".join(subset.paragraphs(doc))])
        out.doc_of[(name, row)] = doc
    book.save(str(folder / name))
    return out


def write_all(subset: Subset, per_deck: int) -> dict[str, Written]:
    """The five folders, from the cache when this subset was written before (the PDFs take
    about two minutes to write on 2 cores)."""
    key = hashlib.sha256(
        json.dumps([WRITER_VERSION, per_deck, subset.doc_ids]).encode("utf-8")
    ).hexdigest()[:12]
    root = cache_dir("office_formats") / f"docs-{key}"
    manifest = root / "written.json"
    if manifest.is_file():
        saved = json.loads(manifest.read_text(encoding="utf-8"))
        return {
            fmt: Written(
                root / fmt,
                {(name, where): doc for name, where, doc in w["doc_of"]},
                w["files"],
                w["units"],
                w["seconds"],
                cached=True,
            )
            for fmt, w in saved.items()
        }
    writers: dict[str, Callable[[Path], Written]] = {
        "markdown": lambda f: write_markdown(f, subset),
        "pdf": lambda f: write_pdf(f, subset),
        "docx": lambda f: write_docx(f, subset),
        "pptx": lambda f: write_pptx(f, subset, per_deck),
        "xlsx": lambda f: write_xlsx(f, subset),
    }
    shutil.rmtree(root, ignore_errors=True)  # a run stopped while writing
    written = {}
    for fmt, write in writers.items():
        folder = root / fmt
        folder.mkdir(parents=True)
        start = time.perf_counter()
        written[fmt] = write(folder)
        written[fmt].seconds = time.perf_counter() - start
    saved = {
        fmt: {
            "doc_of": [[name, where, doc] for (name, where), doc in w.doc_of.items()],
            "files": w.files,
            "units": w.units,
            "seconds": w.seconds,
        }
        for fmt, w in written.items()
    }
    manifest.write_text(json.dumps(saved), encoding="utf-8")  # last: marks the folder whole
    return written


def doc_id(fmt: str, written: Written, metadata: dict[str, Any]) -> str | None:
    key = LOCATOR.get(fmt)
    return written.doc_of.get((metadata["filename"], metadata.get(key) if key else None))


# ----------------------------------------------------------------------------- ingest
def read_and_chunk(folder: Path, setup: Any) -> list[Any]:
    """What an ingest run does before embedding: every file loaded and chunked."""
    chunks = []
    for source, path in sorted(discover([folder]).files.items()):
        chunks.extend(chunk_file(source, load_file(path, setup.options), setup.chunker))
    return chunks


def cli_env() -> dict[str, str]:
    """The default settings: no RAGCHAINS_* variables (the subprocess runs where no .env is)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RAGCHAINS_")}


@dataclass
class Timed:
    wall: float  # seconds
    cpu: float  # the process's user + system seconds: less swayed by other jobs than wall


def cli_ingest(folder: Path, index: Path, cwd: Path) -> tuple[Timed, dict[str, Any]]:
    """Time of one `ragchains ingest FOLDER --index INDEX --json`, and its report."""
    command = [str(Path(sys.executable).with_name("ragchains")), "ingest", str(folder)]
    command += ["--index", str(index), "--rebuild", "--json"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=cli_env(), capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr}")
    report = json.loads(done.stdout)
    if report["skipped"]:
        raise RuntimeError(f"ingest of {folder} skipped files: {report['skipped_files'][:3]}")
    return Timed(wall, cpu), report


# ----------------------------------------------------------------------------- search
def search(
    settings: Settings,
    embedder: Any,
    index_dir: Path,
    fmt: str,
    written: Written,
    subset: Subset,
) -> dict[str, dict[str, Any]]:
    """Per query: its metrics over the abstracts ranked by their best chunk, and the top 10."""
    index = open_index(index_dir, embedder)
    try:
        owner = {c.id: doc_id(fmt, written, c.metadata) for c in index.store.iter_chunks()}
        unmapped = [cid for cid, doc in owner.items() if doc is None]
        setup = build_setup("hybrid", build_retriever(settings, index, embedder), depth=DEPTH)
        out = {}
        for qid, query in subset.queries.items():
            ranked: list[str] = []
            for chunk_id in setup.rank(query):
                doc = owner.get(chunk_id)
                if doc is not None and doc not in ranked:
                    ranked.append(doc)
            out[qid] = {**score_ranking(ranked, subset.qrels[qid]), "top10": ranked[:10]}
        out["_unmapped_chunks"] = {"count": len(unmapped)}
        return out
    finally:
        index.close()


def ratio_interval(
    office: np.ndarray, markdown: np.ndarray, seed: int
) -> tuple[float, float, float]:
    """Mean ratio and its 95% interval, resampling the queries (paired)."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(office), size=(BOOTSTRAP, len(office)))
    ratios = office[picks].mean(axis=1) / np.maximum(markdown[picks].mean(axis=1), 1e-12)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(office.mean() / markdown.mean()), float(low), float(high)


# ----------------------------------------------------------------------------- diagnosis
def chunk_profile(fmt: str, written: Written, subset: Subset, chunks: list[Any]) -> dict[str, Any]:
    """How each format's chunks carry an abstract: per abstract, how many chunks and tokens,
    and the share of its chunks whose text holds its title."""
    per_doc: dict[str, list[Any]] = {}
    for chunk in chunks:
        doc = doc_id(fmt, written, chunk.metadata)
        per_doc.setdefault(doc or "-", []).append(chunk)
    titled = sum(
        1
        for doc, found in per_doc.items()
        for c in found
        if doc != "-" and _squash(subset.titles[doc]) in _squash(c.text)
    )
    mapped = sum(len(v) for k, v in per_doc.items() if k != "-")
    first = next(iter(per_doc.get(subset.doc_ids[0], [])), None)
    return {
        "chunks": len(chunks),
        "unmapped": len(per_doc.get("-", [])),
        "chunks_per_doc": mapped / max(len(per_doc) - ("-" in per_doc), 1),
        "with_title": titled / max(mapped, 1),
        "example": first.text if first is not None else "",
    }


def _home(path: Path) -> str:
    home = Path.home()
    return f"~/{path.relative_to(home)}" if path.is_relative_to(home) else str(path)


def _squash(text: str) -> str:
    return " ".join(text.split()).lower()


# ----------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--queries", type=int, default=100, help="judged test queries")
    parser.add_argument("--docs", type=int, default=1000, help="abstracts in all")
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--repeats", type=int, default=3, help="of reading + chunking")
    parser.add_argument("--ingest-repeats", type=int, default=1, help="of the whole ingest")
    parser.add_argument("--slides-per-deck", type=int, default=10)
    parser.add_argument(
        "--keep",
        type=Path,
        help="build the indexes here (outside the repo) and keep them; the documents are "
        "kept in the cache (~/.cache/ragchains-bench/office_formats)",
    )
    parser.add_argument("--no-write", action="store_true", help="print, leave RESULTS.md alone")
    args = parser.parse_args()
    if args.keep is not None and args.keep.resolve().is_relative_to(REPO):
        parser.error("--keep must be outside the repository")

    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    configure_runtime(settings)
    embedder = build_embedder(settings)
    embedder.encode(["warm up"])
    subset = choose_subset(args.queries, args.docs, args.seed)
    load = LoadOptions(
        max_sheet_rows=settings.max_sheet_rows, ocr_page_timeout=settings.ocr_page_timeout
    )
    setup = run_setup(embedder, settings.chunk_size, settings.chunk_overlap, load, False)
    loads = [os.getloadavg()[0]]

    with tempfile.TemporaryDirectory(prefix="office-formats-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        written = write_all(subset, args.slides_per_deck)
        for fmt, w in written.items():
            made = f"from {w.folder.parent}" if w.cached else f"written in {w.seconds:.1f} s"
            print(f"{fmt}: {w.files:,} files, {w.units:,} {UNITS[fmt]} {made}")

        # Reading + chunking: formats interleaved, so drift in the machine's load hits all.
        read_s: dict[str, list[float]] = {fmt: [] for fmt in FORMATS}
        chunks: dict[str, list[Any]] = {}
        for _ in range(args.repeats):
            for fmt in FORMATS:
                start = time.perf_counter()
                chunks[fmt] = read_and_chunk(written[fmt].folder, setup)
                read_s[fmt].append(time.perf_counter() - start)
        loads.append(os.getloadavg()[0])

        # The fixed cost of a run: one short Markdown file.
        one = root / "one"
        one.mkdir(exist_ok=True)
        (one / "one.md").write_text("# One\n\nA single short paragraph.\n", encoding="utf-8")
        fixed = [cli_ingest(one, root / "index-one", root)[0] for _ in range(2)]
        fixed_s = Timed(median_of([t.wall for t in fixed]), median_of([t.cpu for t in fixed]))

        ingest_s: dict[str, list[Timed]] = {fmt: [] for fmt in FORMATS}
        reports: dict[str, dict[str, Any]] = {}
        for _ in range(args.ingest_repeats):
            for fmt in FORMATS:
                took, reports[fmt] = cli_ingest(written[fmt].folder, root / "index" / fmt, root)
                ingest_s[fmt].append(took)
                print(
                    f"{fmt}: ingest {took.wall:.1f} s ({took.cpu:.1f} s CPU), "
                    f"{reports[fmt]['chunks']} chunks",
                    flush=True,
                )
        loads.append(os.getloadavg()[0])

        results = {
            fmt: search(settings, embedder, root / "index" / fmt, fmt, written[fmt], subset)
            for fmt in FORMATS
        }
    profiles = {fmt: chunk_profile(fmt, written[fmt], subset, chunks[fmt]) for fmt in FORMATS}
    for fmt in FORMATS:
        if len(chunks[fmt]) != reports[fmt]["chunks"]:
            raise RuntimeError(
                f"{fmt}: {len(chunks[fmt])} chunks read here, {reports[fmt]['chunks']} ingested"
            )

    qids = list(subset.queries)
    per_query = {
        fmt: {m: np.array([results[fmt][q][m] for q in qids]) for m in ("ndcg@10", "recall@10")}
        for fmt in FORMATS
    }
    out = cache_dir("office_formats") / "last-run.json"
    out.write_text(
        json.dumps(
            {
                "args": {k: str(v) for k, v in vars(args).items()},
                "doc_ids": subset.doc_ids,
                "queries": subset.queries,
                "qrels": subset.qrels,
                "results": results,
                "profiles": profiles,
            },
            indent=1,
        ),
        encoding="utf-8",
    )
    body = report(args, subset, written, read_s, fixed_s, ingest_s, reports, results, per_query)
    body += _notes(profiles, loads, out)
    if args.no_write:
        print(body)
    else:
        write_section("office_formats", body)


def report(
    args: argparse.Namespace,
    subset: Subset,
    written: dict[str, Written],
    read_s: dict[str, list[float]],
    fixed_s: Timed,
    ingest_s: dict[str, list[Timed]],
    reports: dict[str, dict[str, Any]],
    results: dict[str, dict[str, Any]],
    per_query: dict[str, dict[str, np.ndarray]],
) -> str:
    judged = len({d for rel in subset.qrels.values() for d in rel})
    markdown = per_query["markdown"]["ndcg@10"]
    lines = [
        "## Office formats (`python -m bench.office_formats`)",
        "",
        machine_line(),
        "",
        f"SciFact test split: {len(subset.queries)} judged queries (seed {args.seed}), their "
        f"{judged} judged abstracts and {len(subset.doc_ids) - judged} random others, "
        f"{len(subset.doc_ids):,} abstracts written five ways (title, then paragraphs of "
        f"{SENTENCES_PER_PARAGRAPH} sentences): one Markdown, PDF and Word file each; "
        f"PowerPoint decks of a title slide and {args.slides_per_deck} papers, a slide each; "
        "one Excel workbook, a row each (columns title, abstract). Each folder ingested by "
        "`ragchains ingest` with the default settings and searched by the hybrid retriever "
        f"(the {DEPTH} best chunks per query, as `ragchains eval retrieval`); each abstract "
        "ranked at its best chunk.",
        "",
        "### Retrieval quality",
        "",
        "| format | files | chunks | nDCG@10 | / Markdown (95% CI) | recall@10 | MRR@10 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    verdicts = []
    for fmt in FORMATS:
        ndcg = per_query[fmt]["ndcg@10"]
        mrr = np.mean([results[fmt][q]["mrr@10"] for q in subset.queries])
        if fmt == "markdown":
            versus = "1.00"
        else:
            ratio, low, high = ratio_interval(ndcg, markdown, args.seed)
            versus = f"**{ratio:.3f}** ({low:.2f}-{high:.2f})"
            if fmt in OFFICE:
                meets = "meets" if ratio >= TARGET else "**misses**"
                verdicts.append(f"{fmt} {ratio:.3f} x ({meets})")
        lines.append(
            f"| {fmt} | {written[fmt].files:,} | {reports[fmt]['chunks']:,} | {ndcg.mean():.3f} "
            f"| {versus} | {per_query[fmt]['recall@10'].mean():.3f} | {mrr:.3f} |"
        )
    lines += [
        "",
        f"- Target: each Office format at least {TARGET} x Markdown's nDCG@10: "
        + "; ".join(verdicts)
        + ". The interval resamples the queries (paired, "
        f"{BOOTSTRAP} draws); PDF is shown for comparison, not part of the target.",
        "",
        "### Ingest throughput",
        "",
        f"Reading + chunking: `load_file` + `chunk_file` in one process, median of "
        f"{args.repeats} (formats interleaved). Whole ingest: `ragchains ingest --rebuild` "
        f"(median of {args.ingest_repeats}), wall time and the process's CPU time (user + "
        "system, on 2 cores); both include the process start and model load, "
        f"{fixed_s.wall:.1f} s ({fixed_s.cpu:.1f} s CPU) for a folder of one short Markdown file.",
        "",
        "| format | unit | units | read + chunk s | units/s | whole ingest s (CPU s) | "
        "units/s | chunks/s | units per CPU s | read + chunk / whole |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for fmt in FORMATS:
        units = written[fmt].units
        read = median_of(read_s[fmt])
        whole = median_of([t.wall for t in ingest_s[fmt]])
        cpu = median_of([t.cpu for t in ingest_s[fmt]])
        lines.append(
            f"| {fmt} | {UNITS[fmt]} | {units:,} | {read:.2f} | {units / read:,.0f} | "
            f"{whole:.1f} ({cpu:.0f}) | {units / whole:.1f} | "
            f"{reports[fmt]['chunks'] / whole:.1f} | {units / cpu:.1f} | {read / whole:.0%} |"
        )
    lines += [
        "",
        "- Embedding the chunks is most of every format's ingest. Its wall time moves with "
        "the other jobs on the machine (see the load average below): compare formats by the "
        "read + chunk column and by units per CPU second.",
    ]
    return "\n".join(lines) + "\n"


def _notes(profiles: dict[str, dict[str, Any]], loads: list[float], out: Path) -> str:
    shape = ", ".join(
        f"{fmt} {p['chunks_per_doc']:.2f} chunks per abstract ({p['with_title']:.0%} with its "
        "title)"
        for fmt, p in profiles.items()
    )
    return "\n".join(
        [
            f"- How the chunks carry the abstracts: {shape}.",
            f"- Load average (1 min) at the start, after reading, after ingesting: "
            f"{', '.join(f'{x:.1f}' for x in loads)} on 2 cores (other jobs share the machine).",
            f"- Peak RSS of the benchmark process: {peak_rss_mb():,.0f} MB. Per-query results "
            f"and the chunk profiles: `{_home(out)}`.",
        ]
    )


if __name__ == "__main__":
    main()
