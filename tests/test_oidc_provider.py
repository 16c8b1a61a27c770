"""The sign-in tests' OpenID Connect provider (tests/oidc.py) behaves as a real one: its
discovery document, tokens that verify against its JWKS, the code flow with PKCE as a client
without a browser runs it (the chosen user's claims; a wrong verifier, a reused code and a
missing challenge refused), its login form, RP-initiated logout, and no process left behind."""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from joserfc import jwt
from joserfc.errors import BadSignatureError, ExpiredTokenError, InvalidClaimError
from joserfc.jwk import KeySet

from tests.oidc import REPO, ROLE_CLAIM, OidcProvider, oidc_provider
from tests.servers import wait_until

CLIENT = "ragchains-web"
CALLBACK = "http://127.0.0.1:9/auth/callback"  # never called: the redirects are read, not followed


@pytest.fixture(scope="module")
def provider() -> Iterator[OidcProvider]:
    with oidc_provider() as running:
        yield running


def claims_of(provider: OidcProvider, token: str, *, aud: str) -> dict[str, Any]:
    """``token``'s claims once its signature checks against the provider's JWKS and its iss,
    aud and exp are right (joserfc, as the app checks bearer tokens)."""
    keys = KeySet.import_key_set(httpx.get(f"{provider.issuer}/jwks").json())
    decoded = jwt.decode(token, keys, algorithms=["RS256"])
    jwt.JWTClaimsRegistry(
        iss={"essential": True, "value": provider.issuer},
        aud={"essential": True, "value": aud},
        exp={"essential": True},
        iat={"essential": True},
    ).validate(decoded.claims)
    return dict(decoded.claims)


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode()).digest()
    return verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def authorize(provider: OidcProvider, challenge: str | None, **extra: str) -> httpx.Response:
    params = {
        "response_type": "code",
        "client_id": CLIENT,
        "redirect_uri": CALLBACK,
        "scope": "openid profile email",
        "state": "the-state",
        "nonce": "the-nonce",
        **extra,
    }
    if challenge is not None:
        params |= {"code_challenge": challenge, "code_challenge_method": "S256"}
    return httpx.get(f"{provider.issuer}/authorize", params=params)


def code_from(response: httpx.Response) -> str:
    assert response.status_code == 302, response.text
    location = urlsplit(response.headers["location"])
    assert f"{location.scheme}://{location.netloc}{location.path}" == CALLBACK
    query = parse_qs(location.query)
    assert query["state"] == ["the-state"]
    return query["code"][0]


def exchange(provider: OidcProvider, code: str, verifier: str | None) -> httpx.Response:
    form = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": CALLBACK,
        "client_id": CLIENT,
    }
    if verifier is not None:
        form["code_verifier"] = verifier
    return httpx.post(f"{provider.issuer}/token", data=form)


def test_the_discovery_document_names_the_issuer_and_its_endpoints(
    provider: OidcProvider,
) -> None:
    assert provider.issuer.startswith("http://127.0.0.1:")
    document = httpx.get(provider.discovery_url).json()
    assert document["issuer"] == provider.issuer
    for endpoint, path in [
        ("authorization_endpoint", "/authorize"),
        ("token_endpoint", "/token"),
        ("jwks_uri", "/jwks"),
        ("userinfo_endpoint", "/userinfo"),
        ("end_session_endpoint", "/endsession"),
    ]:
        assert document[endpoint] == provider.issuer + path
    assert document["code_challenge_methods_supported"] == ["S256"]
    assert document["id_token_signing_alg_values_supported"] == ["RS256"]
    [key] = httpx.get(document["jwks_uri"]).json()["keys"]
    assert (key["kty"], key["alg"]) == ("RSA", "RS256")
    assert "d" not in key  # the public half only


def test_a_minted_token_verifies_against_the_jwks_and_expires_when_told(
    provider: OidcProvider,
) -> None:
    token = provider.token("carol", groups=["hr", "legal"], role="admin")
    claims = claims_of(provider, token, aud="ragchains")
    assert claims["sub"] == "carol"
    assert claims["groups"] == ["hr", "legal"]
    assert claims[ROLE_CLAIM] == "admin"
    assert 3590 <= claims["exp"] - time.time() <= 3600

    expired = provider.token("carol", expires_in=-60)
    with pytest.raises(ExpiredTokenError):
        claims_of(provider, expired, aud="ragchains")
    with pytest.raises(InvalidClaimError):
        claims_of(provider, provider.token("carol", aud="another-api"), aud="ragchains")
    with pytest.raises(InvalidClaimError):
        claims_of(provider, provider.token("carol", claims={"iss": "http://evil"}), aud="ragchains")
    assert ROLE_CLAIM not in claims_of(provider, provider.token("dan", role=None), aud="ragchains")

    # A token whose payload was changed after signing fails its signature.
    header, _, signature = token.split(".")
    forged = provider.token("mallory", role="admin").split(".")[1]
    with pytest.raises(BadSignatureError):
        claims_of(provider, f"{header}.{forged}.{signature}", aud="ragchains")


