"""Sign-in with a real OpenID Connect provider under `ragchains serve`, over HTTP (the page's
sign-in in a browser is tests/test_signin_page.py): the code flow with PKCE gives a session
cookie whose person reads only their groups' documents; the provider's access tokens work as
bearer tokens on the API, /v1 and /mcp; an expired, tampered, foreign or misaddressed token is
refused (401) with the reason; a session ends at its ID token's expiry and at sign-out; a change
asked by a page of another origin is refused; keys still work beside it."""

from __future__ import annotations

import base64
import json
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from joserfc import jwt
from joserfc.jwk import RSAKey

from ragchains.serving.keys import add_key
from tests.conftest import FIXTURES
from tests.oidc import OidcProvider, oidc_provider
from tests.servers import ragchains_serve, wait_until
from tests.test_cli import run
from tests.test_mcp import over_http

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HR_FACT = "Parental leave lasts sixteen weeks at full pay"


@dataclass(frozen=True)
class Served:
    base: str
    provider: OidcProvider
    key: str  # a reader's key of the garden group, beside sign-in


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("signin")
    shutil.copytree(FIXTURES / "docs", folder / "corpus" / "docs")
    (folder / "corpus" / "hr").mkdir()
    (folder / "corpus" / "hr" / "leave.md").write_text(f"# Leave\n\n{HR_FACT}.\n")
    done = run(
        "ingest",
        folder / "corpus" / "docs",
        folder / "corpus" / "hr",
        "--index",
        folder / "index",
        "--access",
        "hr/*=hr",
    )
    assert done.returncode == 0, done.stderr
    keys = folder / "keys.toml"
    key = add_key(keys, "gardener", ["garden"])
    with (
        oidc_provider() as provider,
        ragchains_serve(
            "--index",
            str(folder / "index"),
            RAGCHAINS_OIDC_ISSUER=provider.issuer,
            RAGCHAINS_OIDC_CLIENT_ID="ragchains",
            RAGCHAINS_OIDC_ROLE_GROUPS='{"hr-editors": "editor"}',
            RAGCHAINS_KEYS_FILE=str(keys),
        ) as base,
    ):
        yield Served(base, provider, key)


def _sources(base: str, auth: dict[str, str], query: str) -> set[str]:
    reply = httpx.post(
        f"{base}/retrieve/invoke", json={"input": {"query": query}}, headers=auth, timeout=120
    )
    assert reply.status_code == 200, reply.text
    return {d["metadata"]["source"] for d in reply.json()["output"]}


def _found(client: httpx.Client, query: str) -> set[str]:
    reply = client.post("/retrieve/invoke", json={"input": {"query": query}})
    assert reply.status_code == 200, reply.text
    return {d["metadata"]["source"] for d in reply.json()["output"]}


@contextmanager
def _signed_in(served: Served, sub: str, **claims: Any) -> Iterator[httpx.Client]:
    """A browser-like client that went through the provider's sign-in as ``sub``."""
    served.provider.sign_in_as(sub, **claims)
    with httpx.Client(base_url=served.base, follow_redirects=True, timeout=60) as client:
        landed = client.get("/auth/login")
        assert landed.status_code == 200, landed.text
        assert str(landed.url).rstrip("/") == served.base, landed.url
        yield client


def test_a_signed_in_person_reads_their_groups_and_leaves_at_sign_out(served: Served) -> None:
    with _signed_in(served, "hana", name="Hana Ito", groups=["hr", "hr-editors"]) as hana:
        me = hana.get("/me").json()
        assert me["name"] == "oidc:hana" and me["display"] == "Hana Ito" and me["via"] == "oidc"
        assert me["groups"] == ["hr", "hr-editors"] and me["role"] == "editor"  # by her group
        cookie = next(c for c in hana.cookies.jar if c.name == "ragchains_session")
        assert cookie.has_nonstandard_attr("httponly") and not cookie.secure  # plain http here
        assert cookie.get_nonstandard_attr("samesite") == "lax"
        assert "hr/leave.md" in _found(hana, "parental leave weeks full pay")
        # A change on the session's strength asked by another origin's page: refused.
        forged = hana.post("/conversations", json={}, headers={"Origin": "http://evil.example"})
        assert forged.status_code == 403
        own = hana.post("/conversations", json={}, headers={"Origin": served.base})
        assert own.status_code == 201
        out = hana.post("/auth/logout", headers={"Origin": served.base})
        assert out.status_code == 200 and out.json()["signed_out"] is True
        ends = out.json()["end_session_url"]
        assert ends.startswith(f"{served.provider.issuer}/endsession?") and "id_token_hint=" in ends
        assert hana.get("/me").json()["name"] is None  # nobody, now
        assert hana.get("/conversations").status_code == 401
    with _signed_in(served, "gus", groups=["garden"]) as gus:
        assert "hr/leave.md" not in _found(gus, "parental leave weeks full pay")
        assert any(s.endswith("guide.md") for s in _found(gus, "What is the tool shed code?"))
        assert gus.get(f"/conversations/{own.json()['id']}").status_code == 404
        assert gus.get("/me").json()["role"] == "reader"


