"""Nodes, GPUs and shards as the agents report them; see `inventory.py`."""

from llmgw.control.inventory.errors import InventoryError, UnknownNode
from llmgw.control.inventory.inventory import Change, ChangeKind, Inventory, Listener, Transition
from llmgw.control.inventory.metrics import FleetMetrics, FleetSource
from llmgw.control.inventory.model import (
    NODE_STATES,
    SHARD_STATES,
    TERMINAL_SHARD_STATES,
    Gpu,
    GpuInfo,
    GpuUsage,
    HostLimits,
    HostReading,
    Node,
    NodeBrief,
    NodeRegistration,
    NodeState,
    Shard,
    ShardReport,
    ShardSpec,
    ShardState,
)

__all__ = [
    "NODE_STATES",
    "SHARD_STATES",
    "TERMINAL_SHARD_STATES",
    "Change",
    "ChangeKind",
    "FleetMetrics",
    "FleetSource",
    "Gpu",
    "GpuInfo",
    "GpuUsage",
    "HostLimits",
    "HostReading",
    "Inventory",
    "InventoryError",
    "Listener",
    "Node",
    "NodeBrief",
    "NodeRegistration",
    "NodeState",
    "Shard",
    "ShardReport",
    "ShardSpec",
    "ShardState",
    "Transition",
    "UnknownNode",
]
