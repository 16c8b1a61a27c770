"""Sign-in with OpenID Connect: the chat page's people through the authorization code flow
with PKCE (Authlib's Starlette client: the state, nonce and code verifier, the token
exchange and the ID token's signature, issuer, audience, expiry and nonce), and programs
through the provider's access tokens sent as bearer tokens (checked with joserfc against
the provider's published keys: signature, issuer, audience, expiry).

A signed-in person is a ``Principal``: named ``oidc:<sub>`` (never the same name as a key's
owner), their access groups from a claim (``RAGCHAINS_OIDC_GROUPS_CLAIM``), their role from a
claim or from their groups (``RAGCHAINS_OIDC_ROLE_GROUPS``). The session is Starlette's
signed cookie (``HttpOnly``, ``SameSite=Lax``, ``Secure`` when the server's public address is
https); it ends at the ID token's expiry or at sign-out.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import secrets
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode, urlsplit

import httpx
from authlib.integrations.starlette_client import OAuth, OAuthError
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from joserfc import jws, jwt
from joserfc.errors import (
    BadSignatureError,
    ExpiredTokenError,
    InvalidClaimError,
    InvalidKeyIdError,
    JoseError,
    MissingClaimError,
)
from joserfc.jwk import KeySet
from starlette.concurrency import run_in_threadpool

from ragchains.database import DatabaseError
from ragchains.serving.keys import ROLES, SIGNED_IN_PREFIX, Principal
from ragchains.sessions import SessionStore
from ragchains.settings import Settings

log = logging.getLogger("ragchains.server")
T = TypeVar("T")

# Authlib's client talks to the provider with httpx2 when it is installed (openai's own
# client needs it), else with httpx: a provider that cannot be reached raises either's.
try:
    import httpx2

    HTTP_ERRORS: tuple[type[Exception], ...] = (httpx.HTTPError, httpx2.HTTPError)
except ImportError:  # pragma: no cover - httpx2 comes with openai
    HTTP_ERRORS = (httpx.HTTPError,)
# The provider down, or answering what is not its discovery document or keys.
UNREACHED: tuple[type[Exception], ...] = (*HTTP_ERRORS, RuntimeError, ValueError)

SESSION_COOKIE = "ragchains_session"
SESSION_KEY_FILE = "session.key"
MIN_SECRET = 32  # characters of a session key, at least
SESSION_TOKEN = "sid"  # the cookie's key for the server's session (ragchains.sessions)
LEEWAY = 30  # seconds of clock difference allowed between us and the provider
REFETCH_AFTER = 30.0  # seconds, at least, between two fetches of the keys for an unknown one
# How long a session cookie may live at most (the ID token's expiry ends it sooner).
MAX_SESSION_SECONDS = 14 * 24 * 3600
SIGN_IN_PATHS = frozenset({"/auth/login", "/auth/callback", "/auth/logout"})
PROVIDER = "provider"
UNREACHABLE = "the identity provider cannot be reached now; try again shortly"
EXPIRED_SESSION = "your sign-in has expired: sign in again"
STALE_SIGN_IN = "this sign-in was not started here, or took too long: sign in again"


class TokenRefused(Exception):
    """A bearer token that is not one of the provider's, or not for us, or no longer valid."""


class SignInFailed(Exception):
    """The provider's answer gives nobody to sign in (the message says why, for the page)."""


