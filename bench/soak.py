"""Soak (issue 15): 200 concurrent ``/retrieve/invoke`` clients for 60 s against
``ragchains serve`` (the command, as a user runs it, in its own process), with an ingest
committed into the served index folder partway through. Reported: requests, errors (target 0), latency, the server's resident
memory over the run (its growth), and how long after the commit the new generation was
served (no restart).

The model run (issue 30): 32 clients streaming ``/chat/stream`` for 60 s against ``ragchains
serve`` with the embedded model (SmolLM2, one call at a time) and its default queue
settings; a client refused with 503 waits its Retry-After and asks again, as the chat page
does. Reported: whether first answer tokens come in order of arrival (inversions, Kendall's
tau), the waits against the configured bound (``model_queue_wait``), the 503s (on arrival,
mid-stream) and cut streams (target 0).

The churn run (issue 39): 48 ``/chat/stream`` turns arriving at seeded random times over 3
minutes against ``ragchains serve`` with the embedded model, a third of them cut by their
client at a random point (queued or searching, reading, writing the answer), as readers who close the tab
or press Stop. Reported: stuck requests (target 0: the server's queue idle once the clients
are done, and no turn left hanging), whether every turn not cut ended with an intact answer,
the readers' waits (p50, p95), and the server's resident memory before and after.

    python -m bench.soak                 # all runs; each writes its section of bench/RESULTS.md
    python -m bench.soak --run model     # the model run only (CPU heavy: minutes)
    python -m bench.soak --run churn     # the churn run only (3 minutes and the tail)
    python -m bench.soak --seconds 20    # shorter retrieve and model runs (the report says so)
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
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
    parser.add_argument("--run", choices=("all", "retrieve", "model", "churn"), default="all")
    args = parser.parse_args()
    docs, index = prepare()
    if args.run in ("all", "retrieve"):
        retrieve_run(docs, index, args.seconds)
    if args.run in ("all", "model"):
        model_run(index, args.seconds)
    if args.run in ("all", "churn"):
        churn_run(index)


def retrieve_run(docs: Path, index: Path, seconds: float) -> None:
    serve = [str(Path(sys.executable).parent / "ragchains"), "serve", "--index", str(index)]
    with Server(index, command=[*serve, "--port", "{port}"]) as server:
        result = asyncio.run(soak(server.url, server.process.pid, docs, index, seconds))
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
        f"{seconds:.0f} s (one httpx client process) against `ragchains serve` "
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


# ----------------------------------------------------------------------------- model run
STREAMS = 32
# Answerable from the samples (every turn calls the model twice: rewrite, answer); each
# client asks its own, so no two turns are the same.
CHAT_QUESTIONS = (
    "What does the standard health plan cost the employee per month?",
    "How many vacation days do employees get?",
    "What is the per diem for meals while travelling?",
    "How long is parental leave?",
)


@dataclass
class Turn:
    """One /chat/stream request as its client saw it (times: the run's clock)."""

    sent: float
    status: int = 0
    retry_after: int | None = None
    first_token: float | None = None
    finished: float | None = None
    outcome: str = ""  # complete, refused (503 before streaming), busy (503 event), cut, error
    answer: str = ""
    incomplete: bool = False  # the server marked its answer cut short
    left: str = ""  # a client that left on purpose: where (searching, reading, answering)
    events: int = 0


async def chat_turn(
    http: httpx.AsyncClient, question: str, start: float, *, leave_after: float | None = None
) -> Turn:
    """One turn as its reader sees it; ``leave_after``: the reader leaves (closes the
    connection) that many seconds after its request was admitted."""
    turn = Turn(sent=time.perf_counter() - start)
    try:
        async with http.stream(
            "POST", "/chat/stream", json={"input": {"question": question}}
        ) as reply:
            turn.status = reply.status_code
            if reply.status_code != 200:
                turn.retry_after = int(reply.headers.get("retry-after", "0")) or None
                turn.outcome = (
                    "refused" if reply.status_code == 503 else f"http {reply.status_code}"
                )
                await reply.aread()
                turn.finished = time.perf_counter() - start
                return turn
            try:
                async with asyncio.timeout(leave_after):
                    await _read_turn(reply, turn, start)
            except TimeoutError:
                turn.outcome = "left"
                if turn.first_token is not None:
                    turn.left = "answering"
                elif turn.events:  # the sources came: the model reads its prompt
                    turn.left = "reading"
                else:  # queued, rewriting or searching: nothing came yet
                    turn.left = "searching"
    except httpx.HTTPError as exc:
        turn.outcome = f"cut ({type(exc).__name__})"
    turn.outcome = turn.outcome or "cut"
    turn.finished = time.perf_counter() - start
    return turn


async def _read_turn(reply: httpx.Response, turn: Turn, start: float) -> None:
    event = ""
    async for line in reply.aiter_lines():
        if line.startswith("event:"):
            event = line.split(":", 1)[1].strip()
            turn.events += 1
            if event == "end":
                turn.outcome = "complete"
        elif line.startswith("data:") and event == "data":
            data = json.loads(line[5:])
            if data.get("answer"):
                turn.answer += data["answer"]
                if turn.first_token is None:
                    turn.first_token = time.perf_counter() - start
            turn.incomplete = turn.incomplete or bool(data.get("incomplete"))
        elif line.startswith("data:") and event == "error":
            said = json.loads(line[5:])
            turn.outcome = "busy" if said.get("status_code") == 503 else "error"
            turn.retry_after = said.get("retry_after")


async def model_soak(url: str, seconds: float) -> dict[str, Any]:
    turns: list[Turn] = []
    queue_readings: list[dict[str, Any]] = []
    limits = httpx.Limits(max_connections=STREAMS + 2, max_keepalive_connections=STREAMS + 2)
    async with (
        httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http,
        httpx.AsyncClient(base_url=url, timeout=60) as control,
    ):
        # One turn first: the queue learns how long a turn holds the model (a cold server
        # has nothing to estimate a wait from, and admits the first burst whole).
        warm = await chat_turn(http, CHAT_QUESTIONS[0], time.perf_counter())
        start = time.perf_counter()
        stop = start + seconds

        async def client(n: int) -> None:
            await asyncio.sleep(n * 0.1)  # a well-defined order of first arrivals
            asked = 0
            while time.perf_counter() < stop:
                question = f"{CHAT_QUESTIONS[n % len(CHAT_QUESTIONS)]} ({n}.{asked})"
                asked += 1
                turn = await chat_turn(http, question, start)
                turns.append(turn)
                if turn.retry_after:  # as the chat page does
                    await asyncio.sleep(turn.retry_after)

        async def watch() -> None:
            while True:  # until the clients are done
                queue_readings.append((await control.get("/readyz")).json()["llm"]["queue"])
                await asyncio.sleep(1.0)

        watcher = asyncio.create_task(watch())
        await asyncio.gather(*(client(n) for n in range(STREAMS)))
        watcher.cancel()
        final = (await control.get("/readyz")).json()["llm"]["queue"]
        metrics = (await control.get("/metrics")).text
    return {
        "warm": warm,
        "turns": turns,
        "readings": queue_readings,
        "final": final,
        "metrics": metrics,
        "wall": time.perf_counter() - start,
    }


def inversions(turns: list[Turn]) -> tuple[int, int]:
    """Pairs of answered turns whose first tokens came in the other order than they were
    sent, and all pairs."""
    timed = sorted((t.sent, t.first_token) for t in turns if t.first_token is not None)
    firsts = [first for _, first in timed]
    pairs = len(firsts) * (len(firsts) - 1) // 2
    swapped = sum(
        1 for i in range(len(firsts)) for j in range(i + 1, len(firsts)) if firsts[i] > firsts[j]
    )
    return swapped, pairs


def model_run(index: Path, seconds: float) -> None:
    serve = [str(Path(sys.executable).parent / "ragchains"), "serve", "--index", str(index)]
    with Server(index, command=[*serve, "--port", "{port}"]) as server:
        result = asyncio.run(model_soak(server.url, seconds))
    turns: list[Turn] = result["turns"]
    final, readings = result["final"], result["readings"]
    limit = final["max_wait_s"]
    outcomes: dict[str, int] = {}
    for turn in turns:
        outcomes[turn.outcome] = outcomes.get(turn.outcome, 0) + 1
    answered = [t for t in turns if t.outcome == "complete"]
    swapped, pairs = inversions(answered)
    tau = 1 - 2 * swapped / pairs if pairs else 1.0
    first = sorted(t.first_token - t.sent for t in answered if t.first_token is not None)
    cut = sum(v for k, v in outcomes.items() if k not in ("complete", "refused", "busy"))
    waits = final["request_wait_s"]
    longest = max((r["longest_waiting_s"] for r in readings), default=0.0)
    estimated = max((r["estimated_wait_s"] for r in readings), default=0.0)
    over = waits["max"] > limit + 0.5
    lines = [
        "## Soak: the embedded model's queue (`python -m bench.soak --run model`)",
        "",
        machine_line(),
        "",
        f"{STREAMS} clients streaming `/chat/stream` for {seconds:.0f} s (then their last turns "
        "finish) against `ragchains serve` with the embedded SmolLM2 (one call at a time) and "
        f"the default queue settings (`RAGCHAINS_MODEL_QUEUE_WAIT` {limit:g} s), after one "
        "warm-up turn; the clients start 0.1 s apart, each asks a new question as soon as its "
        "last turn ends, and one refused with 503 waits its Retry-After first, as the chat page "
        f"does. A turn alone took {result['warm'].finished:.1f} s in this run; the server's "
        f"recent model time per turn: {final['seconds_per_request']} s.",
        "",
        "| turns | answered | 503 on arrival | 503 mid-stream | cut | first-token order: inversions / pairs (Kendall tau) | time to first token p50 / max s |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {len(turns)} | {len(answered)} | {outcomes.get('refused', 0)} | "
        f"{outcomes.get('busy', 0)} | {cut} | {swapped} / {pairs} ({tau:.3f}) | "
        f"{percentile_ms(first, 50) / 1000:.1f} / {max(first, default=0.0):.1f} |",
        "",
        f"- Waits against the bound ({limit:g} s), as the server measured them: a request's "
        "wait for the model (the time during which any of its calls waited, at the answer gate "
        f"too), over its last {waits['count']} admitted "
        f"requests: median {waits['median']:.1f} s, max {waits['max']:.1f} s "
        f"({'within' if not over else 'OVER'} the bound); the longest a waiting call had "
        f"waited at any 1 s reading: {longest:.1f} s; the highest wait estimated for a "
        f"newcomer: {estimated:.1f} s.",
        f"- Outcomes: {', '.join(f'{k}: {v}' for k, v in sorted(outcomes.items()))}; "
        f"target 0 cut streams: {'meets' if cut == 0 else 'misses'}; first tokens in order "
        f"of arrival: {'yes' if swapped == 0 else f'{swapped} inversions'}.",
        "- First tokens follow arrival through the queue's answer gate: a turn's answer call "
        "starts only once every earlier turn still open has started its own (the model may "
        "idle meanwhile; other calls are served in arrival order as the model frees). An "
        "admitted turn whose wait outgrows the bound all the same (the estimate at admission "
        "counts the model work ahead, not time at the gate) ends with a 503 error event "
        "carrying its Retry-After: the 503 mid-stream column.",
        "- Before issue 30 (the probe of the issue): 32 streams for 60 s gave 0 errors but a "
        "first token at a median of 95 s (max 145 s), in no particular order, with only "
        "keep-alive pings meanwhile.",
    ]
    write_section("soak_model", "\n".join(lines))


# ----------------------------------------------------------------------------- churn run
CHURN_STREAMS = 48
CHURN_SECONDS = 180.0
CHURN_SEED = 39
TURN_GUARD = 300.0  # seconds: a turn that takes longer is stuck


async def churn(url: str, pid: int, *, leave: bool) -> dict[str, Any]:
    """``CHURN_STREAMS`` turns arriving at random over ``CHURN_SECONDS``; with ``leave`` a third
    of their readers leave at a random point (without, the same turns all stay: the baseline).
    A turn refused on arrival (503) is asked again after its Retry-After, as the chat page
    does."""
    rng = random.Random(CHURN_SEED)
    arrivals = sorted(rng.uniform(0, CHURN_SECONDS) for _ in range(CHURN_STREAMS))
    leaving = set(rng.sample(range(CHURN_STREAMS), CHURN_STREAMS // 3)) if leave else set()
    limits = httpx.Limits(max_connections=CHURN_STREAMS + 2)
    async with (
        httpx.AsyncClient(base_url=url, timeout=TURN_GUARD, limits=limits) as http,
        httpx.AsyncClient(base_url=url, timeout=60) as control,
    ):
        warm = await chat_turn(http, CHAT_QUESTIONS[0], time.perf_counter())
        await asyncio.sleep(2)
        rss_before = rss_mb(pid)
        # A reader leaves somewhere in its turn: waiting, reading or writing (a turn alone
        # takes ``warm.finished`` seconds; waiting in the queue only adds to it).
        alone = warm.finished or 5.0
        leave_after = {n: rng.uniform(0.05, 0.95) * alone for n in leaving}
        start = time.perf_counter()

        async def reader(n: int) -> list[Turn]:
            await asyncio.sleep(arrivals[n])
            question = f"{CHAT_QUESTIONS[n % len(CHAT_QUESTIONS)]} ({n})"
            tries = []
            while True:
                try:
                    async with asyncio.timeout(TURN_GUARD):
                        turn = await chat_turn(
                            http, question, start, leave_after=leave_after.get(n)
                        )
                except TimeoutError:
                    turn = Turn(sent=0.0, outcome="stuck")
                tries.append(turn)
                if turn.outcome != "refused" or not turn.retry_after:
                    return tries
                await asyncio.sleep(turn.retry_after)

        tries = await asyncio.gather(*(reader(n) for n in range(CHURN_STREAMS)))
        wall = time.perf_counter() - start
        queue = (await control.get("/readyz")).json()["llm"]["queue"]
        idle_after = 0.0
        while queue["busy"] or queue["waiting"] or queue["requests"]:
            if idle_after > 10:
                break
            await asyncio.sleep(0.1)
            idle_after += 0.1
            queue = (await control.get("/readyz")).json()["llm"]["queue"]
        await asyncio.sleep(5)
        rss_after = rss_mb(pid)
    return {
        "warm": warm,
        "tries": tries,
        "leaving": leaving,
        "queue": queue,
        "idle_after": idle_after,
        "rss": (rss_before, rss_after),
        "wall": wall,
    }


def churn_run(index: Path) -> None:
    serve = [str(Path(sys.executable).parent / "ragchains"), "serve", "--index", str(index)]
    runs = {}
    for leave in (False, True):  # the baseline first, each on a server of its own
        with Server(index, command=[*serve, "--port", "{port}"]) as server:
            runs[leave] = asyncio.run(churn(server.url, server.process.pid, leave=leave))
    result, baseline = runs[True], runs[False]
    tries: list[list[Turn]] = result["tries"]
    last = [t[-1] for t in tries]
    refusals = sum(1 for t in tries for turn in t if turn.outcome == "refused")
    left = [turn for turn in last if turn.outcome == "left"]
    stayed = [turn for n, turn in enumerate(last) if n not in result["leaving"]]
    intact = [
        t for t in stayed if t.outcome == "complete" and t.answer.strip() and not t.incomplete
    ]
    not_intact = [t for t in stayed if t not in intact]
    queue = result["queue"]
    hanging = sum(1 for turn in last if turn.outcome == "stuck")
    stuck = hanging + queue["busy"] + queue["waiting"] + queue["requests"]
    waits = sorted(t.first_token - t.sent for t in intact if t.first_token is not None)
    where: dict[str, int] = {}
    for turn in left:
        where[turn.left] = where.get(turn.left, 0) + 1
    before, after = result["rss"]
    base_before, base_after = baseline["rss"]
    outcomes: dict[str, int] = {}
    for turn in not_intact:
        outcomes[turn.outcome] = outcomes.get(turn.outcome, 0) + 1
    lines = [
        "## Soak: readers who leave (`python -m bench.soak --run churn`)",
        "",
        machine_line(),
        "",
        f"{CHURN_STREAMS} `/chat/stream` turns arriving at seeded random times over "
        f"{CHURN_SECONDS:.0f} s against `ragchains serve` with the embedded SmolLM2 (one call at "
        f"a time, the default queue settings); {len(result['leaving'])} of their readers (a "
        "third, chosen at random) close the connection at a random point of their turn, up to "
        "the time of a turn alone "
        f"({result['warm'].finished:.1f} s in this run), as a reader closing the tab or pressing "
        "Stop. The baseline: the same turns on a server of its own, every reader staying. A turn refused on arrival (503) is asked again after its Retry-After, as the "
        f"chat page does ({refusals} refusals in all). The run took {result['wall']:.0f} s.",
        "",
        "| turns | readers who left (before the sources / before the answer / during it) | stuck | others' answers intact | reader's wait to first token p50 / p95 s | server RSS before / after MB |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {CHURN_STREAMS} | {len(left)} ({where.get('searching', 0)} / {where.get('reading', 0)} "
        f"/ {where.get('answering', 0)}) | {stuck} | {len(intact)} of {len(stayed)} | "
        f"{percentile_ms(waits, 50) / 1000:.1f} / {percentile_ms(waits, 95) / 1000:.1f} | "
        f"{before:.0f} / {after:.0f} |",
        "",
        f"- Stuck (target 0): turns that never ended ({hanging}), and what the server's queue "
        f"held once every client was done (busy {queue['busy']}, waiting {queue['waiting']}, "
        f"requests in progress {queue['requests']}; idle {result['idle_after']:.1f} s after "
        f"the last client): {'meets' if stuck == 0 else 'MISSES'}.",
        f"- Every turn whose reader stayed ended with its whole answer (an `end` event, no error "
        f"event, not marked incomplete): {len(intact)} of {len(stayed)}"
        + (
            f"; the others: {', '.join(f'{k}: {v}' for k, v in sorted(outcomes.items()))}."
            if outcomes
            else "."
        ),
        f"- Server RSS after the run minus before it (each read 2-5 s after the clients were "
        f"idle): **{after - before:+.0f} MB**; the baseline's, every reader staying: "
        f"{base_after - base_before:+.0f} MB ({base_before:.0f} to {base_after:.0f} MB): the "
        "memory a fresh server takes on as it serves its first turns (allocator arenas, "
        "llama.cpp's buffers), with or without readers leaving.",
        "- Before issue 39 one reader leaving while the answer streamed left the model locked "
        "for good: every later turn waited until its bound and got a 503.",
    ]
    write_section("soak_churn", "\n".join(lines))


if __name__ == "__main__":
    main()
