"""Storing API keys: create, look up by secret hash, list, update, revoke, rotate.

The store keeps a key's SHA-256 hash and a short prefix, never the secret itself:
making and hashing the secret is the caller's job. Names are unique among keys
that are not revoked (a partial unique index enforces it, so two servers creating
the same name at once get one key and one `Conflict`).

An update reads the key, checks the result, and writes only the fields it
changes, on condition that the row is still as read (same `updated_at`, not
revoked); a concurrent change makes it read again, so two updates of different
fields both apply and neither can leave a budget without a period.

Not guaranteed: that `changed_since` sees a change made on another server whose
clock runs behind this one's, or committed after the caller's poll started with an
earlier timestamp. Pollers should pass a cursor a few seconds before the newest
`updated_at` they have seen; the overlap costs only re-reading a few keys.
"""

from __future__ import annotations

import builtins
import dataclasses
import math
import re
import secrets
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

from sqlalchemy import RowMapping, Select, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from llmgw.store.engine import transaction
from llmgw.store.errors import Ambiguous, Conflict, InvalidValue, NotFound
from llmgw.store.models import (
    ADMIN_ROLES,
    BUDGET_PERIODS,
    KEY_PRIORITIES,
    KEY_SCOPES,
    AdminRole,
    ApiKey,
    BudgetPeriod,
    Keep,
    KeyChanges,
    KeyPriority,
    KeyScope,
    NewApiKey,
    Team,
    require_aware,
)
from llmgw.store.tables import api_keys, teams
from llmgw.store.teams import team_from_row

T = TypeVar("T")

_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
_MAX_NAME = 200
_MAX_PREFIX = 32
# Read-check-write rounds an update tries while other writers keep changing the key.
_UPDATE_ATTEMPTS = 5
_TICK = timedelta(microseconds=1)
# The limits a key stores as counts (None: no limit); none may be negative.
_LIMITS = ("rpm", "tpm", "budget_tokens", "user_rpm", "user_tpm", "user_budget_tokens")


def new_key_id() -> str:
    """A fresh key id: "key_" and 16 random hex digits."""
    return "key_" + secrets.token_hex(8)


