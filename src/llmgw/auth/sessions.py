"""Admin logins: checking a password, issuing a session token, and resolving it later.

`login` gives the browser a token (32 random bytes, URL-safe base64) to keep
in a cookie; the store keeps only its SHA-256, so a copy of the database does
not let anyone in. Each session also has a CSRF token, which the pages send
back in a header or form field with every state-changing request.

A session lasts `ttl` seconds from login (not from last use: a stolen cookie
stops working at a known time). Expired sessions are refused and deleted when
seen, and all expired ones are swept at each login. A session of a user who was
disabled since is refused too.

Not guaranteed: a constant-time login. Unknown users cost a dummy argon2
verification, so they take about as long as a wrong password, but a store
lookup is not constant-time.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from llmgw.auth.errors import LoginFailed
from llmgw.auth.passwords import MAX_PASSWORD_LENGTH, Passwords
from llmgw.store import AdminSession, SessionRepository, User, UserRepository
from llmgw.store.users import MAX_USER_NAME

# How often last_seen_at is written: a page that polls every second must not
# turn into a write per second.
TOUCH_INTERVAL = timedelta(seconds=60)
# Longer than any token we issue (43 characters); refuse the rest unhashed.
_MAX_TOKEN = 128


def session_id(token: str) -> str:
    """The id a session is stored under: the SHA-256 (hex) of its token."""
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


@dataclass(frozen=True, slots=True)
class LoggedIn:
    """A valid session and the user it belongs to, as read for one request."""

    user: User
    session: AdminSession


class AdminSessions:
    """Logins, logouts and session lookups over the user and session repositories."""

    def __init__(
        self,
        *,
        users: UserRepository,
        sessions: SessionRepository,
        passwords: Passwords,
        ttl: float,
        wall_clock: Callable[[], datetime],
        new_token: Callable[[], str] = lambda: secrets.token_urlsafe(32),
    ) -> None:
        if ttl <= 0:
            raise ValueError("a session ttl must be positive")
        self._users = users
        self._sessions = sessions
        self._passwords = passwords
        self._ttl = timedelta(seconds=ttl)
        self._wall_clock = wall_clock
        self._new_token = new_token

    async def login(self, name: str, password: str) -> tuple[str, LoggedIn]:
        """The new session's token and the session; `LoginFailed` for a wrong user
        name or password, or a disabled user (the same error for all three)."""
        user = None
        if 0 < len(name) <= MAX_USER_NAME:
            user = await self._users.get_by_name(name)
        if user is None or user.is_sso or len(password) > MAX_PASSWORD_LENGTH:
            # Single sign-on users have no password here: as slow as a wrong one.
            await self._passwords.verify_nobody(password)
            raise LoginFailed
        if not await self._passwords.verify(user.password_hash, password) or user.disabled:
            raise LoginFailed
        if self._passwords.needs_rehash(user.password_hash):
            # The cost parameters changed since this hash was made; the password is
            # at hand only now, so upgrade it now. Other sessions stay.
            new_hash = await self._passwords.hash(password)
            user = await self._users.set_password(user.name, new_hash, end_sessions=False)
        return await self.start(user)

    async def start(self, user: User) -> tuple[str, LoggedIn]:
        """A new session for `user`, whose identity the caller has checked (a password
        above, or the identity provider's ID token)."""
        now = self._wall_clock()
        await self._sessions.delete_expired(now)
        token = self._new_token()
        session = await self._sessions.create(
            session_id=session_id(token),
            user_id=user.id,
            csrf_token=secrets.token_urlsafe(32),
            created_at=now,
            expires_at=now + self._ttl,
        )
        return token, LoggedIn(user=user, session=session)

    async def resolve(self, token: str) -> LoggedIn | None:
        """The session this cookie token opens, or None when it opens none (unknown,
        expired, or its user is gone or disabled)."""
        if not token or len(token) > _MAX_TOKEN:
            return None
        sid = session_id(token)
        session = await self._sessions.get(sid)
        if session is None:
            return None
        now = self._wall_clock()
        if session.expires_at <= now:
            await self._sessions.delete(sid)
            return None
        user = await self._users.get(session.user_id)
        if user is None or user.disabled:
            await self._sessions.delete(sid)
            return None
        if now - session.last_seen_at >= TOUCH_INTERVAL:
            await self._sessions.touch(sid, now)
        return LoggedIn(user=user, session=session)

    async def logout(self, session: AdminSession) -> None:
        """End the session; logging out twice is harmless."""
        await self._sessions.delete(session.id)
