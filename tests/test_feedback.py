"""The feedback store: what a payload may hold, what survives restarts and re-ingests, export."""

from __future__ import annotations

import csv
import io
import json
import os
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from ragchains.feedback import (
    FEEDBACK_FILE,
    RECORD_FIELDS,
    FeedbackIn,
    FeedbackStore,
    FeedbackStoreError,
    FeedbackStoreNotFoundError,
    feedback_path,
)
from ragchains.ingest.report import IngestReport
from ragchains.retrievers.indexformat import current_generation
from ragchains.settings import Settings
from tests.conftest import REPO

RAGCHAINS = Path(sys.executable).parent / "ragchains"
RUN_ID = "0b6f3c3e-9a51-4e3f-8c7e-2f1f5d1c9a10"


def payload(**changes: Any) -> dict[str, Any]:
    good: dict[str, Any] = {
        "run_id": RUN_ID,
        "score": 1,
        "comment": "cites the right table",
        "mode": "ask",
        "domain": "hr",
        "prompts": {"answer": "hr/answer@v2", "rewrite": "hr/rewrite@v1"},
        "question": "What does the standard plan cost?",
        "answer": "$45.00 a month [1].",
        "cited_ids": ["employee-handbook.md#benefit-plans:0"],
    }
    good.update(changes)
    return {key: value for key, value in good.items() if value is not ...}


# ----------------------------------------------------------------------------- validation
def test_a_good_payload_is_accepted_and_the_minimal_one_has_concrete_defaults() -> None:
    full = FeedbackIn.model_validate(payload())
    assert full.run_id == uuid.UUID(RUN_ID) and full.score == 1 and full.mode == "ask"
    minimal = FeedbackIn.model_validate({"run_id": RUN_ID, "score": 0, "question": "why?"})
    assert minimal.model_dump(exclude={"run_id", "score", "question"}) == {
        "comment": "",
        "mode": "chat",
        "domain": "default",
        "prompts": {},
        "answer": "",
        "cited_ids": [],
    }
    # The server's JSON body arrives decoded; a JSON document validates the same way.
    assert FeedbackIn.model_validate_json(json.dumps(payload())) == full


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"question": ...}, id="missing question"),
        pytest.param({"question": ""}, id="empty question"),
        pytest.param({"question": " \n\t"}, id="blank question"),
        pytest.param({"question": "q" * 20_001}, id="too long question"),
        pytest.param({"rating": 5}, id="unknown key"),
        pytest.param({"score": True}, id="score True"),
        pytest.param({"score": "1"}, id="score '1'"),
        pytest.param({"score": 2}, id="score 2"),
        pytest.param({"score": -1}, id="score -1"),
        pytest.param({"score": 0.5}, id="score 0.5"),
        pytest.param({"score": 1.0}, id="score 1.0"),
        pytest.param({"score": ...}, id="missing score"),
        pytest.param({"run_id": "run-42"}, id="bad UUID"),
        pytest.param({"run_id": ...}, id="missing run_id"),
        pytest.param({"comment": "c" * 2001}, id="too long comment"),
        pytest.param({"mode": "retrieve"}, id="unknown mode"),
        pytest.param({"domain": ""}, id="empty domain"),
        pytest.param({"domain": "d" * 101}, id="too long domain"),
        pytest.param({"prompts": {f"p{i}": "x@v1" for i in range(21)}}, id="too many prompts"),
        pytest.param({"prompts": {"p" * 51: "x@v1"}}, id="too long prompt name"),
        pytest.param({"prompts": {"answer": "x" * 201}}, id="too long prompt ref"),
        pytest.param({"prompts": {"answer": 2}}, id="prompt ref not a string"),
        pytest.param({"answer": "a" * 50_001}, id="too long answer"),
        pytest.param({"cited_ids": [f"c{i}" for i in range(101)]}, id="too many cited ids"),
        pytest.param({"cited_ids": [""]}, id="empty cited id"),
        pytest.param({"cited_ids": ["c" * 201]}, id="too long cited id"),
    ],
)
def test_each_kind_of_bad_payload_is_rejected(changes: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        FeedbackIn.model_validate(payload(**changes))


def test_the_bounds_are_inclusive() -> None:
    FeedbackIn.model_validate(
        payload(
            question="q" * 20_000,
            comment="c" * 2000,
            domain="d" * 100,
            answer="a" * 50_000,
            prompts={f"{i:0>50}": "r" * 200 for i in range(20)},
            cited_ids=["c" * 200] * 100,
        )
    )


def test_the_schema_documents_every_field_with_concrete_types() -> None:
    schema = FeedbackIn.model_json_schema()
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"run_id", "score", "question"}
    for name, field in schema["properties"].items():
        assert field.get("description"), name
        assert "anyOf" not in field and field.get("type") != "null", name
    assert schema["properties"]["score"]["enum"] == [0, 1]


