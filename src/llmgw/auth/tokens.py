"""API key secrets: making them, hashing them, and finding them in request headers.

A secret is "sk-llmgw-" followed by 32 random bytes (URL-safe base64). The
store keeps only its SHA-256 hex digest and its first `PREFIX_LENGTH`
characters (to tell keys apart in lists). SHA-256 without salt or stretching
is right here: the secrets are 256-bit random values, not passwords, so there
is nothing to brute-force, and the lookup must cost microseconds per request.

Not guaranteed: that a token from the headers has the llmgw format; any string
is hashed and looked up, and only the store decides whether it is a key.
"""

from __future__ import annotations

import hashlib
import secrets

SECRET_PREFIX = "sk-llmgw-"
PREFIX_LENGTH = 12


def generate_secret() -> str:
    """A new random API key secret."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    """The SHA-256 hex digest the store keeps instead of the secret."""
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


def secret_prefix(secret: str) -> str:
    """The first characters of a secret, shown to people to identify a key."""
    return secret[:PREFIX_LENGTH]


def looks_like_secret(text: str) -> bool:
    """True for a whole llmgw secret (not just its prefix)."""
    return text.startswith(SECRET_PREFIX) and len(text) > PREFIX_LENGTH


def token_from_headers(authorization: bytes | None, x_api_key: bytes | None) -> str | None:
    """The API key a request carries, or None when it carries none.

    `Authorization: Bearer <key>` (scheme case-insensitive) wins; otherwise the
    `x-api-key` header (Anthropic-style clients send that). Header bytes are
    decoded as Latin-1, as HTTP defines them; a non-ASCII key simply fails the
    lookup. Another Authorization scheme (Basic, ...) counts as no key.
    """
    if authorization:
        scheme, _, credential = authorization.decode("latin-1").strip().partition(" ")
        credential = credential.strip()
        if scheme.lower() == "bearer" and credential:
            return credential
    if x_api_key:
        key = x_api_key.decode("latin-1").strip()
        if key:
            return key
    return None
