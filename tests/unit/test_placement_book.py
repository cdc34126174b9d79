"""The placement records of a term, on a real store (SQLite and PostgreSQL): read once when the
term starts, written before the starts are sent, dropped when shards are gone, fenced.

The last tests step a real `Controller` by hand: its starts reach the node only
once their records are in the store, and not at all when they cannot be written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from dashboard_fleet import GIB, ManualClock, _NoPublish
from store_fixtures import FakeClock, clock_fixture, store_fixture, target_fixture  # noqa: F401

from llmgw.control.catalog import Catalog
from llmgw.control.catalog.model import CatalogModel, Profile
from llmgw.control.inventory import Inventory
from llmgw.control.inventory.model import GpuInfo, NodeRegistration, ShardReport, ShardSpec
from llmgw.control.placements import NodeAddress, Placement, PlacementBook, PlacementError
from llmgw.control.reconciler.controller import Controller
from llmgw.store import Store

TTL = 10.0
WHERE = NodeAddress(
    advertise_host="127.0.0.1", seen_from="127.0.0.1", port_range=(20000, 20009), same_host=True
)


def placed(shard_id: str, node_id: str = "gpu-1", port: int = 20001) -> Placement:
    spec = ShardSpec(shard_id=shard_id, model="llama", engine="sim", weights="", port=port)
    return Placement(node_id=node_id, profile="p", spec=spec)


def ready(shard_id: str, port: int = 20001) -> ShardReport:
    return ShardReport(
        shard_id=shard_id, model="llama", state="ready", endpoint_url=f"http://127.0.0.1:{port}"
    )


async def book_on(store: Store, fenced: list[str]) -> PlacementBook:
    lease = await store.leadership.acquire("control", "a", TTL, "")
    assert lease is not None
    book = PlacementBook(store=store.placements, lease_name="control", on_fenced=fenced.append)
    await book.start_term(lease.epoch)
    return book


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    for _ in range(500):
        if await check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


async def stored_ids(store: Store) -> list[str]:
    return [p.shard_id for p in await store.placements.all()]


async def test_records_are_written_before_they_count_and_read_by_the_next_term(
    store: Store,
) -> None:
    fenced: list[str] = []
    book = await book_on(store, fenced)
    assert book.loaded
    assert book.vet("gpu-1", WHERE, ready("s1")).refused is not None

    await book.record([placed("s1"), placed("s2", "gpu-2", 20002)])
    assert [p.shard_id for p in await store.placements.all()] == ["s1", "s2"]
    assert book.vet("gpu-1", WHERE, ready("s1")).refused is None
    # Another node announcing a recorded shard is not that shard.
    assert book.vet("gpu-2", WHERE, ready("s1")).refused is not None

    # A server restart, or another leader: the next term reads the same records.
    book.end_term()
    assert not book.loaded
    again = await book_on(store, fenced)
    assert again.vet("gpu-1", WHERE, ready("s1")).refused is None
    assert [p.shard_id for p in again.on_node("gpu-2")] == ["s2"]
    assert fenced == []


async def test_forgotten_records_leave_the_store_and_a_register_drops_what_is_gone(
    store: Store,
) -> None:
    book = await book_on(store, [])
    await book.record([placed("s1"), placed("s2"), placed("s3"), placed("n2", "gpu-2")])
    for shard_id in ("s1", "s2", "s3", "n2"):
        book.settled(shard_id, refused=False)
    await book.record([placed("s4")])  # its start is still in flight

    book.forget(["s1"])
    # gpu-1 registers with s2 only: s3 is gone; s4's start has not been answered yet.
    book.registered("gpu-1", {"s2"})
    assert [p.shard_id for p in book.on_node("gpu-1")] == ["s2", "s4"]
    book.settled("s4", refused=True)  # the node refused the start
    book.forget_node("gpu-2")
    removals = asyncio.create_task(book.run())
    try:
        await until(lambda: _is(stored_ids(store), ["s2"]), "the removals to reach the store")
    finally:
        removals.cancel()


async def test_a_leader_whose_lease_moved_on_records_nothing_and_steps_down(
    store: Store, store_clock: FakeClock
) -> None:
    fenced: list[str] = []
    book = await book_on(store, fenced)
    store_clock.advance(seconds=TTL + 1)
    assert await store.leadership.acquire("control", "b", TTL, "") is not None
    with pytest.raises(PlacementError, match="another server leads now"):
        await book.record([placed("s1")])
    assert fenced and "held by b" in fenced[0]
    assert book.get("s1") is None
    assert await store.placements.all() == []


class Dispatcher:
    """Records the starts it is asked for, and what the store held at that moment."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.started: list[tuple[str, str, list[str]]] = []

    async def start_shard(self, node_id: str, spec: ShardSpec) -> None:
        recorded = [p.shard_id for p in await self.store.placements.all()]
        self.started.append((node_id, spec.shard_id, recorded))

    async def stop_shard(self, node_id: str, shard_id: str, grace_seconds: float) -> None:
        pass

    async def drain_shard(self, node_id: str, shard_id: str, grace_seconds: float) -> None:
        pass

    async def sleep_shard(
        self, node_id: str, shard_id: str, level: int, wait_seconds: float
    ) -> None:
        raise AssertionError("no replica sleeps here")

    async def wake_shard(self, node_id: str, shard_id: str, wait_seconds: float) -> None:
        raise AssertionError("no replica sleeps here")

    async def remove_weights(self, node_id: str, path: str) -> None:
        pass


