"""Single sign-on for the admin pages through an OpenID Connect provider.

`SingleSignOn.begin` starts a sign-in: a fresh `state`, `nonce` and PKCE code
verifier (S256), kept in the store under the state's hash, and the provider's
authorization URL to send the browser to. `SingleSignOn.finish` takes the state
back (once: a replayed state finds nothing), exchanges the code at the token
endpoint with the client secret and the verifier, and checks the ID token:
its signature against the provider's JWKS (fetched again once when the token
names a key id the cached set lacks, which is how providers rotate keys), its
algorithm among the provider's asymmetric ones, `iss`, `aud`, `exp`, `iat` and
`nonce`. Then the user's e-mail domain against `allowed_domains`, and their
groups against the role mapping; the user is created on first sign-in (no
password) and their role replaced at each one; the portal then opens a session
like a password login's.

The protocol is authlib's (authorization URL, PKCE, token request, the OIDC
claim rules) and JOSE is joserfc's, which authlib itself uses; nothing here
parses a JWT by hand. The provider's discovery document is cached for
`metadata_ttl` seconds and its keys until a token names an unknown one.

Every refusal is an `SsoError` whose message says what was wrong and what to do;
the portal shows it on a page. Not guaranteed: a sign-out at the provider (a
logout here ends the llmgw session only), or the userinfo endpoint (groups and
e-mail are read from the ID token alone).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx2
from authlib.integrations.base_client.errors import OAuthError
from authlib.integrations.httpx_client import AsyncOAuth2Client
from authlib.oidc.core import CodeIDToken
from joserfc import jwt
from joserfc.errors import (
    BadSignatureError,
    ClaimError,
    ExpiredTokenError,
    InvalidKeyIdError,
    JoseError,
)
from joserfc.jwk import KeySet
from joserfc.jws import JWSRegistry

from llmgw.auth.users import check_user_name
from llmgw.store import (
    AdminRole,
    AlreadyExists,
    OidcLoginRepository,
    PendingLogin,
    User,
    UserRepository,
)

log = logging.getLogger("llmgw.auth.oidc")

# Signature algorithms accepted for ID tokens: asymmetric only. An HMAC token
# would be keyed with the client secret, which is not the provider's own key.
ASYMMETRIC_ALGS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
# Seconds of clock difference tolerated on exp/iat between us and the provider.
LEEWAY = 60
_ROLE_ORDER: tuple[AdminRole, ...] = ("admin", "operator", "viewer")


class SsoError(Exception):
    """A sign-in refused or impossible; `message` is for the person signing in."""

    status = 400
    code = "sso_failed"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class SsoRefused(SsoError):
    """The provider vouched for the user, but llmgw's rules do not let them in."""

    status = 403
    code = "sso_refused"


class ProviderUnavailable(SsoError):
    """The provider did not answer, or answered something unusable."""

    status = 502
    code = "sso_provider_unavailable"


@dataclass(frozen=True, slots=True)
class SsoSettings:
    """What `auth.oidc` says (the client secret lives in the HTTP client only)."""

    issuer: str
    client_id: str
    scopes: Sequence[str]
    groups_claim: str
    allowed_domains: Sequence[str]
    # Group names per role: admins, operators, viewers.
    roles: Mapping[AdminRole, Sequence[str]]
    redirect_uri: str | None = None


@dataclass(frozen=True, slots=True)
class Started:
    """A sign-in under way: where to send the browser, and the state to bind to it."""

    url: str
    state: str


def _state_id(state: str) -> str:
    return hashlib.sha256(state.encode("utf-8", "surrogateescape")).hexdigest()


def role_for(groups: Sequence[str], roles: Mapping[AdminRole, Sequence[str]]) -> AdminRole | None:
    """The highest role any of `groups` maps to; None when none does."""
    held = set(groups)
    for role in _ROLE_ORDER:
        if held.intersection(roles.get(role, ())):
            return role
    return None


