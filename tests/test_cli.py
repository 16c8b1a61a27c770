"""The installed `ragchains` command, run as a user would: exit codes, output, no tracebacks."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ragchains.retrievers.formats import formats_described
from tests.conftest import REPO

pytestmark = pytest.mark.e2e

RAGCHAINS = Path(sys.executable).parent / "ragchains"


def run(
    *args: str | Path, cwd: Path = REPO, stdin: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAGCHAINS_")}
    result = subprocess.run(
        [str(RAGCHAINS), *map(str, args)],
        cwd=cwd,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
        input=stdin,
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


@pytest.fixture(scope="module")
def samples_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("cli") / "samples"
    shutil.copytree(REPO / "samples", target)
    return target


@pytest.fixture(scope="module")
def index(samples_copy: Path) -> Path:
    index = samples_copy.parent / "index"
    result = run("ingest", samples_copy, "--index", index)
    assert result.returncode == 0, result.stderr
    assert "13 added, 0 updated, 0 removed, 0 unchanged, 0 skipped" in result.stdout
    return index


def test_retrieve_finds_the_benefits_chunk_with_its_citation(index: Path) -> None:
    result = run("retrieve", "--index", index, "what does the standard plan cost", "--k", "3")
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith(" 1. [employee-handbook.md#benefit-plans]")
    assert "convex=" in first and "bm25=" in first and "dense=" in first

    data = json.loads(
        run("retrieve", "--index", index, "what does the standard plan cost", "--json").stdout
    )
    top = data["results"][0]
    assert top["citation"] == "employee-handbook.md#benefit-plans"
    assert "| Standard | $45.00 |" in top["text"]
    assert set(top["scores"]) == {"convex_score", "bm25_score", "dense_score"}


def test_second_ingest_reports_no_changes(index: Path, samples_copy: Path) -> None:
    result = run("ingest", samples_copy, "--index", index, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["added"], report["updated"], report["removed"], report["unchanged"]) == (
        0,
        0,
        0,
        13,
    )
    assert report["embedded"] == 0 and report["wrote"] is False


def test_editing_one_file_reembeds_only_that_file(index: Path, samples_copy: Path) -> None:
    perks = samples_copy / "handbook" / "perks-policy.md"
    perks.write_text(perks.read_text() + "\n## Bike leasing\n\nBikes can be leased via payroll.\n")
    report = json.loads(run("ingest", samples_copy, "--index", index, "--json").stdout)
    assert (report["added"], report["updated"], report["removed"], report["unchanged"]) == (
        0,
        1,
        0,
        12,
    )
    # Unchanged sections of the edited file keep their vectors too: only the new one embeds.
    assert report["embedded"] == 1
    hit = json.loads(run("retrieve", "--index", index, "bike leasing", "--json").stdout)
    assert hit["results"][0]["citation"] == "perks-policy.md#bike-leasing"


def test_price_filter_returns_only_rows_under_100(index: Path) -> None:
    data = json.loads(
        run(
            "retrieve",
            "--index",
            index,
            "sensor",
            "--filter",
            "price",
            "<",
            "100",
            "--k",
            "50",
            "--json",
        ).stdout
    )
    assert data["results"], "expected catalog rows"
    assert data["filters"] == [{"field": "price", "op": "<", "value": 100}]
    for result in data["results"]:
        assert result["source"].startswith("samples/catalog/")
        row = dict(line.split(": ", 1) for line in result["text"].splitlines())
        assert float(row["price"].lstrip("$")) < 100


def test_glob_and_in_filters(index: Path) -> None:
    data = json.loads(
        run(
            "retrieve",
            "--index",
            index,
            "policy",
            "--filter",
            "filename",
            "=",
            "*.pdf",
            "--json",
        ).stdout
    )
    assert {r["citation"].split("#")[0] for r in data["results"]} <= {
        "travel-policy.pdf",
        "security-policy.pdf",
        "office-safety-notice.pdf",
    }
    data = json.loads(
        run(
            "retrieve",
            "--index",
            index,
            "controller",
            "--filter",
            "brand",
            "in",
            "Acreon,Globex Ag",
            "--json",
        ).stdout
    )
    assert data["results"]
    assert all(
        "brand: Acreon" in r["text"] or "brand: Globex Ag" in r["text"] for r in data["results"]
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--filter", "price", "<", "cheap"], 'error: filter price < "cheap": expected a number'),
        (["--filter", "colour", "=", "red"], "error: unknown filter field 'colour'"),
        (["--filter", "brand", ">", "A"], "error: operator '>' does not apply to string field"),
        (["--filter", "price", "~", "1"], "error: unknown filter operator '~'"),
    ],
)
def test_bad_filters_exit_2_with_one_line(index: Path, args: list[str], message: str) -> None:
    result = run("retrieve", "--index", index, "sensor", *args)
    assert result.returncode == 2
    assert result.stderr.strip().startswith(message), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_rerank_shows_the_fallback(index: Path) -> None:
    result = run(
        "retrieve", "--index", index, "what does the standard plan cost", "--rerank", "--json"
    )
    data = json.loads(result.stdout)
    assert data["compressor"]["fallback"] is True
    assert data["results"][0]["citation"] == "employee-handbook.md#benefit-plans"
    assert "rerank_score" in data["results"][0]["scores"]


def test_missing_index_and_nothing_to_ingest(tmp_path: Path) -> None:
    result = run("retrieve", "--index", tmp_path / "none", "query")
    assert result.returncode == 2 and "error: no index at" in result.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "blank.txt").write_text("")
    result = run("ingest", empty, "--index", tmp_path / "idx")
    assert result.returncode == 1
    assert "error: nothing could be ingested (empty/blank.txt: empty file)" in result.stderr
    result = run("ingest", tmp_path / "typo", "--index", tmp_path / "idx")
    assert result.returncode == 2 and "input path not found" in result.stderr


def test_help_explains_each_command() -> None:
    for args in ([], ["ingest"], ["retrieve"]):
        result = run(*args, "--help")
        assert result.returncode == 0 and "Usage: ragchains" in result.stdout
    assert "--filter FIELD OP VALUE" in run("retrieve", "--help").stdout
    # What ingest reads, from the format table: every format with its suffixes.
    assert formats_described() in " ".join(run("ingest", "--help").stdout.split())


# ----------------------------------------------------------------------------- ask and chat
def test_ask_answers_with_citations_from_the_index(index: Path) -> None:
    result = run("ask", "--index", index, "--domain", "hr", "what does the standard plan cost?")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].strip(), "no answer text"
    cited = [line for line in lines[1:] if line.startswith("  [1] ")]
    assert cited and "(samples/handbook/" in cited[0]


def test_ask_json_is_the_answer_object(index: Path) -> None:
    result = run(
        "ask",
        "--index",
        index,
        "which sensors cost under 50?",
        "--json",
        "--filter",
        "price",
        "<",
        "50",
        "--domain",
        "catalog",
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["filters"] == [{"field": "price", "op": "<", "value": 50}]
    assert out["prompts"]["answer"] == "catalog/quote@v1"  # the embedded model quotes rows
    assert out["answer_style"] == "quote"
    labels = {s["label"] for s in out["sources"]}
    assert out["citations"] and {c["label"] for c in out["citations"]} <= labels
    assert set(out["timings"]) >= {"retrieve", "answer", "total"}


def test_ask_answers_the_hotel_allowance_from_the_travel_policy(index: Path) -> None:
    """Offline (no cross-encoder weights) the compressor keeps the fused order and cuts on the
    best passage's similarity: BM25's top hit, the travel policy's first page, passes it."""
    question = "How much is the hotel allowance per night in Europe?"
    result = run("ask", "--index", index, question, "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["abstained"] is False
    assert out["sources"][0]["label"] == "travel-policy.pdf#page=1"
    assert "travel-policy.pdf#page=1" in {c["label"] for c in out["citations"]}
    assert "180" in out["answer"]
    compressor = out["compressor"]
    assert compressor["reorders"] is False
    assert out["best_score"] >= compressor["threshold"]


def test_a_quote_that_names_nothing_of_its_section_is_shown_under_its_heading(
    tmp_path: Path,
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "configuration.md").write_text(
        "# Configuration\n\n## min_search_length\n\nAn integer value that defines the minimum "
        "length for a search query. By default searches shorter than 3 characters are ignored.\n",
        encoding="utf-8",
    )
    assert run("ingest", docs, "--index", tmp_path / "index").returncode == 0
    question = "What is the minimum length of a search query?"
    result = run("ask", "--index", tmp_path / "index", question, "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    # Either sentence says what it is about only under its heading, the setting's name.
    assert out["answer_style"] == "quote" and out["answer"].startswith("**min_search_length:** ")
    assert [c["label"] for c in out["citations"]] == ["configuration.md#min-search-length"]


def test_chat_keeps_history_and_resets(index: Path) -> None:
    turns = "what does the standard plan cost?\nand the premium one?\n/reset\n/quit\nnever read\n"
    result = run("chat", "--index", index, "--domain", "hr", stdin=turns)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("  searched: ") == 2
    assert "(conversation cleared)" in result.stdout
    assert "never read" not in result.stdout


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--domain", "legal"], {}, "unknown domain 'legal'; available: catalog, default, hr"),
        (["--domain", "hr", "--prompt-version", "7"], {}, "has no version 'v7'"),
        (["--prompt-version", "rewrite=1"], {}, "no prompt 'rewrite' here; choose from answer"),
        (["--k", "0"], {}, "Invalid value for '--k'"),
        ([], {"RAGCHAINS_LLM_PROVIDER": "openai"}, "needs RAGCHAINS_OPENAI_API_KEY"),
        ([], {"RAGCHAINS_LLM_MODEL_PATH": "/nonexistent.gguf"}, "does not exist"),
    ],
)
def test_ask_refuses_bad_options_with_one_line(
    index: Path, args: list[str], env: dict[str, str], message: str
) -> None:
    result = run("ask", "--index", index, *args, "question", env=env)
    assert result.returncode == 2
    assert message in result.stderr