class ClaimRules:
    """How a person's claims become a principal (see the module docstring)."""

    def __init__(self, settings: Settings) -> None:
        self.groups_claim = settings.oidc_groups_claim
        self.role_claim = settings.oidc_role_claim
        self.role_groups = dict(settings.oidc_role_groups)
        self.name_claim = settings.oidc_name_claim

    def principal(self, claims: Mapping[str, Any]) -> Principal:
        sub = claims.get("sub")
        if not isinstance(sub, str) or not sub:
            raise TokenRefused("the token names no subject (sub)")
        groups = self.groups(claims.get(self.groups_claim))
        return Principal(
            f"{SIGNED_IN_PREFIX}{sub}",
            groups,
            self.role(claims.get(self.role_claim), groups),
            display=self.display(claims, sub),
            via="oidc",
        )

    @staticmethod
    def groups(value: Any) -> frozenset[str]:
        """A claim's groups: a list of names, or one name, or names separated by spaces
        (providers write each); anything else gives none."""
        if isinstance(value, str):
            value = value.split()
        if not isinstance(value, list | tuple):
            return frozenset()
        return frozenset(
            str(g).strip() for g in value if isinstance(g, str | int) and str(g).strip()
        )

    def role(self, claimed: Any, groups: frozenset[str]) -> str:
        """The highest role the claim or the groups give; reader when none does."""
        given = (
            [claimed]
            if isinstance(claimed, str)
            else list(claimed or [])
            if isinstance(claimed, list)
            else []
        )
        given += [role for group, role in self.role_groups.items() if group in groups]
        ranked = [ROLES.index(role) for role in given if role in ROLES]
        return ROLES[max(ranked)] if ranked else ROLES[0]

    def display(self, claims: Mapping[str, Any], sub: str) -> str:
        for name in (self.name_claim, "name", "email", "preferred_username"):
            value = claims.get(name)
            if isinstance(value, str) and value.strip():
                return value.strip()[:200]
        return sub


