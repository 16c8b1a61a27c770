"""Real servers for the HTTP tests: our app under uvicorn, and a stand-in OpenAI upstream.

Both listen on a free port of 127.0.0.1 and run in a background thread of the test process.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import httpx
import uvicorn
from sse_starlette.sse import AppStatus, EventSourceResponse

# sse-starlette 1.x makes every stream wait on one process-wide exit event, bound to the event
# loop that first waited on it. A server process has one loop; the tests run several servers
# at once, each on its own loop in its own thread, so each loop gets its own event.
_exit_events: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, anyio.Event] = (
    weakref.WeakKeyDictionary()
)


async def _listen_for_exit_signal() -> None:
    if AppStatus.should_exit:
        return
    loop = asyncio.get_running_loop()
    event = _exit_events.get(loop)
    if event is None:
        event = _exit_events[loop] = anyio.Event()
    await event.wait()


EventSourceResponse.listen_for_exit_signal = staticmethod(_listen_for_exit_signal)  # type: ignore[method-assign]


def wait_until(
    check: Callable[[], Any], what: str, *, timeout: float = 30, every: float = 0.2
) -> Any:
    """Call ``check`` until it returns something true, and return that; fail after
    ``timeout`` seconds naming ``what`` and the last value seen (shared machines are slow:
    a deadline, never a timed assertion)."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what} not within {timeout:g} s (last: {value!r})"
        time.sleep(every)
    return value


RAGCHAINS = Path(sys.executable).parent / "ragchains"
REPO = Path(__file__).resolve().parent.parent


