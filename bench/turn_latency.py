"""How long a chat follow-up waits for its answer, against a first question in ask mode.

`ragchains serve` over the samples with the embedded model (the default, no upstream), the
first four follow-ups of ``evaluation/qa/samples-chat.jsonl`` that have a gold standalone
rewrite, each asked twice per repeat: on ``/chat/stream`` with its conversation's earlier
turns as history (their gold answers as the assistant's), and on ``/ask/stream`` as its
standalone rewrite, a first question. Each repeat starts a server of its own, warmed up with
a follow-up of another conversation (untimed): the model's prompt cache then holds the fixed
prompts, as a server that has answered anyone does, and none of a timed turn's own words.
Timed from the request to the first answer token and to the stream's end; medians and 95th
percentiles over every turn of every repeat.

Before and after in the same run: ``--before REV`` (default: the commit before issue 45's
retrieval changes) is built from git into the benchmark cache, ingests its own index of the
samples and is served the same way, one server at a time, on the same machine.

    python -m bench.turn_latency                 # writes its section of bench/RESULTS.md
    python -m bench.turn_latency --before none   # this checkout alone, printed
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.common import REPO, cache_dir, machine_line, percentile_ms, write_section
from bench.server_overhead import Server

BEFORE = "54cd480"  # the last commit before issue 45's follow-up and keyword search
TURNS = 4
REPEATS = 3
TIMEOUT = 300.0


@dataclass(frozen=True)
class Turn:
    conversation: str
    question: str  # the follow-up as asked
    standalone: str  # its gold rewrite: the same question asked first, in ask mode
    history: list[dict[str, str]]


def follow_ups() -> list[Turn]:
    """The follow-ups of the samples' chat set, each with its history."""
    rows = [
        json.loads(line)
        for line in (REPO / "evaluation" / "qa" / "samples-chat.jsonl").read_text().splitlines()
        if line.strip()
    ]
    turns: list[Turn] = []
    earlier: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        history = earlier.setdefault(row["conversation"], [])
        if row.get("standalone") and history:
            turns.append(
                Turn(row["conversation"], row["question"], row["standalone"], list(history))
            )
        answer = row.get("answer") or "I don't know: the documents do not say."
        history += [
            {"type": "human", "content": row["question"]},
            {"type": "ai", "content": answer},
        ]
    return turns


def timed_and_warm_up(turns: list[Turn], count: int = TURNS) -> tuple[list[Turn], Turn]:
    """The first ``count`` follow-ups, and one of a conversation none of them is in: the
    warm-up turn must share no conversation with a timed one, or a prompt cache would hold
    the timed turn's history before its turn."""
    timed = turns[:count]
    warm = next(t for t in turns if t.conversation not in {t.conversation for t in timed})
    return timed, warm


@dataclass(frozen=True)
class Checkout:
    """A version of ragchains to serve: this one, or one built from git."""

    name: str
    key: str  # its folder in the cache: its index is its own
    command: list[str]  # runs the ragchains CLI
    env: dict[str, str]


def this_checkout() -> Checkout:
    return Checkout("after", "this", [str(Path(sys.executable).parent / "ragchains")], {})


def built(rev: str) -> Checkout:
    """``rev`` exported from git and installed (its own code only) into the cache."""
    folder = cache_dir("turn-latency") / rev
    lib = folder / "lib"
    if not (lib / "ragchains").is_dir():
        source = folder / "src"
        source.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
        subprocess.run(
            [*pip, "--no-build-isolation", "--target", str(lib), str(source)], check=True
        )
    # Its packages ahead of this checkout's editable install.
    run = "from ragchains.cli import run; run()"
    env = {"PYTHONPATH": str(lib)}
    return Checkout(f"before ({rev})", rev, [sys.executable, "-c", run], env)


def ingest(checkout: Checkout, index: Path) -> None:
    """The samples into ``index`` (a re-run with nothing changed takes a fraction of a second)."""
    subprocess.run(
        [*checkout.command, "ingest", str(REPO / "samples"), "--index", str(index), "-q"],
        check=True,
        env={**os.environ, **checkout.env},
    )