def test_bearer_tokens_of_the_provider_work_on_every_route_and_bad_ones_say_why(
    served: Served,
) -> None:
    provider = served.provider
    good = provider.token("ines", groups=["hr"])
    auth = {"Authorization": f"Bearer {good}"}
    assert "hr/leave.md" in _sources(served.base, auth, "parental leave weeks full pay")
    assert httpx.get(f"{served.base}/v1/models", headers=auth).status_code == 200
    tools = over_http(served.base, good, lambda client: client.list_tools())
    assert {t.name for t in tools.tools} >= {"search", "ask"}

    header, payload, signature = good.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    forged_payload = base64.urlsafe_b64encode(
        json.dumps({**claims, "groups": ["hr", "it"]}).encode()
    ).rstrip(b"=")
    stranger = RSAKey.import_key(
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
    )  # a key the provider never published
    foreign_key = jwt.encode({"alg": "RS256", "kid": "stranger"}, {**claims}, stranger)
    cases = {
        "the token has expired": provider.token("ines", groups=["hr"], expires_in=-300),
        "the token is for another audience": provider.token("ines", aud="another-app"),
        "the token's signature does not verify": f"{header}.{forged_payload.decode()}.{signature}",
        "the token's issuer is not the identity provider this server uses": provider.token(
            "ines", claims={"iss": "http://127.0.0.1:1/other"}
        ),
        "the token is signed with a key the provider does not publish": foreign_key,
    }
    for reason, token in cases.items():
        for method, path in (
            ("POST", "/retrieve/invoke"),
            ("GET", "/v1/models"),
            ("GET", "/me"),  # open, but a bad token is refused wherever it is sent
        ):
            reply = httpx.request(
                method,
                f"{served.base}{path}",
                json={"input": {"query": "leave"}} if method == "POST" else None,
                headers={"Authorization": f"Bearer {token}"},
            )
            assert reply.status_code == 401, (reason, path, reply.text)
            assert reason in reply.text, (path, reply.text)
            assert "invalid_token" in reply.headers["www-authenticate"]
        with pytest.raises(Exception) as refused:  # the SDK's error on a 401
            over_http(served.base, token, lambda client: client.list_tools())
        assert "401" in repr(refused.value) or "Unauthorized" in repr(refused.value)

    # A key still works beside sign-in, as its owner; an unknown one is refused saying so,
    # even beside a good token (a wrong credential is never passed over).
    keyed = httpx.get(f"{served.base}/me", headers={"X-API-Key": served.key}).json()
    assert keyed["via"] == "key" and keyed["name"] == "gardener"
    wrong = httpx.get(f"{served.base}/v1/models", headers={**auth, "X-API-Key": "no-such-key"})
    assert wrong.status_code == 401 and "the key sent is not known" in wrong.text, wrong.text
    # An empty key header is no key: the token beside it is read.
    empty = httpx.get(f"{served.base}/v1/models", headers={**auth, "X-API-Key": ""})
    assert empty.status_code == 200, empty.text


def test_a_sign_in_that_fails_goes_back_to_the_page_with_the_reason(served: Served) -> None:
    stale = httpx.get(f"{served.base}/auth/callback", params={"code": "c", "state": "s"})
    assert stale.status_code == 303
    assert stale.headers["location"].startswith(f"{served.base}/?sign_in_error=")
    assert "not+started+here" in stale.headers["location"]
    refused = httpx.get(
        f"{served.base}/auth/callback",
        params={"error": "access_denied", "error_description": "The user said no"},
    )
    # Its code, not its words: a link anyone can build must not put words on the page.
    location = refused.headers["location"]
    assert "refused+the+sign-in+%28access_denied%29" in location and "said" not in location


def test_a_session_ends_when_its_id_token_expires(served: Served) -> None:
    served.provider.set_token_ttl(4)
    try:
        with _signed_in(served, "kai", groups=["garden"]) as kai:
            assert kai.get("/me").status_code == 200

            def expired() -> httpx.Response | None:
                reply = kai.get("/conversations")
                return reply if reply.status_code == 401 else None

            reply = wait_until(expired, "the session to end with its ID token", timeout=30)
            assert "your sign-in has expired" in reply.json()["detail"]
            me = kai.get("/me").json()  # nobody, and why
            assert me["name"] is None and "your sign-in has expired" in me["signed_out"]
    finally:
        served.provider.set_token_ttl(3600)


def test_sign_in_says_when_the_provider_cannot_be_reached(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "docs", tmp_path / "docs")
    assert run("ingest", tmp_path / "docs", "--index", tmp_path / "index").returncode == 0
    with ragchains_serve(
        "--index",
        str(tmp_path / "index"),
        RAGCHAINS_OIDC_ISSUER="http://127.0.0.1:9",
        RAGCHAINS_OIDC_CLIENT_ID="ragchains",
    ) as base:
        started = time.monotonic()
        reply = httpx.get(f"{base}/auth/login", timeout=60)
        assert reply.status_code == 503, reply.text
        assert "identity provider cannot be reached" in reply.json()["detail"]
        assert reply.headers["retry-after"] == "5"
        assert time.monotonic() - started < 30
        assert httpx.get(f"{base}/readyz").status_code == 200
