"""Storing the people who log in to the admin pages, and their login sessions.

A user has a unique name, an argon2 password hash made by the caller (the store
never sees a password), an admin flag, and a disabled time once disabled. Users
are never deleted, so a session or a log line naming a user id always means the
same person; a disabled user keeps its name.

A session row is keyed by the SHA-256 of the cookie's token; the token itself
exists only in the browser, so a copy of the database cannot be used to log in.
Times of sessions come from the caller (the portal's wall clock), which also
decides what "expired" means; the store only compares.

Not guaranteed: that a session read is still valid when used; callers check
`expires_at` and the user's state on every request. Nothing here limits how many
sessions a user may hold.
"""

from __future__ import annotations

import builtins
import dataclasses
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import RowMapping, Select, delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from llmgw.store.engine import transaction
from llmgw.store.errors import AlreadyExists, InvalidValue, NotFound
from llmgw.store.models import ADMIN_ROLES, AdminRole, require_aware
from llmgw.store.tables import admin_sessions, users

MAX_USER_NAME = 64
_MAX_HASH = 255
_MAX_CSRF = 64
_MAX_SSO = 255
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
_LIST_HINT = "`llmgw users list` shows the names"


def new_user_id() -> str:
    """A fresh user id: "usr_" and 16 random hex digits."""
    return "usr_" + secrets.token_hex(8)


@dataclass(frozen=True, slots=True)
class User:
    """A person who may log in; `password_hash` is an argon2 encoding, never a password."""

    id: str
    name: str
    password_hash: str
    # What the user may do on the admin pages; None: log in, see nothing.
    admin_role: AdminRole | None
    created_at: datetime
    disabled_at: datetime | None
    # Set for users who sign in through OpenID Connect (their provider's issuer and
    # their `sub` there); such users have no password (`password_hash` is "").
    sso_issuer: str | None = None
    sso_subject: str | None = None

    @property
    def disabled(self) -> bool:
        return self.disabled_at is not None

    @property
    def is_sso(self) -> bool:
        """Whether the user signs in through single sign-on (and has no password)."""
        return self.sso_subject is not None

    @property
    def is_admin(self) -> bool:
        """Whether the user has the `admin` role (may do everything)."""
        return self.admin_role == "admin"


@dataclass(frozen=True, slots=True)
class AdminSession:
    """A login: `id` is the SHA-256 (hex) of the cookie's token."""

    id: str
    user_id: str
    csrf_token: str
    created_at: datetime
    expires_at: datetime
    last_seen_at: datetime


