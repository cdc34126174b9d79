"""An OpenID Connect provider for tests, served on loopback from a thread.

It speaks the parts of the protocol llmgw uses, over real HTTP: discovery
(`/.well-known/openid-configuration`), signing keys (`/jwks`), an authorization
endpoint a browser drives (a page with one button per user, or straight back
with a code when `auto_user` is set), and a token endpoint that checks the
client secret (HTTP Basic), the code (once), the redirect URI and the PKCE
verifier (S256). Keys are made and ID tokens signed with joserfc (the JOSE
library authlib uses); `rotate()` replaces the signing key.

`tamper` makes the next ID tokens wrong in one way, for the refusal tests:
"wrong_key" (signed by a key the JWKS does not hold, under the published kid),
"expired", "wrong_aud", "bad_nonce".

Its URL names `localhost` while the gateway under test listens on 127.0.0.1,
so that in a browser the provider is another site, as in real deployments.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from html import escape
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

from authlib.oauth2.rfc7636 import create_s256_code_challenge
from joserfc import jwt
from joserfc.jwk import RSAKey

CLIENT_ID = "llmgw-test"
CLIENT_SECRET = "s3cret-" + "x" * 24


@dataclass
class IdpUser:
    sub: str
    email: str
    groups: list[str]
    email_verified: bool = True


@dataclass
class _Code:
    user: IdpUser
    redirect_uri: str
    challenge: str
    nonce: str
    used: bool = False


def _new_key(kid: str) -> RSAKey:
    return RSAKey.generate_key(2048, parameters={"kid": kid})


@dataclass
class OidcIssuer:
    """The provider; use as a context manager (it serves until closed)."""

    users: dict[str, IdpUser] = field(default_factory=dict)
    auto_user: str | None = None
    tamper: str | None = None
    token_requests: int = 0

    def __post_init__(self) -> None:
        self._codes: dict[str, _Code] = {}
        self._lock = threading.Lock()
        self._generation = 1
        self.key = _new_key("key-1")
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.url = f"http://localhost:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> OidcIssuer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def rotate(self) -> str:
        """Sign with a new key from now on; the old one leaves the JWKS. The new kid."""
        with self._lock:
            self._generation += 1
            self.key = _new_key(f"key-{self._generation}")
            return str(self.key.kid)

    def discovery(self) -> dict[str, Any]:
        return {
            "issuer": self.url,
            "authorization_endpoint": self.url + "/authorize",
            "token_endpoint": self.url + "/token",
            "jwks_uri": self.url + "/jwks",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic"],
        }

    def jwks(self) -> dict[str, Any]:
        return {"keys": [self.key.as_dict(private=False)]}

    def issue_code(self, params: dict[str, str], user: IdpUser) -> str:
        code = secrets.token_urlsafe(24)
        with self._lock:
            self._codes[code] = _Code(
                user=user,
                redirect_uri=params["redirect_uri"],
                challenge=params["code_challenge"],
                nonce=params["nonce"],
            )
        return code

    def exchange(self, form: dict[str, str], basic: str | None) -> tuple[int, dict[str, Any]]:
        """The token endpoint's status and body."""
        self.token_requests += 1
        if basic is None:
            return 401, {"error": "invalid_client", "error_description": "no client auth"}
        client_id, _, secret = base64.b64decode(basic).decode().partition(":")
        if unquote(client_id) != CLIENT_ID or unquote(secret) != CLIENT_SECRET:
            return 401, {"error": "invalid_client", "error_description": "bad client secret"}
        if form.get("grant_type") != "authorization_code":
            return 400, {"error": "unsupported_grant_type"}
        with self._lock:
            found = self._codes.get(form.get("code", ""))
            if found is None or found.used:
                return 400, {"error": "invalid_grant", "error_description": "unknown or used code"}
            found.used = True
        if form.get("redirect_uri") != found.redirect_uri:
            return 400, {"error": "invalid_grant", "error_description": "redirect_uri differs"}
        verifier = form.get("code_verifier", "")
        if not verifier or create_s256_code_challenge(verifier) != found.challenge:
            return 400, {"error": "invalid_grant", "error_description": "PKCE verifier wrong"}
        access = secrets.token_urlsafe(24)
        return 200, {
            "access_token": access,
            "token_type": "Bearer",
            "expires_in": 300,
            "id_token": self._id_token(found),
        }

    def _id_token(self, code: _Code) -> str:
        now = int(time.time())
        user = code.user
        claims: dict[str, Any] = {
            "iss": self.url,
            "sub": user.sub,
            "aud": CLIENT_ID,
            "iat": now,
            "exp": now + 300,
            "nonce": code.nonce,
            "email": user.email,
            "email_verified": user.email_verified,
            "preferred_username": user.email.partition("@")[0],
            "groups": list(user.groups),
        }
        key = self.key
        if self.tamper == "wrong_key":
            key = _new_key(str(self.key.kid))
        elif self.tamper == "expired":
            claims["iat"], claims["exp"] = now - 7200, now - 3600
        elif self.tamper == "wrong_aud":
            claims["aud"] = "another-client"
        elif self.tamper == "bad_nonce":
            claims["nonce"] = "not-the-nonce-that-was-sent"
        return jwt.encode({"alg": "RS256", "kid": key.kid}, claims, key)


