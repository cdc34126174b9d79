"""Authenticating requests against the real store (SQLite and PostgreSQL), and the cache.

"Another process" is a second `Store` opened on the same database: it shares
nothing in memory with the authenticator under test.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta

import pytest
from store_fixtures import (  # noqa: F401
    START,
    FakeClock,
    StoreTarget,
    clock_fixture,
    store_fixture,
    target_fixture,
)

from llmgw.auth import (
    AuthUnavailable,
    ExpiredKey,
    InvalidKey,
    KeyAuthenticator,
    KeyService,
    MissingKey,
    generate_secret,
    hash_secret,
    secret_prefix,
)
from llmgw.limits import KeyLimits
from llmgw.store import ApiKey, NewApiKey, Store, StoreUnavailable


class Mono:
    """A settable monotonic clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingKeys:
    """The real repository, counting the calls that reach the store."""

    def __init__(self, store: Store) -> None:
        self.inner = store.keys
        self.by_hash = 0
        self.polls = 0
        self.down = False

    async def get_by_hash(self, secret_hash: str) -> ApiKey | None:
        self.by_hash += 1
        if self.down:
            raise StoreUnavailable("the database at test did not answer")
        return await self.inner.get_by_hash(secret_hash)

    async def changed_since(self, ts: datetime) -> list[ApiKey]:
        self.polls += 1
        if self.down:
            raise StoreUnavailable("the database at test did not answer")
        return await self.inner.changed_since(ts)


@pytest.fixture(name="other")
async def other_fixture(
    store_target: StoreTarget, store: Store, store_clock: FakeClock
) -> AsyncIterator[Store]:
    """The same database opened by "another process"."""
    opened = await store_target.open(clock=store_clock)
    try:
        yield opened
    finally:
        await opened.close()


def fixed_secrets(*secrets: str) -> Callable[[], str]:
    queue = list(secrets)
    return lambda: queue.pop(0)


def make_auth(
    keys: CountingKeys, clock: FakeClock, mono: Mono, **kwargs: float
) -> KeyAuthenticator:
    return KeyAuthenticator(keys=keys, clock=mono, wall_clock=clock, **kwargs)  # type: ignore[arg-type]


async def test_a_valid_key_gives_its_principal_and_is_then_served_from_memory(
    store: Store, store_clock: FakeClock
) -> None:
    service = KeyService(keys=store.keys, wall_clock=store_clock)
    key, secret = await service.create(
        name="team-a", models=["llama-8b"], rpm=60, tpm=1000, budget_tokens=5000, period="day"
    )
    keys, mono = CountingKeys(store), Mono()
    auth = make_auth(keys, store_clock, mono)
    principal = await auth.authenticate(secret)
    assert principal.key_id == key.id
    assert principal.name == "team-a"
    assert principal.models == frozenset({"llama-8b"})
    assert not principal.is_admin
    assert principal.limits == KeyLimits(
        key_id=key.id, rpm=60, tpm=1000, budget_tokens=5000, budget_period="day"
    )
    assert principal.may_use("llama-8b") and not principal.may_use("qwen-7b")
    for _ in range(50):
        assert await auth.authenticate(secret) is principal
    assert keys.by_hash == 1


async def test_missing_unknown_and_revoked_keys_are_refused(
    store: Store, store_clock: FakeClock
) -> None:
    service = KeyService(keys=store.keys, wall_clock=store_clock)
    _, secret = await service.create(name="gone")
    await service.revoke("gone")
    auth = make_auth(CountingKeys(store), store_clock, Mono())
    for token in (None, ""):
        with pytest.raises(MissingKey) as missing:
            await auth.authenticate(token)
        assert missing.value.status == 401
    with pytest.raises(InvalidKey) as unknown:
        await auth.authenticate(generate_secret())
    with pytest.raises(InvalidKey) as revoked:
        await auth.authenticate(secret)
    # The client cannot tell a revoked key from one that never existed.
    assert unknown.value.message == revoked.value.message
    assert unknown.value.code == revoked.value.code == "invalid_api_key"
    assert revoked.value.status == 401
    assert secret not in revoked.value.message