class UserRepository:
    """Users in the store; every method is one short transaction."""

    def __init__(
        self,
        *,
        engine: AsyncEngine,
        clock: Callable[[], datetime],
        new_id: Callable[[], str] = new_user_id,
    ) -> None:
        self._engine = engine
        self._clock = clock
        self._new_id = new_id

    async def create(self, name: str, password_hash: str, *, admin_role: AdminRole | None) -> User:
        """Store a new user; `AlreadyExists` when the name is taken (disabled users too)."""
        _check_name(name)
        _check_hash(password_hash)
        _check_role(admin_role)
        user = User(
            id=self._new_id(),
            name=name,
            password_hash=password_hash,
            admin_role=admin_role,
            created_at=self._clock(),
            disabled_at=None,
        )
        try:
            async with transaction(self._engine, f"creating user {name!r}") as conn:
                await conn.execute(users.insert().values(_user_row(user)))
        except IntegrityError as exc:
            raise AlreadyExists(
                f"a user named {name!r} already exists; choose another name "
                f"({_LIST_HINT}, disabled users included)"
            ) from exc
        return user

    async def sign_in_sso(
        self, *, issuer: str, subject: str, name: str, admin_role: AdminRole | None
    ) -> User:
        """The user `subject` of `issuer` with `admin_role`, created on first sign-in under
        `name` (no password); the role of one who exists is replaced by `admin_role`.

        `AlreadyExists` when `name` is taken by another user (local, or another
        subject): a sign-in never takes over an account it did not create.
        """
        _check_name(name)
        _check_role(admin_role)
        if not 0 < len(issuer) <= _MAX_SSO or not 0 < len(subject) <= _MAX_SSO:
            raise InvalidValue(f"an issuer and a subject must be 1 to {_MAX_SSO} characters")
        found = select(users).where(users.c.sso_issuer == issuer, users.c.sso_subject == subject)
        try:
            async with transaction(self._engine, f"signing in user {name!r}") as conn:
                user = await _select_user(conn, found)
                if user is not None:
                    await conn.execute(
                        update(users)
                        .where(users.c.id == user.id)
                        .values(admin_role=admin_role, admin=admin_role == "admin")
                    )
                    return dataclasses.replace(user, admin_role=admin_role)
                user = User(
                    id=self._new_id(),
                    name=name,
                    password_hash="",
                    admin_role=admin_role,
                    created_at=self._clock(),
                    disabled_at=None,
                    sso_issuer=issuer,
                    sso_subject=subject,
                )
                await conn.execute(users.insert().values(_user_row(user)))
        except IntegrityError as exc:
            raise AlreadyExists(
                f"the user name {name!r} is already taken by another user; an admin may "
                f"rename or disable that one ({_LIST_HINT})"
            ) from exc
        return user

    async def revoke_sso_role(self, *, issuer: str, subject: str) -> None:
        """Take the role away from the user `subject` of `issuer`, if there is one: their
        groups no longer map to any role. Their sessions then see nothing."""
        async with transaction(self._engine, "revoking a single sign-on role") as conn:
            await conn.execute(
                update(users)
                .where(users.c.sso_issuer == issuer, users.c.sso_subject == subject)
                .values(admin_role=None, admin=False)
            )

    async def get(self, user_id: str) -> User | None:
        """The user with this id, disabled or not."""
        return await self._one(select(users).where(users.c.id == user_id), "reading a user")

    async def get_by_name(self, name: str) -> User | None:
        """The user with this name, disabled or not."""
        stmt = select(users).where(users.c.name == name)
        return await self._one(stmt, f"reading user {name!r}")

    async def list(self) -> builtins.list[User]:
        """Every user, disabled ones included, oldest first."""
        stmt = select(users).order_by(users.c.created_at, users.c.name)
        async with transaction(self._engine, "listing users") as conn:
            return [_user(row._mapping) for row in await conn.execute(stmt)]

    async def disable(self, name: str) -> User:
        """Disable a user and end its sessions; disabling twice keeps the first time.

        `NotFound` when there is no such user.
        """
        now = self._clock()
        async with transaction(self._engine, f"disabling user {name!r}") as conn:
            user = await _select_user(conn, select(users).where(users.c.name == name))
            if user is None:
                raise NotFound(f"there is no user {name!r}; {_LIST_HINT}")
            await conn.execute(
                update(users)
                .where(users.c.id == user.id, users.c.disabled_at.is_(None))
                .values(disabled_at=now)
            )
            await conn.execute(delete(admin_sessions).where(admin_sessions.c.user_id == user.id))
            user = await _select_user(conn, select(users).where(users.c.id == user.id))
        assert user is not None
        return user

    async def set_role(self, name: str, admin_role: AdminRole | None) -> User:
        """Give a user another role (None: no admin access); `NotFound` when there is no
        such user. Sessions stay: each request reads the user's role afresh."""
        _check_role(admin_role)
        async with transaction(self._engine, f"setting the role of {name!r}") as conn:
            user = await _select_user(conn, select(users).where(users.c.name == name))
            if user is None:
                raise NotFound(f"there is no user {name!r}; {_LIST_HINT}")
            await conn.execute(
                update(users)
                .where(users.c.id == user.id)
                .values(admin_role=admin_role, admin=admin_role == "admin")
            )
        return dataclasses.replace(user, admin_role=admin_role)

    async def set_password(self, name: str, password_hash: str, *, end_sessions: bool) -> User:
        """Replace a user's password hash; `NotFound` when there is no such user.

        `end_sessions` logs the user out everywhere (a changed password should);
        an upgrade of the hash's parameters at login keeps them.
        """
        _check_hash(password_hash)
        async with transaction(self._engine, f"setting the password of {name!r}") as conn:
            user = await _select_user(conn, select(users).where(users.c.name == name))
            if user is None:
                raise NotFound(f"there is no user {name!r}; {_LIST_HINT}")
            if user.is_sso:
                raise InvalidValue(
                    f"user {name!r} signs in through single sign-on and has no password here; "
                    "change it at the identity provider"
                )
            await conn.execute(
                update(users).where(users.c.id == user.id).values(password_hash=password_hash)
            )
            if end_sessions:
                await conn.execute(
                    delete(admin_sessions).where(admin_sessions.c.user_id == user.id)
                )
        return dataclasses.replace(user, password_hash=password_hash)

    async def _one(self, stmt: Select[Any], what: str) -> User | None:
        async with transaction(self._engine, what) as conn:
            return await _select_user(conn, stmt)


