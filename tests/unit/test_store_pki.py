"""The cluster PKI in the store: one active CA even when servers race, join tokens' uses and limits."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest
from store_fixtures import START, FakeClock, clock_fixture, store_fixture, target_fixture  # noqa: F401

from llmgw.pki.cluster import (
    cert_pem,
    create_cluster_key,
    new_ca,
    new_join_token,
    spki_sha256,
    token_root,
)
from llmgw.store import NotFound, Store, StoredCa, StoredJoinToken, TokenUnusable


def a_ca(tmp_name: str, key_dir: Path) -> StoredCa:
    ca = new_ca(now=START, lifetime=timedelta(days=3650))
    key = create_cluster_key(key_dir / tmp_name)
    return StoredCa(
        id=spki_sha256(ca.cert),
        role="active",
        cert_pem=cert_pem(ca.cert).decode(),
        key_sealed=key.seal(ca.key_pem),
        sealing_key_id=key.key_id,
        created_at=START,
        not_after=ca.cert.not_valid_after_utc,
        retired_at=None,
    )


def a_token(
    *, max_uses: int | None = None, ttl: timedelta = timedelta(hours=24)
) -> tuple[str, StoredJoinToken]:
    token = new_join_token("ab" * 32)
    root = token_root(token, now=START, not_after=START + ttl)
    return str(token), StoredJoinToken(
        id=token.token_id,
        secret_hash=token.secret_hash,
        root_pem=cert_pem(root).decode(),
        labels={"rack": "r1"},
        max_uses=max_uses,
        uses=0,
        created_at=START,
        expires_at=START + ttl,
        last_used_at=None,
        revoked_at=None,
    )


async def test_two_servers_creating_the_ca_at_once_get_the_same_one(
    store: Store, tmp_path: Path
) -> None:
    first, second = a_ca("k1", tmp_path), a_ca("k2", tmp_path)
    got = await asyncio.gather(store.pki.create_ca(first), store.pki.create_ca(second))
    assert got[0].id == got[1].id
    assert [ca.id for ca in await store.pki.cas()] == [got[0].id]
    stored = await store.pki.active_ca()
    assert stored is not None and stored.key_sealed == got[0].key_sealed


async def test_a_token_is_stored_without_its_secret_and_counts_its_uses(
    store: Store, store_clock: FakeClock
) -> None:
    text, token = a_token(max_uses=2)
    await store.pki.create_token(token)
    secret = text.rsplit(".", 1)[1]
    stored = await store.pki.token(token.id)
    assert stored is not None and stored.labels == {"rack": "r1"}
    assert secret not in repr(stored)

    assert (await store.pki.use_token(token.id)).uses == 1
    store_clock.advance(seconds=1)
    after = await store.pki.use_token(token.id)
    assert after.uses == 2 and after.last_used_at == START + timedelta(seconds=1)
    with pytest.raises(TokenUnusable, match="used up"):
        await store.pki.use_token(token.id)
    assert await store.pki.usable_tokens(store_clock()) == []


async def test_racing_joins_get_only_the_uses_a_token_has(store: Store) -> None:
    _, token = a_token(max_uses=3)
    await store.pki.create_token(token)
    results = await asyncio.gather(
        *(store.pki.use_token(token.id) for _ in range(6)), return_exceptions=True
    )
    assert sum(1 for r in results if isinstance(r, StoredJoinToken)) == 3
    assert all(isinstance(r, StoredJoinToken | TokenUnusable) for r in results)
    stored = await store.pki.token(token.id)
    assert stored is not None and stored.uses == 3


async def test_a_fleet_joining_at_once_with_one_token_counts_every_use(store: Store) -> None:
    # Many joins racing on one token (more at once than a server lets through)
    # each count a use; none is refused for the race.
    _, token = a_token(max_uses=None)
    await store.pki.create_token(token)
    results = await asyncio.gather(*(store.pki.use_token(token.id) for _ in range(64)))
    assert sorted(r.uses for r in results) == list(range(1, 65))
    stored = await store.pki.token(token.id)
    assert stored is not None and stored.uses == 64


async def test_expired_and_revoked_tokens_are_refused_and_say_why(
    store: Store, store_clock: FakeClock
) -> None:
    _, short = a_token(ttl=timedelta(minutes=10))
    _, revoked = a_token()
    await store.pki.create_token(short)
    await store.pki.create_token(revoked)
    assert {t.id for t in await store.pki.usable_tokens(START)} == {short.id, revoked.id}

    await store.pki.revoke_token(revoked.id)
    with pytest.raises(TokenUnusable, match="revoked"):
        await store.pki.use_token(revoked.id)
    store_clock.advance(minutes=11)
    with pytest.raises(TokenUnusable, match="expired"):
        await store.pki.use_token(short.id)
    with pytest.raises(NotFound, match="no join token"):
        await store.pki.revoke_token("nosuch")
    assert [t.id for t in await store.pki.tokens()] != []
