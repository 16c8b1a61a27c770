"""The logic around sign-in (serving.signin): how claims become a principal, when a session
still holds, the session cookie's key and flags, and the settings' checks. The flow itself,
with a real provider, is in tests/test_signin_served.py and tests/test_signin_page.py."""

from __future__ import annotations

import stat
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from starlette.datastructures import Headers

from ragchains.serving.guards import presented
from ragchains.serving.keys import KeysFileError, add_key
from ragchains.serving.signin import (
    SESSION_TOKEN,
    ClaimRules,
    SignIn,
    TokenRefused,
    secure_cookie,
    session_secret,
)
from ragchains.settings import Settings


def _settings(**values: Any) -> Settings:
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


RULES = ClaimRules(_settings(oidc_role_groups={"hr-editors": "editor", "it": "admin"}))


@pytest.mark.parametrize(
    ("claim", "groups"),
    [
        (["hr", "sales"], {"hr", "sales"}),
        ("hr sales", {"hr", "sales"}),  # space-separated, as some providers write it
        ("hr", {"hr"}),
        ([" hr ", "", 7], {"hr", "7"}),
        (None, set()),
        ({"hr": True}, set()),
    ],
)
def test_a_groups_claim_is_read_as_providers_write_it(claim: Any, groups: set[str]) -> None:
    assert RULES.principal({"sub": "s", "groups": claim}).groups == frozenset(groups)


def test_the_highest_role_the_claim_or_the_groups_give_wins() -> None:
    def role(**claims: Any) -> str:
        return RULES.principal({"sub": "s", **claims}).role

    assert role() == "reader"
    assert role(ragchains_role="editor") == "editor"
    assert role(ragchains_role=["reader", "admin"]) == "admin"
    assert role(ragchains_role="owner") == "reader"  # not a role: ignored
    assert role(groups=["hr-editors"]) == "editor"
    assert role(groups=["hr-editors", "it"]) == "admin"
    assert role(ragchains_role="editor", groups=["it"]) == "admin"


def test_a_person_is_named_by_sub_and_shown_by_their_name() -> None:
    who = RULES.principal({"sub": "248289761001", "name": "Jane Doe", "email": "j@example.com"})
    assert (who.name, who.display, who.via) == ("oidc:248289761001", "Jane Doe", "oidc")
    assert RULES.principal({"sub": "x", "email": "x@example.com"}).display == "x@example.com"
    assert RULES.principal({"sub": "x"}).display == "x"
    with pytest.raises(TokenRefused, match="no subject"):
        RULES.principal({"name": "nobody"})


def test_an_empty_key_header_presents_nothing_and_the_bearer_token_is_read() -> None:
    # A client that sends an unset variable as its key and a token beside it is the token's.
    token = {"authorization": "Bearer a.b.c"}
    assert presented(Headers({"x-api-key": "", **token})) == (b"a.b.c", True)
    assert presented(Headers({"x-api-key": " k1 ", **token})) == (b"k1", False)
    assert presented(Headers({"x-api-key": ""})) == (b"", False)


def test_a_key_cannot_take_a_signed_in_persons_name(tmp_path: Path) -> None:
    with pytest.raises(KeysFileError, match="signed-in person"):
        add_key(tmp_path / "keys.toml", "oidc:jane", ["hr"])


def test_a_session_is_kept_on_the_server_until_it_expires_or_ends(tmp_path: Path) -> None:
    import asyncio

    from ragchains.database import sqlite_engine
    from ragchains.sessions import SessionStore

    engine = sqlite_engine(tmp_path / "conversations.sqlite")
    sessions = SessionStore(engine, where="test")
    signin = SignIn(
        _settings(oidc_issuer="http://idp.example", oidc_client_id="ragchains"), sessions
    )
    groups = [f"group-{n:04d}-{'x' * 30}" for n in range(300)]  # far more than a cookie holds
    live = sessions.open({"claims": {"sub": "a", "groups": groups}}, time.time() + 60)
    gone = sessions.open({"claims": {"sub": "b"}}, time.time() - 1)

    def run(call: Any) -> Any:
        return asyncio.run(call)

    held = run(signin.session_principal({SESSION_TOKEN: live}))
    assert held is not None and held.name == "oidc:a" and len(held.groups or ()) == 300
    assert run(signin.session_principal({SESSION_TOKEN: gone})) is None
    assert run(signin.session_expired({SESSION_TOKEN: gone}))
    for nobody in ({}, {SESSION_TOKEN: "made-up"}, {SESSION_TOKEN: 7}):
        assert run(signin.session_principal(nobody)) is None
        assert not run(signin.session_expired(nobody))
    # Signed out: the same cookie opens nothing, here at once.
    sessions.end(live)
    assert run(signin.session_principal({SESSION_TOKEN: live})) is None
    # The database holds the token's digest, not the token.
    with engine.connect() as conn:
        stored = [r[0] for r in conn.exec_driver_sql("SELECT token_sha256 FROM sign_in_sessions")]
    assert live not in stored and gone not in stored
    engine.dispose()


