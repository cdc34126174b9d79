"""Fleet metrics read the inventory at scrape time."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from test_inventory_state import VirtualClock, ready_shard, registration

from llmgw.control.inventory import FleetMetrics, Inventory, ShardReport, ShardSpec


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_fleet_metrics_follow_the_inventory() -> None:
    clock = VirtualClock()
    inventory = Inventory(
        clock=clock, wall_clock=clock.wall, unreachable_after=15.0, lost_after=60.0
    )
    registry = CollectorRegistry()
    FleetMetrics(registry=registry, inventory=inventory)

    assert sample(registry, "llmgw_nodes", state="ready") == 0
    assert sample(registry, "llmgw_gpus_total") == 0

    inventory.register(registration("node-a", shards=(ready_shard("a0", gpus=(0, 1)),)))
    inventory.register(registration("node-b"))
    inventory.register(registration("node-c"))
    spec = ShardSpec(shard_id="b0", model="m", engine="sim", weights="w", gpu_indices=(1,))
    inventory.shard_status(
        "node-b", ShardReport(shard_id="b0", model="m", state="loading", spec=spec)
    )
    gone = ShardSpec(shard_id="b1", model="m", engine="sim", weights="w", gpu_indices=(0,))
    inventory.shard_status(
        "node-b", ShardReport(shard_id="b1", model="m", state="stopped", spec=gone)
    )
    inventory.shard_status(
        "node-c", ShardReport(shard_id="c0", model="m", state="failed", spec=gone)
    )
    inventory.set_draining("node-c", True)

    clock.advance(20.0)
    inventory.heartbeat("node-a", [])
    inventory.heartbeat("node-b", [])
    inventory.sweep()  # node-c: unreachable
    clock.advance(2.5)

    assert sample(registry, "llmgw_nodes", state="ready") == 2
    assert sample(registry, "llmgw_nodes", state="unreachable") == 1
    assert sample(registry, "llmgw_nodes", state="lost") == 0
    assert sample(registry, "llmgw_nodes_draining") == 1
    assert sample(registry, "llmgw_gpus_total") == 6
    # a0 holds 2 GPUs, b0 (loading) 1; stopped and failed shards hold none.
    assert sample(registry, "llmgw_gpus_in_use") == 3
    assert sample(registry, "llmgw_shards", state="ready") == 1
    assert sample(registry, "llmgw_shards", state="loading") == 1
    assert sample(registry, "llmgw_shards", state="stopped") == 1
    assert sample(registry, "llmgw_shards", state="failed") == 1
    assert sample(registry, "llmgw_shards", state="draining") == 0
    assert sample(registry, "llmgw_node_heartbeat_age_seconds", node="node-a") == 2.5
    assert sample(registry, "llmgw_node_heartbeat_age_seconds", node="node-c") == 22.5

    text = generate_latest(registry).decode()
    assert 'llmgw_nodes{state="ready"} 2.0' in text
