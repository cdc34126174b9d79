"""Placement records on SQLite and PostgreSQL: written and removed in batches, fenced, read back."""

from __future__ import annotations

import pytest
from store_fixtures import (  # noqa: F401
    START,
    FakeClock,
    clock_fixture,
    store_fixture,
    target_fixture,
)

from llmgw.store import InvalidValue, StaleEpoch, Store, StoredPlacement

TTL = 10.0


def placed(shard_id: str, node_id: str, port: int, **fields: object) -> StoredPlacement:
    values: dict[str, object] = {
        "shard_id": shard_id, "replica_id": shard_id, "node_id": node_id, "model": "llama",
        "profile": "tp1", "port": port, "node_rank": 0, "nodes": 1,
        "spec": {"shard_id": shard_id, "port": port, "env": {"A": "1"}, "gpu_indices": [0]},
    }  # fmt: skip
    values.update(fields)
    return StoredPlacement(**values)  # type: ignore[arg-type]


async def test_records_are_written_together_read_back_and_removed(
    store: Store, store_clock: FakeClock
) -> None:
    await store.leadership.acquire("control", "a", TTL, "a:9443")
    gang = [
        placed("big-1", "gpu-2", 20010, replica_id="big-1", nodes=2),
        placed("big-1-r1", "gpu-1", 20011, replica_id="big-1", node_rank=1, nodes=2),
    ]
    written = await store.placements.record("control", 1, [placed("s1", "gpu-1", 20001), *gang])
    assert [(p.shard_id, p.epoch, p.placed_at) for p in written] == [
        ("s1", 1, START), ("big-1", 1, START), ("big-1-r1", 1, START)
    ]  # fmt: skip
    stored = await store.placements.all()
    assert [(p.node_id, p.shard_id, p.replica_id, p.node_rank) for p in stored] == [
        ("gpu-1", "big-1-r1", "big-1", 1),
        ("gpu-1", "s1", "s1", 0),
        ("gpu-2", "big-1", "big-1", 0),
    ]
    assert stored[1].spec == {
        "shard_id": "s1",
        "port": 20001,
        "env": {"A": "1"},
        "gpu_indices": [0],
    }
    assert (stored[1].model, stored[1].profile, stored[1].port) == ("llama", "tp1", 20001)

    # Writing a shard again replaces its record (a start sent again).
    store_clock.advance(seconds=1)
    await store.placements.record("control", 1, [placed("s1", "gpu-1", 20005)])
    again = {p.shard_id: p for p in await store.placements.all()}
    assert again["s1"].port == 20005 and len(again) == 3

    await store.placements.remove("control", 1, ["s1", "big-1", "big-1-r1", "unknown"])
    assert await store.placements.all() == []
    await store.placements.remove("control", 1, [])
    assert await store.placements.record("control", 1, []) == []


async def test_a_leader_whose_lease_moved_on_can_neither_record_nor_remove(
    store: Store, store_clock: FakeClock
) -> None:
    await store.leadership.acquire("control", "a", TTL, "a:9443")
    await store.placements.record("control", 1, [placed("s1", "gpu-1", 20001)])
    store_clock.advance(seconds=TTL + 1)
    assert await store.leadership.acquire("control", "b", TTL, "b:9443") is not None
    with pytest.raises(StaleEpoch, match="held by b at epoch 2"):
        await store.placements.record("control", 1, [placed("s2", "gpu-1", 20002)])
    with pytest.raises(StaleEpoch):
        await store.placements.remove("control", 1, ["s1"])
    # The new leader reads what the old one recorded, and may remove it.
    assert [p.shard_id for p in await store.placements.all()] == ["s1"]
    await store.placements.remove("control", 2, ["s1"])
    assert await store.placements.all() == []


async def test_a_record_with_a_field_the_columns_cannot_hold_is_refused(store: Store) -> None:
    await store.leadership.acquire("control", "a", TTL, "a:9443")
    with pytest.raises(InvalidValue, match="model is 1 to 128"):
        await store.placements.record("control", 1, [placed("s1", "gpu-1", 1, model="m" * 129)])
    assert await store.placements.all() == []
