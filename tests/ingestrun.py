"""``ragchains ingest`` run as a user runs it, its memory watched: the peak resident size of
each of its processes (the run, the forkserver, each parsing worker) and of all of them at
once, sampled every 20 ms with psutil."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

RAGCHAINS = Path(sys.executable).parent / "ragchains"


@dataclass
class WatchedRun:
    returncode: int
    stdout: str
    stderr: str
    peak_process_mb: float  # the largest any one process of the run grew to
    peak_total_mb: float  # the run's processes together, at their largest moment
    seconds: float

    def report(self) -> dict[str, Any]:
        """The ``--json`` report."""
        return json.loads(self.stdout)  # type: ignore[no-any-return]

    def reasons(self) -> dict[str, str]:
        """Each skipped file's reason, by source."""
        return {s["source"]: s["reason"] for s in self.report()["skipped_files"]}


def ingest_watched(*args: str | Path, env: dict[str, str] | None = None) -> WatchedRun:
    """``ragchains ingest ARGS...`` without the caller's RAGCHAINS_* settings."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAGCHAINS_")}
    start = time.monotonic()
    # Files, not pipes: a long report must not fill a pipe nobody reads while we sample.
    with (
        tempfile.TemporaryFile("w+") as out,
        tempfile.TemporaryFile("w+") as err,
        subprocess.Popen(
            [str(RAGCHAINS), "ingest", *map(str, args)],
            env={**clean, **(env or {})},
            stdout=out,
            stderr=err,
            text=True,
        ) as proc,
    ):
        peak_one = peak_all = 0
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            sizes = []
            try:
                family = [root, *root.children(recursive=True)]
            except psutil.Error:
                family = []
            for member in family:
                with contextlib.suppress(psutil.Error):
                    sizes.append(member.memory_info().rss)
            if sizes:
                peak_one, peak_all = max(peak_one, max(sizes)), max(peak_all, sum(sizes))
            time.sleep(0.02)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    assert "Traceback" not in stderr, stderr
    return WatchedRun(
        proc.returncode,
        stdout,
        stderr,
        peak_one / 2**20,
        peak_all / 2**20,
        time.monotonic() - start,
    )