def test_the_code_flow_with_pkce_signs_the_chosen_user_in(provider: OidcProvider) -> None:
    provider.sign_in_as("alice", name="Alice Liddell", groups=["hr"], role="editor")
    verifier, challenge = pkce()
    code = code_from(authorize(provider, challenge))
    tokens = exchange(provider, code, verifier)
    assert tokens.status_code == 200, tokens.text
    reply = tokens.json()
    assert reply["token_type"] == "Bearer"
    assert reply["expires_in"] == 3600

    id_token = claims_of(provider, reply["id_token"], aud=CLIENT)
    assert id_token["sub"] == "alice"
    assert id_token["name"] == "Alice Liddell"
    assert id_token["email"] == "alice@example.com"
    assert id_token["groups"] == ["hr"]
    assert id_token[ROLE_CLAIM] == "editor"
    assert id_token["nonce"] == "the-nonce"
    assert id_token["exp"] - id_token["iat"] == 3600
    access = claims_of(provider, reply["access_token"], aud=CLIENT)
    assert (access["sub"], access["groups"], access[ROLE_CLAIM]) == ("alice", ["hr"], "editor")

    bearer = {"Authorization": f"Bearer {reply['access_token']}"}
    userinfo = httpx.get(f"{provider.issuer}/userinfo", headers=bearer).json()
    assert (userinfo["sub"], userinfo["name"], userinfo[ROLE_CLAIM]) == (
        "alice",
        "Alice Liddell",
        "editor",
    )
    nobody = {"Authorization": "Bearer not-a-token"}
    assert httpx.get(f"{provider.issuer}/userinfo", headers=nobody).status_code == 401

    # The refresh token gives new tokens for the same user, once.
    refresh = {
        "grant_type": "refresh_token",
        "refresh_token": reply["refresh_token"],
        "client_id": CLIENT,
    }
    again = httpx.post(f"{provider.issuer}/token", data=refresh)
    assert again.status_code == 200, again.text
    assert claims_of(provider, again.json()["id_token"], aud=CLIENT)["sub"] == "alice"
    assert httpx.post(f"{provider.issuer}/token", data=refresh).status_code == 400

    # The code is good once.
    reused = exchange(provider, code, verifier)
    assert reused.status_code == 400
    assert "access_token" not in reused.json()


def test_pkce_is_enforced(provider: OidcProvider) -> None:
    provider.sign_in_as("alice")
    verifier, challenge = pkce()
    wrong, _ = pkce()
    refused = exchange(provider, code_from(authorize(provider, challenge)), wrong)
    assert refused.status_code == 400
    assert "id_token" not in refused.json()
    assert exchange(provider, code_from(authorize(provider, challenge)), None).status_code == 400

    # A code asked for without a challenge is never issued.
    location = urlsplit(authorize(provider, None).headers["location"])
    assert parse_qs(location.query)["error"] == ["invalid_request"]

    # Nor is a code good for another client.
    code = code_from(authorize(provider, challenge))
    other = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": CALLBACK,
        "client_id": "another-client",
        "code_verifier": verifier,
    }
    assert httpx.post(f"{provider.issuer}/token", data=other).status_code == 400


def test_the_token_lifetime_is_settable(provider: OidcProvider) -> None:
    provider.sign_in_as("alice")
    provider.set_token_ttl(2)
    try:
        verifier, challenge = pkce()
        reply = exchange(provider, code_from(authorize(provider, challenge)), verifier).json()
    finally:
        provider.set_token_ttl(3600)
    assert reply["expires_in"] == 2
    claims = claims_of(provider, reply["id_token"], aud=CLIENT)
    assert claims["exp"] - claims["iat"] == 2
    time.sleep(3)
    bearer = {"Authorization": f"Bearer {reply['access_token']}"}
    assert httpx.get(f"{provider.issuer}/userinfo", headers=bearer).status_code == 401


def test_logout_ends_the_session_and_the_form_signs_in_a_known_user(
    provider: OidcProvider,
) -> None:
    provider.sign_in_as("alice")
    provider.add_user("bob", name="Bob", groups=["legal"], role="reader")
    logout = httpx.get(
        f"{provider.issuer}/endsession",
        params={"post_logout_redirect_uri": "http://127.0.0.1:9/bye", "state": "s"},
    )
    assert logout.status_code == 302
    assert logout.headers["location"] == "http://127.0.0.1:9/bye?state=s"

    verifier, challenge = pkce()
    form = authorize(provider, challenge)
    assert form.status_code == 200
    assert 'name="username"' in form.text and "Sign in" in form.text
    assert (
        authorize(provider, challenge, prompt="none")
        .headers["location"]
        .startswith(f"{CALLBACK}?error=login_required")
    )
    assert authorize(provider, challenge, username="nobody").status_code == 401

    tokens = exchange(provider, code_from(authorize(provider, challenge, username="bob")), verifier)
    claims = claims_of(provider, tokens.json()["id_token"], aud=CLIENT)
    assert (claims["sub"], claims["groups"], claims[ROLE_CLAIM]) == ("bob", ["legal"], "reader")
    # Signing in through the form starts the provider's session: no form the next time.
    assert authorize(provider, challenge).status_code == 302
    provider.sign_out()
    assert authorize(provider, challenge).status_code == 200


def test_the_provider_goes_when_the_test_process_is_killed() -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\n"
            "from tests.oidc import oidc_provider\n"
            "with oidc_provider() as p:\n"
            "    print(p.process.pid, flush=True)\n"
            "    time.sleep(120)\n",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    node = int(child.stdout.readline())
    os.kill(child.pid, signal.SIGKILL)
    child.wait()

    def gone() -> bool:
        try:
            os.kill(node, 0)
        except ProcessLookupError:
            return True
        # A zombie until init reaps it: gone all the same.
        try:
            with open(f"/proc/{node}/stat") as stat:
                return stat.read().rsplit(") ", 1)[1].startswith("Z")
        except FileNotFoundError:
            return True

    wait_until(gone, "the provider's exit", timeout=20)