class KeyRepository:
    """API keys in the store; every method is one short transaction."""

    def __init__(
        self,
        *,
        engine: AsyncEngine,
        clock: Callable[[], datetime],
        new_id: Callable[[], str] = new_key_id,
    ) -> None:
        self._engine = engine
        self._clock = clock
        self._new_id = new_id

    async def create(self, spec: NewApiKey) -> ApiKey:
        """Store a new key; `Conflict` if an active key has the same name (or hash)."""
        _validate(spec)
        now = self._clock()
        key = ApiKey(
            id=self._new_id(),
            name=spec.name,
            prefix=spec.prefix,
            secret_hash=spec.secret_hash,
            models=tuple(spec.models) if spec.models is not None else None,
            rpm=spec.rpm,
            tpm=spec.tpm,
            budget_tokens=spec.budget_tokens,
            budget_period=spec.budget_period,
            expires_at=spec.expires_at,
            admin_role=spec.admin_role,
            priority=spec.priority,
            weight=spec.weight,
            max_queue_wait=spec.max_queue_wait,
            scopes=spec.scopes,
            team_id=spec.team_id,
            user_rpm=spec.user_rpm,
            user_tpm=spec.user_tpm,
            user_budget_tokens=spec.user_budget_tokens,
            created_at=now,
            updated_at=now,
            revoked_at=None,
        )
        try:
            async with transaction(self._engine, f"creating key {spec.name!r}") as conn:
                await self._check_name_free(conn, spec.name)
                team = await _team_of(conn, spec.team_id)
                await conn.execute(api_keys.insert().values(_to_row(key)))
        except IntegrityError as exc:
            raise await self._conflict_for(spec.name, exc) from exc
        return dataclasses.replace(key, team=team)

    async def get(self, key_id: str) -> ApiKey | None:
        """The key with this id, revoked or not."""
        return await self._one(select(api_keys).where(api_keys.c.id == key_id), "reading a key")

    async def get_by_hash(self, secret_hash: str) -> ApiKey | None:
        """The key whose secret hashes to `secret_hash`, revoked or expired ones included.

        Callers check `ApiKey.is_active` so they can tell "revoked" from "unknown".
        """
        stmt = select(api_keys).where(api_keys.c.secret_hash == secret_hash)
        return await self._one(stmt, "looking a key up by its hash")

    async def find(self, ref: str) -> ApiKey | None:
        """The key named by an id, a name or a prefix, as people type them.

        An exact id wins; otherwise a single active key with that name or prefix;
        otherwise a single revoked one. `Ambiguous` if several keys fit equally.
        """
        stmt = select(api_keys).where(
            or_(api_keys.c.id == ref, api_keys.c.name == ref, api_keys.c.prefix == ref)
        )
        async with transaction(self._engine, f"finding key {ref!r}") as conn:
            found = [_from_row(row._mapping) for row in await conn.execute(stmt)]
            found = await _with_teams(conn, found)
        for key in found:
            if key.id == ref:
                return key
        for candidates in ([k for k in found if not k.revoked], [k for k in found if k.revoked]):
            if len(candidates) == 1:
                return candidates[0]
            if len(candidates) > 1:
                listed = ", ".join(f"{k.id} ({k.name}, {k.prefix})" for k in candidates)
                raise Ambiguous(f"{ref!r} matches several keys: {listed}; use the key id")
        return None

    async def revoke(self, key_id: str) -> ApiKey:
        """Revoke a key (`NotFound` if there is none); revoking twice keeps the first time."""
        now = self._clock()
        async with transaction(self._engine, f"revoking key {key_id}") as conn:
            await conn.execute(
                update(api_keys)
                .where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
                .values(revoked_at=now, updated_at=now)
            )
            key = await _select_one(conn, select(api_keys).where(api_keys.c.id == key_id))
        if key is None:
            raise NotFound(f"there is no key {key_id!r}; `llmgw keys list` shows the ids")
        return key

    async def rotate(self, key_id: str, *, new_prefix: str, new_hash: str) -> ApiKey:
        """Replace a key's secret (prefix and hash), keeping its id, name and limits.

        The old secret stops working as soon as this commits (and caches refresh).
        `NotFound` for an unknown key, `Conflict` for a revoked one.
        """
        _validate_secret(new_prefix, new_hash)
        now = self._clock()
        try:
            async with transaction(self._engine, f"rotating key {key_id}") as conn:
                key = await _select_one(conn, select(api_keys).where(api_keys.c.id == key_id))
                if key is None:
                    raise NotFound(f"there is no key {key_id!r}; `llmgw keys list` shows the ids")
                if key.revoked:
                    raise Conflict(
                        f"key {key_id} ({key.name!r}) is revoked and cannot be rotated; "
                        "create a new key instead"
                    )
                await conn.execute(
                    update(api_keys)
                    .where(api_keys.c.id == key_id)
                    .values(prefix=new_prefix, secret_hash=new_hash, updated_at=now)
                )
        except IntegrityError as exc:
            raise Conflict(f"rotating key {key_id}: another key already has this secret") from exc
        return dataclasses.replace(key, prefix=new_prefix, secret_hash=new_hash, updated_at=now)

    async def update(self, key_id: str, changes: KeyChanges) -> ApiKey:
        """Change a key's name, models, limits, expiry or admin flag; returns the key after.

        Fields of `changes` left at `KEEP` stay as stored; the secret, id and
        creation time never change. `updated_at` moves forward (past its old
        value even if this server's clock is behind), so routers' caches pick
        the change up at their next poll. `InvalidValue` for a value `create`
        would refuse, an empty change, or a budget left without a period (or a
        period without a budget); `NotFound` for an unknown key; `Conflict` for
        a revoked key, or a name another active key has.
        """
        _validate_changes(changes)
        what = f"updating key {key_id}"
        for _ in range(_UPDATE_ATTEMPTS):
            try:
                async with transaction(self._engine, what) as conn:
                    key = await _select_one(conn, select(api_keys).where(api_keys.c.id == key_id))
                    if key is None:
                        raise NotFound(
                            f"there is no key {key_id!r}; `llmgw keys list` shows the ids"
                        )
                    if key.revoked:
                        raise Conflict(
                            f"key {key_id} ({key.name!r}) is revoked and cannot be changed; "
                            "create a new key instead"
                        )
                    # Strictly later than the row's last change, even on a server whose
                    # clock runs behind: the write's condition and the routers' caches
                    # both tell versions apart by `updated_at`.
                    now = max(self._clock(), key.updated_at + _TICK)
                    after = _apply(key, changes, now=now)
                    if after.name != key.name:
                        await self._check_name_free(conn, after.name, other_than=key_id)
                    after = dataclasses.replace(after, team=await _team_of(conn, after.team_id))
                    written = await conn.execute(
                        update(api_keys)
                        .where(
                            api_keys.c.id == key_id,
                            api_keys.c.revoked_at.is_(None),
                            api_keys.c.updated_at == key.updated_at,
                        )
                        .values(_changed_columns(after, changes))
                    )
            except IntegrityError as exc:
                # Only the active-name index can refuse an update: another writer
                # took the new name between the check and the write.
                name = changes.name if isinstance(changes.name, str) else None
                raise await self._conflict_for(name, exc, what=what, other_than=key_id) from exc
            if written.rowcount == 1:
                return after
        raise Conflict(
            f"{what}: the key changed {_UPDATE_ATTEMPTS} times while this update was being "
            "applied; look at it again (`llmgw keys list`) and retry"
        )

    async def changed_since(self, ts: datetime) -> builtins.list[ApiKey]:
        """Keys created, updated, revoked or rotated at or after `ts`, oldest change first.

        Inclusive, so a change made in the same instant as the caller's cursor is
        not lost; re-reading it is harmless.
        """
        require_aware("since", ts)
        stmt = (
            select(api_keys)
            .where(api_keys.c.updated_at >= ts)
            .order_by(api_keys.c.updated_at, api_keys.c.id)
        )
        return await self._many(stmt, "reading changed keys")

    async def list(
        self, *, include_revoked: bool = False, team_id: str | None = None
    ) -> builtins.list[ApiKey]:
        """All keys (of team `team_id` when given), oldest first; revoked ones only when asked."""
        stmt = select(api_keys).order_by(api_keys.c.created_at, api_keys.c.id)
        if team_id is not None:
            stmt = stmt.where(api_keys.c.team_id == team_id)
        if not include_revoked:
            stmt = stmt.where(api_keys.c.revoked_at.is_(None))
        return await self._many(stmt, "listing keys")

    async def _one(self, stmt: Select[Any], what: str) -> ApiKey | None:
        async with transaction(self._engine, what) as conn:
            return await _select_one(conn, stmt)

    async def _many(self, stmt: Select[Any], what: str) -> builtins.list[ApiKey]:
        async with transaction(self._engine, what) as conn:
            found = [_from_row(row._mapping) for row in await conn.execute(stmt)]
            return await _with_teams(conn, found)

    async def _check_name_free(
        self, conn: AsyncConnection, name: str, *, other_than: str | None = None
    ) -> None:
        stmt = select(api_keys.c.id).where(api_keys.c.name == name, api_keys.c.revoked_at.is_(None))
        if other_than is not None:
            stmt = stmt.where(api_keys.c.id != other_than)
        existing = (await conn.execute(stmt)).scalar_one_or_none()
        if existing is not None:
            raise Conflict(
                f"an active key named {name!r} already exists ({existing}); "
                "revoke it or choose another name"
            )

    async def _conflict_for(
        self,
        name: str | None,
        exc: IntegrityError,
        *,
        what: str | None = None,
        other_than: str | None = None,
    ) -> Conflict:
        # The pre-check passed, so another writer won a race, or the hash collides.
        what = what or f"creating key {name!r}"
        if name is not None:
            async with transaction(self._engine, what) as conn:
                try:
                    await self._check_name_free(conn, name, other_than=other_than)
                except Conflict as conflict:
                    return conflict
        if other_than is not None:
            return Conflict(f"{what}: the database refused the change ({exc.orig}); retry")
        return Conflict(f"{what}: another key already has this secret ({exc.orig})")


