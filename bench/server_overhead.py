"""What serving costs: HTTP overhead on a chat turn, and concurrent streams.

1. Overhead: the chat graph over the sample index with an instant stub model, called
   in-process (``ainvoke``, the path the server runs) and over HTTP (``POST /chat/invoke`` to
   the real app under uvicorn in another process), the HTTP path twice in the same run,
   repeats interleaved: tracing off (no OTEL_* variables) and tracing on (the server exports
   its spans over OTLP/HTTP to a sink this benchmark runs, which counts them); Prometheus
   metrics are on in both, as always. Target: p50 difference <= 10 ms, each. A scrape of
   /metrics at the end checks the request counter against the calls made.
2. Concurrency: 64 streaming requests at once against a server whose stub model takes 2 s to
   stream each answer (asynchronously, as a remote model would). Target: all 64 done within
   1.6x the stub alone with no error, on /chat/stream and on /v1/chat/completions. The stub's
   own stream is timed in the same run, as the floor the walls are compared with; the server
   process's CPU time per turn is measured over the bursts.
3. Keep-alive: sequential GET /healthz on one kept-alive connection to `ragchains serve` and
   to `uvicorn --factory ragchains.server:create_app`, same index, same run. Target: serve
   within 2x of uvicorn (a listening socket without IPPROTO_TCP cost ~40 ms a reply).

    python -m bench.server_overhead            # writes its section of bench/RESULTS.md
    python -m bench.server_overhead --overhead-only
        # part 1 alone, printed (RESULTS.md untouched)
    python -m bench.server_overhead --before DIR
        # also measures the server CPU per turn of another checkout (DIR: a worktree of an
        # earlier commit), for the before/after line
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult

from bench.common import REPO, cache_dir, machine_line, percentile_ms, write_section
from ragchains.chains.llm import LLM

QUESTION = "what does the standard plan cost?"
_asked = itertools.count()


def question() -> str:
    """A question never asked before in this run: no cache may answer for the work."""
    return f"{QUESTION} (request {next(_asked)})"


ANSWER = "The standard plan costs $45.00 a month [employee-handbook.md#benefit-plans]."
REPEATS = 5
CALLS = 60
WARM_UP = 5  # untimed calls before each series of CALLS
CONCURRENT = 64
STUB_SECONDS = 2.0


class StubChat(BaseChatModel):
    """Replies at once to plain calls (the rewrite) and streams the answer over ``delay``
    seconds, sleeping asynchronously like a model behind a network."""

    delay: float = 0.0

    @property
    def _llm_type(self) -> str:
        return "stub"

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage("standard plan cost"))])

    async def _agenerate(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> ChatResult:
        return self._generate(messages)

    def _stream(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> Iterator[ChatGenerationChunk]:
        words = ANSWER.split(" ")
        for word in words:
            time.sleep(self.delay / len(words))
            yield ChatGenerationChunk(message=AIMessageChunk(word + " "))

    async def _astream(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        words = ANSWER.split(" ")
        for word in words:
            await asyncio.sleep(self.delay / len(words))
            yield ChatGenerationChunk(message=AIMessageChunk(word + " "))


def stub_llm(delay: float) -> LLM:
    return LLM(model=StubChat(delay=delay), name="stub", tool_calling=False, grammar=False)


def bench_settings(index: Path) -> Any:
    from ragchains.settings import Settings

    # Re-query off: one rewrite and one answer call per turn, whatever the scores.
    return Settings(_env_file=None, index=index, requery=False)  # type: ignore[call-arg]


def sample_index() -> Path:
    from ragchains.factory import configure_runtime, run_ingest

    index = cache_dir("server-overhead") / "samples"
    settings = bench_settings(index)
    configure_runtime(settings)
    run_ingest(settings, [REPO / "samples"], index, progress=False)
    return index


# ----------------------------------------------------------------------------- server process
def serve(index: Path, port: int, delay: float) -> None:
    import uvicorn

    from ragchains.server import KEEP_ALIVE_SECONDS, create_app

    app = create_app(bench_settings(index), llm=stub_llm(delay))
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        timeout_keep_alive=KEEP_ALIVE_SECONDS,  # as `ragchains serve` runs it
    )


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Server:
    """The app in its own process (so client and server do not share an interpreter); with
    ``command``, that command (``{port}`` filled in) instead of the stub-model app, and with
    ``checkout``, the stub-model app of another checkout of ragchains."""

    def __init__(
        self,
        index: Path,
        delay: float = 0.0,
        *,
        command: list[str] | None = None,
        checkout: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        if command is not None:
            argv = [part.format(port=self.port) for part in command]
        else:
            args = ["--serve", str(index), "--port", str(self.port), "--delay", str(delay)]
            argv = [sys.executable, "-m", "bench.server_overhead", *args]
        # Tracing is the benchmark's choice: no OTEL_* variable of the caller's environment
        # reaches a server (the BSP's schedule delay included), only those ``env`` passes.
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        environment = {**inherited, **(env or {})}
        if checkout is not None:  # its packages first on the path, ahead of the installed ones
            # Only a checkout whose ragchains/ holds the packages (the symlinked layout of
            # commits before package-dir) is imported whole; with a later one the installed
            # finder would supply ragchains.chains & co. from this checkout, unsaid.
            if not (checkout / "ragchains" / "chains").is_dir():
                raise SystemExit(f"--before {checkout}: no ragchains/chains there to measure")
            environment["PYTHONPATH"] = str(checkout)
        self.process = subprocess.Popen(argv, cwd=checkout or REPO, env=environment)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 240
        while True:
            try:
                if httpx.get(f"{self.url}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the benchmark server did not start")
            time.sleep(0.2)

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the server process has used so far."""
        import psutil

        times = psutil.Process(self.process.pid).cpu_times()
        return float(times.user + times.system)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.send_signal(signal.SIGINT)  # as Ctrl-C stops `ragchains serve`
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# ----------------------------------------------------------------------------- OTLP sink
# A collector's stand-in, in a process of its own: answers 200 to OTLP/HTTP trace exports
# (POST /v1/traces, protobuf, as the SDK's exporter sends them) and counts their spans.
_sink_lock = threading.Lock()
_sink_exports = [0]
_sink_traces: dict[bytes, list[Any]] = {}  # trace id: [its root span's name, its spans' names]