def user_env(**extra: str) -> dict[str, str]:
    """The environment a user runs the command in: none of the test run's RAGCHAINS_*."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAGCHAINS_")}
    return {**clean, **extra}


# The name llama.cpp's server gives the shipped SmolLM2 in the tests (its --model_alias).
LLAMA_ALIAS = "smollm2-135m-instruct"


@dataclass(frozen=True)
class LlamaServer:
    process: subprocess.Popen[str]
    base_url: str  # http://127.0.0.1:PORT/v1


@contextmanager
def _served_process(
    name: str,
    command: Callable[[int], list[str]],
    health: str,
    *,
    stop: tuple[signal.Signals, ...],
    timeout: float,
    **popen: Any,
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``command(port)`` started on a free port, until the block ends (then the ``stop``
    signals); yields the process and its base URL once GET base + ``health`` answers 200.
    Its output goes to a file (a pipe nobody reads could fill and stall it), shown if it
    fails to start."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(
            command(port), stdout=log, stderr=subprocess.STDOUT, text=True, **popen
        )

        def ready() -> bool:
            if process.poll() is not None:
                log.seek(0)
                raise AssertionError(f"{name} exited: {log.read()[-3000:]}")
            try:
                return httpx.get(f"{base}{health}", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        try:
            wait_until(ready, f"{name} ready", timeout=timeout, every=0.5)
            yield process, base
        finally:
            for sig in stop:
                process.send_signal(sig)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextmanager
def llama_cpp_server() -> Iterator[LlamaServer]:
    """llama.cpp's OpenAI-compatible server (``python -m llama_cpp.server``, from
    llama-cpp-python's server extra) on the shipped SmolLM2 file, served as
    ``LLAMA_ALIAS`` on one thread, until the block ends."""
    from ragchains.models.embedded import packaged_gguf

    def command(port: int) -> list[str]:
        return [
            sys.executable, "-m", "llama_cpp.server", "--model", str(packaged_gguf()),
            "--model_alias", LLAMA_ALIAS, "--host", "127.0.0.1", "--port", str(port),
            "--n_ctx", "4096", "--n_threads", "1", "--seed", "0",
        ]  # fmt: skip

    # SIGCONT first: a test may have frozen it (SIGSTOP).
    stop = (signal.SIGCONT, signal.SIGTERM)
    with _served_process("llama_cpp.server", command, "/v1/models", stop=stop, timeout=120) as (
        process,
        base,
    ):
        yield LlamaServer(process, f"{base}/v1")


@contextmanager
def ragchains_serve(
    *target: str, program: Path = RAGCHAINS, cwd: Path = REPO, **env: str
) -> Iterator[str]:
    """`ragchains serve TARGET...` in a process of its own, as a user runs it, until the block
    ends (then Ctrl-C, as a user stops it); yields its base URL once /readyz answers.
    ``program``: the console script (another install's); ``env``: variables to set."""
    with ragchains_serve_process(*target, program=program, cwd=cwd, **env) as (_, base):
        yield base


@contextmanager
def ragchains_serve_process(
    *target: str, program: Path = RAGCHAINS, cwd: Path = REPO, **env: str
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``ragchains_serve``, yielding the process too (a test that kills it); stopped with
    Ctrl-C at the end unless it is dead already."""

    def command(port: int) -> list[str]:
        return [str(program), "serve", *target, "--port", str(port)]

    with _served_process(
        "ragchains serve",
        command,
        "/readyz",
        stop=(signal.SIGINT,),
        timeout=300,
        cwd=cwd,
        env=user_env(**env),
    ) as served:
        yield served


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """Run ``app`` under uvicorn (lifespan included) and yield its base URL."""
    # IPPROTO_TCP as `ragchains serve` binds it: asyncio sets TCP_NODELAY only then.
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the app did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        listener.close()


# What the "cut" and "capped" models say before they stop: three words.
CUT_SHORT = "Employees receive 25"


class FakeOpenAI(ThreadingHTTPServer):
    """Answers /v1/chat/completions (plain or streamed) like the real API, per model:
    "ok-*" replies, "down" fails with 503, "broken" with 500, "slow" sleeps 1.5 s first,
    "trickle" streams a word every 0.2 s for a minute, "leaky" fails with 401 echoing the
    request's Authorization header, "garbled" answers 200 with an HTML page, "hollow" 200
    without choices, "cut" streams three words and ends its stream there (no
    ``finish_reason``, no ``[DONE]``: a server that died midway), "capped" streams three
    words and stops with ``finish_reason: "length"`` (its token limit; a plain reply of
    either says the same). ``behave_as`` makes every model behave as the one named. With a
    ``gate`` (a threading.Barrier), each plain (not streamed) request waits until the gate's
    number of them are in at once, then replies (503 if they never are). Counts the requests
    per model, and the streams their client dropped."""

    daemon_threads = True
    request_queue_size = 128  # the listen backlog: the concurrency tests connect 64 at once

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: dict[str, int] = {}
        self.behave_as: str | None = None
        self.dropped_streams = 0
        self.gate: threading.Barrier | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _Handler(BaseHTTPRequestHandler):
    server: FakeOpenAI

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        model = body["model"]
        self.server.requests[model] = self.server.requests.get(model, 0) + 1
        behaviour = self.server.behave_as or model
        if behaviour == "slow":
            time.sleep(1.5)
        if self.server.gate is not None and not body.get("stream"):
            try:
                self.server.gate.wait()
            except threading.BrokenBarrierError:
                self._send(503, {"error": {"message": "the gate broke", "type": "server_error"}})
                return
        if behaviour == "down":
            self._send(503, {"error": {"message": "overloaded", "type": "server_error"}})
            return
        if behaviour == "broken":
            self._send(500, {"error": {"message": "model crashed", "type": "server_error"}})
            return
        if behaviour == "leaky":  # an upstream whose error echoes the request's credentials
            said = f"bad credentials: Authorization: {self.headers.get('Authorization')}"
            self._send(401, {"error": {"message": said, "type": "invalid_request_error"}})
            return
        if behaviour == "garbled":  # a 200 that is no chat completion (a proxy's login page)
            self._send_bytes(200, b"<html>please log in</html>", "text/html")
            return
        if behaviour == "hollow":  # a 200 chat completion without choices
            hollow = {"id": "x", "object": "chat.completion", "created": 0, "model": model}
            if body.get("stream"):
                frame = json.dumps({**hollow, "object": "chat.completion.chunk"})
                self._send_bytes(
                    200, f"data: {frame}\n\ndata: [DONE]\n\n".encode(), "text/event-stream"
                )
            else:
                self._send(200, hollow)
            return
        text, finish = f"answer from {model}", "stop"
        if behaviour in ("cut", "capped"):
            text, finish = CUT_SHORT, "length"
        if body.get("stream"):
            pause = 0.2 if behaviour == "trickle" else 0.0
            self._stream(model, text, pause, finish=None if behaviour == "cut" else finish)
            return
        reply = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": finish,
                }
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
        }
        self._send(200, reply)

    def _stream(
        self, model: str, text: str, pause: float = 0.0, finish: str | None = "stop"
    ) -> None:
        """``text`` word by word, then the ``finish`` reason and ``[DONE]``; with no reason,
        the stream ends after the last word (the connection closes)."""

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            frame = {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return f"data: {json.dumps(frame)}\n\n".encode()

        words = text.split(" ") * (300 if pause else 1)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            self.wfile.write(chunk({"role": "assistant", "content": ""}))
            for word in words:
                self.wfile.write(chunk({"content": word + " "}))
                self.wfile.flush()
                time.sleep(pause)
            if finish is not None:
                self.wfile.write(chunk({}, finish) + b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            self.server.dropped_streams += 1

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        self._send_bytes(status, json.dumps(payload).encode(), "application/json")

    def _send_bytes(self, status: int, data: bytes, content_type: str) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
            pass


@contextmanager
def fake_openai_server() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
