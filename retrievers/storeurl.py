"""PostgreSQL store URLs: what is one, and how one is shown (never with its password).

Kept apart from ``retrievers.pgstore`` so the command line can tell a URL from a folder
without importing the database driver.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

STORE_SCHEMES = ("postgresql://", "postgres://")


def is_store_url(text: str | None) -> bool:
    return bool(text) and str(text).startswith(STORE_SCHEMES)


def redact(url: str) -> str:
    """The URL without its password (for logs, /readyz and errors)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]  # as written: IPv6 keeps its brackets
    user = f"{parts.username}:***@" if parts.username else ""
    return urlunsplit(parts._replace(netloc=user + host))


def shown(target: object) -> str:
    """An index folder or store URL as messages show it: a URL without its password."""
    text = str(target)
    return redact(text) if is_store_url(text) else text
