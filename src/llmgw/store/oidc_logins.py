"""Sign-ins through OpenID Connect that are under way: what the callback must check.

When a browser is sent to the provider, the server keeps the sign-in's nonce,
PKCE code verifier and redirect URI under the SHA-256 of its `state`; the
callback takes them back exactly once (`take` deletes the row, and of two
callbacks with the same state only one finds it). Rows live in the store, not
in one process, so the provider may send the browser back to any server.

Not guaranteed: that abandoned sign-ins disappear at once; expired rows are
removed at the next sign-in (`delete_expired`), and `take` refuses them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncEngine

from llmgw.store.engine import transaction
from llmgw.store.errors import InvalidValue
from llmgw.store.models import require_aware
from llmgw.store.tables import oidc_logins

_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
_MAX_SECRET = 128
_MAX_URI = 1024


@dataclass(frozen=True, slots=True)
class PendingLogin:
    """One sign-in under way: `id` is the SHA-256 (hex) of its state."""

    id: str
    nonce: str
    code_verifier: str
    redirect_uri: str
    created_at: datetime
    expires_at: datetime


class OidcLoginRepository:
    """Pending sign-ins; every method is one short transaction."""

    def __init__(self, *, engine: AsyncEngine) -> None:
        self._engine = engine

    async def create(self, login: PendingLogin) -> None:
        """Keep a pending sign-in until `take` or its expiry."""
        if not _SHA256_HEX.match(login.id):
            raise InvalidValue("a pending sign-in's id must be the SHA-256 of its state in hex")
        for what, value in (("nonce", login.nonce), ("code_verifier", login.code_verifier)):
            if not 0 < len(value) <= _MAX_SECRET:
                raise InvalidValue(f"{what} must be 1 to {_MAX_SECRET} characters")
        if not 0 < len(login.redirect_uri) <= _MAX_URI:
            raise InvalidValue(f"redirect_uri must be 1 to {_MAX_URI} characters")
        require_aware("created_at", login.created_at)
        require_aware("expires_at", login.expires_at)
        async with transaction(self._engine, "starting a single sign-on") as conn:
            await conn.execute(
                oidc_logins.insert().values(
                    id=login.id,
                    nonce=login.nonce,
                    code_verifier=login.code_verifier,
                    redirect_uri=login.redirect_uri,
                    created_at=login.created_at,
                    expires_at=login.expires_at,
                )
            )

    async def take(self, login_id: str, now: datetime) -> PendingLogin | None:
        """The pending sign-in with this id, removed so that nobody gets it again; None
        when there is none, it expired, or another caller took it first."""
        require_aware("now", now)
        async with transaction(self._engine, "finishing a single sign-on") as conn:
            row = (
                await conn.execute(select(oidc_logins).where(oidc_logins.c.id == login_id))
            ).first()
            if row is None:
                return None
            deleted = await conn.execute(delete(oidc_logins).where(oidc_logins.c.id == login_id))
        if deleted.rowcount != 1:
            return None
        found = row._mapping
        login = PendingLogin(
            id=found["id"],
            nonce=found["nonce"],
            code_verifier=found["code_verifier"],
            redirect_uri=found["redirect_uri"],
            created_at=found["created_at"],
            expires_at=found["expires_at"],
        )
        return login if login.expires_at > now else None

    async def delete_expired(self, now: datetime) -> int:
        """Remove sign-ins whose expiry is at or before `now`; how many were removed."""
        require_aware("now", now)
        async with transaction(self._engine, "removing expired sign-ins") as conn:
            result = await conn.execute(delete(oidc_logins).where(oidc_logins.c.expires_at <= now))
        return int(result.rowcount)
