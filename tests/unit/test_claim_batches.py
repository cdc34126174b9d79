"""Node-id claims in batches: `claim_many` on SQLite and PostgreSQL, and the
agent service's `ClaimBatcher` gathering concurrent Registers into one transaction."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest
from store_fixtures import clock_fixture, store_fixture, target_fixture  # noqa: F401

from llmgw.control.agentsvc import ClaimBatcher
from llmgw.store import Claim, InvalidValue, Store

NOW = datetime(2026, 12, 4, 3, 0, tzinfo=UTC)
KEY_A = "a" * 64
KEY_B = "b" * 64


async def test_claim_many_answers_each_claim_in_order(store: Store) -> None:
    answers = await store.nodeids.claim_many(
        [("n1", KEY_A), ("n2", KEY_A), ("", KEY_A), ("n1", KEY_B), ("n3", "nothex")],
        now=NOW,
    )
    outcomes = [a.outcome if isinstance(a, Claim) else "invalid" for a in answers]
    # The second claim of n1 sees the first one, in the same transaction.
    assert outcomes == ["bound", "bound", "invalid", "taken", "invalid"]
    again = await store.nodeids.claim_many([("n1", KEY_A), ("n2", KEY_A)], now=NOW)
    assert [a.outcome for a in again if isinstance(a, Claim)] == ["already", "already"]
    one = await store.nodeids.claim("n2", KEY_A, now=NOW)
    assert one.outcome == "already"


class Counting:
    """The real repository, counting the batches the batcher writes."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.sizes: list[int] = []

    async def claim_many(
        self, requests: Sequence[tuple[str, str]], *, now: datetime
    ) -> list[Claim | InvalidValue]:
        self.sizes.append(len(requests))
        return await self.store.nodeids.claim_many(requests, now=now)


@pytest.mark.parametrize("store_target", ["sqlite"], indirect=True)
async def test_concurrent_registers_claim_in_one_transaction(store: Store) -> None:
    counting = Counting(store)
    batcher = ClaimBatcher(store=counting, max_batch=200)
    claims = [batcher.claim(f"node-{i:03d}", KEY_A, now=NOW) for i in range(300)]
    claims.append(batcher.claim("node-000", KEY_B, now=NOW))
    answers = await asyncio.gather(*claims)
    assert [a.outcome for a in answers] == ["bound"] * 300 + ["taken"]
    # Gathered in one loop turn: two batches of at most 200, not 301 transactions.
    assert counting.sizes == [200, 101]
    with pytest.raises(InvalidValue):
        await batcher.claim("x" * 300, KEY_A, now=NOW)
    # One at a time, each is its own batch, answered as the store's own claim.
    assert (await batcher.claim("node-001", KEY_A, now=NOW)).outcome == "already"
    assert counting.sizes[-1] == 1