def test_the_cookie_is_secure_when_people_reach_the_server_over_https() -> None:
    assert secure_cookie(_settings(public_url="https://rag.example.com"))
    assert not secure_cookie(_settings(public_url="http://localhost:8000"))
    assert not secure_cookie(_settings())


def test_the_session_key_is_made_once_and_kept_for_its_owner_only(tmp_path: Path) -> None:
    first = session_secret(_settings(), tmp_path / "idx")
    assert len(first) >= 48 and session_secret(_settings(), tmp_path / "idx") == first
    mode = stat.S_IMODE((tmp_path / "idx" / "session.key").stat().st_mode)
    assert mode == 0o600
    chosen = "c" * 32
    assert session_secret(_settings(session_secret=chosen), tmp_path / "idx") == chosen
    with pytest.raises(ValueError, match="32 or more"):
        session_secret(_settings(session_secret=""), tmp_path / "idx")  # anyone could sign
    # A file a crash left short is not trusted: a new key replaces it.
    (tmp_path / "idx" / "session.key").write_text("")
    again = session_secret(_settings(), tmp_path / "idx")
    assert len(again) >= 48 and again != first
    (tmp_path / "idx" / "session.key").chmod(0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        session_secret(_settings(), tmp_path / "idx")


def test_the_settings_say_what_sign_in_needs() -> None:
    with pytest.raises(ValidationError, match="oidc_client_id"):
        _settings(oidc_issuer="https://idp.example")
    with pytest.raises(ValidationError, match="not reader, editor or admin"):
        _settings(
            oidc_issuer="https://idp.example", oidc_client_id="c", oidc_role_groups={"x": "boss"}
        )
    with pytest.raises(ValidationError):
        _settings(oidc_issuer="idp.example", oidc_client_id="c")  # not a URL


@pytest.mark.parametrize(
    ("origin", "public", "refused"),
    [
        (None, None, False),  # not from a page (curl, an SDK): nothing to forge
        ("http://rag.local:8000", None, False),
        ("https://rag.local:8000", None, False),  # behind a proxy that ends TLS
        ("http://rag.local:9999", None, True),  # another port: the same site, not the page
        ("http://evil.example", None, True),
        ("null", None, True),  # a sandboxed frame or a file
        ("https://rag.example.com", "https://rag.example.com", False),
    ],
)
def test_a_change_asked_from_another_origin_is_refused(
    origin: str | None, public: str | None, refused: bool
) -> None:
    from fastapi import HTTPException
    from starlette.datastructures import Headers

    from ragchains.serving.guards import refuse_other_sites

    sent = {"host": "rag.local:8000", **({"origin": origin} if origin else {})}
    scope = {"method": "POST", "scheme": "http"}
    if refused:
        with pytest.raises(HTTPException) as no:
            refuse_other_sites(scope, Headers(sent), public)
        assert no.value.status_code == 403
    else:
        refuse_other_sites(scope, Headers(sent), public)
    refuse_other_sites({"method": "GET"}, Headers(sent), public)  # reads are never refused


@pytest.mark.parametrize(
    ("fetch_site", "refused"),
    [("same-origin", False), ("none", False), ("same-site", True), ("cross-site", True)],
)
def test_what_the_browser_says_of_the_origin_is_heeded_without_an_origin(
    fetch_site: str, refused: bool
) -> None:
    from fastapi import HTTPException
    from starlette.datastructures import Headers

    from ragchains.serving.guards import refuse_other_sites

    sent = Headers({"host": "rag.local:8000", "sec-fetch-site": fetch_site})
    if refused:
        with pytest.raises(HTTPException):
            refuse_other_sites({"method": "DELETE"}, sent)
    else:
        refuse_other_sites({"method": "DELETE"}, sent)
