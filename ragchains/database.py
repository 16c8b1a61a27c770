"""The database people's records live in (their conversations, their sign-in sessions):
a SQLite file beside the index, or a PostgreSQL store's own schema, through SQLAlchemy Core
so that one implementation serves both.

A write is one transaction that holds the write lock from its first statement (SQLite's
``BEGIN IMMEDIATE``; on PostgreSQL, ``SELECT … FOR UPDATE`` on the row it changes): what it
read before writing (does this conversation exist, is it theirs, which turn is last) is
still true when it writes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

log = logging.getLogger(__name__)

BUSY_TIMEOUT = 10.0  # seconds a SQLite write waits for another writer
WRITES = "ragchains_writes"  # a connection's execution option: its transaction writes


class DatabaseError(RuntimeError):
    """The database cannot be opened, read or written (the message says which and why)."""


class JsonText(sa.types.TypeDecorator[Any]):
    """JSON kept as its text, ASCII-escaped: any value JSON holds is stored as sent in both
    databases (PostgreSQL's jsonb refuses the NUL character; escaped, it is six letters),
    and the file reads as JSON."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> str | None:
        return None if value is None else json.dumps(value, ensure_ascii=True)

    def process_result_value(self, value: Any, dialect: Any) -> Any:
        return None if value is None else json.loads(value)


def sqlite_engine(path: Path) -> Engine:
    """An engine on the SQLite file ``path`` (made when missing, its folder too)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(
        f"sqlite:///{path}",
        # The driver's own transaction handling off (SQLAlchemy's recipe for pysqlite), so
        # that the BEGIN below is the one that runs.
        connect_args={"timeout": BUSY_TIMEOUT, "check_same_thread": False, "isolation_level": None},
    )
    sa.event.listen(engine, "connect", _sqlite_settings)
    sa.event.listen(engine, "begin", _sqlite_begin)
    return engine


def postgres_engine(conninfo: str, schema: str) -> Engine:
    """An engine on ``schema`` of the PostgreSQL database ``conninfo`` names (a store's:
    its schema exists); the tables, which name no schema, are mapped into it."""
    import psycopg

    return sa.create_engine(
        "postgresql+psycopg://",
        creator=lambda: psycopg.connect(conninfo),
        pool_pre_ping=True,
        pool_size=4,
        max_overflow=4,
    ).execution_options(schema_translate_map={None: schema})


def _sqlite_settings(dbapi_connection: Any, _record: Any) -> None:
    # WAL: readers never wait for the writer; FULL: an acknowledged turn is on disk;
    # secure_delete: a deleted conversation's pages are zeroed, not left in the file.
    cursor = dbapi_connection.cursor()
    for pragma in ("journal_mode=WAL", "synchronous=FULL", "secure_delete=ON"):
        cursor.execute(f"PRAGMA {pragma}")
    cursor.close()


def _sqlite_begin(conn: Connection) -> None:
    # A write takes the write lock at once; a read shares the file as WAL lets it.
    conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(WRITES) else "BEGIN")


def read_only(exc: BaseException) -> bool:
    """Whether ``exc`` is a write refused by a read-only database (a PostgreSQL replica's
    SQLSTATE 25006)."""
    cause = getattr(exc.__cause__, "orig", None)
    return getattr(cause, "sqlstate", None) == "25006"


class Database:
    """A store of records in ``engine``'s database: its failures as DatabaseError naming
    ``where`` (the file, or the store's redacted URL), and its transactions."""

    def __init__(self, engine: Engine, *, where: str, what: str) -> None:
        self.engine = engine
        self.where = where
        self.what = what  # "conversations", "sign-in sessions": for messages

    def failure(self, exc: BaseException) -> DatabaseError:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        return DatabaseError(
            f"{self.what} at {self.where}: {reason[0] if reason else type(exc).__name__}"
        )

    @contextmanager
    def transaction(self, *, writes: bool = False) -> Iterator[Connection]:
        """One transaction, committed at the end (rolled back on an error); ``writes``: it
        holds the write lock from its start (see the module docstring)."""
        try:
            with self.engine.connect() as conn:
                conn.execution_options(**{WRITES: writes})
                with conn.begin():
                    yield conn
        except sa.exc.SQLAlchemyError as exc:
            raise self.failure(exc) from exc

    def create_tables(self, metadata: sa.MetaData) -> None:
        """``metadata``'s tables, those missing; two servers starting at once may both try,
        and one finds them made: then it looks again. On a read-only replica nothing can be
        made: what the primary made is read, and each write is refused (the log says so)."""
        for attempt in (1, 2):
            try:
                with self.transaction(writes=True) as conn:
                    metadata.create_all(conn)
                return
            except DatabaseError as exc:
                if read_only(exc):
                    log.warning(
                        "%s at %s: a read-only replica: they are read but not kept (set "
                        "RAGCHAINS_CONVERSATIONS_DB to keep them in a file of this server's)",
                        self.what,
                        self.where,
                    )
                    return
                if attempt == 2:
                    raise

    def close(self) -> None:
        self.engine.dispose()
