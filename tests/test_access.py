"""Per-user document access (issue 15): files labelled with groups at ingest are read only by
callers whose key has one of those groups, on every route, streamed or not; a filter, a glob
or a re-query cannot surface them; unlabelled files stay open to all."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from ragchains.cli import app
from ragchains.factory import build_retriever, open_index
from ragchains.ingest.errors import IngestError
from ragchains.retrievers.access import (
    SIDECAR,
    AccessLabels,
    AccessRule,
    AccessRuleError,
    caller_groups,
    groups_for,
    type_told_by_hidden,
)
from ragchains.retrievers.bm25 import BM25Retriever
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.filters import FilterError, MetadataColumns
from ragchains.retrievers.indexformat import (
    BM25_DIR,
    BM25_LENGTHS_FILE,
    MANIFEST_FILE,
    current_generation,
)
from ragchains.retrievers.pgstore import PostgresStore
from ragchains.retrievers.searchindex import SearchIndex, load_index
from ragchains.serving.keys import KeyRing, KeysFileError, add_key, list_keys, remove_key
from ragchains.settings import Settings
from tests.conftest import sources
from tests.servers import wait_until

HR_DOC = (
    "# Quokka salary bands\n\nThe quokka salary band for senior engineers runs from 91,000 "
    "to 118,000; the quokka bonus pool is 7 percent.\n"
)
ENG_DOC = (
    "# Zephyr roadmap\n\nThe zephyr migration moves the zephyr cluster to the new region in "
    "March; the zephyr freeze starts in February.\n"
)
HR_TABLE = "name,salary_band\nAda,7\nGrace,9\n"  # a field only HR's files have
HR_QUERY = "quokka salary band senior engineers bonus pool"
ENG_QUERY = "zephyr migration cluster region freeze"


# ----------------------------------------------------------------------------- rules
def test_rules_parse_match_first_and_refuse_what_they_cannot_use(tmp_path: Path) -> None:
    rule = AccessRule.parse("docs/hr/*=hr, managers")
    assert rule == AccessRule("docs/hr/*", ("hr", "managers"))
    rules = [rule, AccessRule.parse("docs/*=staff")]
    assert groups_for("docs/hr/pay.md", rules) == ("hr", "managers")  # the first match
    assert groups_for("docs/guide.md", rules) == ("staff",)
    assert groups_for("other/guide.md", rules) == ()  # everyone
    for bad, reason in (
        ("docs/*", "GLOB=GROUP"),
        ("=hr", "GLOB=GROUP"),
        ("docs/*=", "at least one group"),
        ("docs/*=h r", "not a group name"),
    ):
        with pytest.raises(AccessRuleError, match=reason):
            AccessRule.parse(bad)


def _rows(*sources: str) -> MetadataColumns:
    return MetadataColumns([{"source": s} for s in sources], {"source": "string"})


def test_a_fields_type_must_not_tell_of_files_a_caller_may_not_read() -> None:
    # Values of several types make a string field: fine when every caller reads both types.
    assert type_told_by_hidden({(): {"number", "string"}, ("hr",): {"string"}}) is None
    assert type_told_by_hidden({(): {"number"}}) is None  # one type: the same for all
    # Numbers for everyone, strings in HR's files: everyone else would see "string".
    assert type_told_by_hidden({(): {"number"}, ("hr",): {"string"}}) == "everyone"
    # Only labelled files hold it: a group reading numbers only would see "string".
    told = type_told_by_hidden({("hr", "fin"): {"number"}, ("fin",): {"string"}})
    assert told == "group 'hr'"
    # A string field for a group whose files hold strings only tells it nothing.
    assert type_told_by_hidden({("hr",): {"string"}, ("fin",): {"boolean", "string"}}) is None


def test_labels_mask_rows_by_group_and_leave_unlabelled_rows_public() -> None:
    labels = AccessLabels(
        _rows("a.md", "hr.md", "hr.md", "eng.md"),
        {"hr.md": ("hr",), "eng.md": ("eng",), "a.md": ()},
    )
    assert labels.mask(None) is None  # no access control for this caller
    assert labels.mask(frozenset()).tolist() == [True, False, False, False]
    assert labels.mask(frozenset({"hr"})).tolist() == [True, True, True, False]
    assert labels.mask(frozenset({"hr", "eng", "x"})).tolist() == [True] * 4
    assert AccessLabels(_rows("a.md"), {"a.md": ()}).mask(frozenset()) is None  # none labelled


# ----------------------------------------------------------------------------- ingest and search
def _labelled_docs(docs_dir: Path) -> Path:
    """tests/fixtures/docs plus an HR file and table (for the --access rule HR_RULE) and an
    engineering one (labelled by the folder's sidecar)."""
    (docs_dir / "hr-salaries.md").write_text(HR_DOC, encoding="utf-8")
    (docs_dir / "hr-payroll.csv").write_text(HR_TABLE, encoding="utf-8")
    (docs_dir / "eng-roadmap.md").write_text(ENG_DOC, encoding="utf-8")
    (docs_dir / SIDECAR).write_text('[groups]\n"eng-*" = ["eng"]\n', encoding="utf-8")
    return docs_dir


HR_RULE = "docs/hr-*=hr"


@pytest.fixture
def labelled(docs_dir: Path, tmp_path: Path, ingest_into: Callable[..., Any]) -> Path:
    """An index folder of ``_labelled_docs``."""
    index = tmp_path / "idx"
    ingest_into(_labelled_docs(docs_dir), index, access=[AccessRule.parse(HR_RULE)])
    return index


@pytest.fixture
def labelled_store(docs_dir: Path, pg_url: str, ingest_into: Callable[..., Any]) -> str:
    """A PostgreSQL store of ``_labelled_docs``."""
    ingest_into(_labelled_docs(docs_dir), pg_url, access=[AccessRule.parse(HR_RULE)])
    return pg_url


@pytest.fixture(params=["folder", "postgresql"])
def labelled_any(request: pytest.FixtureRequest) -> Any:
    """The labelled documents in an index folder, then in a PostgreSQL store."""
    return request.getfixturevalue("labelled" if request.param == "folder" else "labelled_store")


def test_each_caller_finds_only_what_its_groups_may_read(
    labelled_any: Path | str, settings: Settings, embedder: SentenceTransformerEmbedder
) -> None:
    index = open_index(labelled_any, embedder)
    files = index.store.files() if isinstance(index, SearchIndex) else index.files()
    assert files["docs/hr-salaries.md"].access == ("hr",)
    assert files["docs/eng-roadmap.md"].access == ("eng",)
    assert files["docs/guide.md"].access == ()
    retriever = build_retriever(settings, index, embedder)

    def found(query: str, groups: frozenset[str] | None, **kw: Any) -> set[str]:
        with caller_groups(groups):
            return sources(retriever.invoke(query, **kw))

    assert "docs/hr-salaries.md" in found(HR_QUERY, None)  # no access control: everything
    assert "docs/hr-salaries.md" in found(HR_QUERY, frozenset({"hr"}))
    for groups in (frozenset(), frozenset({"eng"})):
        seen = found(HR_QUERY, groups)
        assert seen and "docs/hr-salaries.md" not in seen  # the public files still answer
        # Asking for it by name, or by glob, finds nothing of it either.
        by_name = [{"field": "source", "op": "=", "value": "docs/hr-salaries.md"}]
        by_glob = [{"field": "source", "op": "=", "value": "docs/hr-*"}]
        assert found(HR_QUERY, groups, filters=by_name) == set()
        assert found(HR_QUERY, groups, filters=by_glob) == set()
    hr_files = {"docs/hr-salaries.md", "docs/hr-payroll.csv"}  # the same filters, as HR
    assert found(HR_QUERY, frozenset({"hr"}), filters=by_glob) == hr_files
    assert found(HR_QUERY, frozenset({"hr"}), filters=by_name) == {"docs/hr-salaries.md"}
    assert "docs/eng-roadmap.md" not in found(ENG_QUERY, frozenset({"hr"}))
    assert "docs/eng-roadmap.md" in found(ENG_QUERY, frozenset({"eng"}))

    async def found_async() -> set[str]:  # the async path (PostgreSQL's own pool)
        try:
            return sources(await retriever.ainvoke(HR_QUERY))
        finally:
            if isinstance(index, PostgresStore):
                await index.aclose()  # its pool belongs to this event loop

    with caller_groups(frozenset({"eng"})):
        seen = asyncio.run(found_async())
        # Fields no file's rows need hold (a page, a row) are told to every caller: their
        # absence from its rows would tell that labelled files exist.
        assert {"page", "row", "source"} <= set(retriever.fields)
        assert "salary_band" not in retriever.fields
    assert seen and "docs/hr-salaries.md" not in seen
    index.close()


def test_a_generation_without_row_lengths_is_written_again_by_a_plain_re_run(
    labelled: Path,
    docs_dir: Path,
    ingest_into: Callable[..., Any],
    embedder: SentenceTransformerEmbedder,
) -> None:
    # As an older ragchains wrote it: BM25 without row lengths (a caller's scores would still
    # weigh hidden rows' lengths).
    gen = current_generation(labelled)
    (gen / BM25_DIR / BM25_LENGTHS_FILE).unlink()
    manifest = json.loads((gen / MANIFEST_FILE).read_text())
    del manifest["checksums"][f"{BM25_DIR}/{BM25_LENGTHS_FILE}"]
    (gen / MANIFEST_FILE).write_text(json.dumps(manifest))
    index = load_index(labelled, embedder_name=embedder.name)
    assert index.bm25.doc_lengths is None
    with caller_groups(frozenset({"eng"})):  # still served: the readers' idf only
        assert "docs/eng-roadmap.md" in sources(BM25Retriever(index=index).invoke(ENG_QUERY))
    index.close()
    report = ingest_into(docs_dir, labelled)  # nothing changed, written all the same
    assert report.wrote and any("row lengths" in n for n in report.notes)
    index = load_index(labelled, embedder_name=embedder.name)
    assert index.bm25.doc_lengths is not None and len(index.bm25.doc_lengths) == len(index)
    index.close()
    assert not ingest_into(docs_dir, labelled).wrote  # once


def test_keyword_scores_tell_nothing_of_hidden_files(
    labelled: Path,
    docs_dir: Path,
    tmp_path: Path,
    ingest_into: Callable[..., Any],
    settings: Settings,
    embedder: SentenceTransformerEmbedder,
) -> None:
    # BM25 over the whole index would weigh a word by how many hidden chunks hold it too (and
    # lengths by theirs): a caller's scores would change with, and so reveal, hidden files.
    # They are those of an index holding only what the caller may read.
    alone_dir = tmp_path / "eng-only" / "docs"
    shutil.copytree(docs_dir, alone_dir, ignore=shutil.ignore_patterns("hr-*", SIDECAR))
    alone_index = tmp_path / "eng-only-idx"
    ingest_into(alone_dir, alone_index)
    whole, alone = (load_index(p, embedder_name=embedder.name) for p in (labelled, alone_index))
    # Hidden words (quokka, salary, band) beside public ones.
    query = "quokka salary band zephyr migration water beds tool shed garden morning timer"

    def scores(retriever: Any, groups: frozenset[str] | None) -> dict[tuple[str, str], float]:
        with caller_groups(groups):
            docs = retriever.invoke(query, k=50)
        return {
            (d.metadata["source"], d.page_content): d.metadata["bm25_score"]
            for d in docs
            if d.metadata["bm25_score"] is not None  # the hybrid's dense-only hits
        }

    for make in (
        lambda index: BM25Retriever(index=index, k=50),
        lambda index: build_retriever(settings, index, embedder),
    ):
        as_eng = scores(make(whole), frozenset({"eng"}))
        assert any("eng-roadmap" in source for source, _ in as_eng)
        expected = scores(make(alone), None)
        shared = as_eng.keys() & expected.keys()
        assert len(shared) >= 3
        assert {k: as_eng[k] for k in shared} == pytest.approx({k: expected[k] for k in shared})
        unmasked = scores(make(whole), None)  # the same search without the caller's view
        assert {k: unmasked[k] for k in shared} != pytest.approx({k: expected[k] for k in shared})
    whole.close()
    alone.close()


def test_an_ingest_whose_field_types_would_tell_of_hidden_files_is_refused(
    labelled_any: Path | str,
    docs_dir: Path,
    ingest_into: Callable[..., Any],
    embedder: SentenceTransformerEmbedder,
) -> None:
    # tools.csv (everyone's) has numbers in its weight_kg column; an HR table with words there
    # would make it a string field for everyone, telling them that some other file exists.
    (docs_dir / "hr-weights.csv").write_text("name,weight_kg\nrake,heavy\n", encoding="utf-8")
    before = open_index(labelled_any, embedder)
    try:
        count = len(before)
    finally:
        before.close()
    with pytest.raises(IngestError, match=r"field 'weight_kg' .* would tell everyone") as refused:
        ingest_into(docs_dir, labelled_any)
    assert "Nothing was written" in str(refused.value)
    after = open_index(labelled_any, embedder)
    try:
        assert len(after) == count and after.fields["weight_kg"] == "number"
    finally:
        after.close()
    # Readable by everyone, the same table is one string field (the run says so).
    rules = [AccessRule.parse("docs/hr-sal*=hr"), AccessRule.parse("docs/hr-pay*=hr")]
    report = ingest_into(docs_dir, labelled_any, access=rules)
    assert report.wrote and any("'weight_kg'" in note for note in report.notes)


def test_new_groups_relabel_files_without_embedding_them_again(
    labelled: Path,
    docs_dir: Path,
    ingest_into: Callable[..., Any],
    embedder: SentenceTransformerEmbedder,
) -> None:
    report = ingest_into(docs_dir, labelled, access=[AccessRule.parse("docs/hr-*=hr,finance")])
    assert report.relabelled == ["docs/hr-payroll.csv", "docs/hr-salaries.md"]
    assert report.chunks_embedded == 0 and report.wrote
    index = load_index(labelled, embedder_name=embedder.name)
    assert index.store.files()["docs/hr-salaries.md"].access == ("finance", "hr")
    index.close()


def test_a_store_relabels_keeps_rules_and_tells_fields_per_caller(
    labelled_store: str,
    docs_dir: Path,
    ingest_into: Callable[..., Any],
    settings: Settings,
    embedder: SentenceTransformerEmbedder,
) -> None:
    store = PostgresStore(labelled_store)
    retriever = build_retriever(settings, store, embedder)
    on_salary = [{"field": "salary_band", "op": ">", "value": 1}]
    try:
        with caller_groups(frozenset({"eng"})):
            assert "salary_band" not in store.visible_fields()  # only HR's table has it
            with pytest.raises(FilterError, match="unknown filter field") as refused:
                retriever.invoke(HR_QUERY, filters=on_salary)
            assert "salary_band" not in str(refused.value).split("known fields")[1]
        with caller_groups(frozenset({"hr"})):
            assert "salary_band" in store.visible_fields()
            assert retriever.invoke(HR_QUERY, filters=on_salary)
        # A plain re-run keeps the rules; new groups relabel without embedding again.
        again = ingest_into(docs_dir, labelled_store)
        assert not again.wrote and any("rules of the last run kept" in n for n in again.notes)
        rebuilt = ingest_into(docs_dir, labelled_store, rebuild=True)
        assert rebuilt.wrote and any("rules of the last run kept" in n for n in rebuilt.notes)
        store.forget()
        assert store.files()["docs/hr-salaries.md"].access == ("hr",)
        report = ingest_into(docs_dir, labelled_store, access=[AccessRule.parse("docs/hr-*=fin")])
        assert report.relabelled == ["docs/hr-payroll.csv", "docs/hr-salaries.md"]
        assert report.chunks_embedded == 0 and report.wrote
        store.forget()
        assert store.files()["docs/hr-salaries.md"].access == ("fin",)
        with caller_groups(frozenset({"fin"})):
            assert "docs/hr-salaries.md" in sources(retriever.invoke(HR_QUERY))
        with caller_groups(frozenset({"hr"})):
            assert "docs/hr-salaries.md" not in sources(retriever.invoke(HR_QUERY))
    finally:
        store.close()


# ----------------------------------------------------------------------------- keys
def test_keys_are_stored_hashed_and_found_by_key(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    alice = add_key(path, "alice", ["hr"])
    bob = add_key(path, "bob", ["eng", "ops"])
    text = path.read_text()
    assert alice not in text and bob not in text  # only their sha256
    assert path.stat().st_mode & 0o777 == 0o600
    ring = KeyRing(path)
    found = ring.find(alice.encode())
    assert found is not None and found.name == "alice" and found.groups == {"hr"}
    assert ring.find(b"rk-wrong") is None and ring.find(b"") is None
    assert list_keys(path) == [("alice", ["hr"], "reader"), ("bob", ["eng", "ops"], "reader")]
    with pytest.raises(KeysFileError, match="already holds a key for 'alice'"):
        add_key(path, "alice", ["x"])
    remove_key(path, "alice")
    assert list_keys(path) == [("bob", ["eng", "ops"], "reader")]
    with pytest.raises(KeysFileError, match="holds no key for 'alice'"):
        remove_key(path, "alice")
    path.chmod(0o664)  # whoever may write it could add a key of their own
    with pytest.raises(KeysFileError, match="can be changed by other users"):
        KeyRing(path)
    path.chmod(0o600)
    add_key(path, "carol", ["hr"])
    assert path.stat().st_mode & 0o777 == 0o600
    for broken in ('[[keys]]\nprincipal = "x"\n', _entry("x", "Z" * 64)):
        path.write_text(broken)
        with pytest.raises(KeysFileError, match="needs principal"):
            KeyRing(path)


def test_keys_changed_at_once_lose_no_change(tmp_path: Path) -> None:
    # Each command reads the file, changes it and writes it back: without a lock, one would
    # write back a list read before another's change (a removed key would come back).
    path = tmp_path / "keys.toml"
    names = [f"user{i}" for i in range(16)]

    def together(change: Callable[[str], object], some: list[str]) -> None:
        start = threading.Barrier(len(some))  # every thread at its change at once

        def run(name: str) -> object:
            start.wait()
            return change(name)

        with ThreadPoolExecutor(len(some)) as pool:
            list(pool.map(run, some))

    together(lambda name: add_key(path, name, ["hr"]), names)
    assert sorted(key.principal for key in list_keys(path)) == sorted(names)
    together(lambda name: remove_key(path, name), names[::2])
    assert sorted(key.principal for key in list_keys(path)) == sorted(names[1::2])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".keys.toml.")] == [
        ".keys.toml.lock"
    ]


