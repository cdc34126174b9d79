"""Storing teams and their members: create, find, list, change, remove.

A team's name is unique. Changing a team's limits also moves `updated_at` of
the team's keys, in the same transaction, so routers' key caches (which poll
keys by `updated_at` and read each key with its team) pick up the new limits at
their next poll. Members are users named by their user name; a user may be in
several teams, with one role in each.

Not guaranteed: that a member's user exists now (users are disabled, never
deleted, so a name keeps pointing at the same person).
"""

from __future__ import annotations

import builtins
import dataclasses
import re
import secrets
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import RowMapping, delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from llmgw.store.engine import transaction
from llmgw.store.errors import Conflict, InvalidValue, NotFound
from llmgw.store.models import (
    BUDGET_PERIODS,
    TEAM_ROLES,
    BudgetPeriod,
    Team,
    TeamLimits,
    TeamMember,
    TeamRole,
)
from llmgw.store.tables import api_keys, team_members, teams, users

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_TICK = timedelta(microseconds=1)


def new_team_id() -> str:
    """A fresh team id: "team_" and 16 random hex digits."""
    return "team_" + secrets.token_hex(8)


def team_from_row(row: RowMapping) -> Team:
    models = row["models"]
    return Team(
        id=row["id"],
        name=row["name"],
        rpm=row["rpm"],
        tpm=row["tpm"],
        budget_tokens=row["budget_tokens"],
        budget_period=cast("BudgetPeriod | None", row["budget_period"]),
        models=tuple(models) if models is not None else None,
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


class TeamRepository:
    """Teams and members in the store; every method is one short transaction."""

    def __init__(
        self,
        *,
        engine: AsyncEngine,
        clock: Callable[[], datetime],
        new_id: Callable[[], str] = new_team_id,
    ) -> None:
        self._engine = engine
        self._clock = clock
        self._new_id = new_id

    async def create(self, name: str, limits: TeamLimits) -> Team:
        """A new team; `InvalidValue` for a bad name or limit, `Conflict` for a taken name."""
        _check_name(name)
        now = self._clock()
        team = _apply(
            Team(
                id=self._new_id(),
                name=name,
                rpm=None,
                tpm=None,
                budget_tokens=None,
                budget_period=None,
                models=None,
                created_at=now,
                updated_at=now,
            ),
            limits,
            now=now,
        )
        try:
            async with transaction(self._engine, f"creating team {name!r}") as conn:
                await _check_free(conn, name)
                await conn.execute(teams.insert().values(_to_row(team)))
        except IntegrityError as exc:
            raise Conflict(f"a team named {name!r} already exists; choose another name") from exc
        return team

    async def find(self, ref: str) -> Team | None:
        """The team with this id or name."""
        stmt = select(teams).where(or_(teams.c.id == ref, teams.c.name == ref))
        async with transaction(self._engine, f"finding team {ref!r}") as conn:
            row = (await conn.execute(stmt)).first()
        return team_from_row(row._mapping) if row is not None else None

    async def get(self, ref: str) -> Team:
        """The team with this id or name; `NotFound` naming how to list them otherwise."""
        team = await self.find(ref)
        if team is None:
            raise NotFound(f"there is no team {ref!r}; `llmgw teams list` shows the teams")
        return team

    async def list(self) -> builtins.list[Team]:
        """All teams, by name."""
        async with transaction(self._engine, "listing teams") as conn:
            rows = await conn.execute(select(teams).order_by(teams.c.name))
            return [team_from_row(row._mapping) for row in rows]

    async def update(self, ref: str, limits: TeamLimits) -> Team:
        """Change a team's name or limits (fields at `KEEP` stay); returns it after.

        The team's keys are touched too, so routers re-read them with the new limits.
        """
        if not limits.changed():
            raise InvalidValue(
                "a team update must change at least one of name, rpm, tpm, budget_tokens, "
                "budget_period or models"
            )
        async with transaction(self._engine, f"updating team {ref!r}") as conn:
            team = await _get(conn, ref)
            now = max(self._clock(), team.updated_at + _TICK)
            after = _apply(team, limits, now=now)
            if after.name != team.name:
                _check_name(after.name)
                await _check_free(conn, after.name)
            await conn.execute(update(teams).where(teams.c.id == team.id).values(_to_row(after)))
            await _touch_keys(conn, team.id, now)
        return after

    async def remove(self, ref: str) -> Team:
        """Remove a team and its memberships; `Conflict` while active keys belong to it."""
        async with transaction(self._engine, f"removing team {ref!r}") as conn:
            team = await _get(conn, ref)
            rows = await conn.execute(
                select(api_keys.c.name).where(
                    api_keys.c.team_id == team.id, api_keys.c.revoked_at.is_(None)
                )
            )
            names = [row.name for row in rows]
            if names:
                raise Conflict(
                    f"team {team.name!r} still has {len(names)} active key(s) "
                    f"({', '.join(sorted(names))}); revoke them or move them to another team "
                    "(llmgw keys update KEY --team T | --no-team) first"
                )
            await conn.execute(delete(team_members).where(team_members.c.team_id == team.id))
            await conn.execute(delete(teams).where(teams.c.id == team.id))
            # Revoked keys keep pointing at nothing: clear them so a new team cannot inherit them.
            await conn.execute(
                update(api_keys).where(api_keys.c.team_id == team.id).values(team_id=None)
            )
        return team

    async def add_member(self, ref: str, user_name: str, role: str) -> TeamMember:
        """Put a user in a team with `role`, or change their role if already in it."""
        checked = _check_role(role)
        async with transaction(self._engine, f"adding {user_name!r} to team {ref!r}") as conn:
            team = await _get(conn, ref)
            found = await conn.execute(select(users.c.id).where(users.c.name == user_name))
            if found.first() is None:
                raise NotFound(
                    f"there is no user {user_name!r}; create it first (llmgw users create)"
                )
            member = TeamMember(
                team_id=team.id, user_name=user_name, role=checked, added_at=self._clock()
            )
            where = (team_members.c.team_id == team.id, team_members.c.user_name == user_name)
            changed = await conn.execute(update(team_members).where(*where).values(role=checked))
            if changed.rowcount == 0:
                await conn.execute(team_members.insert().values(dataclasses.asdict(member)))
        return member

    async def remove_member(self, ref: str, user_name: str) -> Team:
        """Take a user out of a team; `NotFound` if they were not in it."""
        async with transaction(self._engine, f"removing {user_name!r} from team {ref!r}") as conn:
            team = await _get(conn, ref)
            removed = await conn.execute(
                delete(team_members).where(
                    team_members.c.team_id == team.id, team_members.c.user_name == user_name
                )
            )
            if removed.rowcount == 0:
                raise NotFound(f"user {user_name!r} is not a member of team {team.name!r}")
        return team

    async def members(self, ref: str) -> builtins.list[TeamMember]:
        """The team's members, by user name."""
        async with transaction(self._engine, f"reading the members of team {ref!r}") as conn:
            team = await _get(conn, ref)
            rows = await conn.execute(
                select(team_members)
                .where(team_members.c.team_id == team.id)
                .order_by(team_members.c.user_name)
            )
            return [_member(row._mapping) for row in rows]

    async def memberships(self, user_name: str) -> builtins.list[TeamMember]:
        """The teams a user is in, with the role in each."""
        async with transaction(self._engine, f"reading the teams of {user_name!r}") as conn:
            rows = await conn.execute(
                select(team_members).where(team_members.c.user_name == user_name)
            )
            return [_member(row._mapping) for row in rows]

    async def key_counts(self) -> dict[str, int]:
        """Active keys per team id."""
        stmt = (
            select(api_keys.c.team_id, func.count())
            .where(api_keys.c.team_id.is_not(None), api_keys.c.revoked_at.is_(None))
            .group_by(api_keys.c.team_id)
        )
        async with transaction(self._engine, "counting the teams' keys") as conn:
            return {row[0]: int(row[1]) for row in await conn.execute(stmt)}


async def _get(conn: AsyncConnection, ref: str) -> Team:
    row = (
        await conn.execute(select(teams).where(or_(teams.c.id == ref, teams.c.name == ref)))
    ).first()
    if row is None:
        raise NotFound(f"there is no team {ref!r}; `llmgw teams list` shows the teams")
    return team_from_row(row._mapping)


async def _check_free(conn: AsyncConnection, name: str) -> None:
    taken = (await conn.execute(select(teams.c.id).where(teams.c.name == name))).first()
    if taken is not None:
        raise Conflict(f"a team named {name!r} already exists; choose another name")


async def _touch_keys(conn: AsyncConnection, team_id: str, now: datetime) -> None:
    await conn.execute(
        update(api_keys)
        .where(api_keys.c.team_id == team_id, api_keys.c.updated_at < now)
        .values(updated_at=now)
    )


def _check_name(name: str) -> None:
    if not _NAME.match(name) or name.startswith("team_"):
        raise InvalidValue(
            f"team name {name!r} is not usable: 1 to 64 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit, and not starting with 'team_' (team ids do)"
        )


def _check_role(role: str) -> TeamRole:
    for known in TEAM_ROLES:
        if role == known:
            return known
    raise InvalidValue(f"team role {role!r} is not one of {', '.join(TEAM_ROLES)}")


def _apply(team: Team, limits: TeamLimits, *, now: datetime) -> Team:
    changed = limits.changed()
    for field in ("rpm", "tpm", "budget_tokens"):
        value = changed.get(field)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise InvalidValue(
                f"team {field} must be 1 or more (or unset for no limit), got {value}"
            )
    period = changed.get("budget_period")
    if period is not None and period not in BUDGET_PERIODS:
        raise InvalidValue(
            f"team budget_period must be one of {', '.join(BUDGET_PERIODS)}, got {period!r}"
        )
    after = dataclasses.replace(team, **cast("dict[str, Any]", changed), updated_at=now)
    if after.budget_tokens is not None and after.budget_period is None:
        raise InvalidValue(
            f"team {team.name!r} would have a budget of {after.budget_tokens} tokens without a "
            "budget period; set it to day or month too"
        )
    if after.budget_period is not None and after.budget_tokens is None:
        raise InvalidValue(
            f"team {team.name!r} would have budget period {after.budget_period!r} without a "
            "budget; set the budget's tokens too, or clear the period"
        )
    return after


def _to_row(team: Team) -> dict[str, Any]:
    row = dataclasses.asdict(team)
    row["models"] = list(team.models) if team.models is not None else None
    return row


def _member(row: RowMapping) -> TeamMember:
    return TeamMember(
        team_id=row["team_id"],
        user_name=row["user_name"],
        role=cast("TeamRole", row["role"]),
        added_at=row["added_at"],
    )
