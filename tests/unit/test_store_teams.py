"""Teams in the store (SQLite and PostgreSQL): limits, members, keys, and what routers see."""

from __future__ import annotations

import hashlib

import pytest
from store_fixtures import FakeClock, clock_fixture, store_fixture, target_fixture  # noqa: F401

from llmgw.store import (
    KEEP,
    Conflict,
    InvalidValue,
    KeyChanges,
    NewApiKey,
    NotFound,
    Store,
    TeamLimits,
)


def spec(name: str, team_id: str | None) -> NewApiKey:
    digest = hashlib.sha256(f"sk-{name}".encode()).hexdigest()
    return NewApiKey(name=name, prefix=name, secret_hash=digest, team_id=team_id)


async def test_a_key_is_read_with_its_team_and_a_team_change_reaches_the_key_poll(
    store: Store, store_clock: FakeClock
) -> None:
    team = await store.teams.create("ml", TeamLimits(rpm=10, models=("llama",)))
    key = await store.keys.create(spec("app", team.id))
    assert key.team == team
    assert (await store.keys.get_by_hash(key.secret_hash)) == key
    cursor = store_clock.advance(seconds=1)
    changed = await store.teams.update("ml", TeamLimits(rpm=None, tpm=500))
    assert (changed.rpm, changed.tpm, changed.models) == (None, 500, ("llama",))
    [seen] = await store.keys.changed_since(cursor)
    assert seen.id == key.id and seen.team == changed


async def test_team_limits_are_checked(store: Store) -> None:
    for limits, message in (
        (TeamLimits(rpm=0), "team rpm must be 1 or more"),
        (TeamLimits(budget_tokens=5), "without a budget period"),
        (TeamLimits(budget_period="day"), "without a budget"),
        (TeamLimits(budget_tokens=5, budget_period="week"), "day, month"),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidValue, match=message):
            await store.teams.create("t", limits)
    with pytest.raises(InvalidValue, match="not usable"):
        await store.teams.create("has space", TeamLimits())
    await store.teams.create("t", TeamLimits())
    with pytest.raises(Conflict, match="already exists"):
        await store.teams.create("t", TeamLimits())
    with pytest.raises(InvalidValue, match="must change at least one"):
        await store.teams.update("t", TeamLimits())
    assert (await store.teams.get("t")).rpm is None


async def test_members_and_removal(store: Store) -> None:
    team = await store.teams.create("ml", TeamLimits())
    with pytest.raises(NotFound, match="there is no user 'ann'"):
        await store.teams.add_member("ml", "ann", "member")
    await store.users.create("ann", "$argon2id$x", admin_role=None)
    with pytest.raises(InvalidValue, match="team role 'boss'"):
        await store.teams.add_member("ml", "ann", "boss")
    await store.teams.add_member("ml", "ann", "member")
    await store.teams.add_member(team.id, "ann", "team-admin")
    [member] = await store.teams.members("ml")
    assert (member.user_name, member.role) == ("ann", "team-admin")
    assert [m.team_id for m in await store.teams.memberships("ann")] == [team.id]
    key = await store.keys.create(spec("app", team.id))
    with pytest.raises(Conflict, match=r"still has 1 active key\(s\) \(app\)"):
        await store.teams.remove("ml")
    moved = await store.keys.update(key.id, KeyChanges(team_id=None))
    assert (moved.team_id, moved.team) == (None, None)
    await store.teams.remove("ml")
    assert await store.teams.list() == []
    assert await store.teams.memberships("ann") == []
    with pytest.raises(NotFound, match="there is no team 'ml'"):
        await store.keys.update(key.id, KeyChanges(team_id="ml", name=KEEP))