def _validate(spec: NewApiKey) -> None:
    if not spec.name or len(spec.name) > _MAX_NAME:
        raise InvalidValue(f"key name must be 1 to {_MAX_NAME} characters, got {spec.name!r}")
    _validate_secret(spec.prefix, spec.secret_hash)
    for field in _LIMITS:
        value = getattr(spec, field)
        if value is not None and value < 0:
            raise InvalidValue(f"{field} must be zero or more (or unset for no limit), got {value}")
    if spec.budget_period is not None and spec.budget_period not in BUDGET_PERIODS:
        raise InvalidValue(
            f"budget_period must be one of {', '.join(BUDGET_PERIODS)} or unset, "
            f"got {spec.budget_period!r}"
        )
    require_aware("expires_at", spec.expires_at)
    _validate_queueing(spec.priority, spec.weight, spec.max_queue_wait)
    _validate_scopes(spec.scopes)
    _validate_role(spec.admin_role)


def _validate_role(role: object) -> None:
    if isinstance(role, str) and role not in ADMIN_ROLES:
        raise InvalidValue(
            f"admin_role takes {', '.join(ADMIN_ROLES)}, got {role!r}; leave it unset for a "
            "key without admin access"
        )


def _validate_scopes(scopes: object) -> None:
    if isinstance(scopes, tuple):
        for scope in scopes:
            if scope not in KEY_SCOPES:
                raise InvalidValue(
                    f"scopes takes {', '.join(KEY_SCOPES)}, got {scope!r}; leave it empty "
                    "for a key that only calls models"
                )


