"""`ragchains serve` follows ingests while it runs, as a user runs it: the command in a
subprocess, `ragchains ingest` in another, no restart (issue 24: `serve` built its service
another way than the tests did, and never served a new ingest or a relabel).

For an index folder and for a PostgreSQL store: a new document is found, a new filterable
field is accepted and filters, and a file relabelled for another group is hidden from a
key that could read it, each within 5 s of the ingest's commit.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from ragchains.serving.keys import add_key
from tests.conftest import FIXTURES
from tests.servers import ragchains_serve, wait_until
from tests.test_cli import run

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SERVED_WITHIN = 5.0  # seconds from an ingest's commit to the server answering from it
NEW_DOC = (
    "# Zanzibarite\n\nZanzibarite is a blue mineral the greenhouse uses as a humidity "
    "indicator; the kit costs 12 dollars.\n"
)
NEW_ROWS = "name,price,warranty_years\nMoisture meter,31,3\nPruning saw,19,1\n"
QUERY = "zanzibarite blue mineral humidity indicator"


def ingest(docs: Path, target: list[str], *more: str) -> None:
    """`ragchains ingest` as a user runs it; returns once it has committed."""
    result = run("ingest", docs, *target, *more)
    assert result.returncode == 0, result.stderr


def _found(base: str, key: str, query: str, filters: list[dict[str, Any]] | None = None) -> Any:
    """``POST /retrieve/invoke`` with ``key``: the reply."""
    body = {"input": {"query": query, "filters": filters or []}}
    return httpx.post(f"{base}/retrieve/invoke", json=body, headers={"X-API-Key": key}, timeout=60)


def _sources(reply: Any) -> set[str]:
    assert reply.status_code == 200, reply.text
    return {str(doc["metadata"].get("source", "")) for doc in reply.json()["output"]}


def _served_within(what: str, check: Any) -> None:
    """``check`` holds within ``SERVED_WITHIN`` seconds of now (the ingest just committed)."""
    wait_until(check, what, timeout=SERVED_WITHIN, every=0.1)


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    target = tmp_path / "docs"
    shutil.copytree(FIXTURES / "docs", target)
    return target


def test_serve_serves_each_ingest_committed_while_it_runs(
    docs: Path, target: list[str], tmp_path: Path
) -> None:
    keys = tmp_path / "keys.toml"
    hr, eng = add_key(keys, "hana", ["hr"]), add_key(keys, "erik", ["eng"])
    ingest(docs, target)
    with ragchains_serve(*target, RAGCHAINS_KEYS_FILE=str(keys)) as base:
        assert not any(s.endswith("zanzibarite.md") for s in _sources(_found(base, hr, QUERY)))

        # A new document, and a table with a new numeric field.
        (docs / "zanzibarite.md").write_text(NEW_DOC, encoding="utf-8")
        (docs / "meters.csv").write_text(NEW_ROWS, encoding="utf-8")
        ingest(docs, target)

        # The new field first: a request refused at validation runs no search, so only
        # the server's own following of the store can make the field known.
        warranty = [{"field": "warranty_years", "op": ">=", "value": 3}]

        def filters_on_the_new_field() -> bool:
            reply = _found(base, eng, "moisture meter", warranty)
            return reply.status_code == 200 and bool(reply.json()["output"])

        _served_within("a filter on the new field", filters_on_the_new_field)

        def finds_the_new_document() -> bool:
            return any(s.endswith("zanzibarite.md") for s in _sources(_found(base, hr, QUERY)))

        _served_within("the new document found", finds_the_new_document)
        rows = _found(base, eng, "moisture meter", warranty).json()["output"]
        assert {doc["metadata"]["source"] for doc in rows} == {"docs/meters.csv"}
        assert all(doc["metadata"]["warranty_years"] >= 3 for doc in rows)

        # The new document relabelled for another group: hidden from both keys at once.
        ingest(docs, target, "--access", "docs/zanzibarite.md=exec")

        def hidden_from_both() -> bool:
            return not any(
                s.endswith("zanzibarite.md")
                for key in (hr, eng)
                for s in _sources(_found(base, key, QUERY))
            )

        _served_within("the relabelled document hidden", hidden_from_both)
