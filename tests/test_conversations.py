"""The conversation store (ragchains.conversations) in both of its databases: a SQLite file
and a PostgreSQL store's schema. Each owner reads and changes only their own; a delete is
gone from the database; retention deletes what is older than its days."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from pydantic import ValidationError

from ragchains.conversations import (
    CONVERSATIONS,
    TURNS,
    ConversationExists,
    ConversationStore,
    TurnIn,
    conversations_path,
    now_text,
    open_conversations,
    title_of,
)
from ragchains.retrievers.pgstore import split_schema
from ragchains.settings import Settings


def _turn(
    question: str, answer: str = "It is 25 days [handbook.md#leave].", **extra: object
) -> TurnIn:
    return TurnIn.model_validate(
        {
            "question": question,
            "status": "answered",
            "output": {
                "answer": answer,
                "citations": [{"label": "handbook.md#leave", "id": "c1"}],
                "prompts": {"answer": "hr/answer@v2"},
                "sources": [{"id": "c1", "label": "handbook.md#leave", "score": 0.8}],
            },
            **extra,
        }
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ConversationStore]:
    if request.param == "sqlite":
        opened = ConversationStore.sqlite(tmp_path / "conversations.sqlite")
    else:
        url = request.getfixturevalue("pg_url")
        conninfo, schema = split_schema(url)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        opened = ConversationStore.postgres(conninfo, schema, where=url)
    yield opened
    opened.close()


def test_an_owner_lists_opens_renames_and_deletes_their_own(store: ConversationStore) -> None:
    first = store.create("alice")
    second = store.create("alice", "Plans")
    assert first.title == "" and first.turns == 0
    stored, new = store.put_turn("alice", first.id, "t1", _turn("How many vacation days?")) or (
        None,
        None,
    )
    assert new is True and stored is not None and stored.position == 0
    # The first question titles an untitled conversation; the most recent is listed first.
    listed = store.list("alice")
    assert [c.id for c in listed] == [first.id, second.id]
    assert listed[0].title == "How many vacation days?" and listed[0].turns == 1
    assert store.update("alice", second.id, title="Price list") is not None
    assert [c.title for c in store.list("alice")] == ["Price list", "How many vacation days?"]
    opened = store.get("alice", first.id)
    assert opened is not None
    assert opened.history[0].output.answer == "It is 25 days [handbook.md#leave]."
    assert opened.history[0].output.prompts == {"answer": "hr/answer@v2"}
    assert opened.history[0].output.citations[0].label == "handbook.md#leave"
    # Extra fields the page showed (sources) are kept as sent.
    assert opened.history[0].output.model_dump()["sources"][0]["score"] == 0.8
    assert store.delete("alice", first.id) is True
    assert store.get("alice", first.id) is None
    assert store.delete("alice", first.id) is False
    assert [c.id for c in store.list("alice")] == [second.id]


def test_turns_keep_their_order_and_a_resent_turn_replaces_itself(
    store: ConversationStore,
) -> None:
    conversation = store.create("alice")
    for n in range(3):
        store.put_turn("alice", conversation.id, f"t{n}", _turn(f"question {n}"))
    voted = _turn("question 1", feedback={"score": 0, "comment": "wrong year"})
    replaced = store.put_turn("alice", conversation.id, "t1", voted)
    assert replaced is not None and replaced[1] is False and replaced[0].position == 1
    opened = store.get("alice", conversation.id)
    assert opened is not None
    assert [t.id for t in opened.history] == ["t0", "t1", "t2"]
    assert opened.history[1].feedback.score == 0
    assert opened.history[1].feedback.comment == "wrong year"
    assert opened.title == "question 0"


def test_nobody_reads_or_changes_another_persons_conversation(store: ConversationStore) -> None:
    mine = store.create("alice", "HR")
    store.put_turn("alice", mine.id, "t1", _turn("What is my salary band?"))
    assert store.list("bob") == []
    assert store.get("bob", mine.id) is None
    assert store.update("bob", mine.id, title="taken") is None
    assert store.put_turn("bob", mine.id, "t2", _turn("mine now?")) is None
    assert store.delete("bob", mine.id) is False
    opened = store.get("alice", mine.id)
    assert opened is not None and opened.title == "HR" and len(opened.history) == 1
    # An admin's delete (no owner) deletes anyone's.
    assert store.delete(None, mine.id) is True
    assert store.get("alice", mine.id) is None


def test_an_id_is_one_conversations_and_metadata_filters_the_list(
    store: ConversationStore,
) -> None:
    given = str(uuid.uuid4())
    store.create("alice", id=given, metadata={"source": "sdk"})
    store.create("alice")
    with pytest.raises(ConversationExists):
        store.create("bob", id=given)
    assert [c.id for c in store.list("alice", metadata={"source": "sdk"})] == [given]
    updated = store.update("alice", given, metadata={"topic": "leave"})
    assert updated is not None and updated.metadata == {"source": "sdk", "topic": "leave"}
    assert len(store.list("alice", limit=1)) == 1
    assert len(store.list("alice", offset=1)) == 1


def test_retention_deletes_conversations_older_than_its_days(store: ConversationStore) -> None:
    store.keep_days = 30
    old = store.create("alice", "old")
    recent = store.create("alice", "recent")
    store.put_turn("alice", old.id, "t1", _turn("an old question"))
    long_ago = now_text(datetime.now(UTC) - timedelta(days=31))
    with store.engine.begin() as conn:
        conn.execute(
            CONVERSATIONS.update().where(CONVERSATIONS.c.id == old.id).values(updated_at=long_ago)
        )
    assert store.purge() == 1
    assert [c.id for c in store.list("alice")] == [recent.id]
    assert store.get("alice", old.id) is None


def test_what_json_holds_is_kept_as_sent(store: ConversationStore) -> None:
    # PostgreSQL's jsonb refuses NUL; kept as JSON text, both databases keep it.
    odd = "a NUL \x00, a tab \t, emoji 🦘 and ‮right-to-left‬"
    made = store.create("alice", metadata={"odd \x00 key": odd})
    stored = store.put_turn("alice", made.id, "t1", _turn("fine", answer=odd, error=odd))
    assert stored is not None
    opened = store.get("alice", made.id)
    assert opened is not None and opened.metadata == {"odd \x00 key": odd}
    assert opened.history[0].output.answer == odd and opened.history[0].error == odd


def test_a_turn_that_cannot_be_kept_is_refused_with_its_reason() -> None:
    with pytest.raises(ValidationError, match="surrogate"):
        _turn("fine", answer="half \ud800 a pair")
    with pytest.raises(ValidationError, match="question is empty"):
        _turn("   ")
    with pytest.raises(ValidationError):
        TurnIn.model_validate({"question": "q", "status": "thinking"})
    with pytest.raises(ValidationError):  # a vote is 0 or 1, not a boolean
        TurnIn.model_validate({"question": "q", "feedback": {"score": True}})
    assert TurnIn.model_validate({"question": "q", "feedback": {"score": 1.0}}).feedback.score == 1


def test_a_deleted_conversation_is_gone_from_the_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "conversations.sqlite"
    store = ConversationStore.sqlite(path)
    kept = store.create("alice")
    store.put_turn("alice", kept.id, "t1", _turn("Where is the Leipzig office?"))
    gone = store.create("alice")
    secret = f"my medical leave note {uuid.uuid4().hex}"
    store.put_turn("alice", gone.id, "t1", _turn(secret, answer=f"noted: {secret}"))
    assert store.delete("alice", gone.id)
    store.close()
    # Read as bytes, the file and its write-ahead log hold no trace of it.
    files = [p for p in tmp_path.iterdir() if p.name.startswith("conversations.sqlite")]
    assert all(secret.encode() not in p.read_bytes() for p in files), [p.name for p in files]
    # And read with SQL, directly: no row of it in either table.
    with sa.create_engine(f"sqlite:///{path}").connect() as conn:
        rows = conn.exec_driver_sql("SELECT id FROM conversations").all()
        turns = conn.exec_driver_sql("SELECT conversation_id FROM conversation_turns").all()
    assert [r[0] for r in rows] == [kept.id]
    assert {t[0] for t in turns} == {kept.id}


def test_conversations_outlive_the_store_object(tmp_path: Path) -> None:
    path = tmp_path / "conversations.sqlite"
    first = ConversationStore.sqlite(path)
    made = first.create("alice", "kept")
    first.put_turn("alice", made.id, "t1", _turn("kept question"))
    first.close()
    again = ConversationStore.sqlite(path)
    opened = again.get("alice", made.id)
    assert opened is not None and opened.history[0].question == "kept question"
    again.close()


def test_where_conversations_are_kept(tmp_path: Path) -> None:
    default = Settings(_env_file=None)  # type: ignore[call-arg]
    assert conversations_path(default, tmp_path / "index") == (
        tmp_path / "index" / "conversations.sqlite"
    )
    chosen = Settings(_env_file=None, conversations_db=tmp_path / "c.sqlite")  # type: ignore[call-arg]
    assert conversations_path(chosen, tmp_path / "index") == tmp_path / "c.sqlite"
    opened = open_conversations(default, index=tmp_path / "index", store_url=None)
    assert opened.where == str(tmp_path / "index" / "conversations.sqlite")
    opened.close()


def test_a_title_is_the_first_line_of_the_question_cut_at_a_word() -> None:
    assert title_of("  How many\n vacation days? ") == "How many vacation days?"
    long = "word " * 40
    assert title_of(long).endswith("…") and len(title_of(long)) <= 81


def test_writers_at_once_keep_turns_in_order_and_a_delete_leaves_none(
    store: ConversationStore,
) -> None:
    """Eight writers on one conversation: every turn kept at a position of its own. Turns
    racing a delete: none outlives the conversation (its text would stay in the file)."""
    from concurrent.futures import ThreadPoolExecutor

    busy = store.create("alice")
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(lambda n: store.put_turn("alice", busy.id, f"t{n}", _turn(f"q{n}")), range(40))
        )
    opened = store.get("alice", busy.id)
    assert opened is not None
    assert sorted(t.position for t in opened.history) == list(range(40))
    for attempt in range(10):
        doomed = store.create("alice")
        with ThreadPoolExecutor(4) as pool:
            writes = [
                pool.submit(store.put_turn, "alice", doomed.id, f"t{n}", _turn("q"))
                for n in range(6)
            ]
            pool.submit(store.delete, "alice", doomed.id).result()
            for write in writes:
                write.result()  # stored before the delete, or refused (None) after it
        with store.engine.connect() as conn:
            left = conn.execute(
                sa.select(sa.func.count()).where(TURNS.c.conversation_id == doomed.id)
            ).scalar_one()
        assert left == 0, f"attempt {attempt}: {left} turns outlived their conversation"