def _choose_page(params: dict[str, str], users: dict[str, IdpUser]) -> bytes:
    hidden = "".join(
        f'<input type=hidden name="{escape(k)}" value="{escape(v)}">' for k, v in params.items()
    )
    buttons = "".join(
        f'<button type=submit name=user value="{escape(n)}">{escape(n)}</button>' for n in users
    )
    return (
        "<!doctype html><html><head><title>Test identity provider</title></head><body>"
        "<h1>Test identity provider</h1><p>Sign in as:</p>"
        f'<form method=post action="/authorize">{hidden}{buttons}</form></body></html>'
    ).encode()


def _handler(issuer: OidcIssuer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            self.send_header("cache-control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, payload: dict[str, Any]) -> None:
            self._send(status, json.dumps(payload).encode(), "application/json")

        def _redirect_with_code(self, params: dict[str, str], user_name: str) -> None:
            user = issuer.users.get(user_name)
            if user is None:
                self._send(400, b"no such user", "text/plain")
                return
            code = issuer.issue_code(params, user)
            query = urlencode({"code": code, "state": params["state"]})
            self.send_response(302)
            self.send_header("location", f"{params['redirect_uri']}?{query}")
            self.send_header("content-length", "0")
            self.end_headers()

        def _authorize_params(self, params: dict[str, str]) -> str | None:
            if params.get("client_id") != CLIENT_ID:
                return "unknown client_id"
            if params.get("response_type") != "code":
                return "response_type must be code"
            if params.get("code_challenge_method") != "S256" or not params.get("code_challenge"):
                return "PKCE (S256) is required"
            for name in ("redirect_uri", "state", "nonce", "scope"):
                if not params.get(name):
                    return f"{name} is required"
            if "openid" not in params["scope"].split():
                return "scope must include openid"
            return None

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            params = {k: v[0] for k, v in parse_qs(parts.query).items()}
            if parts.path == "/.well-known/openid-configuration":
                self._json(200, issuer.discovery())
            elif parts.path == "/jwks":
                self._json(200, issuer.jwks())
            elif parts.path == "/authorize":
                problem = self._authorize_params(params)
                if problem is not None:
                    self._send(400, problem.encode(), "text/plain")
                elif issuer.auto_user is not None:
                    self._redirect_with_code(params, issuer.auto_user)
                else:
                    self._send(200, _choose_page(params, issuer.users), "text/html")
            else:
                self._send(404, b"not found", "text/plain")

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
            if self.path == "/authorize":
                user = form.pop("user", "")
                problem = self._authorize_params(form)
                if problem is not None:
                    self._send(400, problem.encode(), "text/plain")
                else:
                    self._redirect_with_code(form, user)
            elif self.path == "/token":
                auth = self.headers.get("authorization", "")
                basic = auth[6:] if auth.lower().startswith("basic ") else None
                status, payload = issuer.exchange(form, basic)
                self._json(status, payload)
            else:
                self._send(404, b"not found", "text/plain")

    return Handler


def sso_config(
    issuer: OidcIssuer, secret_file: str, *, local_login: bool = True, **extra: Any
) -> dict[str, Any]:
    """The server config's `auth:` section for `issuer`; `extra` lands in `auth.oidc`."""
    oidc: dict[str, Any] = {
        "issuer": issuer.url,
        "client_id": CLIENT_ID,
        "client_secret_file": secret_file,
        "scopes": ["openid", "email", "profile", "groups"],
        "roles": {"admins": ["llm-admins"], "operators": ["llm-ops"], "viewers": ["llm-viewers"]},
        **extra,
    }
    return {"auth": {"local_login": local_login, "oidc": oidc}}
