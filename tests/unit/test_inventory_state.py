"""The inventory's node state machine, adoption and draining, in virtual time."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from llmgw.control.inventory import (
    Change,
    GpuInfo,
    GpuUsage,
    Inventory,
    NodeRegistration,
    ShardReport,
    ShardSpec,
    UnknownNode,
)

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


class VirtualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return EPOCH + timedelta(seconds=self.now)

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def inventory(clock: VirtualClock) -> Inventory:
    return Inventory(clock=clock, wall_clock=clock.wall, unreachable_after=15.0, lost_after=60.0)


def registration(node_id: str = "node-a", shards: tuple[ShardReport, ...] = ()) -> NodeRegistration:
    return NodeRegistration(
        node_id=node_id,
        hostname=f"{node_id}.lab",
        agent_version="0.1.0",
        gpus=(
            GpuInfo(0, "GPU-aaa", "NVIDIA H100 80GB HBM3", 80 << 30, 79 << 30),
            GpuInfo(1, "GPU-bbb", "NVIDIA H100 80GB HBM3", 80 << 30, 79 << 30),
        ),
        cpu_count=64,
        memory_total=512 << 30,
        weights_disk_free=2 << 40,
        gpu_source="nvml",
        labels={"zone": "a"},
        fabric={"ib-domain": "pod3"},
        running_shards=shards,
        port_range=(20000, 20099),
        weights_dir="/srv/weights",
    )


def ready_shard(shard_id: str = "llama-0", gpus: tuple[int, ...] = (0,)) -> ShardReport:
    return ShardReport(
        shard_id=shard_id,
        model="llama-8b",
        state="ready",
        pid=4242,
        endpoint_url="http://10.0.0.5:20001",
        spec=ShardSpec(
            shard_id=shard_id,
            model="llama-8b",
            engine="vllm",
            weights="/srv/weights/llama",
            gpu_indices=gpus,
            port=20001,
        ),
        since=EPOCH,
    )


def test_ready_then_unreachable_then_lost_then_ready_on_heartbeat(
    inventory: Inventory, clock: VirtualClock
) -> None:
    inventory.register(registration())
    assert inventory.node("node-a").state == "ready"

    clock.advance(14.9)
    assert inventory.sweep() == []
    assert inventory.node("node-a").state == "ready"

    clock.advance(0.2)
    moves = inventory.sweep()
    assert [(m.node_id, m.old, m.new) for m in moves] == [("node-a", "ready", "unreachable")]
    assert inventory.node("node-a").state == "unreachable"
    assert inventory.sweep() == []  # no repeated transitions

    clock.advance(45.0)
    assert [(m.old, m.new) for m in inventory.sweep()] == [("unreachable", "lost")]
    assert inventory.node("node-a").state == "lost"
    assert inventory.heartbeat_age(inventory.node("node-a")) == pytest.approx(60.1)

    inventory.heartbeat("node-a", [])
    node = inventory.node("node-a")
    assert node.state == "ready"
    assert inventory.heartbeat_age(node) == 0.0
    assert node.last_heartbeat_at == clock.wall()
    clock.advance(10.0)
    assert inventory.sweep() == []


def test_a_long_silence_goes_straight_to_lost(inventory: Inventory, clock: VirtualClock) -> None:
    inventory.register(registration())
    clock.advance(300.0)
    assert [(m.old, m.new) for m in inventory.sweep()] == [("ready", "lost")]


def test_heartbeats_keep_a_node_ready_and_record_gpu_load(
    inventory: Inventory, clock: VirtualClock
) -> None:
    inventory.register(registration())
    for _ in range(10):
        clock.advance(5.0)
        inventory.heartbeat(
            "node-a",
            [GpuUsage(index=1, utilization=93.0, memory_used=70 << 30, memory_free=10 << 30)],
        )
        assert inventory.sweep() == []
    gpus = inventory.node("node-a").gpus
    assert (gpus[0].utilization, gpus[0].memory_used) == (None, None)
    assert (gpus[1].utilization, gpus[1].memory_used, gpus[1].memory_free) == (
        93.0,
        70 << 30,
        10 << 30,
    )


def test_registration_keeps_hardware_labels_and_fabric(
    inventory: Inventory, clock: VirtualClock
) -> None:
    node = inventory.register(registration())
    assert node.connected and not node.draining
    assert [g.uuid for g in node.gpus] == ["GPU-aaa", "GPU-bbb"]
    assert (node.cpu_count, node.memory_total, node.weights_disk_free) == (64, 512 << 30, 2 << 40)
    assert node.labels == {"zone": "a"} and node.fabric == {"ib-domain": "pod3"}
    assert node.port_range == (20000, 20099) and node.weights_dir == "/srv/weights"
    assert node.registered_at == clock.wall()


def test_reported_running_shards_are_adopted_not_duplicated(
    inventory: Inventory, clock: VirtualClock
) -> None:
    inventory.register(registration(shards=(ready_shard("llama-0"),)))
    inventory.shard_status("node-a", ShardReport(shard_id="qwen-0", model="qwen", state="loading"))
    inventory.disconnected("node-a")
    clock.advance(20.0)
    inventory.sweep()

    # The agent comes back still running llama-0; qwen-0 died with the old agent.
    node = inventory.register(registration(shards=(ready_shard("llama-0"),)))
    assert list(node.shards) == ["llama-0"]
    shard = node.shards["llama-0"]
    assert (shard.state, shard.engine, shard.pid, shard.gpu_indices) == (
        "ready",
        "vllm",
        4242,
        (0,),
    )
    assert shard.spec is not None and shard.spec.port == 20001
    assert node.state == "ready" and node.connected


def test_the_draining_flag_survives_registering_again(inventory: Inventory) -> None:
    inventory.register(registration())
    assert inventory.set_draining("node-a", True).draining
    inventory.disconnected("node-a")
    assert inventory.register(registration()).draining
    assert not inventory.set_draining("node-a", False).draining
    assert not inventory.register(registration()).draining


def test_shard_status_adds_and_updates_shards(inventory: Inventory, clock: VirtualClock) -> None:
    inventory.register(registration())
    spec = ShardSpec(
        shard_id="s1",
        model="llama-8b",
        engine="llamacpp",
        weights="/srv/weights/m.gguf",
        gpu_indices=(1,),
    )
    inventory.shard_status(
        "node-a", ShardReport(shard_id="s1", model="llama-8b", state="starting", spec=spec)
    )
    clock.advance(3.0)
    # Later statuses need not repeat the spec; it is kept.
    shard = inventory.shard_status(
        "node-a",
        ShardReport(
            shard_id="s1",
            model="llama-8b",
            state="failed",
            message="engine exited",
            exit_code=137,
            output_tail=("Killed",),
        ),
    )
    assert (shard.state, shard.exit_code, shard.output_tail, shard.engine, shard.spec) == (
        "failed",
        137,
        ("Killed",),
        "llamacpp",
        spec,
    )
    assert shard.since == clock.wall()
    assert not shard.holds_gpus
    inventory.forget_shard("node-a", "s1")
    assert inventory.node("node-a").shards == {}


def test_snapshots_do_not_change_behind_the_callers_back(inventory: Inventory) -> None:
    inventory.register(registration())
    before = inventory.node("node-a")
    inventory.shard_status("node-a", ready_shard("x"))
    inventory.set_draining("node-a", True)
    assert before.shards == {} and not before.draining


def test_listeners_hear_changes(inventory: Inventory, clock: VirtualClock) -> None:
    heard: list[Change] = []
    unsubscribe = inventory.subscribe(heard.append)
    inventory.register(registration(shards=(ready_shard("a"),)))
    inventory.shard_status("node-a", ShardReport(shard_id="b", model="m", state="loading"))
    inventory.heartbeat("node-a", [])  # nothing changed: no event
    inventory.register(registration(shards=(ready_shard("a"),)))  # b no longer reported
    inventory.set_draining("node-a", True)
    inventory.set_draining("node-a", True)  # no change, no event
    clock.advance(16.0)
    inventory.sweep()
    inventory.disconnected("node-a")
    unsubscribe()
    inventory.heartbeat("node-a", [])
    assert [(c.kind, c.node_id, c.shard_id) for c in heard] == [
        ("node_registered", "node-a", None),
        ("shard_status", "node-a", "b"),
        ("node_registered", "node-a", None),
        ("shard_removed", "node-a", "b"),
        ("node_draining", "node-a", None),
        ("node_state", "node-a", None),
        ("node_disconnected", "node-a", None),
    ]


def test_unknown_nodes_raise(inventory: Inventory) -> None:
    for call in (
        lambda: inventory.node("ghost"),
        lambda: inventory.heartbeat("ghost", []),
        lambda: inventory.set_draining("ghost", True),
        lambda: inventory.disconnected("ghost"),
    ):
        with pytest.raises(UnknownNode) as error:
            call()
        assert "ghost" in str(error.value)


def test_windows_must_be_ordered(clock: VirtualClock) -> None:
    with pytest.raises(ValueError, match="unreachable_after < lost_after"):
        Inventory(clock=clock, wall_clock=clock.wall, unreachable_after=60.0, lost_after=15.0)


def test_nodes_are_listed_by_id(inventory: Inventory) -> None:
    for node_id in ("node-c", "node-a", "node-b"):
        inventory.register(registration(node_id))
    assert [n.id for n in inventory.nodes()] == ["node-a", "node-b", "node-c"]


def test_an_older_repeated_status_does_not_undo_a_newer_one(inventory: Inventory) -> None:
    inventory.register(registration())
    later = EPOCH + timedelta(seconds=30)
    inventory.shard_status(
        "node-a", ShardReport(shard_id="s1", model="m", state="ready", since=later)
    )
    kept = inventory.shard_status(
        "node-a", ShardReport(shard_id="s1", model="m", state="loading", since=EPOCH)
    )
    assert kept.state == "ready"
    assert inventory.node("node-a").shards["s1"].state == "ready"


def test_an_engine_adopted_by_a_restarted_agent_keeps_its_age(inventory: Inventory) -> None:
    inventory.register(registration(shards=(ready_shard("llama-0"),)))
    inventory.disconnected("node-a")
    # The new agent adopts the same engine process and says "ready since now".
    adopted = replace(ready_shard("llama-0"), since=EPOCH + timedelta(seconds=90))
    node = inventory.register(registration(shards=(adopted,)))
    assert node.shards["llama-0"].since == EPOCH
    again = inventory.shard_status("node-a", replace(adopted, message="adopted"))
    assert again.since == EPOCH

    # Another process behind the same shard id (or another state) is new.
    moved = replace(adopted, pid=5151)
    assert inventory.shard_status("node-a", moved).since == EPOCH + timedelta(seconds=90)
    loading = replace(moved, state="loading", since=EPOCH + timedelta(seconds=95))
    assert inventory.shard_status("node-a", loading).since == EPOCH + timedelta(seconds=95)


def test_a_node_snapshot_carries_every_field_and_its_own_shard_dict(inventory: Inventory) -> None:
    """`Node.copy` is written field by field (for speed): a field added to `Node` and
    forgotten there fails here."""
    spec = ShardSpec(shard_id="s1", model="m", engine="sim", weights="w", gpu_indices=(0,))
    report = ShardReport("s1", "m", "ready", spec=spec)
    original = inventory.register(registration(shards=(report,)))
    snapshot = original.copy()
    for f in dataclasses.fields(original):
        assert getattr(snapshot, f.name) == getattr(original, f.name), f.name
    snapshot.shards.pop("s1")
    assert "s1" in original.shards