def _validate_queueing(priority: object, weight: object, max_queue_wait: object) -> None:
    if isinstance(priority, str) and priority not in KEY_PRIORITIES:
        raise InvalidValue(f"priority must be one of {', '.join(KEY_PRIORITIES)}, got {priority!r}")
    if isinstance(weight, int | float) and not (0 < weight < math.inf):
        raise InvalidValue(f"weight must be more than 0, got {weight}")
    if isinstance(max_queue_wait, int | float) and not (0 <= max_queue_wait < math.inf):
        raise InvalidValue(
            f"max_queue_wait must be 0 or more seconds (or unset), got {max_queue_wait}"
        )


def _validate_changes(changes: KeyChanges) -> None:
    changed = changes.changed()
    if not changed:
        raise InvalidValue(
            "a key update must change at least one of name, models, rpm, tpm, "
            "budget_tokens, budget_period, expires_at, admin_role, priority, weight, "
            "max_queue_wait, scopes, team_id, user_rpm, user_tpm or user_budget_tokens"
        )
    if isinstance(changes.name, str) and (not changes.name or len(changes.name) > _MAX_NAME):
        raise InvalidValue(f"key name must be 1 to {_MAX_NAME} characters, got {changes.name!r}")
    for field in _LIMITS:
        value = changed.get(field)
        if isinstance(value, int) and value < 0:
            raise InvalidValue(f"{field} must be zero or more (or None for no limit), got {value}")
    period = changes.budget_period
    if isinstance(period, str) and period not in BUDGET_PERIODS:
        raise InvalidValue(
            f"budget_period must be one of {', '.join(BUDGET_PERIODS)} or None, got {period!r}"
        )
    if isinstance(changes.expires_at, datetime):
        require_aware("expires_at", changes.expires_at)
    _validate_queueing(changes.priority, changes.weight, changes.max_queue_wait)
    _validate_scopes(changes.scopes)
    _validate_role(changes.admin_role)


def _apply(key: ApiKey, changes: KeyChanges, *, now: datetime) -> ApiKey:
    """`key` with `changes` applied, refused if its budget would lack a period or vice versa."""
    after = dataclasses.replace(
        key,
        name=_pick(changes.name, key.name),
        models=_pick(changes.models, key.models),
        rpm=_pick(changes.rpm, key.rpm),
        tpm=_pick(changes.tpm, key.tpm),
        budget_tokens=_pick(changes.budget_tokens, key.budget_tokens),
        budget_period=_pick(changes.budget_period, key.budget_period),
        expires_at=_pick(changes.expires_at, key.expires_at),
        admin_role=_pick(changes.admin_role, key.admin_role),
        priority=_pick(changes.priority, key.priority),
        weight=_pick(changes.weight, key.weight),
        max_queue_wait=_pick(changes.max_queue_wait, key.max_queue_wait),
        scopes=_pick(changes.scopes, key.scopes),
        team_id=_pick(changes.team_id, key.team_id),
        user_rpm=_pick(changes.user_rpm, key.user_rpm),
        user_tpm=_pick(changes.user_tpm, key.user_tpm),
        user_budget_tokens=_pick(changes.user_budget_tokens, key.user_budget_tokens),
        updated_at=now,
    )
    if after.budget_tokens is not None and after.budget_period is None:
        raise InvalidValue(
            f"key {key.id} would have a budget of {after.budget_tokens} tokens without a "
            "budget_period; set budget_period to day or month too"
        )
    if after.budget_period is not None and after.budget_tokens is None:
        raise InvalidValue(
            f"key {key.id} would have budget_period {after.budget_period!r} without "
            "budget_tokens; set budget_tokens too, or clear budget_period"
        )
    return after


