"""The sweeper loop ages nodes on its interval, in virtual time."""

from __future__ import annotations

import asyncio

import pytest
from test_inventory_state import VirtualClock, registration

from llmgw.control.agentsvc import run_sweeper
from llmgw.control.inventory import Inventory


async def test_the_sweeper_moves_silent_nodes_along() -> None:
    clock = VirtualClock()
    inventory = Inventory(
        clock=clock, wall_clock=clock.wall, unreachable_after=15.0, lost_after=60.0
    )
    inventory.register(registration())
    states: list[str] = []

    async def sleep(seconds: float) -> None:
        clock.advance(seconds)
        states.append(inventory.node("node-a").state)
        if len(states) == 10:
            raise asyncio.CancelledError
        await asyncio.sleep(0)

    with pytest.raises(asyncio.CancelledError):
        await run_sweeper(inventory=inventory, interval=10.0, sleep=sleep)
    # Each entry is the state the previous sweep left: the sweep at t=20 finds
    # 20 s of silence (unreachable), the one at t=60 finds 60 s (lost).
    assert states == ["ready", "ready"] + ["unreachable"] * 4 + ["lost"] * 4
