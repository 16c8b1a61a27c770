"""Readers' feedback on answers (thumbs up or down), kept in a SQLite file that outlives restarts.

Each record holds what is needed to judge an answer later without the server's logs: the
question, the answer, the prompt versions that wrote it and the chunks it cited. By default the
file is ``feedback.sqlite`` at the root of the index folder, beside its ``gen-*`` generations:
ingest replaces generations, never the folder, so feedback survives a re-ingest.

The file opens in WAL mode with ``synchronous=FULL``: a vote that was acknowledged is on disk.
Every call opens its own connection, so one store can be shared by the server's worker threads.
Nothing here imports FastAPI or LangServe; the server uses ``FeedbackIn`` as its request model.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StringConstraints

from ragchains.settings import Settings
from ragchains.textrules import text_type

FEEDBACK_FILE = "feedback.sqlite"
SCHEMA_VERSION = 1
# Seconds a write waits for another writer (thread or process) before giving up.
BUSY_TIMEOUT = 10.0

_PromptName = Annotated[str, StringConstraints(min_length=1, max_length=50)]
_PromptRef = Annotated[str, StringConstraints(min_length=1, max_length=200)]
_ChunkId = Annotated[str, StringConstraints(min_length=1, max_length=200)]

# The fields of a record, in export order (the table's columns).
RECORD_FIELDS = (
    "id",
    "created_at",
    "run_id",
    "score",
    "comment",
    "mode",
    "domain",
    "prompts",
    "question",
    "answer",
    "cited_ids",
)
_SCHEMA = (
    """
    CREATE TABLE feedback (
        id INTEGER PRIMARY KEY,
        created_at TEXT NOT NULL,
        run_id TEXT NOT NULL,
        score INTEGER NOT NULL CHECK (score IN (0, 1)),
        comment TEXT NOT NULL,
        mode TEXT NOT NULL,
        domain TEXT NOT NULL,
        prompts TEXT NOT NULL,
        question TEXT NOT NULL,
        answer TEXT NOT NULL,
        cited_ids TEXT NOT NULL
    )
    """,
    "CREATE INDEX feedback_run_id ON feedback (run_id)",
    f"PRAGMA user_version = {SCHEMA_VERSION}",
)


Question = text_type("question", 20_000)


class FeedbackIn(BaseModel):
    """One reader's verdict on one answer: the body of ``POST /feedback``.

    Bounded everywhere, so a bad or oversized payload is a 422 before anything is stored.
    ``score`` is strict: only the JSON integers 0 and 1, never ``true``, ``1.0`` or ``"1"``.
    """

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "run_id": "0b6f3c3e-9a51-4e3f-8c7e-2f1f5d1c9a10",
                    "score": 1,
                    "comment": "Right figure, and it cites the table.",
                    "mode": "chat",
                    "domain": "hr",
                    "prompts": {"answer": "hr/answer@v2", "rewrite": "hr/rewrite@v1"},
                    "question": "What does the standard plan cost?",
                    "answer": "The standard plan costs $45.00 a month [1].",
                    "cited_ids": ["employee-handbook.md#benefit-plans:0"],
                }
            ]
        },
    )

    run_id: UUID = Field(description="LangServe run id of the answer (the stream's run_id)")
    score: Annotated[StrictInt, Field(ge=0, le=1, json_schema_extra={"enum": [0, 1]})] = Field(
        description="1 = thumbs up, 0 = thumbs down"
    )
    comment: str = Field("", max_length=2000, description="what the reader said, if anything")
    mode: Literal["chat", "ask"] = Field("chat", description="which chain wrote the answer")
    domain: str = Field(
        "default", min_length=1, max_length=100, description="prompt domain of the answer"
    )
    prompts: dict[_PromptName, _PromptRef] = Field(
        default_factory=dict,
        max_length=20,
        description='prompts that ran, name -> ref, e.g. {"answer": "default/answer@v2"}',
    )
    question: Question = Field(description="the question as the reader asked it")  # type: ignore[valid-type]
    answer: str = Field("", max_length=50_000, description="the answer the reader judged")
    cited_ids: list[_ChunkId] = Field(
        default_factory=list, max_length=100, description="chunk ids the answer cited, in order"
    )


class FeedbackRecord(BaseModel):
    """What storing a ``FeedbackIn`` returns: its row id and when it was stored."""

    id: int = Field(description="row id in the feedback store, increasing")
    created_at: str = Field(description="when it was stored, UTC ISO-8601 to the second")


class FeedbackStoreError(ValueError):
    """The feedback file cannot be used; the one-line message names the file."""


class FeedbackStoreNotFoundError(FeedbackStoreError):
    """A store opened with ``create=False`` has no file yet."""


class FeedbackStore:
    """The feedback SQLite file at ``path``, created (folder, schema) on first use.

    Nothing touches the disk until the first call, so a server over a read-only index still
    starts. ``create=False`` (for export) never creates or changes the file: a missing file
    raises ``FeedbackStoreNotFoundError``.
    """

    def __init__(self, path: str | Path, *, create: bool = True) -> None:
        self.path = Path(path)
        self.create = create
        # Only schema creation needs it: two threads' first calls must not both create.
        self._schema_lock = threading.Lock()

    def add(self, feedback: FeedbackIn) -> FeedbackRecord:
        """Store one feedback; it is durable when this returns."""
        created_at = datetime.now(UTC).isoformat(timespec="seconds")
        row = (
            created_at,
            str(feedback.run_id),
            feedback.score,
            feedback.comment,
            feedback.mode,
            feedback.domain,
            json.dumps(feedback.prompts, ensure_ascii=False, sort_keys=True),
            feedback.question,
            feedback.answer,
            json.dumps(feedback.cited_ids, ensure_ascii=False),
        )
        marks = ", ".join("?" * len(row))
        with self._connection() as con:
            cursor = con.execute(
                f"INSERT INTO feedback ({', '.join(RECORD_FIELDS[1:])}) VALUES ({marks})", row
            )
            row_id = cursor.lastrowid
        assert row_id is not None  # an INSERT always sets it
        return FeedbackRecord(id=row_id, created_at=created_at)

    def records(self) -> list[dict[str, Any]]:
        """Every stored feedback, oldest first, with prompts and cited_ids decoded."""
        with self._connection() as con:
            columns = ", ".join(RECORD_FIELDS)
            rows = con.execute(f"SELECT {columns} FROM feedback ORDER BY id").fetchall()
        out = []
        for values in rows:
            record = dict(zip(RECORD_FIELDS, values, strict=True))
            try:
                record["prompts"] = json.loads(record["prompts"])
                record["cited_ids"] = json.loads(record["cited_ids"])
            except json.JSONDecodeError as exc:
                raise FeedbackStoreError(
                    f"feedback store {self.path} is damaged: record {record['id']} holds "
                    f"invalid JSON ({exc})"
                ) from exc
            out.append(record)
        return out

    # ------------------------------------------------------------------------- connections
    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        """A fresh connection with the schema checked; every SQLite failure names the file."""
        con = self._open()
        try:
            con.execute("PRAGMA synchronous=FULL")  # per connection, not stored in the file
            self._check_schema(con)
            yield con
        except sqlite3.Error as exc:
            raise FeedbackStoreError(f"feedback store {self.path} is unusable: {exc}") from exc
        finally:
            con.close()

    def _open(self) -> sqlite3.Connection:
        if not self.create and not self.path.exists():
            raise FeedbackStoreNotFoundError(
                f"no feedback store at {self.path}: no feedback has been recorded there"
            )
        if self.path.exists() and not self.path.is_file():
            raise FeedbackStoreError(f"feedback store {self.path} is not a file")
        try:
            if self.create:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                target = self.path.absolute().as_uri() + "?mode=rwc"
            else:
                target = self.path.absolute().as_uri() + "?mode=rw"
            # Autocommit: each statement is its own transaction unless one is begun explicitly.
            return sqlite3.connect(target, uri=True, timeout=BUSY_TIMEOUT, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise FeedbackStoreError(f"cannot open feedback store {self.path}: {reason}") from exc

    def _check_schema(self, con: sqlite3.Connection) -> None:
        """Create the schema in a new file; refuse other SQLite files and newer schemas."""
        version = self._version(con)  # the first read: a file that is not SQLite fails here
        if version == 0:
            if not self.create:
                raise FeedbackStoreError(f"{self.path} is not a ragchains feedback store")
            with self._schema_lock:
                self._create_schema(con)
            version = self._version(con)
        if version > SCHEMA_VERSION:
            raise FeedbackStoreError(
                f"feedback store {self.path} has schema version {version}, written by a newer "
                f"ragchains; this one reads version {SCHEMA_VERSION}"
            )

    def _create_schema(self, con: sqlite3.Connection) -> None:
        con.execute("PRAGMA journal_mode=WAL")  # stored in the file: set once, at creation
        con.execute("BEGIN IMMEDIATE")  # another process may be creating it too
        try:
            if self._version(con) == 0:
                tables = [
                    name
                    for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'")
                ]
                if tables:
                    raise FeedbackStoreError(
                        f"{self.path} is a SQLite file of something else (tables: "
                        f"{', '.join(sorted(tables))}), not a ragchains feedback store"
                    )
                for statement in _SCHEMA:
                    con.execute(statement)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    @staticmethod
    def _version(con: sqlite3.Connection) -> int:
        return int(con.execute("PRAGMA user_version").fetchone()[0])


def feedback_path(settings: Settings, index: Path | None) -> Path:
    """Where feedback on answers from ``index`` is stored: RAGCHAINS_FEEDBACK_DB when set,
    else ``feedback.sqlite`` at the index folder's root, beside (never inside) its
    generations, which a re-ingest replaces; for a PostgreSQL store (no folder), in the
    current folder."""
    return settings.feedback_db or (Path(index) if index is not None else Path()) / FEEDBACK_FILE