def controller_with(store: Store, book: PlacementBook) -> tuple[Controller, Dispatcher]:
    clock = ManualClock()
    inventory = Inventory(
        clock=clock.monotonic, wall_clock=clock.wall, unreachable_after=15.0, lost_after=60.0
    )
    inventory.register(
        NodeRegistration(
            node_id="gpu-1", hostname="gpu-1", agent_version="0.1.0",
            gpus=tuple(GpuInfo(g, f"GPU-{g}", "NVIDIA L4", 24 * GIB, 23 * GIB) for g in range(2)),
            port_range=(20000, 20009), weights_dir="/w",
        )
    )  # fmt: skip
    model = CatalogModel(
        name="llama", weights="org/llama", min_replicas=2, max_replicas=2,
        profiles=(Profile(name="tp1", engine="sim", gpus=1),),
    )  # fmt: skip
    dispatcher = Dispatcher(store)
    controller = Controller(
        catalog=Catalog(repo=None, config_models=[model], config_file="llmgw.yaml"),
        inventory=inventory, dispatcher=dispatcher, placements=book, publisher=_NoPublish(),
        clock=clock.monotonic, wall_clock=clock.wall, policy="pack", interval=1.0,
        retry_base=1.0, retry_max=30.0, activation_timeout=60.0, stop_grace=5.0,
    )  # fmt: skip
    return controller, dispatcher


async def _is(value: Awaitable[object], expected: object) -> bool:
    return await value == expected


async def _true(value: bool) -> bool:
    return value


async def test_the_reconciler_sends_starts_only_once_they_are_recorded(store: Store) -> None:
    book = await book_on(store, [])
    controller, dispatcher = controller_with(store, book)
    controller.step()
    await until(lambda: _true(len(dispatcher.started) == 2), "both starts to be sent")
    shard_ids = sorted(shard_id for _, shard_id, _ in dispatcher.started)
    for node_id, _, recorded in dispatcher.started:
        # Both starts of the reconcile were recorded, in one write, before either was sent.
        assert node_id == "gpu-1" and sorted(recorded) == shard_ids
    stored = {p.shard_id: p for p in await store.placements.all()}
    assert {(p.node_id, p.model, p.profile) for p in stored.values()} == {("gpu-1", "llama", "tp1")}
    assert sorted(p.port for p in stored.values()) == [20000, 20001]


async def test_a_start_whose_record_cannot_be_written_is_not_sent(
    store: Store, store_clock: FakeClock
) -> None:
    fenced: list[str] = []
    book = await book_on(store, fenced)
    controller, dispatcher = controller_with(store, book)
    store_clock.advance(seconds=TTL + 1)
    assert await store.leadership.acquire("control", "b", TTL, "") is not None
    controller.step()
    await until(
        lambda: _true(any("could not be recorded" in e.message for e in controller.events())),
        "the refused record",
    )
    assert dispatcher.started == []
    assert await store.placements.all() == []
    assert fenced
    events = [e.message for e in controller.events() if e.kind == "start"]
    assert any("its placement could not be recorded" in m for m in events), events