def test_a_keyring_lets_no_key_in_while_its_file_is_unusable_and_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ragchains.serving import keys as keys_module

    monkeypatch.setattr(keys_module, "RELOAD_INTERVAL", 0.0)  # look on every call
    path = tmp_path / "keys.toml"
    key = add_key(path, "erin", ["hr"]).encode()
    ring = KeyRing(path)
    assert ring.find(key) is not None
    path.chmod(0o666)
    assert ring.find(key) is None  # refused while others may write it
    path.chmod(0o600)  # the mend the log asks for: a chmod changes only the inode's times
    assert ring.find(key) is not None
    remove_key(path, "erin")
    assert ring.find(key) is None


def _entry(principal: str, digest: str) -> str:
    return f'[[keys]]\nprincipal = "{principal}"\ngroups = ["hr"]\nsha256 = "{digest}"\n'


def test_a_running_server_follows_the_keys_file(
    serve_upstream: Callable[..., AbstractContextManager[str]], tmp_path: Path
) -> None:
    keys = tmp_path / "keys.toml"
    first = add_key(keys, "dora", ["hr"])

    def status(key: str) -> int:
        body = {"input": {"query": "watering"}}
        return httpx.post(
            f"{base}/retrieve/invoke", json=body, headers={"X-API-Key": key}, timeout=60
        ).status_code

    def settles(key: str, expected: int) -> None:  # the file is re-read within a second
        wait_until(lambda: status(key) == expected, f"status {expected}", timeout=15)

    with serve_upstream(keys_file=keys, openai_model="ok-keys") as base:
        assert status(first) == 200
        remove_key(keys, "dora")  # revoked: refused without a restart
        settles(first, 401)
        second = add_key(keys, "dora", ["hr"])
        settles(second, 200)
        keys.write_text("not toml [")  # a broken file lets no key in (and says so in the log)
        settles(second, 401)


