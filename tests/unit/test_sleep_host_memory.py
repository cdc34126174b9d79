"""A replica is put to sleep only where its node can hold it in host memory.

`SleepBook.step` against nodes as the inventory knows them: the node's available
memory (heartbeats) and its `--sleep-memory-max` (Register), with what its
sleeping replicas and those falling asleep already hold. The dispatcher is a
recorder; the sleeps it is sent are the decision under test.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any

from opentelemetry.trace import NoOpTracer
from test_placement import make_node, make_shard

from llmgw.control.catalog.model import CatalogModel, Profile
from llmgw.control.inventory.model import HeldWeights, HostLimits, HostReading, Node, Shard
from llmgw.control.reconciler.demand import DemandBook
from llmgw.control.reconciler.sleep import SleepBook

MB = 10**6
COMMIT = "c" * 40


class Recorder:
    """Records sleep commands; everything else is not expected here."""

    def __init__(self) -> None:
        self.slept: list[tuple[str, str]] = []

    async def sleep_shard(self, node_id: str, shard_id: str, level: int, wait: float) -> None:
        self.slept.append((node_id, shard_id))


def book() -> tuple[SleepBook, Recorder, list[str], list[Coroutine[Any, Any, None]]]:
    recorder = Recorder()
    events: list[str] = []
    spawned: list[Coroutine[Any, Any, None]] = []
    sleeps = SleepBook(
        dispatcher=recorder,  # type: ignore[arg-type]
        clock=lambda: 100.0,
        tracer=NoOpTracer(),
        spawn=lambda coro, name: spawned.append(coro),
        event=lambda kind, model, node, message: events.append(message),
        wake_loop=lambda: None,
        command_timeout=10.0,
    )
    return sleeps, recorder, events, spawned


def napper(name: str) -> CatalogModel:
    return CatalogModel(
        name=name,
        weights="org/tiny",
        weights_commit=COMMIT,
        profiles=(Profile(name="p", engine="sim", gpus=0),),
        sleep_after=1.0,
        keep_alive=300.0,
    )


def sleepy_shard(shard_id: str, model: str, state: str = "ready") -> Shard:
    shard = make_shard(shard_id, model, port=20000, state=state)  # type: ignore[arg-type]
    assert shard.spec is not None
    spec = dataclasses.replace(shard.spec, weights=f"org/tiny@{COMMIT}", sleep_mode=True)
    return dataclasses.replace(shard, spec=spec)


def node_with(*shards: Shard, available: int, limit: int = 0) -> Node:
    return dataclasses.replace(
        make_node("node-a", shards=shards),
        weights=(HeldWeights("org/tiny", COMMIT, 30 * MB, None),),
        host=HostReading(
            disk_total=1, disk_free=1, memory_total=1 << 40, memory_available=available
        ),
        limits=HostLimits(sleep_memory_max=limit),
    )


def idle_demand(*models: str) -> DemandBook:
    demand = DemandBook(clock=lambda: 0.0, wall_clock=lambda: datetime.now(UTC))
    for name in models:
        demand.started(name)
        demand.finished(name)  # last active at 0; the step runs at 100
    return demand


def test_a_replica_sleeps_only_while_the_available_memory_holds_it() -> None:
    sleeps, recorder, events, spawned = book()
    models = [napper("m1"), napper("m2")]
    node = node_with(sleepy_shard("r1", "m1"), sleepy_shard("r2", "m2"), available=45 * MB)
    sleeps.step(models, [node], idle_demand("m1", "m2"), (), 100.0)
    # 45 MB available: the first (30 MB) falls asleep, the second would need 60 MB.
    assert sleeps.falling == frozenset({"r1"})
    assert events[-1] == (
        "replica r2 on node node-a stays awake: asleep it would hold 30.0 MB of host "
        "memory and the node has 15.0 MB available"
    )
    # The next reconcile says nothing new about it.
    sleeps.step(models, [node], idle_demand("m1", "m2"), (), 100.0)
    assert sum("stays awake" in e for e in events) == 1
    for coro in spawned:
        asyncio.run(coro)
    assert recorder.slept == [("node-a", "r1")]
    assert sleeps.falling == frozenset()


def test_the_sleep_memory_limit_counts_what_sleeping_replicas_hold() -> None:
    sleeps, _, events, spawned = book()
    asleep = sleepy_shard("r0", "m0", state="sleeping")
    node = node_with(asleep, sleepy_shard("r1", "m1"), available=1 << 40, limit=50 * MB)
    assert node.sleeping_memory() == 30 * MB
    sleeps.step([napper("m0"), napper("m1")], [node], idle_demand("m1"), (), 100.0)
    assert sleeps.falling == frozenset() and spawned == []
    assert "past the node's --sleep-memory-max 50.0 MB (30.0 MB held by sleeping" in events[-1]
    # With room under the limit, it sleeps.
    roomy = dataclasses.replace(node, limits=HostLimits(sleep_memory_max=60 * MB))
    sleeps.step([napper("m1")], [roomy], idle_demand("m1"), (), 100.0)
    assert sleeps.falling == frozenset({"r1"})
    for coro in spawned:
        asyncio.run(coro)
