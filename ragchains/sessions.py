"""Sign-in sessions kept on the server, in the conversations' database (the same SQLite file
or the same store schema, a table of their own). The browser's cookie holds only a random
token; the person's claims, which may be too many for a cookie (a provider's groups), and
their ID token stay here, stored under the token's SHA-256 (a copy of the database opens no
session). Signing out deletes the session: a copy of the cookie taken before is worth nothing.

Nothing here imports FastAPI: ``serving.signin`` reads and writes sessions through it.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from typing import Any

import sqlalchemy as sa
from cachetools import TTLCache
from sqlalchemy.engine import Engine

from ragchains.database import Database, JsonText

METADATA = sa.MetaData()
SESSIONS = sa.Table(
    "sign_in_sessions",
    METADATA,
    sa.Column("token_sha256", sa.String(64), primary_key=True),
    sa.Column("person", JsonText(), nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Index("sign_in_sessions_by_expiry", "expires_at"),
)
# Seconds a server trusts what it read of a session: a sign-out on another server sharing
# the store ends it here within this long (on this one, at once).
HELD_FOR = 10.0


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class SessionStore(Database):
    """The sessions in ``engine``'s database (see the module docstring). Thread-safe."""

    def __init__(self, engine: Engine, *, where: str) -> None:
        super().__init__(engine, where=where, what="sign-in sessions")
        self._held: TTLCache[str, dict[str, Any] | None] = TTLCache(maxsize=10_000, ttl=HELD_FOR)
        self.create_tables(METADATA)

    def open(self, person: dict[str, Any], expires_at: float) -> str:
        """A new session for ``person`` until ``expires_at`` (a time.time()); its token."""
        token = secrets.token_urlsafe(32)
        now = time.time()
        with self.transaction(writes=True) as conn:
            conn.execute(SESSIONS.delete().where(SESSIONS.c.expires_at < now))
            conn.execute(
                SESSIONS.insert().values(
                    token_sha256=_digest(token), person=person, expires_at=expires_at
                )
            )
        return token

    def find(self, token: str) -> tuple[dict[str, Any], float] | None:
        """The person of the session ``token`` names and when it expires; None when there is
        no such session (never made, signed out, or swept after its expiry)."""
        key = _digest(token)
        if key in self._held:
            held = self._held[key]
        else:
            named = sa.select(SESSIONS).where(SESSIONS.c.token_sha256 == key)
            with self.transaction() as conn:
                row = conn.execute(named).first()
            held = {"person": row.person, "expires_at": row.expires_at} if row is not None else None
            self._held[key] = held
        return (held["person"], held["expires_at"]) if held is not None else None

    def end(self, token: str) -> None:
        """Ends the session ``token`` names (a sign-out)."""
        key = _digest(token)
        with self.transaction(writes=True) as conn:
            conn.execute(SESSIONS.delete().where(SESSIONS.c.token_sha256 == key))
        self._held[key] = None
