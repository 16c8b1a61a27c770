"""People's conversations, kept on the server: each one has an owner (a principal's name),
a title and its turns, each turn with its answer, citations, feedback and prompt versions.
The chat page lists and reopens them on any device; the threads API (``serving.threads``)
serves the same records as Agent Protocol threads.

One implementation, two databases, through SQLAlchemy Core: a SQLite file beside the index
(``conversations.sqlite`` at the index folder's root, which a re-ingest never replaces) or
the tables ``conversations`` and ``conversation_turns`` in a PostgreSQL store's own schema.
Every read and write names the owner, so one person never reads or changes another's; a
deleted conversation is gone from the file, not only hidden (SQLite's ``secure_delete``, then
a checkpoint of its write-ahead log).

Nothing here imports FastAPI: the server's routes are in ``serving.conversations``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import sqlalchemy as sa
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StringConstraints,
    model_validator,
)
from sqlalchemy.engine import Connection, Engine

from ragchains.database import Database, DatabaseError, JsonText, postgres_engine, sqlite_engine
from ragchains.settings import Settings
from ragchains.textrules import json_int, text_type

log = logging.getLogger(__name__)

CONVERSATIONS_FILE = "conversations.sqlite"
PURGE_INTERVAL = 600.0  # seconds between two sweeps for conversations past their retention
TITLE_CHARS = 120
MAX_TURNS = 2000  # turns one conversation keeps; a longer one is refused a new turn
DEFAULT_PAGE = 50
MAX_PAGE = 200


# The tables, without a schema: a PostgreSQL store's schema is mapped in per connection
# (``schema_translate_map``), so the same tables serve any store.
METADATA = sa.MetaData()
_JSON = JsonText()
CONVERSATIONS = sa.Table(
    "conversations",
    METADATA,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("owner", sa.Text, nullable=False),  # a key owner's name has no length limit
    sa.Column("title", sa.String(TITLE_CHARS), nullable=False),
    # ISO 8601 in UTC with microseconds: one width, so text order is time order in both
    # databases, and a person reading the file sees dates.
    sa.Column("created_at", sa.String(32), nullable=False),
    sa.Column("updated_at", sa.String(32), nullable=False),
    sa.Column("metadata", _JSON, nullable=False),
    sa.Index("conversations_by_owner", "owner", "updated_at"),
    sa.Index("conversations_by_age", "updated_at"),
)
TURNS = sa.Table(
    "conversation_turns",
    METADATA,
    sa.Column("conversation_id", sa.String(64), primary_key=True),
    sa.Column("id", sa.String(100), primary_key=True),
    sa.Column("position", sa.Integer, nullable=False),
    sa.Column("created_at", sa.String(32), nullable=False),
    sa.Column("record", _JSON, nullable=False),
    sa.Index("turns_in_order", "conversation_id", "position"),
)


class ConversationExists(ValueError):
    """A conversation (anyone's) already has the id asked for."""


class ConversationFull(ValueError):
    """A conversation that holds MAX_TURNS turns is given another."""


# ----------------------------------------------------------------------------- records
class Citation(BaseModel):
    """One [label] of an answer and the chunk it resolved to (as the chains return it)."""

    model_config = ConfigDict(extra="allow")
    label: str = ""
    id: str = ""


class TurnOutput(BaseModel):
    """What the chain returned for a turn, as the page keeps it: the answer, its citations
    and the prompt versions that wrote it, and whatever else it showed (sources, notes,
    scores, timings), kept as sent."""

    model_config = ConfigDict(extra="allow")
    answer: str = ""
    citations: list[Citation] = Field(default_factory=list)
    prompts: dict[str, str] = Field(default_factory=dict)
    abstained: StrictBool = False


class TurnFeedback(BaseModel):
    """The reader's thumbs up (1) or down (0) on the turn's answer, and their comment."""

    score: json_int(ge=0, le=1) | None = None  # type: ignore[valid-type]
    comment: Annotated[str, StringConstraints(max_length=2000)] = ""


class TurnIn(BaseModel):
    """A finished turn: the question, how it was asked, how it ended and what it returned."""

    model_config = ConfigDict(extra="forbid")
    # Kept as asked: /chat's own limit (RAGCHAINS_MAX_QUESTION_CHARS) checked it already.
    question: text_type("question", 1_000_000)  # type: ignore[valid-type]
    mode: Literal["chat", "ask"] = "chat"
    domain: Annotated[str, StringConstraints(min_length=1, max_length=100)] = "default"
    status: Literal["answered", "abstained", "error", "stopped"] = "answered"
    output: TurnOutput = Field(default_factory=TurnOutput)
    feedback: TurnFeedback = Field(default_factory=TurnFeedback)
    run_id: Annotated[str, StringConstraints(max_length=100)] | None = None
    error: Annotated[str, StringConstraints(max_length=2000)] | None = None

    @model_validator(mode="after")
    def _storable(self) -> TurnIn:
        storable(self.model_dump(mode="json"), "turn")
        return self


class Turn(TurnIn):
    id: str
    position: StrictInt
    created_at: str


class Conversation(BaseModel):
    id: str
    title: str
    created_at: str
    updated_at: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    turns: StrictInt = 0


class ConversationWithTurns(Conversation):
    history: list[Turn] = Field(default_factory=list)


def storable(value: Any, what: str) -> Any:
    """``value`` when it can be stored and sent back: text that is not UTF-8 (JSON's lone
    surrogate escapes) is refused, with a reason."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"the {what} holds a lone surrogate (not UTF-8)") from None
        if isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return value


def now_text(at: datetime | None = None) -> str:
    return (at or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def title_of(question: str) -> str:
    """A conversation's title from its first question: its first line, cut at a word."""
    line = " ".join(question.split())
    if len(line) <= 80:
        return line
    cut = line[:80].rsplit(" ", 1)[0]
    return f"{cut}…"


# ----------------------------------------------------------------------------- the store
class ConversationStore(Database):
    """The conversations of every owner in one database (see the module docstring).
    Thread-safe: each call takes a connection of the engine's pool."""

    def __init__(self, engine: Engine, *, keep_days: int | None = None, where: str) -> None:
        super().__init__(engine, where=where, what="conversations")
        self.keep_days = keep_days
        self._purged_at = -PURGE_INTERVAL
        self._purge_lock = threading.Lock()
        self.create_tables(METADATA)

    @classmethod
    def sqlite(cls, path: Path, *, keep_days: int | None = None) -> ConversationStore:
        """The store in the SQLite file ``path`` (made when missing, its folder too)."""
        return cls(sqlite_engine(path), keep_days=keep_days, where=str(path))

    @classmethod
    def postgres(
        cls, conninfo: str, schema: str, *, keep_days: int | None = None, where: str
    ) -> ConversationStore:
        """The store in ``schema`` of the PostgreSQL database ``conninfo`` names."""
        return cls(postgres_engine(conninfo, schema), keep_days=keep_days, where=where)

    # ------------------------------------------------------------------ conversations
    def create(
        self,
        owner: str,
        title: str = "",
        *,
        id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Conversation:
        """A new conversation of ``owner``'s; ConversationExists when ``id`` is taken."""
        self._purge_now_and_then()
        stamp = now_text()
        row = {
            "id": id or str(uuid.uuid4()),
            "owner": owner,
            "title": title[:TITLE_CHARS],
            "created_at": stamp,
            "updated_at": stamp,
            "metadata": dict(metadata or {}),
        }
        try:
            with self.transaction(writes=True) as conn:
                conn.execute(CONVERSATIONS.insert().values(**row))
        except DatabaseError as exc:
            if isinstance(exc.__cause__, sa.exc.IntegrityError):
                raise ConversationExists(f"a conversation with id {row['id']} exists") from exc
            raise
        return Conversation(**{k: v for k, v in row.items() if k != "owner"})

    def list(
        self,
        owner: str,
        *,
        limit: int = DEFAULT_PAGE,
        offset: int = 0,
        metadata: Mapping[str, Any] | None = None,
        oldest_first: bool = False,
    ) -> list[Conversation]:
        """``owner``'s conversations, the most recently continued first; those whose
        metadata holds every key and value of ``metadata`` when it is given."""
        self._purge_now_and_then()
        order = (
            CONVERSATIONS.c.updated_at.asc() if oldest_first else CONVERSATIONS.c.updated_at.desc()
        )
        query = (
            sa.select(CONVERSATIONS)
            .where(CONVERSATIONS.c.owner == owner)
            .order_by(order, CONVERSATIONS.c.id)
        )
        if not metadata:  # the page in SQL; a metadata filter reads the owner's all
            query = query.limit(limit).offset(offset)
        with self.transaction() as conn:
            rows = conn.execute(query).mappings().all()
            if metadata:
                wanted = dict(metadata)
                rows = [r for r in rows if all(_meta(r).get(k) == v for k, v in wanted.items())]
                rows = rows[offset : offset + limit]
            ids = [row["id"] for row in rows]
            counts: dict[str, int] = dict(
                conn.execute(  # type: ignore[arg-type]
                    sa.select(TURNS.c.conversation_id, sa.func.count())
                    .where(TURNS.c.conversation_id.in_(ids))
                    .group_by(TURNS.c.conversation_id)
                ).all()
            )
        return [_conversation(row, int(counts.get(row["id"], 0))) for row in rows]

    def get(self, owner: str, conversation_id: str) -> ConversationWithTurns | None:
        """``owner``'s conversation with its turns in order; None when it is not theirs
        (or does not exist: the two are not told apart)."""
        with self.transaction() as conn:
            row = self._row(conn, owner, conversation_id)
            if row is None:
                return None
            turns = conn.execute(
                sa.select(TURNS)
                .where(TURNS.c.conversation_id == conversation_id)
                .order_by(TURNS.c.position)
            ).mappings()
            history = [_turn(turn) for turn in turns]
        return ConversationWithTurns(
            **_conversation(row, len(history)).model_dump(), history=history
        )

    def update(
        self,
        owner: str,
        conversation_id: str,
        *,
        title: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Conversation | None:
        """Renamed, and/or its metadata merged with ``metadata``; None when not ``owner``'s."""
        with self.transaction(writes=True) as conn:
            row = self._row(conn, owner, conversation_id, lock=True)
            if row is None:
                return None
            changes: dict[str, Any] = {"updated_at": now_text()}
            if title is not None:
                changes["title"] = title[:TITLE_CHARS]
            if metadata is not None:
                changes["metadata"] = {**_meta(row), **metadata}
            conn.execute(
                CONVERSATIONS.update()
                .where(CONVERSATIONS.c.id == conversation_id)
                .values(**changes)
            )
            row = self._row(conn, owner, conversation_id)
            count = conn.execute(
                sa.select(sa.func.count()).where(TURNS.c.conversation_id == conversation_id)
            ).scalar_one()
        return _conversation(row, count) if row is not None else None

    def delete(self, owner: str | None, conversation_id: str) -> bool:
        """Deletes the conversation and its turns, for good; ``owner`` None: anyone's (an
        admin's delete). False when there was none to delete."""
        where = CONVERSATIONS.c.id == conversation_id
        if owner is not None:
            where = where & (CONVERSATIONS.c.owner == owner)
        with self.transaction(writes=True) as conn:
            gone = conn.execute(CONVERSATIONS.delete().where(where)).rowcount
            if gone:
                conn.execute(TURNS.delete().where(TURNS.c.conversation_id == conversation_id))
        if gone:
            self._forget()
        return bool(gone)

    # ------------------------------------------------------------------ turns
    def put_turn(
        self, owner: str, conversation_id: str, turn_id: str, turn: TurnIn
    ) -> tuple[Turn, bool] | None:
        """The turn stored under ``turn_id`` (replacing one of that id: a turn's feedback
        is sent again with it), last when new; (turn, whether it is new), None when the
        conversation is not ``owner``'s. The first question titles an untitled conversation."""
        record = turn.model_dump(mode="json")
        stamp = now_text()
        with self.transaction(writes=True) as conn:
            # Locked: a delete or another turn of this conversation waits for this one.
            row = self._row(conn, owner, conversation_id, lock=True)
            if row is None:
                return None
            key = (TURNS.c.conversation_id == conversation_id) & (TURNS.c.id == turn_id)
            held = conn.execute(sa.select(TURNS).where(key)).mappings().first()
            if held is not None:
                conn.execute(TURNS.update().where(key).values(record=record))
                position, created = int(held["position"]), str(held["created_at"])
            else:
                count, last = conn.execute(
                    sa.select(sa.func.count(), sa.func.max(TURNS.c.position)).where(
                        TURNS.c.conversation_id == conversation_id
                    )
                ).one()
                if count >= MAX_TURNS:
                    raise ConversationFull(
                        f"a conversation keeps at most {MAX_TURNS} turns: start a new one"
                    )
                position, created = (last + 1 if last is not None else 0), stamp
                conn.execute(
                    TURNS.insert().values(
                        conversation_id=conversation_id,
                        id=turn_id,
                        position=position,
                        created_at=created,
                        record=record,
                    )
                )
            changes: dict[str, Any] = {"updated_at": stamp}
            if not row["title"]:
                changes["title"] = title_of(turn.question)
            conn.execute(
                CONVERSATIONS.update()
                .where(CONVERSATIONS.c.id == conversation_id)
                .values(**changes)
            )
        return Turn(**record, id=turn_id, position=position, created_at=created), held is None

    # ------------------------------------------------------------------ retention
    def purge(self, now: datetime | None = None) -> int:
        """Deletes every conversation last changed (a turn, a rename) more than ``keep_days``
        ago; how many."""
        if self.keep_days is None:
            return 0
        cutoff = now_text((now or datetime.now(UTC)) - timedelta(days=self.keep_days))
        with self.transaction(writes=True) as conn:
            old = [
                row[0]
                for row in conn.execute(
                    sa.select(CONVERSATIONS.c.id).where(CONVERSATIONS.c.updated_at < cutoff)
                )
            ]
            for chunk in range(0, len(old), 500):
                ids = old[chunk : chunk + 500]
                conn.execute(TURNS.delete().where(TURNS.c.conversation_id.in_(ids)))
                conn.execute(CONVERSATIONS.delete().where(CONVERSATIONS.c.id.in_(ids)))
        if old:
            log.info("deleted %d conversation(s) older than %d days", len(old), self.keep_days)
            self._forget()
        return len(old)

    def _purge_now_and_then(self) -> None:
        if self.keep_days is None:
            return
        with self._purge_lock:
            if time.monotonic() - self._purged_at < PURGE_INTERVAL:
                return
            self._purged_at = time.monotonic()
        self.purge()

    def _forget(self) -> None:
        """After a delete: SQLite's write-ahead log folded back into the file (whose freed
        pages ``secure_delete`` zeroed), so the deleted text is in neither. Best effort: a
        reader in the middle of a read keeps the log until the next checkpoint."""
        if self.engine.dialect.name != "sqlite":
            return
        try:
            with self.engine.connect() as conn:
                # Outside any transaction: a checkpoint cannot run inside one.
                conn.execution_options(isolation_level="AUTOCOMMIT")
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        except sa.exc.SQLAlchemyError as exc:
            log.warning(
                "conversations at %s: checkpoint after a delete failed: %s", self.where, exc
            )

    @staticmethod
    def _row(conn: Connection, owner: str, conversation_id: str, *, lock: bool = False) -> Any:
        """``owner``'s conversation's row; ``lock``: held until the transaction ends
        (PostgreSQL; SQLite's write transaction holds the whole file already)."""
        query = sa.select(CONVERSATIONS).where(
            (CONVERSATIONS.c.id == conversation_id) & (CONVERSATIONS.c.owner == owner)
        )
        return conn.execute(query.with_for_update() if lock else query).mappings().first()


def _meta(row: Any) -> dict[str, Any]:
    return dict(row["metadata"] or {})


def _conversation(row: Any, turns: int) -> Conversation:
    return Conversation(
        id=row["id"],
        title=row["title"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        metadata=_meta(row),
        turns=turns,
    )


def _turn(row: Any) -> Turn:
    return Turn(
        **row["record"],
        id=row["id"],
        position=int(row["position"]),
        created_at=row["created_at"],
    )


def conversations_path(settings: Settings, index: Path | None) -> Path:
    """Where an index folder's conversations are kept: RAGCHAINS_CONVERSATIONS_DB when set,
    else ``conversations.sqlite`` at the index folder's root, beside (never inside) its
    generations, which a re-ingest replaces."""
    return (
        settings.conversations_db or (index if index is not None else Path()) / CONVERSATIONS_FILE
    )


def open_conversations(
    settings: Settings, *, index: Path | None, store_url: str | None
) -> ConversationStore:
    """The conversations of a server answering from ``index`` or the store at
    ``store_url``: a SQLite file beside the index (or RAGCHAINS_CONVERSATIONS_DB), the
    store's own database otherwise."""
    keep = settings.conversation_days
    if store_url is not None and settings.conversations_db is None:
        from ragchains.retrievers.pgstore import split_schema
        from ragchains.retrievers.storeurl import redact

        conninfo, schema = split_schema(store_url)
        return ConversationStore.postgres(
            conninfo, schema, keep_days=keep, where=f"{redact(store_url)} (schema {schema})"
        )
    return ConversationStore.sqlite(conversations_path(settings, index), keep_days=keep)