class SignIn:
    """The provider, its sign-in routes and its tokens (see the module docstring)."""

    def __init__(self, settings: Settings, sessions: SessionStore) -> None:
        assert settings.oidc_issuer is not None and settings.oidc_client_id is not None
        # As configured, to the letter: tokens name their issuer so (Auth0's ends in "/").
        self.issuer = settings.oidc_issuer
        self.client_id = settings.oidc_client_id
        self.audience = settings.oidc_audience or settings.oidc_client_id
        self.public_url = settings.public_url.rstrip("/") if settings.public_url else None
        self.rules = ClaimRules(settings)
        self.sessions = sessions
        secret = settings.oidc_client_secret
        self.oauth = OAuth()
        self.oauth.register(
            PROVIDER,
            client_id=self.client_id,
            client_secret=secret.get_secret_value() if secret is not None else None,
            server_metadata_url=f"{self.issuer.rstrip('/')}/.well-known/openid-configuration",
            client_kwargs={
                "scope": settings.oidc_scopes,
                "code_challenge_method": "S256",
                # A public client (no secret) names itself in the token request's body.
                **({} if secret is not None else {"token_endpoint_auth_method": "none"}),
                "timeout": 10.0,
            },
        )
        # One fetch of the provider's keys at a time, and one forced fetch per
        # REFETCH_AFTER at most: tokens naming unknown keys cannot make it fetch in a loop.
        self._keys_lock = asyncio.Lock()
        self._keys_fetched_at = -REFETCH_AFTER

    @property
    def client(self) -> Any:
        return self.oauth.create_client(PROVIDER)

    # ------------------------------------------------------------------ the session
    async def _session(
        self, session: Mapping[str, Any] | None
    ) -> tuple[dict[str, Any], float] | None:
        token = (session or {}).get(SESSION_TOKEN)
        if not isinstance(token, str) or not token:
            return None
        return await stored_session(self.sessions.find, token)

    async def session_principal(self, session: Mapping[str, Any] | None) -> Principal | None:
        """The person whose session the cookie names, until their ID token expires."""
        found = await self._session(session)
        if found is None or found[1] <= time.time():
            return None
        try:
            return self.rules.principal(found[0].get("claims") or {})
        except TokenRefused:
            return None

    async def session_expired(self, session: Mapping[str, Any] | None) -> bool:
        """Whether the cookie names a session that has ended with its ID token."""
        found = await self._session(session)
        return found is not None and found[1] <= time.time()

    # ------------------------------------------------------------------ bearer tokens
    async def bearer_principal(self, token: str) -> Principal:
        """The principal of one of the provider's access tokens; TokenRefused saying why."""
        try:
            unverified = jws.extract_compact(token.encode("ascii"))
        except (JoseError, ValueError, UnicodeEncodeError) as exc:
            raise TokenRefused("the bearer token is not a key nor a token (JWT)") from exc
        claims = _json_object(unverified.payload)
        if claims.get("iss") != self.issuer:
            raise TokenRefused("the token's issuer is not the identity provider this server uses")
        if "nonce" in claims:  # what the provider gave this server at a sign-in: not for calls
            raise TokenRefused("an ID token is not an access token: send the access token")
        try:
            keys = await self._key_set()
            assert keys is not None  # unforced: always fetched
            verified = jwt.decode(token, keys, algorithms=await self._algorithms())
        except InvalidKeyIdError:
            # The provider may have rotated its keys since they were fetched.
            verified = await self._decode_after_refresh(token)
        except BadSignatureError as exc:
            raise TokenRefused("the token's signature does not verify") from exc
        except JoseError as exc:
            raise TokenRefused(f"the token cannot be read: {exc.description or exc.error}") from exc
        registry = jwt.JWTClaimsRegistry(
            leeway=LEEWAY,
            iss={"essential": True, "value": self.issuer},
            aud={"essential": True, "value": self.audience},
            exp={"essential": True},
            sub={"essential": True},
        )
        try:
            registry.validate(verified.claims)
        except ExpiredTokenError as exc:
            raise TokenRefused("the token has expired") from exc
        except MissingClaimError as exc:
            raise TokenRefused(f"the token lacks the {exc.claim!r} claim") from exc
        except InvalidClaimError as exc:
            what = {"aud": "is for another audience", "nbf": "is not valid yet"}
            reason = what.get(exc.claim, f"has a wrong {exc.claim!r} claim")
            raise TokenRefused(f"the token {reason}") from exc
        except JoseError as exc:
            raise TokenRefused(f"the token is refused: {exc.description or exc.error}") from exc
        return self.rules.principal(verified.claims)

    async def _decode_after_refresh(self, token: str) -> Any:
        unknown = "the token is signed with a key the provider does not publish"
        keys = await self._key_set(force=True)
        if keys is None:  # fetched again a moment ago: the key is not there
            raise TokenRefused(unknown)
        try:
            return jwt.decode(token, keys, algorithms=await self._algorithms())
        except InvalidKeyIdError as exc:
            raise TokenRefused(unknown) from exc
        except BadSignatureError as exc:
            raise TokenRefused("the token's signature does not verify") from exc
        except JoseError as exc:
            raise TokenRefused(f"the token cannot be read: {exc.description or exc.error}") from exc

    async def _key_set(self, *, force: bool = False) -> KeySet | None:
        """The provider's published keys; ``force``: fetched again (a key may have been
        rotated in), unless that was done within REFETCH_AFTER (then None)."""
        async with self._keys_lock:
            if force:
                if time.monotonic() - self._keys_fetched_at < REFETCH_AFTER:
                    return None
                self._keys_fetched_at = time.monotonic()
            try:
                keys = await self.client.fetch_jwk_set(force=force)
                return KeySet.import_key_set(keys)
            except UNREACHED as exc:
                log.warning("identity provider %s: keys not fetched: %s", self.issuer, exc)
                raise HTTPException(503, UNREACHABLE, headers={"Retry-After": "5"}) from exc
            except JoseError as exc:
                log.warning("identity provider %s: keys not usable: %s", self.issuer, exc)
                raise HTTPException(503, UNREACHABLE, headers={"Retry-After": "5"}) from exc

    async def _algorithms(self) -> list[str]:
        metadata = await self.client.load_server_metadata()
        found = metadata.get("id_token_signing_alg_values_supported") or ["RS256"]
        return [alg for alg in found if alg != "none"]

    # ------------------------------------------------------------------ the routes
    def redirect_uri(self, request: Request) -> str:
        if self.public_url is not None:
            return f"{self.public_url}/auth/callback"
        return str(request.url_for("sign_in_callback"))

    def home(self, request: Request) -> str:
        return f"{self.public_url}/" if self.public_url is not None else str(request.base_url)

    def router(self) -> APIRouter:
        router = APIRouter(tags=["sign-in"])

        @router.get(
            "/auth/login",
            summary="Sign in with the identity provider",
            status_code=302,
            response_class=Response,  # a redirect: no body to declare
            responses={
                302: {
                    "description": "To the identity provider's sign-in page",
                    "headers": {"Location": {"schema": {"type": "string"}, "required": True}},
                },
                503: {"description": UNREACHABLE},
            },
        )
        async def sign_in(request: Request) -> Response:
            """Redirects to the identity provider's sign-in; it comes back to /auth/callback."""
            try:
                return await self.client.authorize_redirect(request, self.redirect_uri(request))
            except UNREACHED as exc:
                log.warning("identity provider %s unreachable: %s", self.issuer, exc)
                raise HTTPException(503, UNREACHABLE, headers={"Retry-After": "5"}) from exc

        @router.get("/auth/callback", name="sign_in_callback", include_in_schema=False)
        async def sign_in_callback(request: Request) -> Response:
            """Back from the provider: the session made, then the page. A sign-in that
            failed (refused at the provider, a state or ID token that does not check) goes
            back to the page too, which shows the reason (``?sign_in_error=``)."""
            try:
                who, person = await self._signed_in(request)
            except SignInFailed as exc:
                log.warning("sign-in failed: %s", exc)
                failed = urlencode({"sign_in_error": str(exc)})
                return RedirectResponse(f"{self.home(request)}?{failed}", status_code=303)
            token = await stored_session(self.sessions.open, person, person["exp"])
            request.session.clear()  # a new session's token: none from before is kept
            request.session[SESSION_TOKEN] = token
            log.info("signed in: %s (%s)", who.name, who.role)
            return RedirectResponse(self.home(request), status_code=303)

        @router.post(
            "/auth/logout",
            summary="Sign out: the session ends here",
            responses={200: {"description": "Where to go to end the provider's session too"}},
        )
        async def sign_out(request: Request) -> JSONResponse:
            """Ends this server's session at once; ``end_session_url`` (when the provider
            has one) ends the provider's too, then comes back to the page."""
            found = await self._session(request.session)
            token = request.session.get(SESSION_TOKEN)
            request.session.clear()
            if isinstance(token, str):
                await stored_session(self.sessions.end, token)
            hint = found[0].get("id_token") if found is not None else None
            try:
                metadata = await self.client.load_server_metadata()
            except UNREACHED:
                metadata = {}
            url = None
            if metadata.get("end_session_endpoint"):
                made = await self.client.create_logout_url(
                    post_logout_redirect_uri=self.home(request),
                    id_token_hint=hint,
                    client_id=self.client_id,
                )
                url = made["url"]
            return JSONResponse({"signed_out": True, "end_session_url": url})

        return router

    async def _signed_in(self, request: Request) -> tuple[Principal, dict[str, Any]]:
        """The person the provider's answer names, and their session; SignInFailed why not."""
        try:
            token = await self.client.authorize_access_token(request, leeway=LEEWAY)
        except OAuthError as exc:
            if exc.error == "mismatching_state":  # no sign-in of this browser's to finish
                raise SignInFailed(STALE_SIGN_IN) from exc
            # The page shows its error code only: a description could be anyone's words in
            # a link built to be clicked.
            code = exc.error if re.fullmatch(r"[a-z_]{1,40}", exc.error or "") else "refused"
            log.info("sign-in refused by the provider: %r", exc.description)
            raise SignInFailed(f"the identity provider refused the sign-in ({code})") from exc
        except JoseError as exc:
            raise SignInFailed(f"the ID token is refused ({exc.error})") from exc
        except UNREACHED as exc:
            raise SignInFailed(UNREACHABLE) from exc
        claims = dict(token.get("userinfo") or {})
        if not claims:
            raise SignInFailed("the provider sent no ID token")
        if self.rules.groups_claim not in claims:
            more = await self._userinfo(token)
            if more.get("sub") == claims.get("sub"):  # OIDC: the same person, or none of it
                claims = {**more, **claims}
        try:
            who = self.rules.principal(claims)
        except TokenRefused as exc:
            raise SignInFailed(str(exc)) from exc
        exp = min(float(claims.get("exp") or 0), time.time() + MAX_SESSION_SECONDS)
        kept = {k: claims[k] for k in _KEPT_CLAIMS if k in claims}
        for name in (self.rules.groups_claim, self.rules.role_claim, self.rules.name_claim):
            if name in claims:
                kept[name] = claims[name]
        return who, {"claims": kept, "exp": exp, "id_token": token.get("id_token")}

    async def _userinfo(self, token: Mapping[str, Any]) -> dict[str, Any]:
        """The userinfo endpoint's claims, for a provider that keeps groups out of the ID
        token; none when it has no such endpoint or does not answer."""
        try:
            return dict(await self.client.userinfo(token=dict(token)))
        except (*UNREACHED, KeyError, OAuthError) as exc:
            log.info("identity provider %s: no userinfo (%s)", self.issuer, exc)
            return {}


