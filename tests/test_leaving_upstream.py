"""A reader who leaves closes the upstream request, and the upstream stops generating (issue
39): `ragchains serve` with the openai provider against llama.cpp's OpenAI-compatible server
(``python -m llama_cpp.server``, as the suite runs it), ``/v1/chat/completions`` streamed and
cut at points spread over a turn (ten with ``make test-long``, three in the suite)."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.leaving import (
    GUARD,
    POINT_COUNTS,
    ROUTES,
    SEED,
    Turn,
    assert_freed,
    leave_at_every_point,
)
from tests.servers import LlamaServer, llama_cpp_server, ragchains_serve

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def cpu_seconds(pid: int) -> float:
    """The process's CPU time so far (user and system, all threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture(scope="module")
def llama() -> Iterator[LlamaServer]:
    with llama_cpp_server() as server:
        yield server


@pytest.mark.parametrize("points", POINT_COUNTS)
def test_a_client_that_leaves_closes_the_upstream_request_and_the_upstream_stops(
    llama: LlamaServer, sample_index: Path, points: int
) -> None:
    """/v1 streamed through `ragchains serve` on the openai provider, cut at points: our
    server closes its request to llama.cpp's server, which stops generating: within two
    seconds its CPU is still. It stops at its next token; a prompt it is reading it reads to
    the end (llama-cpp-python's server reads one in a single call it cannot interrupt, though
    it lets go of its lock at once), so a cut before the answer's first token waits for that
    at most: the upstream is idle two seconds after the cut, or after the first token would
    have come."""
    pid = llama.process.pid
    freed: list[tuple[float, float]] = []

    def upstream_freed(turn: Turn, after: float, gone: float) -> None:
        reading = max(0.0, turn.first_token - after)  # what a prompt being read may take
        while True:
            before = cpu_seconds(pid)
            time.sleep(0.25)
            if cpu_seconds(pid) - before < 0.05:
                break
            assert time.monotonic() - gone < GUARD, "the upstream never stopped generating"
        freed.append((time.monotonic() - gone, 2.0 + reading))

    env = {"RAGCHAINS_LLM_PROVIDER": "openai", "RAGCHAINS_OPENAI_BASE_URL": llama.base_url}
    with ragchains_serve("--index", str(sample_index), **env) as base:
        rng = random.Random(f"{SEED}-{points}")
        cuts = leave_at_every_point(base, ROUTES[2], rng, points, upstream_freed)
    assert_freed(cuts)
    assert len(freed) == points
    assert all(took <= bound for took, bound in freed), freed
