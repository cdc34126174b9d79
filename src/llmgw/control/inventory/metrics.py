"""Fleet metrics, computed from the inventory when Prometheus scrapes.

Nothing is updated on the report path: heartbeats and shard statuses cost no
metric work. At scrape time the collector reads a snapshot of every node.

Not guaranteed: per-GPU series. `llmgw_gpus_in_use` counts GPUs assigned to
shards that may still hold them (any state but stopped or failed: a failed
shard's process has exited), not what NVML says is busy.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llmgw.control.inventory.model import NODE_STATES, SHARD_STATES, Node


class FleetSource(Protocol):
    """What the collector reads: the `Inventory` satisfies it."""

    def nodes(self) -> Sequence[Node]: ...

    def heartbeat_age(self, node: Node) -> float: ...


class FleetMetrics(Collector):
    """Registers itself on `registry`; every value is read at scrape time."""

    def __init__(self, *, registry: CollectorRegistry, inventory: FleetSource) -> None:
        self._inventory = inventory
        registry.register(self)

    def describe(self) -> Iterator[Metric]:
        # Named families without values: lets the registry check for clashes at
        # registration without reading the inventory.
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        (nodes_f, draining_f, gpus_f, in_use_f, shards_f, age_f, memory_f, used_f, model_f) = (
            self._families()
        )
        nodes = self._inventory.nodes()
        by_state = Counter(node.state for node in nodes)
        shard_states = Counter(s.state for node in nodes for s in node.shards.values())
        for state in NODE_STATES:
            nodes_f.add_metric([state], by_state[state])
        for shard_state in SHARD_STATES:
            shards_f.add_metric([shard_state], shard_states[shard_state])
        draining_f.add_metric([], sum(1 for node in nodes if node.draining))
        gpus_f.add_metric([], sum(len(node.gpus) for node in nodes))
        in_use_f.add_metric([], sum(len(node.gpus_in_use()) for node in nodes))
        for node in nodes:
            age_f.add_metric([node.id], self._inventory.heartbeat_age(node))
        gpus = [gpu for node in nodes for gpu in node.gpus]
        memory_f.add_metric([], sum(gpu.memory_total for gpu in gpus))
        used_f.add_metric([], sum(gpu.memory_total - gpu.memory_free for gpu in gpus))
        by_model = Counter((s.model, s.state) for node in nodes for s in node.shards.values())
        for (model, shard_state), count in sorted(by_model.items()):
            model_f.add_metric([model, shard_state], count)
        yield from (nodes_f, draining_f, gpus_f, in_use_f, shards_f, age_f, memory_f, used_f)
        yield model_f

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, ...]:
        return (
            GaugeMetricFamily(
                "llmgw_nodes",
                "Known nodes by state (ready, unreachable: heartbeats missing, lost: gone "
                "long enough that their replicas belong elsewhere).",
                labels=["state"],
            ),
            GaugeMetricFamily(
                "llmgw_nodes_draining", "Nodes an operator marked draining (any state)."
            ),
            GaugeMetricFamily("llmgw_gpus_total", "GPUs reported by all known nodes."),
            GaugeMetricFamily(
                "llmgw_gpus_in_use",
                "GPUs assigned to shards that are not stopped or failed.",
            ),
            GaugeMetricFamily(
                "llmgw_shards", "Shards on all known nodes, by state.", labels=["state"]
            ),
            GaugeMetricFamily(
                "llmgw_node_heartbeat_age_seconds",
                "Seconds since each node's last heartbeat (or its registration).",
                labels=["node"],
            ),
            GaugeMetricFamily(
                "llmgw_gpu_memory_total_bytes", "GPU memory of all known nodes' GPUs."
            ),
            GaugeMetricFamily(
                "llmgw_gpu_memory_used_bytes",
                "GPU memory in use on all known nodes' GPUs (total minus free, as last reported).",
            ),
            GaugeMetricFamily(
                "llmgw_model_shards",
                "Shards of each model on all known nodes, by state.",
                labels=["model", "state"],
            ),
        )