class _SinkHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # the exporter's session keeps its connection

    def do_POST(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != "/v1/traces":
            self._reply(404, b"", "text/plain")
            return
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        export = ExportTraceServiceRequest.FromString(body)
        with _sink_lock:
            _sink_exports[0] += 1
            for resource_spans in export.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        trace = _sink_traces.setdefault(span.trace_id, [None, []])
                        trace[1].append(span.name)
                        if not span.parent_span_id:
                            trace[0] = span.name
        self._reply(200, ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf")

    def do_GET(self) -> None:
        if self.path == "/readyz":
            self._reply(200, b"ok", "text/plain")
        elif self.path == "/stats":
            self._reply(200, json.dumps(sink_stats()).encode(), "application/json")
        else:
            self._reply(404, b"", "text/plain")

    def _reply(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per export would only fill the terminal


def sink_stats() -> dict[str, Any]:
    """Exports and spans received; per root span name: its traces, their spans, the fewest
    and most spans in one of them, and how many spans of each name they hold."""
    roots: dict[str, dict[str, Any]] = {}
    with _sink_lock:
        for root, names in _sink_traces.values():
            entry = roots.setdefault(
                str(root), {"traces": 0, "spans": 0, "min": len(names), "max": 0, "names": {}}
            )
            entry["traces"] += 1
            entry["spans"] += len(names)
            entry["min"] = min(entry["min"], len(names))
            entry["max"] = max(entry["max"], len(names))
            for name in names:
                entry["names"][name] = entry["names"].get(name, 0) + 1
        spans = sum(len(names) for _, names in _sink_traces.values())
        return {"exports": _sink_exports[0], "spans": spans, "roots": roots}


def run_sink(port: int) -> None:
    sink = ThreadingHTTPServer(("127.0.0.1", port), _SinkHandler)
    try:
        sink.serve_forever()
    except KeyboardInterrupt:  # Server.__exit__'s SIGINT
        pass
    finally:
        sink.server_close()


SINK = [sys.executable, "-m", "bench.server_overhead", "--sink", "--port", "{port}"]


# ----------------------------------------------------------------------------- 1. overhead
def in_process_times(index: Path) -> list[float]:
    from ragchains.factory import build_service

    service = build_service(bench_settings(index), index, llm=stub_llm(0.0))
    chat = service.chains.chat

    async def run() -> list[float]:
        for _ in range(5):
            await chat.ainvoke({"question": question()})
        times = []
        for _ in range(CALLS):
            body = {"question": question()}
            start = time.perf_counter()
            await chat.ainvoke(body)
            times.append(time.perf_counter() - start)
        return times

    return asyncio.run(run())


def http_times(url: str) -> list[float]:
    with httpx.Client(base_url=url, timeout=60) as client:
        for _ in range(WARM_UP):
            client.post("/chat/invoke", json={"input": {"question": question()}}).raise_for_status()
        times = []
        for _ in range(CALLS):
            body = {"input": {"question": question()}}
            start = time.perf_counter()
            response = client.post("/chat/invoke", json=body)
            times.append(time.perf_counter() - start)
            response.raise_for_status()
    return times


def scraped_counts(url: str) -> dict[str, dict[str, float]]:
    """From one scrape of /metrics (prometheus_client's parser): the requests counted for
    ``/chat/invoke`` by method and status, the answer stage's timings and the turns counted,
    each by chain label."""
    from prometheus_client.parser import text_string_to_metric_families

    response = httpx.get(f"{url}/metrics", timeout=30)
    response.raise_for_status()
    counts: dict[str, dict[str, float]] = {"requests": {}, "answer stage": {}, "turns": {}}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "ragchains_http_requests_total":
                if labels.get("route") == "/chat/invoke":
                    key = f"{labels.get('method')} {labels.get('status')}"
                    counts["requests"][key] = counts["requests"].get(key, 0.0) + sample.value
            elif sample.name == "ragchains_stage_duration_seconds_count":
                if labels.get("stage") == "answer" and sample.value:
                    counts["answer stage"][str(labels.get("chain"))] = sample.value
            elif sample.name == "ragchains_turns_total" and sample.value:
                counts["turns"][str(labels.get("chain"))] = sample.value
    return counts


def overhead(index: Path) -> list[str]:
    """Part 1: in-process against HTTP with tracing off and on, interleaved in one run."""
    local_p50, local_p95 = [], []
    modes = ("off", "on")
    p50: dict[str, list[float]] = {mode: [] for mode in modes}
    p95: dict[str, list[float]] = {mode: [] for mode in modes}
    cpu: dict[str, list[float]] = {mode: [] for mode in modes}
    with Server(index, command=SINK) as sink:
        # The endpoint alone: the BSP's schedule delay (and every other OTEL_BSP_*) at its
        # default, as a deployment that sets only where to send its traces runs.
        traced = {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.url}
        with Server(index, 0.0) as off, Server(index, 0.0, env=traced) as on:
            servers = {"off": off, "on": on}
            for repeat in range(REPEATS):
                local = in_process_times(index)
                local_p50.append(percentile_ms(local, 50))
                local_p95.append(percentile_ms(local, 95))
                # Alternate which server goes first, so neither always follows the other.
                for mode in modes if repeat % 2 == 0 else modes[::-1]:
                    server = servers[mode]
                    cpu_start = server.cpu_seconds()
                    remote = http_times(server.url)
                    used = server.cpu_seconds() - cpu_start
                    cpu[mode].append(used * 1000.0 / (WARM_UP + CALLS))
                    p50[mode].append(percentile_ms(remote, 50))
                    p95[mode].append(percentile_ms(remote, 95))
            scraped = {mode: scraped_counts(server.url) for mode, server in servers.items()}
        # Both servers stopped: the traced one flushed its last batch as it exited.
        received = httpx.get(f"{sink.url}/stats", timeout=10).json()
    calls = REPEATS * (WARM_UP + CALLS)  # to each server

    med = statistics.median
    added = {
        mode: med(r - loc for r, loc in zip(p50[mode], local_p50, strict=True)) for mode in modes
    }
    tracing_cost = med(on - off for on, off in zip(p50["on"], p50["off"], strict=True))
    tracing_cpu = med(on - off for on, off in zip(cpu["on"], cpu["off"], strict=True))
    chat_traces = received["roots"].get("POST /chat/invoke")
    if not received["spans"] or chat_traces is None:
        raise RuntimeError(f"no /chat/invoke span reached the OTLP sink: {received}")
    per_request = chat_traces["spans"] / chat_traces["traces"]
    low, high = chat_traces["min"], chat_traces["max"]
    span_names = ", ".join(f"`{name}` {n}" for name, n in chat_traces["names"].items())
    others = ", ".join(
        f"{entry['traces']} `{root}`"
        for root, entry in sorted(received["roots"].items())
        if root != "POST /chat/invoke"
    )

    def counted(mode: str) -> str:
        found = scraped[mode]
        requests = sum(found["requests"].values())
        verdict = "equal" if requests == calls else "not equal"
        by_status = ", ".join(f"{k}: {v:.0f}" for k, v in sorted(found["requests"].items()))

        def by_chain(series: str) -> str:
            return ", ".join(f'chain="{k}": {v:.0f}' for k, v in sorted(found[series].items()))

        return (
            f'`ragchains_http_requests_total{{route="/chat/invoke"}}` {requests:.0f} '
            f"({by_status or 'no series'}; {verdict} to the calls made); "
            f'`ragchains_stage_duration_seconds_count{{stage="answer"}}` '
            f"{by_chain('answer stage') or 'none'}; `ragchains_turns_total` "
            f"{by_chain('turns') or 'all 0'}"
        )

    def runs(values: list[float]) -> str:
        return ", ".join(f"{v:.2f}" for v in values)

    rows = []
    for mode, name in (
        ("off", "HTTP `POST /chat/invoke`, tracing off, metrics on"),
        ("on", "HTTP `POST /chat/invoke`, tracing on (OTLP export), metrics on"),
    ):
        verdict = "meets" if added[mode] <= 10 else "misses"
        rows.append(
            f"| {name} | {med(p50[mode]):.2f} | {med(p95[mode]):.2f} | {runs(p50[mode])} "
            f"| {added[mode]:.2f} | {verdict} | {med(cpu[mode]):.1f} |"
        )
    return [
        "### HTTP overhead, instant stub model: tracing off and on",
        "",
        "Two servers in the same run, each under uvicorn in its own process: one with no "
        "`OTEL_*` variable (tracing off), one with `OTEL_EXPORTER_OTLP_ENDPOINT` set to a "
        "local OTLP/HTTP sink this benchmark runs in a third process (it answers 200 to "
        "`POST /v1/traces` and counts the spans it receives), every other `OTEL_*` variable "
        "unset (`OTEL_BSP_SCHEDULE_DELAY` at its default, 5 s). Prometheus metrics are "
        f"collected by both (always on). Each of the {REPEATS} repeats times the in-process "
        "chain, then both servers, their order alternating from one repeat to the next; "
        "figures are medians over the repeats, overheads the median of the per-repeat p50 "
        "differences. The in-process chain runs without the app's callbacks (no metrics, no "
        "spans): what the server adds, metrics and tracing included, counts as overhead.",
        "",
        "| path | p50 ms | p95 ms | p50 ms per repeat | added at p50 ms | target <= 10 ms "
        "| server CPU ms / call |",
        "|---|---:|---:|---|---:|---|---:|",
        f"| in-process `chat.ainvoke` | {med(local_p50):.2f} | {med(local_p95):.2f} "
        f"| {runs(local_p50)} | | | |",
        *rows,
        "",
        f"- HTTP adds **{added['off']:.2f} ms** at p50 with tracing off and "
        f"**{added['on']:.2f} ms** with tracing on; tracing itself costs "
        f"**{tracing_cost:.2f} ms** at p50 and {tracing_cpu:.1f} ms of server CPU per call "
        "(medians of the per-repeat on - off differences; medians of differences, these "
        "three need not add up).",
        f"- Spans received by the sink: {received['spans']} in {received['exports']} exports. "
        f"The {chat_traces['traces']} `POST /chat/invoke` traces (calls made: {calls}) hold "
        f"{chat_traces['spans']} spans, **{per_request:.1f} per request** "
        f"({f'{low} in each' if low == high else f'{low} to {high} in one'}; by name: "
        f"{span_names})" + (f"; other traces: {others}." if others else "."),
        f"- Metrics, one scrape of `/metrics` of each server after the last repeat (parsed with "
        f"`prometheus_client`'s parser), {calls} calls made to each. Tracing on: "
        f"{counted('on')}. Tracing off: {counted('off')}.",
        "- Server CPU per call: the server process's CPU time (user + system, psutil) over "
        f"one repeat's {WARM_UP + CALLS} calls, divided by them; with tracing on it includes "
        "the batch exports that fell in that window.",
    ]


# ----------------------------------------------------------------------------- 2. concurrency
async def one_stream(client: httpx.AsyncClient, route: str) -> bool:
    """Reads one stream to its end; True when it ended normally with an answer."""
    if route == "chat":
        request = ("/chat/stream", {"input": {"question": question()}})
    else:
        messages = [{"role": "user", "content": question()}]
        request = (
            "/v1/chat/completions",
            {"model": "default", "messages": messages, "stream": True},
        )
    answered = ended = failed = False
    async with client.stream("POST", request[0], json=request[1]) as response:
        if response.status_code != 200:
            return False
        async for line in response.aiter_lines():
            failed |= line.startswith("event: error") or line.startswith('data: {"error"')
            ended |= line.startswith("event: end") or line == "data: [DONE]"
            answered |= '"answer"' in line or '"content": "The' in line
    return answered and ended and not failed


def model_alone() -> float:
    """Seconds the stub model takes to stream its answer with nothing else running."""

    async def stream() -> float:
        start = time.perf_counter()
        async for _ in StubChat(delay=STUB_SECONDS).astream(QUESTION):
            pass
        return time.perf_counter() - start

    return asyncio.run(stream())


async def concurrent_streams(server: Server, route: str) -> tuple[float, int, float]:
    """The wall time of one burst of streams, its failed streams, and the server's CPU
    milliseconds per turn over it."""
    limits = httpx.Limits(max_connections=CONCURRENT, max_keepalive_connections=CONCURRENT)
    async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
        await one_stream(client, route)  # warm-up
        cpu = server.cpu_seconds()
        start = time.perf_counter()
        results = await asyncio.gather(
            *(one_stream(client, route) for _ in range(CONCURRENT)), return_exceptions=True
        )
        wall = time.perf_counter() - start
        cpu_ms = (server.cpu_seconds() - cpu) * 1000.0 / CONCURRENT
    errors = sum(1 for ok in results if ok is not True)
    return wall, errors, cpu_ms


def server_cpu_per_turn(index: Path, checkout: Path | None) -> float:
    """Median server CPU ms per /chat/stream turn over the bursts, for ``checkout``'s code."""
    cpu: list[float] = []
    with Server(index, STUB_SECONDS, checkout=checkout) as server:
        for _ in range(REPEATS):
            cpu.append(asyncio.run(concurrent_streams(server, "chat"))[2])
    return statistics.median(cpu)


# ----------------------------------------------------------------------------- 3. keep-alive
HEALTH_CALLS = 200


def healthz_times(url: str) -> list[float]:
    """Sequential GET /healthz on one kept-alive connection, after 20 warm-up calls."""
    with httpx.Client(base_url=url, timeout=10) as client:
        for _ in range(20):
            client.get("/healthz").raise_for_status()
        times = []
        for _ in range(HEALTH_CALLS):
            start = time.perf_counter()
            client.get("/healthz")
            times.append(time.perf_counter() - start)
    return times


def keep_alive(index: Path) -> dict[str, list[float]]:
    """p50 ms of /healthz per repeat, for `ragchains serve` and `uvicorn --factory`."""
    ragchains = str(Path(sys.executable).parent / "ragchains")
    serve = [ragchains, "serve", "--index", str(index), "--port", "{port}"]
    factory = [
        sys.executable, "-m", "uvicorn", "--factory", "ragchains.server:create_app",
        "--port", "{port}", "--log-level", "warning",
    ]  # fmt: skip
    env = {"RAGCHAINS_INDEX": str(index)}
    p50: dict[str, list[float]] = {"serve": [], "factory": []}
    with Server(index, command=serve) as served, Server(index, command=factory, env=env) as fac:
        for _ in range(REPEATS):  # interleaved: both see the same machine load
            p50["serve"].append(percentile_ms(healthz_times(served.url), 50))
            p50["factory"].append(percentile_ms(healthz_times(fac.url), 50))
    return p50


def _commit(checkout: Path) -> str:
    found = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
    )
    return found.stdout.strip() or "unknown"


# ----------------------------------------------------------------------------- report
def main(before: Path | None, overhead_only: bool = False) -> None:
    index = sample_index()
    header = [
        "## Service overhead (`python -m bench.server_overhead`)",
        "",
        machine_line(),
        "",
        f"Chat graph over the sample index ({os.cpu_count()} cores), re-query off; the server runs "
        "under uvicorn in its own process. Medians over "
        f"{REPEATS} repeats of {CALLS} sequential calls each (after {WARM_UP} warm-up calls).",
        "",
    ]
    part1 = overhead(index)
    if overhead_only:
        print("\n".join(header + part1))
        return

    walls: dict[str, list[float]] = {"chat": [], "openai": []}
    errors: dict[str, int] = {"chat": 0, "openai": 0}
    cpu: dict[str, list[float]] = {"chat": [], "openai": []}
    alone: list[float] = []
    loads = [os.getloadavg()[0]]
    with Server(index, STUB_SECONDS) as server:
        for _ in range(REPEATS):
            alone.append(model_alone())
            for route in walls:
                wall, failed, cpu_ms = asyncio.run(concurrent_streams(server, route))
                walls[route].append(wall)
                errors[route] += failed
                cpu[route].append(cpu_ms)
            loads.append(os.getloadavg()[0])
    cpu_before = server_cpu_per_turn(index, before) if before is not None else None
    health = keep_alive(index)

    med = statistics.median
    lines = [
        *header,
        *part1,
        "",
        f"### {CONCURRENT} concurrent streams, stub model taking {STUB_SECONDS:.0f} s per answer",
        "",
        f"Wall time from sending all {CONCURRENT} requests to the end of the last stream, "
        f"median of {REPEATS} runs per route; the stub model alone streams its answer in "
        f"**{med(alone):.2f} s** (median of {REPEATS}, timed in the same run between the "
        "bursts).",
        "",
        "| route | wall s (median) | wall / model alone | runs | failed streams "
        "| server CPU ms / turn |",
        "|---|---:|---:|---|---:|---:|",
    ]
    for route, name in (("chat", "`/chat/stream`"), ("openai", "`/v1/chat/completions` stream")):
        runs = ", ".join(f"{w:.2f}" for w in walls[route])
        ratio = med(walls[route]) / med(alone)
        lines.append(
            f"| {name} | {med(walls[route]):.2f} | {ratio:.2f} | {runs} | {errors[route]} "
            f"| {med(cpu[route]):.1f} |"
        )
    worst = max(med(w) for w in walls.values()) / med(alone)
    met = worst <= 1.6 and not sum(errors.values())
    lines += [
        "",
        f"- Slowest route {worst:.2f} x the model alone; target <= 1.6 x on both routes with "
        f"0 errors: {'meets' if met else 'misses'}.",
        "- Server CPU per turn: the server process's CPU time (user + system, psutil) over a "
        "burst, divided by its turns.",
        f"- Load average (1 min) on the machine during the bursts: "
        f"{min(loads):.1f} to {max(loads):.1f} on {os.cpu_count()} cores (other jobs share it).",
        "- The stub answers the rewrite at once and streams the answer over 2 s with "
        "asynchronous sleeps, as a model behind a network does. The embedded llama.cpp model "
        "serves one call at a time (one context behind a lock), so with it concurrent turns "
        "queue for the model (waiting as coroutines, holding no thread).",
    ]
    if cpu_before is not None:
        lines.append(
            f"- Before and after (`/chat/stream`, same run, same machine): {cpu_before:.1f} ms "
            f"of server CPU per turn with the code of commit {_commit(before)}, "
            f"{med(cpu['chat']):.1f} ms with this one ({_commit(REPO)})."
        )
    health_ratio = med(health["serve"]) / med(health["factory"])
    lines += [
        "",
        "### Keep-alive: `/healthz` on one connection",
        "",
        f"{HEALTH_CALLS} sequential `GET /healthz` on one kept-alive connection (after 20 "
        f"warm-up calls), {REPEATS} repeats interleaved between the two servers, same index.",
        "",
        "| server | p50 ms (median of repeats) | runs |",
        "|---|---:|---|",
        f"| `ragchains serve` | {med(health['serve']):.2f} | "
        + ", ".join(f"{v:.2f}" for v in health["serve"])
        + " |",
        f"| `uvicorn --factory ragchains.server:create_app` | {med(health['factory']):.2f} | "
        + ", ".join(f"{v:.2f}" for v in health["factory"])
        + " |",
        "",
        f"- `ragchains serve` at {health_ratio:.2f} x uvicorn's p50; target <= 2 x: "
        f"{'meets' if health_ratio <= 2 else 'misses'}.",
    ]
    write_section("server_overhead", "\n".join(lines))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--delay", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--sink", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--overhead-only",
        action="store_true",
        help="run part 1 only (HTTP overhead, tracing off and on) and print it; "
        "bench/RESULTS.md is left as it is",
    )
    parser.add_argument(
        "--before",
        type=Path,
        help="a checkout of an earlier commit (git worktree add DIR COMMIT) whose server CPU "
        "per turn is measured too, for the before/after line",
    )
    args = parser.parse_args()
    if args.sink:
        run_sink(args.port)
    elif args.serve:
        serve(args.serve, args.port, args.delay)
    else:
        main(args.before, args.overhead_only)