class ProviderMetadata:
    """The provider's discovery document and signing keys, fetched and cached."""

    def __init__(
        self,
        *,
        client: AsyncOAuth2Client,
        issuer: str,
        clock: Callable[[], float],
        metadata_ttl: float = 3600.0,
    ) -> None:
        self._client = client
        self._issuer = issuer
        self._clock = clock
        self._ttl = metadata_ttl
        self._metadata: dict[str, Any] | None = None
        self._fetched_at = 0.0
        self._keys: KeySet | None = None

    @property
    def url(self) -> str:
        return self._issuer.rstrip("/") + "/.well-known/openid-configuration"

    async def get(self) -> dict[str, Any]:
        """The discovery document; `ProviderUnavailable` when it cannot be read or is
        not the configured issuer's."""
        if self._metadata is not None and self._clock() - self._fetched_at < self._ttl:
            return self._metadata
        document = await self._get_json(self.url, "its discovery document")
        if document.get("issuer") != self._issuer:
            raise ProviderUnavailable(
                f"the discovery document at {self.url} names the issuer "
                f"{document.get('issuer')!r}, not {self._issuer!r}; set auth.oidc.issuer to "
                "exactly the provider's issuer"
            )
        for field in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
            if not isinstance(document.get(field), str):
                raise ProviderUnavailable(
                    f"the discovery document at {self.url} has no {field}; is {self._issuer} "
                    "an OpenID Connect provider?"
                )
        self._metadata, self._fetched_at = document, self._clock()
        return document

    async def keys(self, *, refresh: bool = False) -> KeySet:
        """The provider's signing keys; fetched again when `refresh`."""
        if self._keys is not None and not refresh:
            return self._keys
        uri = (await self.get())["jwks_uri"]
        document = await self._get_json(uri, "its signing keys (JWKS)")
        try:
            self._keys = KeySet.import_key_set(document)  # type: ignore[arg-type]
        except (JoseError, ValueError, KeyError, TypeError) as exc:
            raise ProviderUnavailable(
                f"the provider's signing keys at {uri} cannot be read: {exc}"
            ) from exc
        return self._keys

    async def _get_json(self, url: str, what: str) -> dict[str, Any]:
        try:
            response = await self._client.request("GET", url, withhold_token=True)
        except httpx2.HTTPError as exc:
            raise ProviderUnavailable(
                f"cannot reach the identity provider for {what} ({url}): {exc}; "
                "try again shortly, or check auth.oidc.issuer"
            ) from exc
        if response.status_code != 200:
            raise ProviderUnavailable(
                f"the identity provider answered {response.status_code} for {what} ({url})"
            )
        try:
            document = response.json()
        except ValueError as exc:
            raise ProviderUnavailable(
                f"the identity provider sent {what} ({url}) not as JSON"
            ) from exc
        if not isinstance(document, dict):
            raise ProviderUnavailable(f"the identity provider sent {what} ({url}) not as an object")
        return document