# ----------------------------------------------------------------------------- the store
def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / FEEDBACK_FILE
    store = FeedbackStore(path)
    assert not path.exists()  # nothing on disk before the first use
    first = store.add(FeedbackIn.model_validate(payload()))
    second = store.add(FeedbackIn.model_validate(payload(score=0, prompts={}, cited_ids=[])))
    assert path.is_file() and second.id > first.id
    assert first.created_at.endswith("+00:00") and len(first.created_at) == 25

    records = store.records()
    assert [r["id"] for r in records] == [first.id, second.id]
    assert list(records[0]) == list(RECORD_FIELDS)
    assert records[0] == {"id": first.id, "created_at": first.created_at, **payload()}
    assert (records[1]["score"], records[1]["prompts"], records[1]["cited_ids"]) == (0, {}, [])


def test_the_file_is_wal_with_schema_version_1(tmp_path: Path) -> None:
    path = tmp_path / FEEDBACK_FILE
    FeedbackStore(path).add(FeedbackIn.model_validate(payload()))
    con = sqlite3.connect(path)
    try:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert con.execute("PRAGMA user_version").fetchone()[0] == 1
    finally:
        con.close()


def test_a_restarted_store_sees_the_earlier_records(tmp_path: Path) -> None:
    path = tmp_path / FEEDBACK_FILE
    before = FeedbackStore(path)
    before.add(FeedbackIn.model_validate(payload(comment="first")))
    del before
    after = FeedbackStore(path)
    after.add(FeedbackIn.model_validate(payload(comment="second")))
    assert [r["comment"] for r in after.records()] == ["first", "second"]


