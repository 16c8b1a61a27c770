"""Parsing files in worker processes, each file under a memory and a time budget that the
operating system enforces.

A parser library can be made to use any amount of memory or time by the file it reads: a
workbook whose few shared strings fill a million cells, a sheet 16,384 columns wide, a PDF
whose page tree loops. Checking sizes before parsing cannot see every such case, so the
budget is not left to the parsers: each file is loaded and chunked in a worker process whose
address space is capped (``RLIMIT_AS``), and a file still running at its time budget has its
worker ended (pebble's pool replaces it and goes on). The run, and the process that started
it (``ragchains ingest``, or a server running an ingest job), only ever receives chunks or a
reason, so one file can cost at most its own budget, never the others' work nor the index.

Workers are forked from a small server process that imports only the loaders (the
multiprocessing ``forkserver``), never from the caller, which may hold an embedding model:
the budget is the parse's, not the caller's memory copied.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import resource
import signal
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import BrokenExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tqdm import tqdm

from ragchains.ingest import pageprogress
from ragchains.ingest.chunking import Chunker, chunk_file
from ragchains.ingest.errors import IngestError
from ragchains.ingest.loaders import load_file
from ragchains.ingest.parts import LoadOptions, SkipFile
from ragchains.retrievers.indexformat import Chunk

log = logging.getLogger(__name__)
T = TypeVar("T")

# A worker with the loaders imported maps about 250 MB (100 MB resident); a page of a scan
# being OCRed, under 450 MB. 1 GB leaves a parse three times what a large real document takes.
DEFAULT_MEMORY_MB = 1024
# Under this a worker cannot hold its own code and the loaders' libraries.
MIN_MEMORY_MB = 512
DEFAULT_SECONDS = 120.0
# A worker is replaced after this many files, so what a parser library leaks or fragments
# stays bounded over a long run.
FILES_PER_WORKER = 50


@dataclass(frozen=True)
class ParseBudget:
    """What one file may cost to parse: ``memory_mb`` of address space in its worker,
    ``seconds`` of wall-clock time; ``workers`` files are parsed at once (0: one per core)."""

    memory_mb: int = DEFAULT_MEMORY_MB
    seconds: float = DEFAULT_SECONDS
    workers: int = 0

    def __post_init__(self) -> None:
        if self.memory_mb < MIN_MEMORY_MB:
            raise ValueError(
                f"a file's memory budget must be {MIN_MEMORY_MB} MB or more, not {self.memory_mb}"
            )
        if self.seconds <= 0:
            raise ValueError(f"a file's time budget must be positive, got {self.seconds}")
        if self.workers < 0:
            raise ValueError(f"workers must be 0 (one per core) or more, got {self.workers}")

    def worker_count(self, files: int) -> int:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return max(1, min(self.workers or cores or 1, files))

    @property
    def memory_shown(self) -> str:
        mb = self.memory_mb
        return f"{mb // 1024} GB" if mb % 1024 == 0 else f"{mb:,} MB"

    @property
    def over_memory(self) -> str:
        return f"over the {self.memory_shown} memory budget while parsing"

    @property
    def over_time(self) -> str:
        return f"over the {self.seconds:g} s time budget while parsing"


@dataclass
class ParseJob:
    """A file to parse: its source name (the citation's), where it is, its sha256."""

    source: str
    path: Path
    sha256: str


@dataclass
class Parsed:
    """A file read: its format, its chunks, and what was left out of it."""

    format: str
    chunks: list[Chunk]
    partial: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- the worker
# Set once per worker by ``_start_worker``: the budget, the run's chunker and load options.
_worker: dict[str, Any] = {}


def _start_worker(
    chunker: Chunker, options: LoadOptions, budget: ParseBudget, pages: Any = None
) -> None:
    _start_budgeted(budget)
    _worker.update(chunker=chunker, options=options)
    pageprogress.listen(pages)


def _start_budgeted(budget: ParseBudget) -> None:
    cap = budget.memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    # A library's warnings about a file's oddities (openpyxl: "Unknown extension is not
    # supported") are not the user's to act on; what was left out is reported as partial.
    warnings.simplefilter("ignore")
    # Ctrl-C in a terminal reaches the whole process group: the process that started the
    # workers decides what a stop means (it ends them), not each worker half-way.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker.update(budget=budget)


def _parse(job: ParseJob) -> Parsed | str:
    """One file loaded and chunked, or the reason it is skipped."""
    _worker["peak_before"] = _peak_address_space()
    pageprogress.reading(job.source)
    try:
        loaded = load_file(job.path, _worker["options"])
        chunks = chunk_file(job.source, loaded, _worker["chunker"], file_id=job.sha256)
    except SkipFile as exc:
        if _out_of_memory(exc):
            return _memory_reason()
        return str(exc)
    except Exception as exc:  # a parser bug must not sink the other files
        if _out_of_memory(exc):
            return _memory_reason()
        return f"could not be parsed ({type(exc).__name__}: {str(exc)[:200]})"
    if not chunks:
        return "no text left after chunking"
    return Parsed(loaded.format, chunks, loaded.partial)


def _out_of_memory(exc: BaseException) -> bool:
    """Whether a failure came from the memory budget: a MemoryError anywhere in its chain
    (loaders turn a library's failure into a reason), libxml2's allocation failure, or a
    peak address space at the cap (an allocation refused while the heap was full)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, MemoryError) or "memory allocation failed" in str(seen).lower():
            return True
        seen = seen.__cause__ or seen.__context__
    # The peak is the worker's since it started: it counts only if this file raised it.
    peak = _peak_address_space()
    return peak > _worker["peak_before"] and peak >= _worker["budget"].memory_mb * 2**20 * 0.9


def _peak_address_space() -> int:
    with contextlib.suppress(OSError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmPeak:"):
                return int(line.split()[1]) * 1024
    return 0


def _memory_reason() -> str:
    return _worker["budget"].over_memory  # type: ignore[no-any-return]


# ----------------------------------------------------------------------------- the run
def _context() -> Any:
    """The forkserver, preloading the loaders so each worker starts in milliseconds (and
    ``workerstart``, for the workers a closed pool no longer wants)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([f"{__package__}.workerstart", __name__])
    return context


def parse_files(
    jobs: Sequence[ParseJob],
    *,
    chunker: Chunker,
    options: LoadOptions,
    budget: ParseBudget,
    progress: bool = False,
    on_pages: Callable[[list[tuple[str, str, int]]], None] | None = None,
) -> Iterator[tuple[ParseJob, Parsed | str]]:
    """Each job's outcome, in the order given: its chunks, or the reason it is skipped
    (``over the 1 GB memory budget while parsing``, ``over the 120 s time budget``, a
    parser's own reason). Files are parsed ``budget.worker_count`` at a time; leaving the
    iteration early ends the workers. ``on_pages``: told, from a thread of its own, the
    page counts the workers send as they read (``ingest.pageprogress``)."""
    if not jobs:
        return
    from pebble import ProcessExpired, ProcessPool

    context = _context()
    pages = context.Queue() if on_pages is not None else None
    pool = ProcessPool(
        max_workers=budget.worker_count(len(jobs)),
        max_tasks=FILES_PER_WORKER,
        initializer=_start_worker,
        initargs=(chunker, options, budget, pages),
        context=context,
    )
    listening = _PageListener(pages, on_pages) if pages is not None and on_pages else None
    finished = False
    try:
        futures = [pool.schedule(_parse, args=(job,), timeout=budget.seconds) for job in jobs]
        for job, future in tqdm(
            zip(jobs, futures, strict=True),
            total=len(jobs),
            desc="Reading",
            unit="file",
            disable=not progress,
        ):
            try:
                outcome: Parsed | str = future.result()
            except FutureTimeout:
                outcome = budget.over_time
            except ProcessExpired as exc:
                outcome = _died(exc.exitcode)
            except BrokenExecutor as exc:
                # No worker could start (or keep running): that is no file's fault, and
                # skipping every file for it would be a wrong reason for each.
                raise IngestError(
                    f"the processes that parse files could not run ({exc}); nothing was "
                    "written (ragchains must run from a file or a command, not from "
                    "standard input)"
                ) from exc
            except MemoryError:  # raised in the worker sending its result back
                outcome = budget.over_memory
            except Exception as exc:  # the result could not come back (pickling, a pool error)
                log.debug("parsing %s failed", job.path, exc_info=True)
                outcome = f"could not be parsed ({type(exc).__name__}: {str(exc)[:200]})"
            yield job, outcome
        finished = True
    finally:
        if finished:
            pool.close()
        else:  # stopped early (an error, Ctrl-C): no file still parsing is wanted
            pool.stop()
        pool.join()
        if listening is not None:
            listening.stop()


class _PageListener:
    """Hands the workers' page counts to ``on_pages`` until stopped."""

    def __init__(self, pages: Any, on_pages: Callable[[list[tuple[str, str, int]]], None]) -> None:
        self.pages = pages
        self.on_pages = on_pages
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ragchains-pages", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            found = pageprogress.drained(self.pages, 0.2)
            if found:
                try:
                    self.on_pages(found)
                except Exception:  # progress must never fail the run
                    log.debug("page progress not told", exc_info=True)

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(5)
        self.pages.close()


def _died(exitcode: int | None) -> str:
    if exitcode == -signal.SIGKILL:
        # Under the address-space cap a parser fails an allocation before the machine runs
        # out; a kill is the kernel's OOM killer (memory short for everything on the
        # machine) or a stop from outside.
        return (
            "the parsing process was killed (SIGKILL: the machine out of memory, or a stop "
            "from outside)"
        )
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name if -exitcode in signal.valid_signals() else exitcode
        return f"the parser crashed on this file ({name})"
    return f"the parsing process ended unexpectedly (exit code {exitcode})"


class BudgetedCalls:
    """Calls that read a file's bytes (a viewer's page, a sheet) made in worker processes
    under a ``ParseBudget``, for a process that must never parse a file itself: a server.
    ``call`` returns the function's result or raises what it raised; a call over its budget
    raises ``SkipFile`` with the reason. The workers start at the first call."""

    def __init__(self, budget: ParseBudget, workers: int = 1) -> None:
        self.budget = budget
        self.workers = workers
        self._pool: Any = None
        self._lock = threading.Lock()

    def call(self, function: Callable[..., T], *args: Any) -> T:
        from pebble import ProcessExpired

        future = self._started().schedule(
            _budgeted_call, args=(function, *args), timeout=self.budget.seconds
        )
        try:
            return future.result()  # type: ignore[no-any-return]
        except FutureTimeout:
            raise SkipFile(self.budget.over_time) from None
        except ProcessExpired as exc:
            raise SkipFile(_died(exc.exitcode)) from None
        except MemoryError:
            raise SkipFile(self.budget.over_memory) from None

    def _started(self) -> Any:
        with self._lock:
            if self._pool is None:
                from pebble import ProcessPool

                self._pool = ProcessPool(
                    max_workers=self.workers,
                    max_tasks=FILES_PER_WORKER,
                    initializer=_start_budgeted,
                    initargs=(self.budget,),
                    context=_context(),
                )
            return self._pool

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.stop()
                self._pool.join()
                self._pool = None


def _budgeted_call(function: Callable[..., T], *args: Any) -> T:
    return function(*args)
