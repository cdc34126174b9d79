"""The lease, fenced endpoint publishing, demand rows and the server list, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest
from store_fixtures import (  # noqa: F401
    START,
    FakeClock,
    StoreTarget,
    clock_fixture,
    store_fixture,
    target_fixture,
)

from llmgw.store import ControlServer, Demand, StaleEpoch, Store, StoredPlacement

TTL = 10.0


def placed(shard_id: str, port: int, *, model: str = "m", rank: int = 0) -> StoredPlacement:
    return StoredPlacement(
        shard_id=shard_id, replica_id=shard_id, node_id="gpu-1", model=model, profile="p",
        port=port, node_rank=rank, nodes=1, spec={"shard_id": shard_id},
    )  # fmt: skip


async def test_the_first_server_takes_the_lease_and_another_cannot_while_it_lasts(
    store: Store, store_clock: FakeClock
) -> None:
    lease = await store.leadership.acquire("control", "a", TTL, "a:9443")
    assert lease is not None and (lease.owner, lease.epoch) == ("a", 1)
    assert await store.leadership.acquire("control", "b", TTL, "b:9443") is None
    # Renewing keeps the epoch; taking it again as the owner too.
    store_clock.advance(seconds=5)
    assert await store.leadership.renew("control", "a", 1, TTL) is not None
    again = await store.leadership.acquire("control", "a", TTL, "a:9443")
    assert again is not None and again.epoch == 1 and again.acquired_at == lease.acquired_at
    current = await store.leadership.current("control")
    assert current is not None and current.agent_address == "a:9443"


async def test_an_expired_lease_moves_with_a_new_epoch_and_the_old_owner_is_fenced(
    store: Store, store_clock: FakeClock
) -> None:
    await store.leadership.acquire("control", "a", TTL, "a:9443")
    await store.placements.record("control", 1, [placed("r1", 1)])
    await store.leadership.publish("control", 1, "m", ["m", "alias"], [("r1", "http://x:1")])
    store_clock.advance(seconds=TTL + 1)
    taken = await store.leadership.acquire("control", "b", TTL, "b:9443")
    assert taken is not None and (taken.owner, taken.epoch) == ("b", 2)
    # The paused leader wakes up: its renewal and its writes are refused.
    assert await store.leadership.renew("control", "a", 1, TTL) is None
    with pytest.raises(StaleEpoch, match=r"epoch 1 .* held by b at epoch 2"):
        await store.leadership.publish("control", 1, "m", ["m"], [])
    with pytest.raises(StaleEpoch):
        await store.leadership.withdraw("control", 1, ["m"])
    # What the old leader published stays until the new one replaces it.
    [kept] = await store.leadership.endpoints()
    assert (kept.model, kept.replica_id, kept.names, kept.epoch) == ("m", "r1", ("m", "alias"), 1)
    assert (kept.node_id, kept.port) == ("gpu-1", 1)
    await store.placements.record("control", 2, [placed("r2", 2)])
    await store.leadership.publish("control", 2, "m", ["m"], [("r2", "http://y:2")])
    assert [e.replica_id for e in await store.leadership.endpoints()] == ["r2"]
    await store.leadership.withdraw("control", 2, ["m"])
    assert await store.leadership.endpoints() == []


async def test_a_released_lease_is_free_at_once(store: Store, store_clock: FakeClock) -> None:
    await store.leadership.acquire("control", "a", TTL, "a:9443")
    assert await store.leadership.release("control", "a", 1)
    store_clock.advance(seconds=0.001)
    taken = await store.leadership.acquire("control", "b", TTL, "b:9443")
    assert taken is not None and taken.epoch == 2


async def test_two_servers_racing_for_a_free_lease_get_one_winner(store: Store) -> None:
    results = await asyncio.gather(
        *(store.leadership.acquire("control", f"s{i}", TTL, f"s{i}:1") for i in range(4))
    )
    assert sum(1 for r in results if r is not None) == 1


async def test_demand_rows_are_replaced_per_server(store: Store) -> None:
    await store.leadership.report_demand("a", [Demand("m", "a", START, 2, START)])
    await store.leadership.report_demand("b", [Demand("m", "b", START, 0, None)])
    await store.leadership.report_demand("a", [Demand("n", "a", START, 1, None)])
    rows = sorted((d.model, d.server, d.in_flight) for d in await store.leadership.demand())
    assert rows == [("m", "b", 0), ("n", "a", 1)]


def control_server(name: str) -> ControlServer:
    return ControlServer(
        server=name, hostname=f"host-{name}", version="0.1.0", api_url=f"http://{name}:8080",
        agent_address=f"{name}:9443", started_at=START, last_seen=START,
    )  # fmt: skip


async def test_servers_announce_themselves_and_are_forgotten_with_their_demand(
    store: Store, store_clock: FakeClock
) -> None:
    await store.leadership.announce(control_server("b"))
    await store.leadership.announce(control_server("a"))
    store_clock.advance(seconds=4)
    await store.leadership.announce(control_server("a"))  # a refresh, not a second row
    listed = await store.leadership.servers()
    assert [(s.server, s.hostname, s.agent_address) for s in listed] == [
        ("a", "host-a", "a:9443"),
        ("b", "host-b", "b:9443"),
    ]
    # last_seen is the store's clock at each announcement; started_at stays.
    assert [(s.last_seen - START).total_seconds() for s in listed] == [4.0, 0.0]
    assert {s.started_at for s in listed} == {START}

    await store.leadership.report_demand("a", [Demand("m", "a", START, 2, None)])
    await store.leadership.report_demand("b", [Demand("m", "b", START, 1, START)])
    await store.leadership.forget(["b", "never-announced"])
    assert [s.server for s in await store.leadership.servers()] == ["a"]
    assert [d.server for d in await store.leadership.demand()] == ["a"]
    await store.leadership.forget([])
    assert [s.server for s in await store.leadership.servers()] == ["a"]


async def test_only_endpoints_of_recorded_replicas_are_read_back(store: Store) -> None:
    # A standby serves what `endpoints` returns: a row without a placement record
    # (of that model, rank 0) is not a replica the leader placed.
    await store.leadership.acquire("control", "a", TTL, "a:9443")
    await store.placements.record(
        "control", 1,
        [placed("r1", 20001), placed("other", 20002, model="n"), placed("g-r1", 20003, rank=1)],
    )  # fmt: skip
    await store.leadership.publish(
        "control", 1, "m", ["m"],
        [("r1", "http://x:20001"), ("never", "http://evil:80"), ("other", "http://x:20002"),
         ("g-r1", "http://x:20003")],
    )  # fmt: skip
    assert [(e.replica_id, e.port) for e in await store.leadership.endpoints()] == [("r1", 20001)]
    await store.placements.remove("control", 1, ["r1"])
    assert await store.leadership.endpoints() == []


async def test_an_adapters_rows_are_read_back_through_its_bases_records(store: Store) -> None:
    # A replica published under a LoRA adapter's names is its base's: its row names the
    # base, and only the base's placement record lets a standby serve it.
    await store.leadership.acquire("control", "a", TTL, "a:9443")
    await store.placements.record("control", 1, [placed("r1", 20001)])
    await store.leadership.publish("control", 1, "m", ["m"], [("r1", "http://x:20001")])
    await store.leadership.publish(
        "control", 1, "red", ["red"], [("r1", "http://x:20001")], base="m"
    )
    await store.leadership.publish(
        "control", 1, "blue", ["blue"], [("r1", "http://x:20001")], base="n"
    )
    rows = await store.leadership.endpoints()
    assert [(e.model, e.replica_id, e.base, e.port) for e in rows] == [
        ("m", "r1", None, 20001),
        ("red", "r1", "m", 20001),
    ]


async def test_the_lease_is_renewed_while_every_pooled_connection_is_busy(
    store: Store, store_clock: FakeClock
) -> None:
    # A registration storm can hold every connection of the store's pool; the lease
    # has connections of its own, so its renewal does not wait for one of them.
    assert await store.lease.acquire("control", "a", TTL, "a:9443") is not None
    engine = store._engine  # the shared pool: 5 connections and 10 more while busy
    held = [await engine.connect() for _ in range(15)]
    try:
        store_clock.advance(seconds=5)
        async with asyncio.timeout(20):
            assert await store.lease.renew("control", "a", 1, TTL) is not None
            current = await store.lease.current("control")
        assert current is not None and current.owner == "a"
    finally:
        for conn in held:
            await conn.close()