class SingleSignOn:
    """Starting and finishing sign-ins; built once by the composition root."""

    def __init__(
        self,
        *,
        settings: SsoSettings,
        client: AsyncOAuth2Client,
        provider: ProviderMetadata,
        logins: OidcLoginRepository,
        users: UserRepository,
        wall_clock: Callable[[], datetime],
        login_ttl: float = 600.0,
    ) -> None:
        self._settings = settings
        self._client = client
        self._provider = provider
        self._logins = logins
        self._users = users
        self._wall_clock = wall_clock
        self._login_ttl = timedelta(seconds=login_ttl)

    @property
    def redirect_uri(self) -> str | None:
        """The configured callback URL; None: the portal derives it from the request."""
        return self._settings.redirect_uri

    async def begin(self, redirect_uri: str) -> Started:
        """Start a sign-in whose callback is `redirect_uri`."""
        metadata = await self._provider.get()
        state = secrets.token_urlsafe(32)
        nonce = secrets.token_urlsafe(32)
        verifier = secrets.token_urlsafe(48)
        now = self._wall_clock()
        await self._logins.delete_expired(now)
        await self._logins.create(
            PendingLogin(
                id=_state_id(state),
                nonce=nonce,
                code_verifier=verifier,
                redirect_uri=redirect_uri,
                created_at=now,
                expires_at=now + self._login_ttl,
            )
        )
        url, _ = self._client.create_authorization_url(
            metadata["authorization_endpoint"],
            state=state,
            code_verifier=verifier,
            nonce=nonce,
            redirect_uri=redirect_uri,
            scope=" ".join(self._settings.scopes),
        )
        return Started(url=str(url), state=state)

    async def finish(self, *, state: str, code: str) -> User:
        """The user a finished sign-in is for (created on first sign-in, role re-read); the
        caller opens their session. `SsoError` saying why not."""
        pending = await self._logins.take(_state_id(state), self._wall_clock())
        if pending is None:
            raise SsoError(
                "this sign-in is not known here: it was already used, it expired, or it was "
                "not started by this gateway (state not recognised); start again from the "
                "login page"
            )
        metadata = await self._provider.get()
        token = await self._exchange(metadata, pending, code)
        claims = await self._check_id_token(metadata, token, pending.nonce)
        return await self._sign_in(claims)

    async def _exchange(
        self, metadata: Mapping[str, Any], pending: PendingLogin, code: str
    ) -> dict[str, Any]:
        try:
            token = await self._client.fetch_token(
                metadata["token_endpoint"],
                grant_type="authorization_code",
                code=code,
                code_verifier=pending.code_verifier,
                redirect_uri=pending.redirect_uri,
            )
        except OAuthError as exc:
            raise SsoError(
                f"the identity provider refused the sign-in code ({exc.error}: "
                f"{exc.description or 'no description'}); start again from the login page"
            ) from exc
        except httpx2.HTTPError as exc:
            raise ProviderUnavailable(
                f"cannot reach the identity provider's token endpoint: {exc}; try again shortly"
            ) from exc
        except ValueError as exc:
            # authlib reads the answer as JSON; a provider sending HTML ends here.
            raise ProviderUnavailable(
                f"the identity provider's token endpoint sent an unreadable answer: {exc}"
            ) from exc
        if not isinstance(token, dict) or not isinstance(token.get("id_token"), str):
            raise SsoError("the identity provider sent no ID token; add openid to auth.oidc.scopes")
        return dict(token)

    async def _check_id_token(
        self, metadata: Mapping[str, Any], token: Mapping[str, Any], nonce: str
    ) -> CodeIDToken:
        offered = metadata.get("id_token_signing_alg_values_supported") or ["RS256"]
        algorithms = [alg for alg in offered if alg in ASYMMETRIC_ALGS]
        if not algorithms:
            raise ProviderUnavailable(
                f"the provider signs ID tokens only with {', '.join(map(str, offered))}; "
                f"llmgw accepts {', '.join(sorted(ASYMMETRIC_ALGS))}"
            )
        registry = JWSRegistry(algorithms=algorithms)
        raw = token["id_token"]
        try:
            try:
                decoded = jwt.decode(raw, await self._provider.keys(), registry=registry)
            except InvalidKeyIdError:
                # The provider rotated its keys since we fetched them.
                decoded = jwt.decode(
                    raw, await self._provider.keys(refresh=True), registry=registry
                )
        except InvalidKeyIdError as exc:
            raise SsoError(
                "the ID token is signed with a key the identity provider does not publish "
                "(unknown key id); sign-in refused"
            ) from exc
        except BadSignatureError as exc:
            raise SsoError(
                "the ID token's signature does not match the identity provider's keys; "
                "sign-in refused"
            ) from exc
        except JoseError as exc:
            raise SsoError(f"the ID token cannot be read ({exc.error}); sign-in refused") from exc
        options: dict[str, Any] = {
            "iss": {"essential": True, "value": self._settings.issuer},
            "aud": {"essential": True, "value": self._settings.client_id},
            "exp": {"essential": True},
        }
        params = {
            "nonce": nonce,
            "client_id": self._settings.client_id,
            "access_token": token.get("access_token"),
        }
        claims = CodeIDToken(decoded.claims, decoded.header, options, params)
        try:
            claims.validate(now=int(self._wall_clock().timestamp()), leeway=LEEWAY)
        except ExpiredTokenError as exc:
            raise SsoError(
                "the ID token has expired; check that this server's clock is right, "
                "then sign in again"
            ) from exc
        except ClaimError as exc:
            raise SsoError(_claim_problem(exc.claim, claims, self._settings)) from exc
        return claims

    async def _sign_in(self, claims: CodeIDToken) -> User:
        settings = self._settings
        email = claims.get("email")
        email = email.strip().lower() if isinstance(email, str) else None
        if settings.allowed_domains:
            domain = email.rpartition("@")[2] if email and "@" in email else None
            if domain is None or domain not in settings.allowed_domains:
                raise SsoRefused(
                    f"the account {email or claims['sub']!r} is not in an allowed e-mail domain "
                    f"({', '.join(settings.allowed_domains)}); sign in with an account of "
                    "your organisation"
                )
            if claims.get("email_verified") is False:
                raise SsoRefused(
                    f"the identity provider has not verified the e-mail {email!r}; verify it "
                    "there, then sign in again"
                )
        groups = claims.get(settings.groups_claim, [])
        if isinstance(groups, str):
            groups = [groups]
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise SsoRefused(
                f"the ID token's {settings.groups_claim!r} claim is not a list of group "
                "names; check auth.oidc.groups_claim"
            )
        name = _user_name(claims, email)
        role = role_for(groups, settings.roles)
        if role is None:
            await self._users.revoke_sso_role(issuer=settings.issuer, subject=str(claims["sub"]))
            held = ", ".join(groups) if groups else "none"
            raise SsoRefused(
                f"{name}: none of your groups ({held}) gives a role on this gateway; ask an "
                "admin to add one of your groups to auth.oidc.roles (admins, operators or viewers)"
            )
        try:
            user = await self._users.sign_in_sso(
                issuer=settings.issuer, subject=str(claims["sub"]), name=name, admin_role=role
            )
        except AlreadyExists as exc:
            raise SsoRefused(str(exc)) from exc
        if user.disabled:
            raise SsoRefused(f"the user {user.name!r} is disabled here; ask an admin")
        log.info("single sign-on: %s (%s) as %s", user.name, claims["sub"], role)
        return user


def _user_name(claims: CodeIDToken, email: str | None) -> str:
    """The name a new user gets: the e-mail, else preferred_username, else `sub`."""
    for candidate in (email, claims.get("preferred_username"), str(claims["sub"])):
        if not isinstance(candidate, str):
            continue
        try:
            check_user_name(candidate)
        except ValueError:
            continue
        return candidate
    raise SsoRefused(
        "the identity provider sent no e-mail, preferred_username or subject usable as a "
        "user name here (letters, digits and . _ @ -, at most 64)"
    )


def _claim_problem(claim: str, claims: CodeIDToken, settings: SsoSettings) -> str:
    if claim == "iss":
        return (
            f"the ID token was issued by {claims.get('iss')!r}, not by the configured "
            f"issuer {settings.issuer!r}; sign-in refused"
        )
    if claim in ("aud", "azp"):
        return (
            f"the ID token is meant for another client (aud {claims.get('aud')!r}), not "
            f"for {settings.client_id!r}; sign-in refused"
        )
    if claim == "nonce":
        return (
            "the ID token's nonce does not match this sign-in (a replayed or mixed-up "
            "token); start again from the login page"
        )
    return f"the ID token's {claim!r} claim is missing or invalid; sign-in refused"
