"""Soak (issue 15): 200 concurrent ``/retrieve/invoke`` clients for 60 s against
``ragchains serve`` (the command, as a user runs it, in its own process), with an ingest
committed into the served index folder partway through. Reported: requests, errors (target 0), latency, the server's resident
memory over the run (its growth), and how long after the commit the new generation was
served (no restart).

    python -m bench.soak                 # writes its section of bench/RESULTS.md
    python -m bench.soak --seconds 20    # a shorter run (the report says so)
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import REPO, cache_dir, machine_line, percentile_ms, write_section
from bench.server_overhead import Server

CLIENTS = 200
SECONDS = 60.0
INGEST_AT = 0.3  # of the run
QUERIES = (
    "what does the standard plan cost?",
    "soil moisture sensor price",
    "how many vacation days do employees get?",
    "travel policy per diem",
    "greenhouse humidity",
    "parental leave",
)
NEW_DOC = (
    "# Zanzibarite\n\nZanzibarite is a blue mineral the greenhouse uses as a humidity "
    "indicator; the kit costs 12 dollars.\n"
)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def prepare() -> tuple[Path, Path]:
    """A private copy of samples/ and a fresh index of it (each run starts the same)."""
    root = cache_dir("soak")
    docs, index = root / "docs", root / "index"
    shutil.rmtree(docs, ignore_errors=True)
    shutil.rmtree(index, ignore_errors=True)
    shutil.copytree(REPO / "samples", docs)
    ingest(docs, index)
    return docs, index


def ingest(docs: Path, index: Path) -> None:
    subprocess.run(
        [Path(sys.executable).parent / "ragchains", "ingest", str(docs), "--index", str(index)],
        check=True,
        capture_output=True,
        cwd=REPO,
    )


async def soak(url: str, pid: int, docs: Path, index: Path, seconds: float) -> dict[str, Any]:
    statuses: dict[str, int] = {}
    times: list[float] = []
    memory: list[tuple[float, float]] = []
    asked = itertools.count()
    start = time.perf_counter()
    stop = start + seconds

    async def client(http: httpx.AsyncClient) -> None:
        while time.perf_counter() < stop:
            n = next(asked)
            query = f"{QUERIES[n % len(QUERIES)]} #{n}"  # never asked before: no cache answers
            began = time.perf_counter()
            try:
                reply = await http.post("/retrieve/invoke", json={"input": {"query": query}})
                key = str(reply.status_code)
            except httpx.HTTPError as exc:
                key = type(exc).__name__
            times.append(time.perf_counter() - began)
            statuses[key] = statuses.get(key, 0) + 1

    def sample_memory() -> None:  # in a thread: the busy event loop would delay it
        while time.perf_counter() < stop:
            memory.append((time.perf_counter() - start, rss_mb(pid)))
            time.sleep(1.0)

    switch: dict[str, Any] = {}

    async def ingest_partway(http: httpx.AsyncClient) -> None:
        await asyncio.sleep(seconds * INGEST_AT)
        before = (await http.get("/readyz")).json()["index"]["generation"]
        (docs / "notes" / "zanzibarite.md").write_text(NEW_DOC, encoding="utf-8")
        began = time.perf_counter()
        await asyncio.to_thread(ingest, docs, index)
        committed = time.perf_counter()
        while (await http.get("/readyz")).json()["index"]["generation"] == before:
            await asyncio.sleep(0.1)
        served = time.perf_counter()
        reply = await http.post(
            "/retrieve/invoke", json={"input": {"query": "zanzibarite blue mineral humidity"}}
        )
        switch.update(
            at=began - start,
            ingest_s=committed - began,
            served_after_s=served - committed,
            found=any("zanzibarite" in d["metadata"]["source"] for d in reply.json()["output"]),
        )

    # One connection per client, each reused at once: none sits idle toward the server's
    # keep-alive limit, where a request racing the server's close would fail.
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    async with (
        httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http,
        httpx.AsyncClient(base_url=url, timeout=120) as control,
    ):
        await http.post("/retrieve/invoke", json={"input": {"query": "warm up"}})
        alone = []  # the baseline: one search at a time, in this run
        for n in range(20):
            began = time.perf_counter()
            await http.post("/retrieve/invoke", json={"input": {"query": f"{QUERIES[0]} ~{n}"}})
            alone.append(time.perf_counter() - began)
        start = time.perf_counter()  # the run's clock starts with the load (the closures read it)
        stop = start + seconds
        sampler = threading.Thread(target=sample_memory)
        sampler.start()
        await asyncio.gather(*(client(http) for _ in range(CLIENTS)), ingest_partway(control))
        sampler.join()
    return {
        "statuses": statuses,
        "times": times,
        "memory": memory,
        "switch": switch,
        "wall": time.perf_counter() - start,
        "alone": alone,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=SECONDS)
    args = parser.parse_args()
    docs, index = prepare()
    serve = [str(Path(sys.executable).parent / "ragchains"), "serve", "--index", str(index)]
    with Server(index, command=[*serve, "--port", "{port}"]) as server:
        result = asyncio.run(soak(server.url, server.process.pid, docs, index, args.seconds))
    statuses, times, memory = result["statuses"], result["times"], result["memory"]
    total = sum(statuses.values())
    errors = total - statuses.get("200", 0)
    idle, last = memory[0][1], memory[-1][1]
    # Under load: once the 200 requests in flight have their buffers (the first seconds).
    loaded = next((mb for at, mb in memory if at >= 5), idle)
    switch = result["switch"]
    lines = [
        "## Soak (`python -m bench.soak`)",
        "",
        machine_line(),
        "",
        f"{CLIENTS} concurrent clients posting `/retrieve/invoke` back to back for "
        f"{args.seconds:.0f} s (one httpx client process) against `ragchains serve` "
        "in its own process, over a fresh index of samples/; at "
        f"{switch['at']:.0f} s a `ragchains ingest` adds a document to the served folder. "
        "Each query is new (no cache answers it). The latencies are mostly queueing: 200 "
        "requests wait at once on 2 cores shared by the server, the client and the ingest "
        f"(one search alone, in this run: {percentile_ms(result['alone'], 50):.1f} ms at p50 "
        "over 20 sequential calls).",
        "",
        "| requests | per s | errors | p50 ms | p95 ms | p99 ms |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {total} | {total / result['wall']:.0f} | {errors} | {percentile_ms(times, 50):.0f} "
        f"| {percentile_ms(times, 95):.0f} | {percentile_ms(times, 99):.0f} |",
        "",
        f"- Statuses: {', '.join(f'{k}: {v}' for k, v in sorted(statuses.items()))}; "
        f"target 0 errors: {'meets' if errors == 0 else 'misses'}.",
        f"- Server RSS: {idle:.0f} MB idle, {loaded:.0f} MB after 5 s of load, "
        f"{max(mb for _, mb in memory):.0f} MB at most, {last:.0f} MB at the end: growth "
        f"**{last - loaded:+.0f} MB** from 5 s to the end, which includes the new generation "
        "(its files, its filter columns) and the allocator keeping freed memory. Sampled "
        "each second, every tenth shown: "
        + ", ".join(f"{mb:.0f} MB at {at:.0f} s" for at, mb in memory[::10])
        + ".",
        f"- The ingest took {switch['ingest_s']:.1f} s; the server served the new generation "
        f"{switch['served_after_s']:.1f} s after it was committed, without a restart; the new "
        f"document {'was' if switch['found'] else 'was NOT'} found right after.",
    ]
    write_section("soak", "\n".join(lines))


if __name__ == "__main__":
    main()