def test_ask_on_a_missing_index_is_an_error(tmp_path: Path) -> None:
    result = run("ask", "--index", tmp_path / "none", "question")
    assert result.returncode == 2 and "error: " in result.stderr


def test_ask_with_an_unreachable_model_server_is_one_line(index: Path) -> None:
    with socket.socket() as closed:  # a port nothing listens on once this block ends
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    env = {
        "RAGCHAINS_LLM_PROVIDER": "openai",
        "RAGCHAINS_OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
        "RAGCHAINS_LLM_MAX_RETRIES": "0",
    }
    result = run("ask", "--index", index, "what does the standard plan cost?", env=env)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "error: the chat model's server cannot be reached"
    )
    assert "Traceback" not in result.stderr


def test_serve_stops_on_ctrl_c_saying_so_with_exit_status_0(index: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAGCHAINS_")}
    serve = [str(RAGCHAINS), "serve", "--index", str(index), "--port", str(port)]
    with subprocess.Popen(
        serve, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:  # up once it says how to stop it
            if "Press Ctrl-C to stop." in line:
                break
        process.send_signal(signal.SIGINT)
        rest = process.stdout.read()
        assert process.wait(timeout=60) == 0, rest
    assert "ragchains stopped." in rest and "Aborted" not in rest, rest


def test_serve_refuses_a_busy_port_and_a_missing_index(index: Path, tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        result = run("serve", "--index", index, "--port", port)
    assert result.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in result.stderr
    result = run("serve", "--index", tmp_path / "none", "--port", port)  # free again
    assert result.returncode == 2 and "error: no index at" in result.stderr