def test_concurrent_adds_from_threads_all_land(tmp_path: Path) -> None:
    store = FeedbackStore(tmp_path / FEEDBACK_FILE)  # first use is concurrent too
    threads, per_thread = 8, 10
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def vote(n: int) -> None:
        try:
            start.wait()
            for i in range(per_thread):
                store.add(FeedbackIn.model_validate(payload(comment=f"{n}-{i}")))
        except BaseException as exc:  # reported below, with the thread's failure
            errors.append(exc)

    workers = [threading.Thread(target=vote, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == []
    records = store.records()
    assert len(records) == threads * per_thread
    assert {r["comment"] for r in records} == {
        f"{n}-{i}" for n in range(threads) for i in range(per_thread)
    }
    assert len({r["id"] for r in records}) == len(records)


def test_a_damaged_file_is_one_typed_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / FEEDBACK_FILE
    path.write_bytes(b"this is not a database, just some text " * 100)
    for store in (FeedbackStore(path), FeedbackStore(path, create=False)):
        with pytest.raises(FeedbackStoreError) as caught:
            store.records()
        assert str(path) in str(caught.value) and "\n" not in str(caught.value)
        with pytest.raises(FeedbackStoreError):
            store.add(FeedbackIn.model_validate(payload()))


def test_other_sqlite_files_newer_schemas_and_folders_are_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE notes (text TEXT)")
    con.commit()
    con.close()
    with pytest.raises(FeedbackStoreError, match="not a ragchains feedback store"):
        FeedbackStore(other).add(FeedbackIn.model_validate(payload()))

    newer = tmp_path / "newer.sqlite"
    FeedbackStore(newer).add(FeedbackIn.model_validate(payload()))
    con = sqlite3.connect(newer)
    con.execute("PRAGMA user_version = 2")
    con.commit()
    con.close()
    with pytest.raises(FeedbackStoreError, match="schema version 2, written by a newer"):
        FeedbackStore(newer).records()

    with pytest.raises(FeedbackStoreError, match="is not a file"):
        FeedbackStore(tmp_path).records()


def test_reading_without_create_never_makes_a_file(tmp_path: Path) -> None:
    path = tmp_path / "missing" / FEEDBACK_FILE
    with pytest.raises(FeedbackStoreNotFoundError, match=f"no feedback store at {path}"):
        FeedbackStore(path, create=False).records()
    assert not path.parent.exists()


# ----------------------------------------------------------------------------- where it lives
def test_feedback_path_is_the_setting_or_the_index_root(tmp_path: Path) -> None:
    index = tmp_path / "idx"
    assert feedback_path(Settings(_env_file=None), index) == index / FEEDBACK_FILE  # type: ignore[call-arg]
    chosen = tmp_path / "votes.sqlite"
    settings = Settings(_env_file=None, feedback_db=chosen)  # type: ignore[call-arg]
    assert feedback_path(settings, index) == chosen


def test_a_reingest_keeps_the_feedback_file(
    ingest_into: Callable[..., IngestReport], docs_dir: Path, tmp_path: Path, settings: Settings
) -> None:
    index = tmp_path / "idx"
    ingest_into(docs_dir, index)
    first_generation = current_generation(index)
    store = FeedbackStore(feedback_path(settings, index))
    store.add(FeedbackIn.model_validate(payload(comment="before the re-ingest")))
    assert store.path.parent == index  # beside the generations, not inside one

    (docs_dir / "notes.txt").write_text("A new note about watering ferns weekly.\n")
    assert ingest_into(docs_dir, index).wrote
    assert ingest_into(docs_dir, index, rebuild=True).wrote
    assert current_generation(index) != first_generation and not first_generation.exists()
    assert [r["comment"] for r in store.records()] == ["before the re-ingest"]


# ----------------------------------------------------------------------------- export command
def run_cli(*args: str | Path, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """The installed command, without the caller's RAGCHAINS_* settings."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAGCHAINS_")}
    result = subprocess.run(
        [str(RAGCHAINS), *map(str, args)],
        cwd=cwd,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


@pytest.fixture
def stored(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    path = tmp_path / FEEDBACK_FILE
    store = FeedbackStore(path)
    store.add(FeedbackIn.model_validate(payload(comment='says "45", with a comma')))
    store.add(FeedbackIn.model_validate(payload(score=0, mode="chat", question="Naïve?\nYes")))
    return path, store.records()


@pytest.mark.e2e
def test_export_prints_the_records_as_json_and_csv(
    stored: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    path, records = stored
    as_json = run_cli("feedback", "export", "--db", path)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == records
    assert as_json.stdout.startswith("[\n  {")  # indented

    as_csv = run_cli("feedback", "export", "--db", path, "--csv")
    assert as_csv.returncode == 0, as_csv.stderr
    rows = list(csv.DictReader(io.StringIO(as_csv.stdout, newline="")))
    assert len(rows) == 2 and list(rows[0]) == list(RECORD_FIELDS)
    for row, record in zip(rows, records, strict=True):
        assert json.loads(row["prompts"]) == record["prompts"]
        assert json.loads(row["cited_ids"]) == record["cited_ids"]
        assert int(row["score"]) == record["score"] and int(row["id"]) == record["id"]
        assert (row["comment"], row["question"]) == (record["comment"], record["question"])

    out = tmp_path / "export.json"
    to_file = run_cli("feedback", "export", "--db", path, "--json", "--out", out)
    assert to_file.returncode == 0 and to_file.stdout == ""
    assert json.loads(out.read_text(encoding="utf-8")) == records
    assert "wrote 2 feedback records" in to_file.stderr


@pytest.mark.e2e
def test_export_finds_the_store_of_an_index(stored: tuple[Path, list[dict[str, Any]]]) -> None:
    path, records = stored
    result = run_cli("feedback", "export", "--index", path.parent)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == records


@pytest.mark.e2e
def test_export_of_a_missing_or_damaged_store_is_one_line_exit_2(tmp_path: Path) -> None:
    missing = tmp_path / "none.sqlite"
    result = run_cli("feedback", "export", "--db", missing)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"error: no feedback store at {missing}")
    assert result.stderr.count("\n") == 1 and not missing.exists()

    result = run_cli("feedback", "export", "--index", tmp_path / "no-index")
    assert result.returncode == 2
    assert f"error: no feedback store at {tmp_path / 'no-index' / FEEDBACK_FILE}" in result.stderr

    damaged = tmp_path / "damaged.sqlite"
    damaged.write_text("not SQLite at all " * 50)
    result = run_cli("feedback", "export", "--db", damaged, "--csv")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: ") and str(damaged) in result.stderr
    assert result.stderr.count("\n") == 1


@pytest.mark.e2e
def test_export_help_and_refusals(tmp_path: Path) -> None:
    result = run_cli("feedback", "export", "--help")
    assert result.returncode == 0 and "Usage: ragchains feedback export" in result.stdout
    for option in ("--index DIR", "--db FILE", "--json", "--csv", "--out FILE"):
        assert option in result.stdout, option
    assert "feedback" in run_cli("--help").stdout
    both = run_cli("feedback", "export", "--index", "a", "--db", "b")
    assert both.returncode == 2 and "not both" in both.stderr
    nothing = run_cli("feedback", "export", cwd=tmp_path)  # no .env there
    assert nothing.returncode == 2 and "pass --index DIR or --db FILE" in nothing.stderr