async def test_an_expired_key_is_refused_with_its_expiry(
    store: Store, store_clock: FakeClock
) -> None:
    service = KeyService(keys=store.keys, wall_clock=store_clock)
    _, secret = await service.create(name="short", expires_at=START + timedelta(hours=1))
    auth = make_auth(CountingKeys(store), store_clock, Mono())
    assert (await auth.authenticate(secret)).name == "short"
    store_clock.advance(hours=1)
    with pytest.raises(ExpiredKey) as expired:
        await auth.authenticate(secret)
    assert expired.value.status == 401
    assert expired.value.code == "expired_api_key"
    assert "expired at 2025-01-01 13:00:00 UTC" in expired.value.message
    # Also when the first lookup already finds it expired.
    fresh = make_auth(CountingKeys(store), store_clock, Mono())
    with pytest.raises(ExpiredKey):
        await fresh.authenticate(secret)


async def test_unknown_keys_are_negatively_cached_for_a_short_time(
    store: Store, store_clock: FakeClock
) -> None:
    keys, mono = CountingKeys(store), Mono()
    auth = make_auth(keys, store_clock, mono, negative_ttl=2.0)
    bad = generate_secret()
    for _ in range(100):
        with pytest.raises(InvalidKey):
            await auth.authenticate(bad)
    assert keys.by_hash == 1
    mono.now += 2.5
    with pytest.raises(InvalidKey):
        await auth.authenticate(bad)
    assert keys.by_hash == 2


async def test_a_key_created_elsewhere_works_after_the_next_poll_or_the_negative_ttl(
    store: Store, other: Store, store_clock: FakeClock
) -> None:
    secret_a, secret_b = generate_secret(), generate_secret()
    keys, mono = CountingKeys(store), Mono()
    auth = make_auth(keys, store_clock, mono, negative_ttl=2.0)
    for secret in (secret_a, secret_b):
        with pytest.raises(InvalidKey):
            await auth.authenticate(secret)
    elsewhere = KeyService(
        keys=other.keys, wall_clock=store_clock, new_secret=fixed_secrets(secret_a, secret_b)
    )
    await elsewhere.create(name="new-a")
    # A lookup that never found it is not retried on each request...
    with pytest.raises(InvalidKey):
        await auth.authenticate(secret_a)
    # ...but the next poll sees the new key and forgets that it was unknown.
    assert await auth.refresh() == 1
    assert (await auth.authenticate(secret_a)).name == "new-a"
    # Without a poll, the negative entry simply expires.
    store_clock.advance(seconds=1)
    await elsewhere.create(name="new-b")
    mono.now += 2.5
    assert (await auth.authenticate(secret_b)).name == "new-b"


async def test_a_key_revoked_elsewhere_stops_working_at_the_next_poll(
    store: Store, other: Store, store_clock: FakeClock
) -> None:
    service = KeyService(keys=store.keys, wall_clock=store_clock)
    _, secret = await service.create(name="team-a")
    _, keep = await service.create(name="team-b")
    keys = CountingKeys(store)
    auth = make_auth(keys, store_clock, Mono())
    await auth.authenticate(secret)
    await auth.authenticate(keep)
    store_clock.advance(seconds=30)
    await KeyService(keys=other.keys, wall_clock=store_clock).revoke("team-a")
    assert (await auth.authenticate(secret)).name == "team-a"  # cached until the poll
    await auth.refresh()
    with pytest.raises(InvalidKey):
        await auth.authenticate(secret)
    assert (await auth.authenticate(keep)).name == "team-b"
    assert keys.by_hash == 2  # the poll updated the cache; no lookups were needed


async def test_the_poll_loop_applies_revocations_within_its_interval(
    store: Store, other: Store, store_clock: FakeClock
) -> None:
    service = KeyService(keys=store.keys, wall_clock=store_clock)
    _, secret = await service.create(name="team-a")
    auth = make_auth(CountingKeys(store), store_clock, Mono(), refresh_interval=0.02)
    await auth.authenticate(secret)
    loop = asyncio.create_task(auth.run())
    try:
        store_clock.advance(minutes=5)
        await KeyService(keys=other.keys, wall_clock=store_clock).revoke("team-a")
        async with asyncio.timeout(5):
            while True:
                try:
                    await auth.authenticate(secret)
                except InvalidKey:
                    break
                await asyncio.sleep(0.01)
    finally:
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop


