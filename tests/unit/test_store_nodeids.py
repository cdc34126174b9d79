"""Node ids bound to keys, and the deny-list of revoked keys, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import hashlib
from datetime import timedelta

import pytest
from store_fixtures import START, clock_fixture, store_fixture, target_fixture  # noqa: F401

from llmgw.store import BoundLabels, InvalidValue, Store
from llmgw.store.tables import node_identities


def key(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


LATER = START + timedelta(minutes=5)


async def test_the_first_key_binds_the_id_and_keeps_it(store: Store) -> None:
    first = await store.nodeids.claim("gpu-1", key("a"), now=START)
    assert first.outcome == "bound" and first.revocation is None
    assert first.binding is not None and first.binding.key_hash == key("a")

    again = await store.nodeids.claim("gpu-1", key("a"), now=LATER)
    assert again.outcome == "already"
    assert again.binding is not None
    assert (again.binding.bound_at, again.binding.last_seen_at) == (START, LATER)

    other = await store.nodeids.claim("gpu-1", key("b"), now=LATER)
    assert other.outcome == "taken"
    # The owner, with when it first claimed the id; nothing changed.
    assert other.binding is not None
    assert (other.binding.key_hash, other.binding.bound_at) == (key("a"), START)
    [kept] = await store.nodeids.bindings()
    assert (kept.node_id, kept.key_hash, kept.last_seen_at) == ("gpu-1", key("a"), LATER)


async def test_racing_claims_of_one_id_get_one_owner(store: Store) -> None:
    claims = await asyncio.gather(
        *(store.nodeids.claim("gpu-1", key(str(i)), now=START) for i in range(6))
    )
    bound = [c for c in claims if c.outcome == "bound"]
    assert len(bound) == 1
    owner = bound[0].binding
    assert owner is not None
    taken = [c for c in claims if c.outcome == "taken"]
    assert len(taken) == 5
    assert all(c.binding is not None and c.binding.key_hash == owner.key_hash for c in taken)


async def test_revoking_denies_the_key_and_frees_the_id(store: Store) -> None:
    await store.nodeids.claim("gpu-1", key("a"), now=START)
    revoked = await store.nodeids.revoke("gpu-1", now=LATER, reason="removed by the operator")
    assert revoked is not None
    assert (revoked.key_hash, revoked.node_id, revoked.revoked_at, revoked.reason) == (
        key("a"),
        "gpu-1",
        LATER,
        "removed by the operator",
    )
    assert await store.nodeids.is_revoked(key("a"))
    assert not await store.nodeids.is_revoked(key("b"))
    assert await store.nodeids.binding("gpu-1") is None

    # The old key stays out, whichever id it claims; a new key takes the id.
    denied = await store.nodeids.claim("gpu-1", key("a"), now=LATER)
    assert denied.outcome == "revoked" and denied.binding is None
    assert denied.revocation == revoked
    assert (await store.nodeids.claim("gpu-7", key("a"), now=LATER)).outcome == "revoked"
    rejoined = await store.nodeids.claim("gpu-1", key("b"), now=LATER)
    assert rejoined.outcome == "bound"
    assert await store.nodeids.revocations() == [revoked]


async def test_revoking_an_id_without_a_key_changes_nothing(store: Store) -> None:
    assert await store.nodeids.revoke("never-seen", now=START, reason="x") is None
    assert await store.nodeids.revocations() == []


async def test_a_key_revoked_twice_keeps_its_first_revocation(store: Store) -> None:
    # One key holding two ids (a certificate with two names): revoking one frees both.
    await store.nodeids.claim("gpu-1", key("a"), now=START)
    await store.nodeids.claim("gpu-1-alias", key("a"), now=START)
    first = await store.nodeids.revoke("gpu-1", now=START, reason="first")
    assert await store.nodeids.bindings() == []
    assert await store.nodeids.revoke("gpu-1-alias", now=LATER, reason="second") is None
    assert await store.nodeids.revocations() == [first]


async def test_revocations_are_listed_newest_first(store: Store) -> None:
    for i, name in enumerate(("a", "b", "c")):
        await store.nodeids.claim(f"gpu-{name}", key(name), now=START)
        await store.nodeids.revoke(f"gpu-{name}", now=START + timedelta(minutes=i), reason=name)
    assert [r.reason for r in await store.nodeids.revocations()] == ["c", "b", "a"]


async def test_a_binding_left_to_a_revoked_key_does_not_hold_the_id(store: Store) -> None:
    await store.nodeids.claim("gpu-1", key("a"), now=START)
    await store.nodeids.revoke("gpu-1", now=START, reason="removed")
    # What a claim racing the revocation can leave behind: the revoked key bound again.
    async with store._engine.begin() as conn:
        await conn.execute(
            node_identities.insert().values(
                node_id="gpu-1", key_hash=key("a"), bound_at=START, last_seen_at=START
            )
        )
    taken_over = await store.nodeids.claim("gpu-1", key("new"), now=LATER)
    assert taken_over.outcome == "bound"
    assert taken_over.binding is not None and taken_over.binding.key_hash == key("new")


async def test_rebinding_moves_the_id_to_the_renewed_key(store: Store) -> None:
    await store.nodeids.claim("gpu-1", key("old"), now=START)
    moved = await store.nodeids.rebind(
        "gpu-1", old_key_hash=key("old"), new_key_hash=key("new"), now=LATER
    )
    assert moved.outcome == "already"
    assert moved.binding is not None
    assert (moved.binding.key_hash, moved.binding.bound_at) == (key("new"), START)
    assert (await store.nodeids.claim("gpu-1", key("old"), now=LATER)).outcome == "taken"
    # A third key's id cannot be taken by re-keying.
    await store.nodeids.claim("gpu-2", key("third"), now=START)
    stolen = await store.nodeids.rebind(
        "gpu-2", old_key_hash=key("old"), new_key_hash=key("mine"), now=LATER
    )
    assert stolen.outcome == "taken"
    # A revoked old key cannot be renewed away from its revocation.
    await store.nodeids.revoke("gpu-1", now=LATER, reason="removed")
    refused = await store.nodeids.rebind(
        "gpu-1", old_key_hash=key("new"), new_key_hash=key("newer"), now=LATER
    )
    assert refused.outcome == "revoked"


@pytest.mark.parametrize(
    ("node_id", "key_hash", "match"),
    [
        ("", key("a"), "node id is 1 to 253"),
        ("n" * 254, key("a"), "node id is 1 to 253"),
        ("gpu-1", "not-a-hash", "64 lowercase hex"),
        ("gpu-1", key("a").upper(), "64 lowercase hex"),
    ],
)
async def test_bad_values_are_refused_naming_them(
    store: Store, node_id: str, key_hash: str, match: str
) -> None:
    with pytest.raises(InvalidValue, match=match):
        await store.nodeids.claim(node_id, key_hash, now=START)
    assert await store.nodeids.bindings() == []


async def test_a_reason_too_long_is_refused(store: Store) -> None:
    await store.nodeids.claim("gpu-1", key("a"), now=START)
    with pytest.raises(InvalidValue, match="at most 500"):
        await store.nodeids.revoke("gpu-1", now=START, reason="x" * 501)
    assert not await store.nodeids.is_revoked(key("a"))


async def test_a_join_binds_its_token_s_labels_and_every_claim_returns_them(store: Store) -> None:
    # A certificate of the operator's own PKI registers without a join: nothing bound.
    own = await store.nodeids.claim("gpu-0", key("z"), now=START)
    assert own.binding is not None and own.binding.labels is None and own.binding.fabric is None

    bound = BoundLabels(labels={"zone": "a"}, fabric={"ib-domain": "pod3"})
    joined = await store.nodeids.claim("gpu-1", key("a"), now=START, bind=bound)
    assert joined.binding is not None
    assert (joined.binding.labels, joined.binding.fabric) == ({"zone": "a"}, {"ib-domain": "pod3"})
    # A Register claims without `bind`: the token's labels come back with the binding.
    registered = await store.nodeids.claim("gpu-1", key("a"), now=LATER)
    assert registered.outcome == "already" and registered.binding is not None
    assert registered.binding.labels == {"zone": "a"}
    assert registered.binding.fabric == {"ib-domain": "pod3"}
    # Another key gets nothing of them.
    taken = await store.nodeids.claim("gpu-1", key("b"), now=LATER, bind=BoundLabels({"zone": "b"}))
    assert taken.outcome == "taken"
    # A renewal with a new key keeps them; joining again with another token replaces them.
    await store.nodeids.rebind("gpu-1", old_key_hash=key("a"), new_key_hash=key("c"), now=LATER)
    renewed = await store.nodeids.claim("gpu-1", key("c"), now=LATER)
    assert renewed.binding is not None and renewed.binding.labels == {"zone": "a"}
    rejoined = await store.nodeids.claim(
        "gpu-1", key("c"), now=LATER, bind=BoundLabels({"zone": "c"})
    )
    assert rejoined.binding is not None
    assert (rejoined.binding.labels, rejoined.binding.fabric) == ({"zone": "c"}, {})
    # A revocation frees the id and its labels: a new key that takes it has none bound.
    await store.nodeids.revoke("gpu-1", now=LATER, reason="gone")
    fresh = await store.nodeids.claim("gpu-1", key("d"), now=LATER)
    assert fresh.binding is not None and fresh.binding.labels is None
