"""Shared benchmark plumbing: cache folder, timing statistics, machine facts, results file."""

from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import statistics
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "RESULTS.md"
SHARED_DATA = REPO.parent / "shared" / "data"


def cache_dir(name: str) -> Path:
    """Embeddings and corpora are cached outside the repository (they take minutes to make)."""
    root = Path(os.environ.get("RAGCHAINS_BENCH_CACHE", Path.home() / ".cache" / "ragchains-bench"))
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def percentile_ms(samples: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples) * 1000.0, q))


def time_calls(fn: Callable[[int], object], n: int) -> list[float]:
    """Seconds per call of fn(i) for i in range(n)."""
    out = []
    for i in range(n):
        start = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - start)
    return out


def median_of(runs: Sequence[float]) -> float:
    return statistics.median(runs)


def peak_rss_mb() -> float:
    """This process's peak resident memory, in MB."""
    # VmHWM belongs to the process image: ru_maxrss survives exec, so a benchmark's worker
    # process would report its parent's peak if that was higher.
    try:
        status = Path("/proc/self/status").read_text(encoding="utf-8")
        found = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
        if found:
            return int(found.group(1)) / 1024.0
    except OSError:
        pass
    # ru_maxrss is in kilobytes on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def machine_line() -> str:
    versions = ", ".join(
        f"{pkg} {metadata.version(pkg)}"
        for pkg in (
            "bm25s",
            "faiss-cpu",
            "sentence-transformers",
            "torch",
            "langchain-core",
            "langchain-classic",
            "langchain-community",
            "rank-bm25",
        )
        if _installed(pkg)
    )
    cpu = platform.processor() or platform.machine()
    try:
        model = re.search(
            r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text(encoding="utf-8")
        )
        if model:
            cpu = model.group(1).strip()
    except OSError:
        pass
    return (
        f"{datetime.now(UTC).date().isoformat()} · {os.cpu_count()} cores ({cpu}) · "
        f"Python {platform.python_version()} · {versions}"
    )


def _installed(pkg: str) -> bool:
    try:
        metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return False
    return True


def write_section(name: str, body: str) -> None:
    """Replace (or append) the section between this benchmark's markers in RESULTS.md."""
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    text = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else _HEADER
    if begin in text and end in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    RESULTS.write_text(text, encoding="utf-8")
    print(block)


_HEADER = """# Benchmark results

Written by `make bench` (each benchmark rewrites its own section). Latencies are medians over
repeats, compared with a baseline measured in the same process on the same data; these shared
2-core machines are noisy, so ratios matter more than absolute numbers.
"""


def synthetic_run(
    description: str | None,
    *,
    sizes: str = "10000,100000",
    extra: Sequence[tuple[str, dict[str, Any]]] = (),
) -> tuple[argparse.Namespace, Any, Any]:
    """The options of a benchmark over the synthetic corpus (--sizes, --queries, --repeats,
    and ``extra``: (flag, add_argument keywords)), the default settings (no .env, no
    RAGCHAINS_* variables) and the embedder they name."""
    from ragchains.factory import build_embedder, configure_runtime
    from ragchains.settings import Settings

    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default=sizes)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    for flag, options in extra:
        parser.add_argument(flag, **options)
    args = parser.parse_args()
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    configure_runtime(settings)
    return args, settings, build_embedder(settings)
