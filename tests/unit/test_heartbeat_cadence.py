"""The heartbeat interval that grows with the fleet: the server's steps, each node's
thresholds in the inventory, and the agent's wait for its next heartbeat."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from llmgw.agent.connection import _Interval
from llmgw.control.agentsvc.cadence import HeartbeatCadence
from llmgw.control.inventory import HostReading, Inventory, NodeRegistration, UnknownNode


def test_the_configured_interval_holds_up_to_the_threshold_then_grows_in_whole_steps() -> None:
    cadence = HeartbeatCadence(interval=5.0, scale_above=1000)
    assert not cadence.update(1)
    assert not cadence.update(1000)
    assert (cadence.factor, cadence.interval) == (1, 5.0)
    assert cadence.update(1001)
    assert (cadence.factor, cadence.interval) == (2, 10.0)
    assert not cadence.update(2000)
    # A jump (a storm's registrations) goes straight to the step it needs.
    assert cadence.update(9500)
    assert (cadence.factor, cadence.interval) == (10, 50.0)
    assert cadence.interval_for(3) == 15.0


def test_the_interval_shrinks_only_well_below_a_step() -> None:
    cadence = HeartbeatCadence(interval=5.0, scale_above=1000)
    cadence.update(2500)
    assert cadence.factor == 3
    # Hovering around the boundary does not retell every agent at each registration.
    assert not cadence.update(2000)
    assert not cadence.update(1901)
    assert cadence.factor == 3
    assert cadence.update(1900)
    assert cadence.factor == 2
    assert not cadence.update(901)
    assert cadence.update(0)
    assert cadence.factor == 1


def test_a_cadence_needs_a_positive_interval_and_threshold() -> None:
    with pytest.raises(ValueError, match="scale_above >= 1"):
        HeartbeatCadence(interval=5.0, scale_above=0)
    with pytest.raises(ValueError, match="interval > 0"):
        HeartbeatCadence(interval=0.0, scale_above=10)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def registration(node_id: str) -> NodeRegistration:
    return NodeRegistration(node_id=node_id, hostname=node_id, agent_version="test")


def test_a_node_told_a_longer_interval_ages_by_its_own_thresholds() -> None:
    clock = Clock()
    inventory = Inventory(
        clock=clock,
        wall_clock=lambda: datetime(2026, 1, 1, tzinfo=UTC),
        unreachable_after=15.0,
        lost_after=60.0,
    )
    inventory.register(registration("plain"))
    inventory.register(registration("slow"))
    inventory.heartbeat_factor("slow", 3)

    def state() -> dict[str, str]:
        return {n.id: n.state for n in inventory.nodes()}

    clock.now += 20  # four missed beats at 5 s; one and a third at 15 s
    moves = inventory.sweep()
    assert [(m.node_id, m.new) for m in moves] == [("plain", "unreachable")]
    assert state() == {"plain": "unreachable", "slow": "ready"}
    clock.now += 25  # 45 s: three beats at 15 s missed
    assert [(m.node_id, m.new) for m in inventory.sweep()] == [("slow", "unreachable")]
    clock.now += 20  # 65 s: lost at 60 s for the plain node; the slow one at 180 s
    assert [(m.node_id, m.new) for m in inventory.sweep()] == [("plain", "lost")]
    clock.now += 115
    assert [(m.node_id, m.new) for m in inventory.sweep()] == [("slow", "lost")]
    # Told the configured interval again: the configured thresholds.
    inventory.heartbeat_factor("slow", 1)
    inventory.heartbeat("slow", (), (), HostReading(), ())
    clock.now += 16
    assert [(m.node_id, m.new) for m in inventory.sweep()] == [("slow", "unreachable")]
    with pytest.raises(UnknownNode):
        inventory.heartbeat_factor("nobody", 2)


async def test_an_interval_changed_while_waiting_moves_the_next_heartbeat() -> None:
    slept: asyncio.Queue[float] = asyncio.Queue()

    async def park(seconds: float) -> None:
        slept.put_nowait(seconds)
        await asyncio.Event().wait()  # a long sleep: only a change ends it

    interval = _Interval(1000.0)
    waiting = asyncio.create_task(interval.wait(park))
    async with asyncio.timeout(10):
        assert await slept.get() == 1000.0
        # Longer: the wait goes on, for the rest of the new interval from its start.
        interval.change(3000.0)
        assert 2999.0 < await slept.get() <= 3000.0
        assert not waiting.done()
        # Shorter than what has passed: due at once, without another sleep.
        interval.change(1e-9)
        await waiting
    assert slept.empty()
    # A value that is not positive is ignored.
    interval.change(0.0)
    assert interval.seconds == 1e-9


async def test_an_unchanged_interval_waits_one_sleep() -> None:
    slept: list[float] = []

    async def record(seconds: float) -> None:
        slept.append(seconds)

    await _Interval(5.0).wait(record)
    assert slept == [5.0]
