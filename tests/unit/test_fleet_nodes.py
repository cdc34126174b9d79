"""The leader's view of the nodes in the store: fenced writes, what a standby reads.

Store tests run on SQLite and PostgreSQL (the store fixtures); the publisher loop
runs against an in-memory store with a sleep that counts rounds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import pytest
from store_fixtures import (  # noqa: F401
    START,
    FakeClock,
    StoreTarget,
    clock_fixture,
    store_fixture,
    target_fixture,
)

from llmgw.control.leadership import FleetView, publish_fleet
from llmgw.control.leadership.fleet import PAUSE_PER_COST
from llmgw.store import FleetNode, StaleEpoch, Store, StoreError

TTL = 10.0


def view(node_id: str, state: str = "ready", age: float = 0.5) -> dict[str, Any]:
    return {
        "id": node_id,
        "state": state,
        "last_heartbeat_at": START.isoformat(),
        "heartbeat_age_seconds": age,
        "gpus": [{"index": 0, "in_use": False}],
    }


async def test_the_leader_writes_nodes_fenced_and_a_standby_reads_them(
    store: Store, store_clock: FakeClock
) -> None:
    await store.leadership.acquire("control", "a", TTL, "a:9443")
    views = {"n1": view("n1"), "n2": view("n2")}
    await store.leadership.publish_nodes("control", 1, views, keep_only=True)
    assert [(n.node_id, n.view, n.epoch) for n in await store.leadership.fleet_nodes()] == [
        ("n1", views["n1"], 1),
        ("n2", views["n2"], 1),
    ]
    await store.leadership.publish_nodes(
        "control", 1, {"n2": view("n2", "unreachable")}, keep_only=False
    )
    await store.leadership.withdraw_nodes("control", 1, ["n1"])
    [only] = await store.leadership.fleet_nodes()
    assert (only.node_id, only.view["state"]) == ("n2", "unreachable")

    # A new leader replaces the table; the old one is fenced.
    store_clock.advance(seconds=TTL + 1)
    await store.leadership.acquire("control", "b", TTL, "b:9443")
    await store.leadership.publish_nodes("control", 2, {"n3": view("n3")}, keep_only=True)
    assert [n.node_id for n in await store.leadership.fleet_nodes()] == ["n3"]
    with pytest.raises(StaleEpoch):
        await store.leadership.publish_nodes("control", 1, {"n1": view("n1")}, keep_only=False)
    with pytest.raises(StaleEpoch):
        await store.leadership.withdraw_nodes("control", 1, ["n3"])
    assert [n.node_id for n in await store.leadership.fleet_nodes()] == ["n3"]


class MemoryFleet:
    def __init__(self, epoch: int = 1) -> None:
        self.rows: dict[str, dict[str, Any]] = {}
        self.writes: list[tuple[str, list[str]]] = []
        self.epoch = epoch
        self.fail = False

    def _check(self, epoch: int) -> None:
        if self.fail:
            raise StoreError("connection refused")
        if epoch != self.epoch:
            raise StaleEpoch(f"epoch {epoch} is stale")

    async def publish_nodes(
        self,
        lease_name: str,
        epoch: int,
        views: Mapping[str, dict[str, Any]],
        *,
        keep_only: bool,
    ) -> None:
        self._check(epoch)
        if keep_only:
            self.rows = {}
        self.rows.update(views)
        self.writes.append(("replace" if keep_only else "publish", sorted(views)))

    async def withdraw_nodes(self, lease_name: str, epoch: int, node_ids: Sequence[str]) -> None:
        self._check(epoch)
        for node_id in node_ids:
            self.rows.pop(node_id, None)
        self.writes.append(("withdraw", sorted(node_ids)))

    async def fleet_nodes(self) -> list[FleetNode]:
        return [
            FleetNode(k, v, self.epoch, START + timedelta(seconds=1))
            for k, v in sorted(self.rows.items())
        ]


class Rounds:
    """A sleep that lets the loop run `steps` (callables run between rounds), then stops it."""

    def __init__(self, *steps: Any) -> None:
        self.steps = list(steps)

    async def __call__(self, _: float) -> None:
        if not self.steps:
            raise LookupError("done")
        self.steps.pop(0)()


async def test_the_publisher_writes_only_what_changed_and_stops_when_fenced() -> None:
    store = MemoryFleet()
    current = {"n1": view("n1"), "n2": view("n2")}
    fenced: list[str] = []

    def age_only() -> None:
        current["n1"] = view("n1", age=9.0)  # a heartbeat age alone is no change

    def n2_unreachable_n1_gone() -> None:
        current["n2"] = view("n2", "unreachable")
        del current["n1"]

    def store_down() -> None:
        store.fail = True
        current["n4"] = view("n4")

    def store_back() -> None:
        store.fail = False

    def new_leader() -> None:
        store.epoch = 2
        current["n5"] = view("n5")

    with pytest.raises(LookupError):
        await publish_fleet(
            store=store,
            views=lambda: dict(current),
            lease_name="control",
            epoch=1,
            on_fenced=fenced.append,
            interval=1.0,
            sleep=Rounds(age_only, n2_unreachable_n1_gone, store_down, store_back),
        )
    assert store.writes == [
        ("replace", ["n1", "n2"]),
        ("withdraw", ["n1"]),
        ("publish", ["n2"]),
        ("publish", ["n4"]),
    ]
    assert "heartbeat_age_seconds" not in store.rows["n2"]
    assert store.rows["n2"]["state"] == "unreachable" and fenced == []

    await publish_fleet(
        store=store,
        views=lambda: dict(current),
        lease_name="control",
        epoch=1,
        on_fenced=fenced.append,
        interval=1.0,
        sleep=Rounds(new_leader),
    )
    assert fenced == ["epoch 1 is stale"]


async def test_the_publisher_pauses_longer_when_a_round_costs_more() -> None:
    """Building every node's view costs in proportion to the fleet; the pause after a
    round is at least PAUSE_PER_COST times that cost, so a big fleet is published less
    often instead of taking the event loop."""
    store = MemoryFleet()
    now = [100.0]
    cost = [0.01]
    pauses: list[float] = []

    def views() -> dict[str, dict[str, Any]]:
        now[0] += cost[0]  # what building the views took
        return {"n1": view("n1")}

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 1:
            cost[0] = 0.5  # the fleet grew
        elif len(pauses) == 3:
            raise LookupError("done")
        else:
            cost[0] = 0.01

    with pytest.raises(LookupError):
        await publish_fleet(
            store=store,
            views=views,
            lease_name="control",
            epoch=1,
            on_fenced=lambda _: None,
            interval=1.0,
            sleep=sleep,
            clock=lambda: now[0],
        )
    assert pauses == [1.0, pytest.approx(0.5 * PAUSE_PER_COST), 1.0]
    assert PAUSE_PER_COST * 0.5 > 1.0
    assert store.writes == [("replace", ["n1"])]


async def test_a_standby_reports_the_heartbeat_age_as_of_now() -> None:
    store = MemoryFleet()
    store.rows = {"n1": {k: v for k, v in view("n1").items() if k != "heartbeat_age_seconds"}}
    leading = False
    fleet = FleetView(
        store=store,
        leading=lambda: leading,
        leader=lambda: "a",
        wall_clock=lambda: START + timedelta(seconds=7.25),
    )
    assert not fleet.leading() and fleet.leader() == "a"
    [node] = await fleet.nodes()
    assert node["heartbeat_age_seconds"] == 7.25
    assert node["leader_view_at"] == (START + timedelta(seconds=1)).isoformat()


async def test_a_standby_keeps_the_last_read_for_its_dashboard() -> None:
    store = MemoryFleet()
    fleet = FleetView(
        store=store,
        leading=lambda: False,
        leader=lambda: None,
        wall_clock=lambda: START + timedelta(seconds=2),
    )
    assert fleet.latest() is None

    def leader_wrote_n2() -> None:
        store.rows["n2"] = view("n2", "unreachable")

    def store_down() -> None:
        store.fail = True
        store.rows.clear()

    async def fleet_nodes_or_fail() -> list[FleetNode]:
        if store.fail:
            raise StoreError("connection refused")
        return await MemoryFleet.fleet_nodes(store)

    store.fleet_nodes = fleet_nodes_or_fail  # type: ignore[method-assign]
    store.rows = {"n1": view("n1")}
    with pytest.raises(LookupError):
        await fleet.follow(interval=0.5, sleep=Rounds(leader_wrote_n2, store_down))
    latest = fleet.latest()
    assert latest is not None
    assert [(n["id"], n["state"]) for n in latest] == [("n1", "ready"), ("n2", "unreachable")]
    assert latest[0]["heartbeat_age_seconds"] == 2.0