def test_the_keys_command_prints_a_key_once_and_lists_owners(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    made = CliRunner().invoke(
        app, ["keys", "add", "carol", "--groups", "hr", "--keys-file", str(path)]
    )
    assert made.exit_code == 0, made.output
    key = made.stdout.strip().splitlines()[0]
    assert key.startswith("rk-") and key not in path.read_text()
    listed = CliRunner().invoke(app, ["keys", "list", "--keys-file", str(path)])
    assert listed.exit_code == 0 and listed.stdout.strip() == "carol: hr (reader)"
    bad = CliRunner().invoke(
        app, ["keys", "add", "dan", "--groups", "a b", "--keys-file", str(path)]
    )
    assert bad.exit_code == 2 and "not a group name" in bad.output
    gone = CliRunner().invoke(app, ["keys", "remove", "carol", "--keys-file", str(path)])
    assert gone.exit_code == 0 and "removed" in gone.output
    listed = CliRunner().invoke(app, ["keys", "list", "--keys-file", str(path)])
    assert listed.exit_code == 0 and listed.stdout.strip() == ""
    again = CliRunner().invoke(app, ["keys", "remove", "carol", "--keys-file", str(path)])
    assert again.exit_code == 2 and "holds no key for 'carol'" in again.output


# ----------------------------------------------------------------------------- every route
def _replies(base: str, key: str, question: str) -> dict[str, str]:
    """The text of each route's reply to ``question`` (streamed and not), by question and
    route."""
    headers = {"X-API-Key": key}
    config = {"configurable": {"domain": "default"}}
    out: dict[str, str] = {}
    for route, field in (("retrieve", "query"), ("ask", "question"), ("chat", "question")):
        body = {"input": {field: question}, "config": config}
        for endpoint in ("invoke", "stream", "batch"):
            sent = {"inputs": [body["input"]], "config": config} if endpoint == "batch" else body
            reply = httpx.post(
                f"{base}/{route}/{endpoint}", json=sent, headers=headers, timeout=120
            )
            assert reply.status_code == 200, (route, endpoint, reply.text[:300])
            out[f"{question}: {route}/{endpoint}"] = reply.text
    for stream in (False, True):
        messages = [{"role": "user", "content": question}]
        body2 = {"model": "default", "messages": messages, "stream": stream}
        reply = httpx.post(f"{base}/v1/chat/completions", json=body2, headers=headers, timeout=120)
        assert reply.status_code == 200, reply.text[:300]
        out[f"{question}: v1/stream={stream}"] = reply.text
    return out


def test_two_keys_see_disjoint_hidden_documents_on_every_route(
    serve_upstream: Callable[..., AbstractContextManager[str]],
    labelled_any: Path | str,
    tmp_path: Path,
) -> None:
    keys = tmp_path / "keys.toml"
    hr, eng = add_key(keys, "hana", ["hr"]), add_key(keys, "erik", ["eng"])
    with serve_upstream(index=labelled_any, keys_file=keys, openai_model="ok-access") as base:
        as_hr = {**_replies(base, hr, HR_QUERY), **_replies(base, hr, ENG_QUERY)}
        as_eng = {**_replies(base, eng, HR_QUERY), **_replies(base, eng, ENG_QUERY)}
        no_key = httpx.post(f"{base}/retrieve/invoke", json={"input": {"query": "x"}})
        ready = httpx.get(f"{base}/readyz").json()
    for route, text in as_hr.items():
        assert "eng-roadmap" not in text, route
    for route, text in as_eng.items():
        assert "hr-salaries" not in text, route
    # Each does find its own (the searches are real, not empty everywhere).
    assert any("hr-salaries" in text for text in as_hr.values())
    assert any("eng-roadmap" in text for text in as_eng.values())
    assert no_key.status_code == 401
    assert "chunks" not in ready["index"] and "fields" not in ready["index"]
    assert ready["api_key_required"] is True
    assert "salary_band" not in json.dumps(ready)  # a field only HR's table has


# ----------------------------------------------------------------------------- labels that stay
def test_a_plain_re_run_keeps_the_rules_and_only_access_clear_drops_them(
    labelled: Path,
    docs_dir: Path,
    ingest_into: Callable[..., Any],
    embedder: SentenceTransformerEmbedder,
) -> None:
    """A re-run without --access made every labelled file public, silently."""
    (docs_dir / "notes.txt").write_text("changed notes\n", encoding="utf-8")  # a real change
    kept = ingest_into(docs_dir, labelled)
    assert any("access rules of the last run kept: docs/hr-*=hr" in n for n in kept.notes)
    index = load_index(labelled, embedder_name=embedder.name)
    assert index.store.files()["docs/hr-salaries.md"].access == ("hr",)
    index.close()
    rebuilt = ingest_into(docs_dir, labelled, rebuild=True)  # new vectors, the same readers
    assert any("access rules of the last run kept" in n for n in rebuilt.notes)
    index = load_index(labelled, embedder_name=embedder.name)
    assert index.store.files()["docs/hr-salaries.md"].access == ("hr",)
    index.close()
    cleared = ingest_into(docs_dir, labelled, access=[])
    opened = [n for n in cleared.notes if "now readable by everyone" in n]
    assert opened and "docs/hr-salaries.md" in opened[0]
    index = load_index(labelled, embedder_name=embedder.name)
    assert index.store.files()["docs/hr-salaries.md"].access == ()
    assert index.store.files()["docs/eng-roadmap.md"].access == ("eng",)  # its sidecar's
    index.close()


def test_rules_that_would_leave_files_open_by_mistake_are_caught(
    docs_dir: Path,
    tmp_path: Path,
    ingest_into: Callable[..., Any],
    embedder: SentenceTransformerEmbedder,
) -> None:
    with pytest.raises(IngestError, match="matches no file: files are named"):
        ingest_into(docs_dir, tmp_path / "a", access=[AccessRule.parse("hr/*=hr")])
    # A sidecar deeper down applies to its folder; a folder named like a glob is literal.
    team = docs_dir / "team[hr]"
    team.mkdir()
    (team / "pay.md").write_text(HR_DOC, encoding="utf-8")
    (team / SIDECAR).write_text('[groups]\n"*" = ["hr"]\n', encoding="utf-8")
    ingest_into(docs_dir, tmp_path / "b")
    index = load_index(tmp_path / "b", embedder_name=embedder.name)
    assert index.store.files()["docs/team[hr]/pay.md"].access == ("hr",)
    assert index.store.files()["docs/guide.md"].access == ()
    index.close()


def test_a_field_only_hidden_files_have_is_not_told_of_even_in_an_error(
    labelled: Path,
    settings: Settings,
    embedder: SentenceTransformerEmbedder,
) -> None:
    """Its name and type were listed in the 422's "known fields", in the rewrite's tools
    and in /readyz: each told that a hidden file exists."""
    index = load_index(labelled, embedder_name=embedder.name)
    retriever = build_retriever(settings, index, embedder)
    band = [{"field": "salary_band", "op": ">", "value": 8}]
    with caller_groups(frozenset({"eng"})):
        assert "salary_band" not in retriever.fields and "source" in retriever.fields
        with pytest.raises(FilterError) as refused:
            retriever.invoke("payroll", filters=band)
        known = str(refused.value).split("known fields:")[1]  # (its own words aside)
        assert "salary" not in known and "source" in known
    with caller_groups(frozenset({"hr"})):
        assert retriever.fields["salary_band"] == "number"
        assert sources(retriever.invoke("payroll", filters=band)) == {"docs/hr-payroll.csv"}
    assert "salary_band" in retriever.fields  # no access control: every field
    index.close()


def test_a_key_has_a_role_reader_by_default_and_a_bad_role_stops_the_file(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    made = CliRunner().invoke(
        app,
        ["keys", "add", "eddie", "--groups", "hr", "--role", "editor", "--keys-file", str(path)],
    )
    assert made.exit_code == 0, made.output
    add_key(path, "rosa", ["eng"])
    assert [(k.principal, k.role) for k in list_keys(path)] == [
        ("eddie", "editor"),
        ("rosa", "reader"),
    ]
    listed = CliRunner().invoke(app, ["keys", "list", "--keys-file", str(path)])
    assert listed.stdout.splitlines() == ["eddie: hr (editor)", "rosa: eng (reader)"]
    ring = KeyRing(path)
    key = made.stdout.strip().splitlines()[0].encode()
    found = ring.find(key)
    assert found is not None and found.role == "editor" and found.may("editor")
    assert not found.may("admin")
    # A file written before roles (no role line) is read: its keys are readers.
    old = tmp_path / "old.toml"
    old.write_text('[[keys]]\nprincipal = "olga"\ngroups = ["ops"]\nsha256 = "' + "a" * 64 + '"\n')
    old.chmod(0o600)
    assert list_keys(old)[0].role == "reader"
    bad = tmp_path / "bad.toml"
    bad.write_text(old.read_text().replace('groups = ["ops"]', 'groups = ["ops"]\nrole = "owner"'))
    bad.chmod(0o600)
    with pytest.raises(KeysFileError, match="role 'owner'"):
        KeyRing(bad)
    wrong = CliRunner().invoke(
        app, ["keys", "add", "x", "--groups", "hr", "--role", "owner", "--keys-file", str(path)]
    )
    assert wrong.exit_code == 2 and "owner" in wrong.output