def timed(url: str, path: str, body: dict[str, Any]) -> tuple[float, float]:
    """Seconds to the first answer token and to the end of one streamed turn."""
    started = time.perf_counter()
    first: float | None = None
    with httpx.stream("POST", f"{url}{path}", json={"input": body}, timeout=TIMEOUT) as reply:
        if reply.status_code != 200:
            raise SystemExit(f"{path}: {reply.status_code} {reply.read()[:300]!r}")
        for line in reply.iter_lines():
            if first is None and line.startswith("data:") and _answer_text(line[5:]):
                first = time.perf_counter() - started
    if first is None:
        raise SystemExit(f"{path}: the turn streamed no answer text")
    return first, time.perf_counter() - started


def _answer_text(data: str) -> bool:
    try:
        chunk = json.loads(data)
    except ValueError:
        return False
    return isinstance(chunk, dict) and bool(chunk.get("answer"))


def _asked(turn: Turn) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        ("chat", "/chat/stream", {"question": turn.question, "chat_history": turn.history}),
        ("ask", "/ask/stream", {"question": turn.standalone}),
    ]


def measure(checkout: Checkout, turns: list[Turn], warm: Turn) -> dict[str, dict[str, list]]:
    """One repeat, on a server of its own: a turn asked again would find its own prompt in
    the model's prompt cache, which no reader's new question does."""
    index = cache_dir("turn-latency") / checkout.key / "index"
    ingest(checkout, index)
    serve = [*checkout.command, "serve", "--index", str(index), "--port", "{port}"]
    seconds: dict[str, dict[str, list]] = {m: {"first": [], "total": []} for m in ("chat", "ask")}
    with Server(index, command=serve, env=checkout.env) as server:
        for _, path, body in _asked(warm):  # warm-up, untimed: each mode's first call
            timed(server.url, path, body)
        for turn in turns:
            for mode, path, body in _asked(turn):
                first, total = timed(server.url, path, body)
                seconds[mode]["first"].append(first)
                seconds[mode]["total"].append(total)
    return seconds


def table(results: dict[str, dict[str, dict[str, list]]]) -> list[str]:
    lines = [
        "| version | mode | first token p50 | first token p95 | total p50 | total p95 |",
        "|---|---|---|---|---|---|",
    ]
    for name, modes in results.items():
        for mode, kinds in modes.items():
            cells = [
                f"{percentile_ms(kinds[kind], q) / 1000:.2f} s"
                for kind in ("first", "total")
                for q in (50, 95)
            ]
            lines.append(f"| {name} | {mode} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=BEFORE, help="git revision to compare ('none': skip)")
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = parser.parse_args()
    turns, warm = timed_and_warm_up(follow_ups())
    after = this_checkout()
    # The same checkout with llama.cpp's prompt cache off: what the cache itself is worth.
    uncached = Checkout(
        "after, prompt cache off", after.key, after.command, {"RAGCHAINS_LLM_PROMPT_CACHE_MB": "0"}
    )
    checkouts = [after, uncached]
    if args.before != "none":
        checkouts.insert(0, built(args.before))
    # Repeats take turns between versions: a machine that slows down over the run slows all.
    results: dict[str, dict[str, dict[str, list]]] = {}
    for _ in range(args.repeats):
        for checkout in checkouts:
            run = measure(checkout, turns, warm)
            mine = results.setdefault(checkout.name, {m: {"first": [], "total": []} for m in run})
            for mode, kinds in run.items():
                for kind, values in kinds.items():
                    mine[mode][kind] += values
    lines = table(results)
    print("\n".join(lines))
    if args.before == "none":
        return
    body = [
        "## Chat and ask turn latency",
        "",
        f"`python -m bench.turn_latency`: {len(turns)} follow-ups of the samples' chat set, "
        f"{args.repeats} repeats, `ragchains serve` with the embedded model; chat with the "
        "conversation's history, ask with the gold standalone question; each repeat on a "
        "fresh server warmed up with a turn of another conversation. Median and 95th "
        "percentile over every turn.",
        "",
        *lines,
        "",
        machine_line(),
    ]
    write_section("turn_latency", "\n".join(body))


if __name__ == "__main__":
    main()