class SessionRepository:
    """Admin login sessions; times are the caller's, every method is one transaction."""

    def __init__(self, *, engine: AsyncEngine) -> None:
        self._engine = engine

    async def create(
        self,
        *,
        session_id: str,
        user_id: str,
        csrf_token: str,
        created_at: datetime,
        expires_at: datetime,
    ) -> AdminSession:
        """Store a session; `NotFound` when the user does not exist."""
        if not _SHA256_HEX.match(session_id):
            raise InvalidValue("session_id must be the SHA-256 of the token in lowercase hex")
        if not csrf_token or len(csrf_token) > _MAX_CSRF:
            raise InvalidValue(f"csrf_token must be 1 to {_MAX_CSRF} characters")
        require_aware("created_at", created_at)
        require_aware("expires_at", expires_at)
        session = AdminSession(
            id=session_id,
            user_id=user_id,
            csrf_token=csrf_token,
            created_at=created_at,
            expires_at=expires_at,
            last_seen_at=created_at,
        )
        try:
            async with transaction(self._engine, "creating a session") as conn:
                await conn.execute(admin_sessions.insert().values(_session_row(session)))
        except IntegrityError as exc:
            # The only foreign key is the user; a clashing 256-bit token hash is not
            # a thing that happens.
            raise NotFound(f"cannot create a session for user {user_id}: no such user") from exc
        return session

    async def get(self, session_id: str) -> AdminSession | None:
        """The session with this id (token hash), expired or not."""
        stmt = select(admin_sessions).where(admin_sessions.c.id == session_id)
        async with transaction(self._engine, "reading a session") as conn:
            row = (await conn.execute(stmt)).first()
        return _session(row._mapping) if row is not None else None

    async def touch(self, session_id: str, now: datetime) -> None:
        """Record that the session was used at `now`; nothing if it is gone."""
        require_aware("now", now)
        async with transaction(self._engine, "recording a session's use") as conn:
            await conn.execute(
                update(admin_sessions)
                .where(admin_sessions.c.id == session_id)
                .values(last_seen_at=now)
            )

    async def delete(self, session_id: str) -> bool:
        """End a session; False when there was none."""
        async with transaction(self._engine, "ending a session") as conn:
            result = await conn.execute(
                delete(admin_sessions).where(admin_sessions.c.id == session_id)
            )
        return bool(result.rowcount)

    async def delete_for_user(self, user_id: str) -> int:
        """End every session of one user; how many there were."""
        async with transaction(self._engine, "ending a user's sessions") as conn:
            result = await conn.execute(
                delete(admin_sessions).where(admin_sessions.c.user_id == user_id)
            )
        return int(result.rowcount)

    async def delete_expired(self, now: datetime) -> int:
        """Remove sessions whose expiry is at or before `now`; how many were removed."""
        require_aware("now", now)
        async with transaction(self._engine, "removing expired sessions") as conn:
            result = await conn.execute(
                delete(admin_sessions).where(admin_sessions.c.expires_at <= now)
            )
        return int(result.rowcount)


def _check_name(name: str) -> None:
    if not name or len(name) > MAX_USER_NAME:
        raise InvalidValue(f"user name must be 1 to {MAX_USER_NAME} characters, got {name!r}")


def _check_role(role: object) -> None:
    if role is not None and role not in ADMIN_ROLES:
        raise InvalidValue(
            f"a user's role must be one of {', '.join(ADMIN_ROLES)} or none, got {role!r}"
        )


def _check_hash(password_hash: str) -> None:
    if not password_hash.startswith("$") or len(password_hash) > _MAX_HASH:
        raise InvalidValue("password_hash must be a password hash encoding such as $argon2id$...")


async def _select_user(conn: AsyncConnection, stmt: Select[Any]) -> User | None:
    row = (await conn.execute(stmt)).first()
    return _user(row._mapping) if row is not None else None


def _user_row(user: User) -> dict[str, Any]:
    return {
        "id": user.id,
        "name": user.name,
        "password_hash": user.password_hash,
        # `admin` is kept for readers of the table that predate roles.
        "admin": user.is_admin,
        "admin_role": user.admin_role,
        "created_at": user.created_at,
        "disabled_at": user.disabled_at,
        "sso_issuer": user.sso_issuer,
        "sso_subject": user.sso_subject,
    }


def _user(row: RowMapping) -> User:
    return User(
        id=row["id"],
        name=row["name"],
        password_hash=row["password_hash"],
        admin_role=cast("AdminRole | None", row["admin_role"]),
        created_at=row["created_at"],
        disabled_at=row["disabled_at"],
        sso_issuer=row["sso_issuer"],
        sso_subject=row["sso_subject"],
    )


def _session_row(session: AdminSession) -> dict[str, Any]:
    return {
        "id": session.id,
        "user_id": session.user_id,
        "csrf_token": session.csrf_token,
        "created_at": session.created_at,
        "expires_at": session.expires_at,
        "last_seen_at": session.last_seen_at,
    }


def _session(row: RowMapping) -> AdminSession:
    return AdminSession(
        id=row["id"],
        user_id=row["user_id"],
        csrf_token=row["csrf_token"],
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        last_seen_at=row["last_seen_at"],
    )
