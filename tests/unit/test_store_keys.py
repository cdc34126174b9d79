"""API keys in the store: create, look up, list, update, revoke, rotate, poll for changes."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import re
from datetime import UTC, datetime, timedelta

import pytest
from store_fixtures import START, FakeClock, clock_fixture, store_fixture, target_fixture  # noqa: F401

from llmgw.store import (
    Ambiguous,
    ApiKey,
    Conflict,
    InvalidValue,
    KeyChanges,
    NewApiKey,
    NotFound,
    Store,
)


def spec(name: str, secret: str | None = None, **limits: object) -> NewApiKey:
    secret = secret or f"sk-llmgw-{name}-secret"
    digest = hashlib.sha256(secret.encode()).hexdigest()
    return NewApiKey(name=name, prefix=secret[:12], secret_hash=digest, **limits)  # type: ignore[arg-type]


async def test_a_created_key_reads_back_identically(store: Store) -> None:
    expires = datetime(2025, 6, 1, 8, 30, tzinfo=UTC)
    created = await store.keys.create(
        spec(
            "team-a",
            models=("llama-8b", "qwen-7b"),
            rpm=60,
            tpm=100_000,
            budget_tokens=5_000_000_000,
            budget_period="month",
            expires_at=expires,
            admin_role="admin",
        )
    )
    assert re.fullmatch(r"key_[0-9a-f]{16}", created.id)
    assert created.created_at == created.updated_at == START
    assert created.revoked_at is None
    assert await store.keys.get(created.id) == created
    assert await store.keys.get_by_hash(created.secret_hash) == created
    assert created.models == ("llama-8b", "qwen-7b")
    assert created.budget_tokens == 5_000_000_000
    assert created.expires_at == expires
    assert created.is_active(START) and not created.is_active(expires)
    assert created.allows_model("qwen-7b") and not created.allows_model("other")


async def test_unlimited_and_no_model_keys_keep_their_meaning(store: Store) -> None:
    open_key = await store.keys.create(spec("all-models"))
    no_models = await store.keys.create(spec("no-models", models=()))
    open_read = await store.keys.get(open_key.id)
    none_read = await store.keys.get(no_models.id)
    assert open_read is not None and none_read is not None
    assert open_read.models is None and open_read.allows_model("anything")
    assert (open_read.rpm, open_read.tpm, open_read.budget_tokens) == (None, None, None)
    assert none_read.models == () and not none_read.allows_model("anything")


async def test_unknown_keys_are_none(store: Store) -> None:
    assert await store.keys.get("key_0000000000000000") is None
    assert await store.keys.get_by_hash("0" * 64) is None
    assert await store.keys.find("nobody") is None


async def test_an_active_name_cannot_be_taken_twice(store: Store) -> None:
    first = await store.keys.create(spec("team-a", "sk-one"))
    with pytest.raises(Conflict, match=rf"'team-a' already exists \({first.id}\)"):
        await store.keys.create(spec("team-a", "sk-two"))
    await store.keys.revoke(first.id)
    second = await store.keys.create(spec("team-a", "sk-two"))
    assert [k.id for k in await store.keys.list()] == [second.id]


async def test_concurrent_creates_of_one_name_make_one_key(store: Store) -> None:
    results = await asyncio.gather(
        *(store.keys.create(spec("race", f"sk-race-{i}")) for i in range(4)),
        return_exceptions=True,
    )
    assert sum(isinstance(r, ApiKey) for r in results) == 1
    assert all(isinstance(r, Conflict) for r in results if not isinstance(r, ApiKey))
    assert len(await store.keys.list()) == 1


async def test_a_secret_hash_belongs_to_one_key(store: Store) -> None:
    await store.keys.create(spec("a", "sk-same"))
    with pytest.raises(Conflict, match="another key already has this secret"):
        await store.keys.create(spec("b", "sk-same"))


async def test_list_leaves_out_revoked_keys_unless_asked(
    store: Store, store_clock: FakeClock
) -> None:
    a = await store.keys.create(spec("a"))
    store_clock.advance(seconds=1)
    b = await store.keys.create(spec("b"))
    store_clock.advance(seconds=1)
    c = await store.keys.create(spec("c"))
    revoked = await store.keys.revoke(b.id)
    assert await store.keys.list() == [a, c]
    assert await store.keys.list(include_revoked=True) == [a, revoked, c]


async def test_revoking_records_when_and_is_idempotent(
    store: Store, store_clock: FakeClock
) -> None:
    key = await store.keys.create(spec("a"))
    when = store_clock.advance(minutes=5)
    revoked = await store.keys.revoke(key.id)
    assert revoked.revoked_at == revoked.updated_at == when
    assert not revoked.is_active(when)
    store_clock.advance(minutes=5)
    assert await store.keys.revoke(key.id) == revoked
    assert await store.keys.get_by_hash(key.secret_hash) == revoked
    with pytest.raises(NotFound, match="key_nope"):
        await store.keys.revoke("key_nope")


async def test_rotating_replaces_only_the_secret(store: Store, store_clock: FakeClock) -> None:
    key = await store.keys.create(spec("a", "sk-old-secret", rpm=5, models=("m",)))
    when = store_clock.advance(hours=1)
    new_hash = hashlib.sha256(b"sk-new-secret").hexdigest()
    rotated = await store.keys.rotate(key.id, new_prefix="sk-new-secre", new_hash=new_hash)
    assert rotated.prefix == "sk-new-secre" and rotated.secret_hash == new_hash
    assert rotated.updated_at == when
    assert (rotated.id, rotated.name, rotated.rpm, rotated.models, rotated.created_at) == (
        key.id,
        key.name,
        key.rpm,
        key.models,
        key.created_at,
    )
    assert await store.keys.get_by_hash(new_hash) == rotated
    assert await store.keys.get_by_hash(key.secret_hash) is None


async def test_rotating_a_revoked_or_unknown_key_fails(store: Store) -> None:
    key = await store.keys.create(spec("a"))
    await store.keys.revoke(key.id)
    new_hash = hashlib.sha256(b"x").hexdigest()
    with pytest.raises(Conflict, match="is revoked"):
        await store.keys.rotate(key.id, new_prefix="sk-x", new_hash=new_hash)
    with pytest.raises(NotFound):
        await store.keys.rotate("key_nope", new_prefix="sk-x", new_hash=new_hash)


async def test_changed_since_sees_creates_revokes_and_rotations(
    store: Store, store_clock: FakeClock
) -> None:
    a = await store.keys.create(spec("a"))
    t1 = store_clock.advance(seconds=10)
    b = await store.keys.create(spec("b"))
    c = await store.keys.create(spec("c"))
    store_clock.advance(seconds=10)
    revoked_a = await store.keys.revoke(a.id)
    t3 = store_clock.advance(seconds=10)
    rotated_b = await store.keys.rotate(b.id, new_prefix="sk-b2", new_hash="b" * 64)

    # Each key once, in its latest state, ordered by its latest change.
    assert await store.keys.changed_since(START) == [c, revoked_a, rotated_b]
    assert {k.id for k in await store.keys.changed_since(t1)} == {a.id, b.id, c.id}
    assert await store.keys.changed_since(t3) == [rotated_b]
    assert await store.keys.changed_since(t3 + timedelta(microseconds=1)) == []


async def test_find_by_id_name_or_prefix(store: Store) -> None:
    a = await store.keys.create(spec("team-a", "sk-llmgw-aaaa-1"))
    b = await store.keys.create(spec("team-b", "sk-llmgw-bbbb-1"))
    assert await store.keys.find(a.id) == a
    assert await store.keys.find("team-b") == b
    assert await store.keys.find("sk-llmgw-aaa") == a


async def test_find_prefers_active_keys_and_reports_ambiguity(store: Store) -> None:
    old = await store.keys.create(spec("team-a", "sk-llmgw-aaaa-1"))
    await store.keys.revoke(old.id)
    assert await store.keys.find("team-a") == await store.keys.get(old.id)
    new = await store.keys.create(spec("team-a", "sk-llmgw-aaaa-2"))
    assert await store.keys.find("team-a") == new
    # Both keys have the prefix "sk-llmgw-aaa"; only one is active, so it wins.
    assert await store.keys.find("sk-llmgw-aaa") == new
    await store.keys.create(spec("team-c", "sk-llmgw-aaaa-3"))
    with pytest.raises(Ambiguous, match=r"sk-llmgw-aaa.*matches several keys"):
        await store.keys.find("sk-llmgw-aaa")


INVALID: list[tuple[dict[str, object], str]] = [
    ({"secret_hash": "not-a-hash"}, "SHA-256"),
    ({"name": ""}, "key name"),
    ({"prefix": ""}, "key prefix"),
    ({"rpm": -1}, "rpm must be zero or more"),
    ({"budget_period": "week"}, "budget_period must be one of day, month"),
    ({"expires_at": datetime(2025, 1, 1)}, "expires_at=.* has no time zone"),
]


async def test_invalid_keys_are_refused_before_the_database(store: Store) -> None:
    base = spec("a")
    for changes, message in INVALID:
        fields = {"name": base.name, "prefix": base.prefix, "secret_hash": base.secret_hash}
        with pytest.raises(InvalidValue, match=message):
            await store.keys.create(NewApiKey(**{**fields, **changes}))  # type: ignore[arg-type]
    key = await store.keys.create(base)
    with pytest.raises(InvalidValue, match="SHA-256"):
        await store.keys.rotate(key.id, new_prefix="sk-x", new_hash="ABC")
    assert await store.keys.list() == [key]


async def test_updating_sets_each_field_and_keeps_the_others(
    store: Store, store_clock: FakeClock
) -> None:
    key = await store.keys.create(spec("team-a", models=("m1",), rpm=5, tpm=500))
    expires = datetime(2026, 1, 1, tzinfo=UTC)
    steps: list[tuple[KeyChanges, dict[str, object]]] = [
        (KeyChanges(name="team-b"), {"name": "team-b"}),
        (KeyChanges(models=("m1", "m2")), {"models": ("m1", "m2")}),
        (KeyChanges(rpm=60), {"rpm": 60}),
        (KeyChanges(tpm=1000), {"tpm": 1000}),
        (
            KeyChanges(budget_tokens=10_000, budget_period="day"),
            {"budget_tokens": 10_000, "budget_period": "day"},
        ),
        (KeyChanges(budget_tokens=20_000), {"budget_tokens": 20_000}),
        (KeyChanges(budget_period="month"), {"budget_period": "month"}),
        (KeyChanges(expires_at=expires), {"expires_at": expires}),
        (KeyChanges(admin_role="operator"), {"admin_role": "operator"}),
    ]
    expected = key
    for changes, fields in steps:
        when = store_clock.advance(seconds=1)
        updated = await store.keys.update(key.id, changes)
        expected = dataclasses.replace(expected, **fields, updated_at=when)  # type: ignore[arg-type]
        assert updated == expected, changes
        assert await store.keys.get(key.id) == expected
    # The secret, id and creation time never change.
    assert (expected.id, expected.prefix, expected.secret_hash, expected.created_at) == (
        key.id,
        key.prefix,
        key.secret_hash,
        key.created_at,
    )
    assert await store.keys.get_by_hash(key.secret_hash) == expected


async def test_updating_clears_each_optional_limit(store: Store, store_clock: FakeClock) -> None:
    key = await store.keys.create(
        spec(
            "team-a",
            models=("m1",),
            rpm=5,
            tpm=500,
            budget_tokens=1000,
            budget_period="month",
            expires_at=datetime(2026, 1, 1, tzinfo=UTC),
            admin_role="admin",
        )
    )
    steps: list[tuple[KeyChanges, dict[str, object]]] = [
        (KeyChanges(models=None), {"models": None}),
        (KeyChanges(rpm=None), {"rpm": None}),
        (KeyChanges(tpm=None), {"tpm": None}),
        (
            KeyChanges(budget_tokens=None, budget_period=None),
            {"budget_tokens": None, "budget_period": None},
        ),
        (KeyChanges(expires_at=None), {"expires_at": None}),
        (KeyChanges(admin_role=None), {"admin_role": None}),
    ]
    expected = key
    for changes, fields in steps:
        when = store_clock.advance(seconds=1)
        expected = dataclasses.replace(expected, **fields, updated_at=when)  # type: ignore[arg-type]
        assert await store.keys.update(key.id, changes) == expected, changes
    stored = await store.keys.get(key.id)
    assert stored is not None and stored == expected
    assert stored.allows_model("anything") and stored.is_active(START + timedelta(days=3650))
    assert (stored.name, stored.rpm, stored.tpm, stored.budget_tokens) == (
        "team-a",
        None,
        None,
        None,
    )


async def test_an_update_is_seen_by_changed_since_even_from_a_slow_clock(
    store: Store, store_clock: FakeClock
) -> None:
    key = await store.keys.create(spec("a"))
    other = await store.keys.create(spec("b"))
    t1 = store_clock.advance(seconds=10)
    updated = await store.keys.update(key.id, KeyChanges(rpm=7))
    assert await store.keys.changed_since(t1) == [updated]
    # A server whose clock is behind the key's last change still moves it forward.
    store_clock.now = START - timedelta(minutes=5)
    again = await store.keys.update(key.id, KeyChanges(rpm=8))
    assert again.updated_at > updated.updated_at
    assert await store.keys.changed_since(t1) == [again]
    assert other not in await store.keys.changed_since(t1)


async def test_renaming_respects_active_names(store: Store) -> None:
    a = await store.keys.create(spec("team-a"))
    b = await store.keys.create(spec("team-b"))
    with pytest.raises(Conflict, match=rf"an active key named 'team-b' already exists \({b.id}\)"):
        await store.keys.update(a.id, KeyChanges(name="team-b"))
    assert (await store.keys.get(a.id)) == a
    # Renaming a key to its own name is no clash; a revoked key's name is free.
    assert (await store.keys.update(a.id, KeyChanges(name="team-a"))).name == "team-a"
    await store.keys.revoke(b.id)
    assert (await store.keys.update(a.id, KeyChanges(name="team-b"))).name == "team-b"
    assert [k.name for k in await store.keys.list()] == ["team-b"]


async def test_updating_a_revoked_or_unknown_key_fails(store: Store) -> None:
    key = await store.keys.create(spec("a", rpm=5))
    revoked = await store.keys.revoke(key.id)
    with pytest.raises(Conflict, match=r"is revoked and cannot be changed; create a new key"):
        await store.keys.update(key.id, KeyChanges(rpm=10))
    assert await store.keys.get(key.id) == revoked
    with pytest.raises(NotFound, match="there is no key 'key_nope'"):
        await store.keys.update("key_nope", KeyChanges(rpm=10))


async def test_a_budget_needs_a_period_after_the_update(
    store: Store, store_clock: FakeClock
) -> None:
    plain = await store.keys.create(spec("plain"))
    store_clock.advance(seconds=1)
    budgeted = await store.keys.create(spec("budgeted", budget_tokens=100, budget_period="day"))
    with pytest.raises(InvalidValue, match="budget of 50 tokens without a budget_period"):
        await store.keys.update(plain.id, KeyChanges(budget_tokens=50))
    with pytest.raises(InvalidValue, match="budget_period 'day' without budget_tokens"):
        await store.keys.update(plain.id, KeyChanges(budget_period="day"))
    with pytest.raises(InvalidValue, match="without a budget_period"):
        await store.keys.update(budgeted.id, KeyChanges(budget_period=None))
    with pytest.raises(InvalidValue, match="without budget_tokens"):
        await store.keys.update(budgeted.id, KeyChanges(budget_tokens=None))
    assert await store.keys.list() == [plain, budgeted]
    # A budget alone keeps the stored period.
    assert (await store.keys.update(budgeted.id, KeyChanges(budget_tokens=70))).budget_period == (
        "day"
    )


async def test_concurrent_updates_of_different_fields_both_apply(store: Store) -> None:
    key = await store.keys.create(spec("a"))
    await asyncio.gather(
        store.keys.update(key.id, KeyChanges(rpm=11)),
        store.keys.update(key.id, KeyChanges(tpm=22)),
        store.keys.update(key.id, KeyChanges(models=("m",))),
    )
    stored = await store.keys.get(key.id)
    assert stored is not None
    assert (stored.rpm, stored.tpm, stored.models) == (11, 22, ("m",))


INVALID_CHANGES: list[tuple[KeyChanges, str]] = [
    (KeyChanges(), "must change at least one of name, models"),
    (KeyChanges(name=""), "key name must be 1 to 200 characters"),
    (KeyChanges(name="x" * 201), "key name must be 1 to 200 characters"),
    (KeyChanges(rpm=-1), "rpm must be zero or more"),
    (KeyChanges(budget_tokens=-5, budget_period="day"), "budget_tokens must be zero or more"),
    (KeyChanges(budget_period="week"), "budget_period must be one of day, month"),  # type: ignore[arg-type]
    (KeyChanges(expires_at=datetime(2025, 1, 1)), "expires_at=.* has no time zone"),
]


async def test_invalid_updates_are_refused_before_the_database(store: Store) -> None:
    key = await store.keys.create(spec("a", rpm=5))
    for changes, message in INVALID_CHANGES:
        with pytest.raises(InvalidValue, match=message):
            await store.keys.update(key.id, changes)
    assert await store.keys.list() == [key]
