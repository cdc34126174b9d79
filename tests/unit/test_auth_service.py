"""Managing keys through `KeyService` on the real store (SQLite and PostgreSQL)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text
from store_fixtures import START, FakeClock, clock_fixture, store_fixture, target_fixture  # noqa: F401

from llmgw.auth import KeyInputError, KeyService
from llmgw.store import Ambiguous, Conflict, InvalidValue, NotFound, Store

FLAGS = {"budget_tokens": "--budget-tokens", "period": "--period", "expires_at": "--expires"}


def fixed_secrets(*secrets: str) -> Callable[[], str]:
    queue = list(secrets)
    return lambda: queue.pop(0)


async def raw_key_rows(store: Store) -> list[dict[str, Any]]:
    # Read the table itself, to see exactly what the store keeps.
    async with store._engine.connect() as conn:
        result = await conn.execute(text("SELECT * FROM api_keys"))
        return [dict(row._mapping) for row in result]


async def test_create_returns_the_secret_and_the_store_keeps_only_its_hash(
    store: Store, store_clock: FakeClock
) -> None:
    service = KeyService(keys=store.keys, wall_clock=store_clock)
    key, secret = await service.create(
        name="team-a",
        models=["llama-8b", " qwen-7b ", "llama-8b"],
        rpm=60,
        tpm=100_000,
        budget_tokens=1_000_000,
        period="month",
        expires_at=START + timedelta(days=30),
        admin_role="admin",
    )
    assert secret.startswith("sk-llmgw-")
    assert key.prefix == secret[:12]
    assert key.secret_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert key.models == ("llama-8b", "qwen-7b")
    assert (key.rpm, key.tpm, key.budget_tokens, key.budget_period) == (
        60,
        100_000,
        1_000_000,
        "month",
    )
    assert key.is_admin
    rows = await raw_key_rows(store)
    assert len(rows) == 1
    assert rows[0]["secret_hash"] == key.secret_hash
    for column, value in rows[0].items():
        assert secret not in str(value), f"the secret is stored in column {column}"
        assert secret[12:20] not in str(value), f"part of the secret is stored in {column}"


@pytest.mark.parametrize(
    ("kwargs", "field", "message"),
    [
        ({"name": ""}, "name", "name must be 1 to 200 characters"),
        ({"name": "x" * 201}, "name", "name must be 1 to 200 characters"),
        ({"rpm": 0}, "rpm", "rpm must be at least 1 (leave it out for no limit), got 0"),
        ({"tpm": -5}, "tpm", "tpm must be at least 1 (leave it out for no limit), got -5"),
        ({"budget_tokens": 100}, "budget_tokens", "--budget-tokens needs --period day|month"),
        ({"period": "day"}, "period", "--period only applies with --budget-tokens"),
        ({"budget_tokens": 1, "period": "week"}, "period", "--period must be day or month"),
        ({"models": []}, "models", "models lists no model"),
        ({"models": ["a", ""]}, "models", "models has an empty model name in ['a', '']"),
        ({"expires_at": START - timedelta(seconds=1)}, "expires_at", "--expires is in the past"),
        ({"expires_at": START.replace(tzinfo=None)}, "expires_at", "--expires needs a time zone"),
    ],
)
async def test_invalid_input_names_the_field(
    store: Store, store_clock: FakeClock, kwargs: dict[str, Any], field: str, message: str
) -> None:
    service = KeyService(keys=store.keys, wall_clock=store_clock)
    with pytest.raises(KeyInputError) as bad:
        await service.create(**{"name": "k", **kwargs})
    assert bad.value.field == field
    assert message in bad.value.render(FLAGS)
    assert await store.keys.list(include_revoked=True) == []


async def test_list_resolve_revoke_and_rotate(store: Store, store_clock: FakeClock) -> None:
    service = KeyService(keys=store.keys, wall_clock=store_clock)
    a, secret_a = await service.create(name="team-a")
    store_clock.advance(seconds=1)
    b, _ = await service.create(name="team-b")
    assert [k.name for k in await service.list()] == ["team-a", "team-b"]
    for ref in (a.id, "team-a", a.prefix, secret_a):
        assert (await service.resolve(ref)).id == a.id
    with pytest.raises(NotFound) as unknown:
        await service.resolve("nobody")
    assert "no key has the id, name or prefix 'nobody'" in str(unknown.value)

    store_clock.advance(seconds=1)
    rotated, new_secret = await service.rotate("team-b")
    assert rotated.id == b.id and new_secret != secret_a
    assert rotated.secret_hash == hashlib.sha256(new_secret.encode()).hexdigest()
    assert await store.keys.get_by_hash(b.secret_hash) is None

    revoked = await service.revoke("team-a")
    assert revoked.revoked_at == store_clock.now
    assert [k.name for k in await service.list()] == ["team-b"]
    assert [k.name for k in await service.list(include_revoked=True)] == ["team-a", "team-b"]
    with pytest.raises(Conflict):
        await service.rotate(a.id)
    store_clock.advance(seconds=1)
    again = await service.revoke(a.id)
    assert again.revoked_at == revoked.revoked_at


async def test_duplicate_names_and_ambiguous_prefixes(store: Store, store_clock: FakeClock) -> None:
    service = KeyService(
        keys=store.keys,
        wall_clock=store_clock,
        new_secret=fixed_secrets("sk-llmgw-AAA-first", "sk-llmgw-AAA-second", "sk-llmgw-BBB"),
    )
    await service.create(name="one")
    await service.create(name="two")
    with pytest.raises(Ambiguous):
        await service.resolve("sk-llmgw-AAA")
    with pytest.raises(Conflict) as clash:
        await service.create(name="one")
    assert "an active key named 'one' already exists" in str(clash.value)


async def test_update_sets_and_clears_fields_and_keeps_the_secret(
    store: Store, store_clock: FakeClock
) -> None:
    service = KeyService(keys=store.keys, wall_clock=store_clock)
    key, secret = await service.create(name="team-a", rpm=5, tpm=500)
    expires = START + timedelta(days=30)
    updated = await service.update(
        "team-a",
        name=" team-b ",
        models=["m1", " m2 ", "m1"],
        rpm=60,
        budget_tokens=1000,
        period="day",
        expires_at=expires,
        admin_role="admin",
    )
    assert (updated.name, updated.models, updated.rpm, updated.tpm) == (
        "team-b",
        ("m1", "m2"),
        60,
        500,
    )
    assert (updated.budget_tokens, updated.budget_period, updated.expires_at) == (
        1000,
        "day",
        expires,
    )
    assert updated.is_admin and updated.secret_hash == key.secret_hash
    assert (await service.resolve(secret)).id == key.id

    # A budget alone keeps the stored period; clearing the budget clears its period.
    assert (await service.update(key.id, budget_tokens=2000)).budget_period == "day"
    cleared = await service.update(
        secret, models=None, rpm=None, tpm=None, budget_tokens=None, expires_at=None
    )
    assert (cleared.models, cleared.rpm, cleared.tpm) == (None, None, None)
    assert (cleared.budget_tokens, cleared.budget_period, cleared.expires_at) == (None, None, None)
    assert (cleared.name, cleared.is_admin) == ("team-b", True)
    assert await store.keys.get(key.id) == cleared


@pytest.mark.parametrize(
    ("kwargs", "field", "message"),
    [
        ({"name": " "}, "name", "name must be 1 to 200 characters"),
        ({"rpm": 0}, "rpm", "rpm must be at least 1 (clear it for no limit), got 0"),
        ({"tpm": -1}, "tpm", "tpm must be at least 1 (clear it for no limit), got -1"),
        ({"budget_tokens": 0, "period": "day"}, "budget_tokens", "at least 1"),
        ({"budget_tokens": 100}, "budget_tokens", "--budget-tokens needs --period day|month"),
        ({"period": "day"}, "period", "--period only applies with --budget-tokens"),
        ({"period": "week"}, "period", "--period must be day or month, got 'week'"),
        ({"models": []}, "models", "models lists no model; clear it to allow every model"),
        ({"models": ["a", " "]}, "models", "models has an empty model name"),
        ({"expires_at": START}, "expires_at", "--expires is in the past"),
        ({"expires_at": START.replace(tzinfo=None)}, "expires_at", "--expires needs a time zone"),
        ({"rpm": 5, "ref": " "}, "ref", "ref is empty"),
    ],
)
async def test_invalid_updates_name_the_field(
    store: Store, store_clock: FakeClock, kwargs: dict[str, Any], field: str, message: str
) -> None:
    service = KeyService(keys=store.keys, wall_clock=store_clock)
    key, _ = await service.create(name="k")
    changes = {name: value for name, value in kwargs.items() if name != "ref"}
    with pytest.raises(KeyInputError) as bad:
        await service.update(kwargs.get("ref", "k"), **changes)
    assert bad.value.field == field
    assert message in bad.value.render(FLAGS)
    assert await store.keys.list(include_revoked=True) == [key]


async def test_update_refuses_revoked_unknown_and_taken_names(
    store: Store, store_clock: FakeClock
) -> None:
    service = KeyService(keys=store.keys, wall_clock=store_clock)
    a, _ = await service.create(name="a")
    await service.create(name="b")
    with pytest.raises(Conflict) as clash:
        await service.update("a", name="b")
    assert "an active key named 'b' already exists" in str(clash.value)
    with pytest.raises(NotFound):
        await service.update("nobody", rpm=5)
    await service.revoke("a")
    with pytest.raises(Conflict) as revoked:
        await service.update(a.id, rpm=5)
    assert f"key {a.id} ('a') is revoked and cannot be changed" in str(revoked.value)
    with pytest.raises(InvalidValue, match="must change at least one"):
        await service.update("b")
