"""Worst-case filters (issue 15): a 10,000-value ``in`` list once took 37.5 s and stalled
/healthz for 13.7 s. Now it is refused at once (422: at most 1,000 values), the largest list
accepted is answered, and neither holds up the event loop.

Against the real app under uvicorn in its own process, over the sample index:
1. ``POST /retrieve/invoke`` latency: no filter (the baseline), the 10,000-value list, the
   1,000-value list (the limit, answered).
2. ``GET /healthz`` latency, idle and while 20 requests of each list run at once.
Targets: the 10,000-value list answered or refused in < 50 ms; /healthz < 50 ms under load.

    python -m bench.hostile_filters            # writes its section of bench/RESULTS.md
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import statistics
import time
from typing import Any

import httpx

from bench.common import machine_line, percentile_ms, write_section
from bench.server_overhead import Server, sample_index
from ragchains.retrievers.filters import MAX_FILTERS, MAX_GLOB_CHARS, MAX_IN_VALUES, MAX_VALUE_CHARS

REPEATS = 5
CALLS = 20
CONCURRENT = 20
LOAD_SECONDS = 3.0
TARGET_MS = 50.0


def body(values: int | None) -> bytes:
    filters = (
        [] if values is None else [{"field": "price", "op": "in", "value": list(range(values))}]
    )
    return json.dumps({"input": {"query": "soil moisture sensor", "filters": filters}}).encode()


JSON = {"content-type": "application/json"}


def request_times(client: httpx.Client, values: int | None) -> tuple[list[float], int]:
    payload, times, status = body(values), [], 0
    for _ in range(CALLS):
        start = time.perf_counter()
        reply = client.post("/retrieve/invoke", content=payload, headers=JSON)
        times.append(time.perf_counter() - start)
        status = reply.status_code
    return times, status


def load(url: str, values: int, started: Any, done: Any) -> None:
    """``CONCURRENT`` clients posting the list back to back (bodies encoded once) until
    ``done`` is set, in a process of its own: the probe's own process must not be the one
    that is busy. ``started`` is set once every client has had a reply."""

    async def run() -> None:
        payload = body(values)
        limits = httpx.Limits(max_connections=CONCURRENT)
        answered: set[int] = set()
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

            async def hammer(n: int) -> None:
                while not done.is_set():
                    await client.post("/retrieve/invoke", content=payload, headers=JSON)
                    answered.add(n)
                    if len(answered) == CONCURRENT:
                        started.set()

            await asyncio.gather(*(hammer(n) for n in range(CONCURRENT)))

    asyncio.run(run())


def health_under_load(client: httpx.Client, url: str, values: int | None) -> list[float]:
    """/healthz every 20 ms, alone (``values`` None: the baseline) or while the load runs."""
    spawn = multiprocessing.get_context("spawn")
    started, done = spawn.Event(), spawn.Event()
    loader = None
    if values is not None:
        loader = spawn.Process(target=load, args=(url, values, started, done))
        loader.start()
        if not started.wait(60):  # the load fully under way before the first probe
            raise RuntimeError("the load did not start")
    times, stop = [], time.perf_counter() + LOAD_SECONDS
    while time.perf_counter() < stop:
        start = time.perf_counter()
        client.get("/healthz").raise_for_status()
        times.append(time.perf_counter() - start)
        time.sleep(0.02)
    done.set()
    if loader is not None:
        loader.join()
    return times


def one_repeat(url: str) -> dict[str, Any]:
    with httpx.Client(base_url=url, timeout=60) as client:
        request_times(client, None)  # warm-up
        out: dict[str, Any] = {}
        for name, values in (("none", None), ("10000", 10_000), ("1000", 1_000)):
            times, status = request_times(client, values)
            out[name] = (percentile_ms(times, 50), status)
        for name, values in (("idle", None), ("10000", 10_000), ("1000", 1_000)):
            times = health_under_load(client, url, values)
            out[f"health-{name}"] = (
                percentile_ms(times, 50),
                percentile_ms(times, 99),
                percentile_ms(times, 100),
                len(times),
            )
    return out


def _outcome(status: int) -> str:
    return "refused (422)" if status == 422 else f"answered ({status})"


def main() -> None:
    index = sample_index()
    runs: list[dict[str, Any]] = []
    with Server(index, 0.0) as server:
        for _ in range(REPEATS):
            runs.append(one_repeat(server.url))

    def med(key: str, part: int = 0) -> float:
        return statistics.median(run[key][part] for run in runs)

    refused = med("10000")
    # The slowest reply over every repeat, not a median of them.
    worst = max(run[key][2] for run in runs for key in ("health-10000", "health-1000"))
    lines = [
        "## Worst-case filters (`python -m bench.hostile_filters`)",
        "",
        machine_line(),
        "",
        f"The real app under uvicorn in its own process, sample index. Medians over {REPEATS} "
        f"repeats; each request figure is the p50 of {CALLS} sequential calls.",
        "",
        "| `POST /retrieve/invoke` | status | p50 ms | / no filter |",
        "|---|---:|---:|---:|",
    ]
    for name, label in (
        ("none", "no filter (baseline)"),
        ("10000", "`price in` 10,000 values"),
        ("1000", f"`price in` {MAX_IN_VALUES:,} values (the limit)"),
    ):
        status = runs[-1][name][1]
        lines.append(f"| {label} | {status} | {med(name):.1f} | {med(name) / med('none'):.2f} |")
    probes = sum(run["health-10000"][3] for run in runs)
    lines += [
        "",
        f"`GET /healthz` every 20 ms for {LOAD_SECONDS:.0f} s, from the moment all "
        f"{CONCURRENT} clients (another process) posting the list back to back have had a "
        f"reply; about {probes // REPEATS} probes per repeat. p50 and p99: medians over the "
        "repeats; max: the slowest of all.",
        "",
        "| while | p50 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|",
    ]
    for name, label in (
        ("health-idle", "nothing else running (baseline)"),
        ("health-10000", "the 10,000-value list"),
        ("health-1000", f"the {MAX_IN_VALUES:,}-value list"),
    ):
        slowest = max(run[name][2] for run in runs)
        lines.append(f"| {label} | {med(name):.1f} | {med(name, 1):.1f} | {slowest:.1f} |")
    lines += [
        "",
        f"- The 10,000-value list is {_outcome(runs[-1]['10000'][1])} in {refused:.1f} ms at "
        f"p50; target < {TARGET_MS:.0f} ms: {'meets' if refused < TARGET_MS else 'misses'}.",
        f"- /healthz under either load: slowest of all {worst:.1f} ms; target < "
        f"{TARGET_MS:.0f} ms: {'meets' if worst < TARGET_MS else 'misses'}.",
        f"- Filters are checked in one pass (at most {MAX_FILTERS} filters, {MAX_IN_VALUES:,} "
        f"values, {MAX_VALUE_CHARS:,} characters per value, {MAX_GLOB_CHARS} per glob) and "
        "requests' search work runs in a worker pool, never on the event loop.",
    ]
    write_section("hostile_filters", "\n".join(lines))


if __name__ == "__main__":
    main()
