"""A real OpenID Connect provider on loopback for the sign-in tests: npm's oauth2-mock-server
(pinned in package.json, installed into node_modules by ``make setup``), run by
tests/oidc_provider.mjs under Node.js; no network beyond 127.0.0.1.

``with oidc_provider() as provider:`` starts it on a free port and yields an ``OidcProvider``;
the process ends with the block, and on its own if the test process dies (it exits when its
stdin closes).
"""

from __future__ import annotations

import json
import re
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve().parent / "oidc_provider.mjs"
PACKAGE = "oauth2-mock-server"
# oauth2-mock-server's own floor (package.json "engines"); 9.x wants Node.js 22.
NODE_AT_LEAST = (20, 19)
# The claim the provider puts a user's ragchains role in.
ROLE_CLAIM = "ragchains_role"


class OidcProviderMissing(RuntimeError):
    """Node.js or the npm package is not where ``make setup`` puts them."""


@dataclass(frozen=True)
class OidcProvider:
    """The running provider: ``issuer`` is its URL (http://127.0.0.1:PORT), the base of
    /.well-known/openid-configuration, /authorize, /token, /jwks, /userinfo and /endsession.

    Who /authorize signs in is the provider's session, which is one for the whole provider
    (not per browser): ``sign_in_as`` sets it, /endsession and ``sign_out`` end it, and with
    none the browser gets a login form (a "User name" field and a "Sign in" button) that knows
    the users given to ``sign_in_as`` and ``add_user``."""

    issuer: str
    process: subprocess.Popen[str]

    @property
    def discovery_url(self) -> str:
        return f"{self.issuer}/.well-known/openid-configuration"

    def sign_in_as(
        self,
        sub: str,
        *,
        name: str | None = None,
        email: str | None = None,
        groups: Sequence[str] = (),
        role: str | None = "reader",
    ) -> None:
        """Sign ``sub`` in at the provider: every browser sign-in from now on comes back as
        this user at once (no form), until another ``sign_in_as``, ``sign_out`` or an
        /endsession. ``name`` defaults to ``sub``, ``email`` to ``sub@example.com``;
        ``role`` None leaves the role claim out."""
        self._control("/test/sign-in", _user(sub, name, email, groups, role))

    def add_user(
        self,
        sub: str,
        *,
        name: str | None = None,
        email: str | None = None,
        groups: Sequence[str] = (),
        role: str | None = "reader",
    ) -> None:
        """A user the login form signs in when ``sub`` is typed as the user name; signs
        nobody in."""
        self._control("/test/users", _user(sub, name, email, groups, role))

    def sign_out(self) -> None:
        """End the provider's session, as /endsession does: the next sign-in shows the form."""
        self._control("/test/sign-out", {})

    def token(
        self,
        sub: str,
        *,
        groups: Sequence[str] = (),
        role: str | None = "reader",
        aud: str | Sequence[str] = "ragchains",
        expires_in: int = 3600,
        name: str | None = None,
        email: str | None = None,
        claims: Mapping[str, Any] | None = None,
    ) -> str:
        """An access token (a JWT signed with the provider's RS256 key, as its /jwks lists)
        for a bearer request: iss, iat, nbf, exp (now + ``expires_in``: negative for one
        expired already), sub, aud, jti and the user's claims, then ``claims`` over them
        (a wrong ``iss``, say). /userinfo answers for it too."""
        body = {
            **_user(sub, name, email, groups, role),
            "aud": aud if isinstance(aud, str) else list(aud),
            "expires_in": expires_in,
            "claims": dict(claims or {}),
        }
        return str(self._control("/test/token", body)["access_token"])

    def set_token_ttl(self, seconds: int) -> None:
        """How long the ID and access tokens /token issues from now on last (the
        ``token_ttl`` it started with otherwise)."""
        self._control("/test/config", {"token_ttl": seconds})

    def _control(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        response = httpx.post(f"{self.issuer}{path}", json=body, timeout=10)
        if response.status_code != 200:
            raise AssertionError(f"the OIDC provider refused {path}: {response.text}")
        reply: dict[str, Any] = response.json()
        return reply


def _user(
    sub: str, name: str | None, email: str | None, groups: Sequence[str], role: str | None
) -> dict[str, Any]:
    if isinstance(groups, str):  # ("hr") rather than ("hr",): one group, not two letters
        raise TypeError(f"groups: a sequence of names, not the string {groups!r}")
    user: dict[str, Any] = {"sub": sub, "groups": list(groups), "role": role}
    if name is not None:
        user["name"] = name
    if email is not None:
        user["email"] = email
    return user


def _node() -> str:
    node = shutil.which("node") or ("/usr/bin/node" if Path("/usr/bin/node").exists() else None)
    if node is None:
        raise OidcProviderMissing("no Node.js (node) on PATH or at /usr/bin/node: run `make setup`")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True)
    found = tuple(int(part) for part in re.findall(r"\d+", version.stdout)[:2])
    if found < NODE_AT_LEAST:
        raise OidcProviderMissing(
            f"{PACKAGE} needs Node.js {'.'.join(map(str, NODE_AT_LEAST))} or newer; "
            f"{node} is {version.stdout.strip()}"
        )
    return node


def _check_package() -> None:
    pinned = json.loads((REPO / "package.json").read_text())["devDependencies"][PACKAGE]
    installed = REPO / "node_modules" / PACKAGE / "package.json"
    if not installed.exists():
        raise OidcProviderMissing(f"{PACKAGE} is not in {REPO / 'node_modules'}: run `make setup`")
    version = json.loads(installed.read_text())["version"]
    if version != pinned:
        raise OidcProviderMissing(
            f"node_modules has {PACKAGE} {version}, package.json pins {pinned}: run `make setup`"
        )


@contextmanager
def oidc_provider(*, token_ttl: int = 3600, timeout: float = 30) -> Iterator[OidcProvider]:
    """The provider on a free port of 127.0.0.1 until the block ends. ``token_ttl``: how long
    the tokens /token issues last, in seconds (``set_token_ttl`` changes it later)."""
    node = _node()
    _check_package()
    command = [node, str(SCRIPT), "--port", "0", "--token-ttl", str(token_ttl)]
    with tempfile.TemporaryFile("w+") as log:
        # stdin stays open for as long as this process lives: the provider exits when it
        # closes, so even a SIGKILLed test run leaves none behind.
        process = subprocess.Popen(
            [*command, "--exit-with-stdin"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            cwd=REPO,
        )
        try:
            started = _started(process, log, timeout)
            yield OidcProvider(issuer=started["issuer"], process=process)
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            for pipe in (process.stdin, process.stdout):
                if pipe is not None:
                    pipe.close()


def _started(process: subprocess.Popen[str], log: Any, timeout: float) -> dict[str, Any]:
    """The line the provider prints once it listens; its stderr in the error if it dies or
    says nothing within ``timeout`` seconds."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([process.stdout], [], [], min(left, 0.5))
        if ready:
            line = process.stdout.readline()
            if line:
                started: dict[str, Any] = json.loads(line)
                return started
        if process.poll() is not None:
            break
    process.poll()
    log.seek(0)
    state = f"exited with {process.returncode}" if process.returncode is not None else "is silent"
    raise AssertionError(
        f"the OIDC provider ({SCRIPT.name}) {state} after start: {log.read()[-3000:]}"
    )