async def test_a_key_rotated_elsewhere_swaps_secrets_at_the_next_poll(
    store: Store, other: Store, store_clock: FakeClock
) -> None:
    service = KeyService(keys=store.keys, wall_clock=store_clock)
    key, old = await service.create(name="team-a")
    auth = make_auth(CountingKeys(store), store_clock, Mono())
    await auth.authenticate(old)
    store_clock.advance(seconds=5)
    rotated, new = await KeyService(keys=other.keys, wall_clock=store_clock).rotate(key.id)
    assert rotated.id == key.id
    assert (await auth.authenticate(new)).key_id == key.id  # a miss reads the new hash
    await auth.refresh()
    with pytest.raises(InvalidKey):
        await auth.authenticate(old)
    assert (await auth.authenticate(new)).key_id == key.id


async def test_the_cache_is_a_bounded_lru_and_entries_are_reread_after_max_age(
    store: Store, store_clock: FakeClock
) -> None:
    service = KeyService(keys=store.keys, wall_clock=store_clock)
    secrets = [(await service.create(name=f"k{i}"))[1] for i in range(3)]
    keys, mono = CountingKeys(store), Mono()
    auth = make_auth(keys, store_clock, mono, cache_size=2, max_age=60.0)
    for secret in secrets:
        await auth.authenticate(secret)
    assert auth.cached_keys == 2
    assert keys.by_hash == 3
    await auth.authenticate(secrets[2])  # most recent: still cached
    assert keys.by_hash == 3
    await auth.authenticate(secrets[0])  # least recent: evicted, read again
    assert keys.by_hash == 4
    mono.now += 61
    await auth.authenticate(secrets[0])
    assert keys.by_hash == 5


async def test_concurrent_requests_with_an_uncached_key_share_one_lookup(
    store: Store, store_clock: FakeClock
) -> None:
    _, secret = await KeyService(keys=store.keys, wall_clock=store_clock).create(name="busy")
    keys = CountingKeys(store)
    auth = make_auth(keys, store_clock, Mono())
    principals = await asyncio.gather(*(auth.authenticate(secret) for _ in range(50)))
    assert {p.name for p in principals} == {"busy"}
    assert keys.by_hash == 1


async def test_a_store_outage_refuses_uncached_keys_with_503_and_keeps_cached_ones(
    store: Store, store_clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    service = KeyService(keys=store.keys, wall_clock=store_clock)
    _, cached = await service.create(name="cached")
    _, uncached = await service.create(name="uncached")
    keys = CountingKeys(store)
    auth = make_auth(keys, store_clock, Mono())
    await auth.authenticate(cached)
    keys.down = True
    with pytest.raises(AuthUnavailable) as unavailable:
        await auth.authenticate(uncached)
    assert unavailable.value.status == 503
    assert "database" not in unavailable.value.message  # no store details for clients
    assert (await auth.authenticate(cached)).name == "cached"
    with pytest.raises(StoreUnavailable):
        await auth.refresh()


async def test_the_poll_loop_survives_a_store_outage(
    store: Store, store_clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    keys = CountingKeys(store)
    keys.down = True
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            keys.down = False
        if len(sleeps) > 4:
            raise asyncio.CancelledError
        await asyncio.sleep(0)

    auth = KeyAuthenticator(
        keys=keys, clock=Mono(), wall_clock=store_clock, refresh_interval=2.0, sleep=sleep
    )
    with caplog.at_level(logging.INFO, logger="llmgw.auth"), pytest.raises(asyncio.CancelledError):
        await auth.run()
    assert sleeps == [2.0] * 5
    assert keys.polls == 4
    messages = [r.getMessage() for r in caplog.records]
    assert sum("cannot refresh API keys" in m for m in messages) == 1  # once per outage
    assert any("works again" in m for m in messages)


async def test_a_key_with_unusable_stored_limits_is_refused(
    store: Store, store_clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    secret = generate_secret()
    await store.keys.create(
        NewApiKey(name="zero", prefix=secret_prefix(secret), secret_hash=hash_secret(secret), rpm=0)
    )
    auth = make_auth(CountingKeys(store), store_clock, Mono())
    with pytest.raises(InvalidKey):
        await auth.authenticate(secret)
    assert "rpm must be >= 1" in caplog.text