async def stored_session(call: Callable[..., T], *args: Any) -> T:
    """A session store's ``call`` off the event loop; a database that fails is a 503."""
    try:
        return await run_in_threadpool(call, *args)
    except DatabaseError as exc:
        log.error("%s", exc)
        raise HTTPException(503, "sign-in sessions cannot be read or kept now") from exc


# Claims the session keeps, beside those the rules read (a cookie is at most 4 KB).
_KEPT_CLAIMS = ("sub", "name", "email", "preferred_username", "exp")


def _json_object(payload: bytes) -> dict[str, Any]:
    import json

    try:
        value = json.loads(payload)
    except ValueError as exc:
        raise TokenRefused("the token's claims are not JSON") from exc
    if not isinstance(value, dict):
        raise TokenRefused("the token's claims are not a JSON object")
    return value


def secure_cookie(settings: Settings) -> bool:
    """Whether the session cookie is marked Secure: when people reach the server over https."""
    return bool(settings.public_url and urlsplit(settings.public_url).scheme == "https")


def session_secret(settings: Settings, folder: Path) -> str:
    """The key that signs session cookies: RAGCHAINS_SESSION_SECRET, else one made once and
    kept in ``folder``/session.key (readable by its owner only), so a restart keeps people
    signed in. Anyone holding a short or empty key could sign a cookie of their own: a key
    under MIN_SECRET characters is refused (a damaged file is replaced)."""
    if settings.session_secret is not None:
        secret = settings.session_secret.get_secret_value()
        if len(secret) < MIN_SECRET:
            raise ValueError(
                f"RAGCHAINS_SESSION_SECRET has {len(secret)} characters: use {MIN_SECRET} or "
                "more (e.g. python -c 'import secrets; print(secrets.token_urlsafe(48))')"
            )
        return secret
    path = folder / SESSION_KEY_FILE
    kept = _kept_secret(path)
    if kept is not None:
        return kept
    folder.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_urlsafe(48)
    # Written whole under a name of its own, then linked into place: another server sees no
    # file or all of it, and of two made at once the second reads the first's.
    scratch = folder / f".{SESSION_KEY_FILE}.{secrets.token_hex(8)}"
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(secret + "\n")
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(scratch, path)
        except FileExistsError:
            kept = _kept_secret(path)
            if kept is not None:  # another server's, made meanwhile
                return kept
            os.replace(scratch, path)  # a damaged one: people sign in again
    finally:
        scratch.unlink(missing_ok=True)
    return secret


def _kept_secret(path: Path) -> str | None:
    """The key kept at ``path``; None when there is none, or one too short to trust (a
    crash mid-write left it so: it is replaced)."""
    try:
        with open(path) as kept:
            mode = os.fstat(kept.fileno()).st_mode
            secret = kept.read().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"session key {path}: {exc.strerror}") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(
            f"session key {path} can be read by other users, who could sign in as anyone: "
            f"chmod 600 {path}"
        )
    if len(secret) < MIN_SECRET:
        log.warning("session key %s is damaged (too short): a new one is made", path)
        return None
    return secret


def session_folder(settings: Settings, index_folder: Path | None, location: str) -> Path:
    """Where session.key is kept: beside the conversations of an index folder, else in the
    user's state folder under the store's name."""
    if settings.conversations_db is not None:
        return settings.conversations_db.parent
    if index_folder is not None:
        return index_folder
    import platformdirs

    named = hashlib.sha256(location.encode()).hexdigest()[:16]
    return Path(platformdirs.user_state_dir("ragchains")) / "sessions" / f"store-{named}"