def _pick(new: T | Keep, old: T) -> T:
    return old if isinstance(new, Keep) else new


def _changed_columns(after: ApiKey, changes: KeyChanges) -> dict[str, Any]:
    row = _to_row(after)
    columns = {field: row[field] for field in (*changes.changed(), "updated_at")}
    if "admin_role" in columns:
        columns["is_admin"] = row["is_admin"]
    return columns


def _validate_secret(prefix: str, secret_hash: str) -> None:
    if not prefix or len(prefix) > _MAX_PREFIX:
        raise InvalidValue(f"key prefix must be 1 to {_MAX_PREFIX} characters, got {prefix!r}")
    if not _SHA256_HEX.match(secret_hash):
        raise InvalidValue("secret_hash must be the SHA-256 of the secret in lowercase hex")


async def _select_one(conn: AsyncConnection, stmt: Select[Any]) -> ApiKey | None:
    row = (await conn.execute(stmt)).first()
    if row is None:
        return None
    key = _from_row(row._mapping)
    return (await _with_teams(conn, [key]))[0]


async def _team_of(conn: AsyncConnection, team_id: str | None) -> Team | None:
    """The team `team_id` names; `NotFound` if there is none (None: no team)."""
    if team_id is None:
        return None
    row = (await conn.execute(select(teams).where(teams.c.id == team_id))).first()
    if row is None:
        raise NotFound(f"there is no team {team_id!r}; `llmgw teams list` shows the teams")
    return team_from_row(row._mapping)


async def _with_teams(conn: AsyncConnection, keys: builtins.list[ApiKey]) -> builtins.list[ApiKey]:
    """`keys` with their teams attached (one query for all of them)."""
    wanted = {key.team_id for key in keys if key.team_id is not None}
    if not wanted:
        return keys
    rows = await conn.execute(select(teams).where(teams.c.id.in_(wanted)))
    by_id = {row.id: team_from_row(row._mapping) for row in rows}
    return [
        dataclasses.replace(key, team=by_id.get(key.team_id)) if key.team_id else key
        for key in keys
    ]


def _to_row(key: ApiKey) -> dict[str, Any]:
    return {
        "id": key.id,
        "name": key.name,
        "prefix": key.prefix,
        "secret_hash": key.secret_hash,
        "models": list(key.models) if key.models is not None else None,
        "rpm": key.rpm,
        "tpm": key.tpm,
        "budget_tokens": key.budget_tokens,
        "budget_period": key.budget_period,
        "expires_at": key.expires_at,
        # is_admin is kept for readers of the table that predate roles.
        "is_admin": key.is_admin,
        "admin_role": key.admin_role,
        "created_at": key.created_at,
        "updated_at": key.updated_at,
        "revoked_at": key.revoked_at,
        "priority": key.priority,
        "weight": key.weight,
        "max_queue_wait": key.max_queue_wait,
        "scopes": list(key.scopes) or None,
        "team_id": key.team_id,
        "user_rpm": key.user_rpm,
        "user_tpm": key.user_tpm,
        "user_budget_tokens": key.user_budget_tokens,
    }


def _from_row(row: RowMapping) -> ApiKey:
    models = row["models"]
    return ApiKey(
        id=row["id"],
        name=row["name"],
        prefix=row["prefix"],
        secret_hash=row["secret_hash"],
        models=tuple(models) if models is not None else None,
        rpm=row["rpm"],
        tpm=row["tpm"],
        budget_tokens=row["budget_tokens"],
        budget_period=cast("BudgetPeriod | None", row["budget_period"]),
        expires_at=row["expires_at"],
        admin_role=cast("AdminRole | None", row["admin_role"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        revoked_at=row["revoked_at"],
        priority=cast("KeyPriority", row["priority"]),
        weight=float(row["weight"]),
        max_queue_wait=row["max_queue_wait"],
        scopes=tuple(cast("list[KeyScope]", row["scopes"] or ())),
        team_id=row["team_id"],
        user_rpm=row["user_rpm"],
        user_tpm=row["user_tpm"],
        user_budget_tokens=row["user_budget_tokens"],
    )
