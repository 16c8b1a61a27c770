"""A reader who leaves closes the upstream request, and the upstream stops generating (issue
39): `ragchains serve` with the openai provider against llama.cpp's OpenAI-compatible server
(``python -m llama_cpp.server``, as the suite runs it), ``/v1/chat/completions`` streamed and
cut at points spread over a turn (ten with ``make test-long``; the suite cuts once, mid-answer)."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.leaving import (
    ALLOWANCE,
    GUARD,
    POINT_COUNTS,
    ROUTES,
    SEED,
    Departure,
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
    seconds of a cut during the answer its CPU is still. A prompt it is reading it reads to
    the end (llama-cpp-python's server reads one in a single call it cannot interrupt, though
    it lets go of its lock at once), so a cut before the answer's first token may wait for
    that too: at most the time to a first token, with the allowance a question after a cut
    has for a machine busy with other work."""
    pid = llama.process.pid
    late: list[str] = []

    def upstream_freed(turn: Turn, departure: Departure) -> None:
        bound = 2.0 if departure.answering else 2.0 + ALLOWANCE * turn.first_token
        while True:
            before = cpu_seconds(pid)
            time.sleep(0.25)
            if cpu_seconds(pid) - before < 0.05:
                break
            assert time.monotonic() - departure.when < GUARD, "the upstream never stopped"
        took = time.monotonic() - departure.when
        if took > bound:
            answering = "during the answer" if departure.answering else "before the answer"
            late.append(f"cut at {departure.after:.2f} s ({answering}): still after {took:.2f} s")

    env = {"RAGCHAINS_LLM_PROVIDER": "openai", "RAGCHAINS_OPENAI_BASE_URL": llama.base_url}
    with ragchains_serve("--index", str(sample_index), **env) as base:
        rng = random.Random(f"{SEED}-{points}")
        cuts = leave_at_every_point(base, ROUTES[2], rng, points, upstream_freed)
    assert_freed(cuts)
    assert not late, "\n".join(late)
