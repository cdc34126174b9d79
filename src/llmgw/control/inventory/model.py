"""Plain dataclasses for nodes, GPUs and shards, and for the reports that update them.

These are the control plane's own types: the agent service converts protobuf
messages into them at its boundary, so nothing past it depends on generated
code. Reports (`NodeRegistration`, `GpuUsage`, `ShardReport`) are what an agent
said; `Node`, `Gpu` and `Shard` are what the inventory keeps.

Not guaranteed: that a `Node` handed out stays current. The inventory hands out
copies; a copy is a snapshot taken when it was asked for.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, get_args

NodeState = Literal["ready", "unreachable", "lost"]
ShardState = Literal["starting", "loading", "ready", "draining", "stopped", "failed", "sleeping"]

NODE_STATES: tuple[NodeState, ...] = get_args(NodeState)
SHARD_STATES: tuple[ShardState, ...] = get_args(ShardState)
# A shard in one of these has no process: its GPUs and port are free again.
TERMINAL_SHARD_STATES: frozenset[ShardState] = frozenset({"stopped", "failed"})


@dataclass(frozen=True, slots=True)
class ShardSpec:
    """What a shard runs: the StartShard command's payload, and what adoption recovers."""

    shard_id: str
    model: str
    engine: str
    weights: str
    gpu_indices: tuple[int, ...] = ()
    port: int = 0
    engine_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    # 0 leaves the engine's own default in place.
    gpu_memory_utilization: float = 0.0
    # Seconds; 0 leaves the engine kind's default (on the agent) in place.
    load_timeout: float = 0.0
    unhealthy_after: float = 0.0
    drain_grace: float = 0.0
    # A multi-node replica: `nodes` shards sharing `replica_id` (rank 0's shard id),
    # this one rank `node_rank`; ranks meet at master_addr:master_port.
    nodes: int = 1
    node_rank: int = 0
    master_addr: str = ""
    master_port: int = 0
    replica_id: str = ""
    # Started so that it can sleep (its model has a sleep_after).
    sleep_mode: bool = False

    @property
    def replica(self) -> str:
        """The replica this shard belongs to: its own id unless it is one of a gang."""
        return self.replica_id or self.shard_id


@dataclass(frozen=True, slots=True)
class NetInterface:
    """One network interface of a node and its addresses, as CIDR strings."""

    name: str
    addresses: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One GPU as the agent describes it when it registers."""

    index: int
    uuid: str
    name: str
    memory_total: int
    memory_free: int


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """One GPU's load, from a heartbeat."""

    index: int
    utilization: float
    memory_used: int
    memory_free: int


@dataclass(frozen=True, slots=True)
class ShardReport:
    """A shard's status as the agent reports it (on a transition, or when registering)."""

    shard_id: str
    model: str
    state: ShardState
    message: str = ""
    pid: int | None = None
    endpoint_url: str = ""
    output_tail: tuple[str, ...] = ()
    exit_code: int | None = None
    spec: ShardSpec | None = None
    # When the shard entered this state on the node; None when the agent did not say.
    since: datetime | None = None
    # The LoRA adapters its engine has loaded, least recently loaded first.
    adapters: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeRegistration:
    """Everything an agent's Register message says about its node."""

    node_id: str
    hostname: str
    agent_version: str
    gpus: tuple[GpuInfo, ...] = ()
    cpu_count: int = 0
    memory_total: int = 0
    weights_disk_free: int = 0
    gpu_source: str = "none"
    labels: Mapping[str, str] = field(default_factory=dict)
    fabric: Mapping[str, str] = field(default_factory=dict)
    running_shards: tuple[ShardReport, ...] = ()
    port_range: tuple[int, int] = (0, 0)
    weights_dir: str = ""
    # The host engine URLs use, as the agent says (empty from older agents), and
    # the address this server sees the agent's connection from (its gRPC peer).
    advertise_host: str = ""
    seen_from: str = ""
    # Every interface the agent reported (empty from older agents).
    interfaces: tuple[NetInterface, ...] = ()


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU of a node: what registration said, plus the last heartbeat's load."""

    index: int
    uuid: str
    name: str
    memory_total: int
    memory_free: int
    # None until the first heartbeat reports them.
    utilization: float | None = None
    memory_used: int | None = None


@dataclass(frozen=True, slots=True)
class Shard:
    """One shard on a node, as last reported; replaced whole on every report."""

    id: str
    model: str
    engine: str
    state: ShardState
    message: str
    pid: int | None
    endpoint_url: str
    output_tail: tuple[str, ...]
    exit_code: int | None
    spec: ShardSpec | None
    since: datetime
    # The LoRA adapters its engine has loaded (as its agent reports), least recently
    # loaded first.
    adapters: tuple[str, ...] = ()

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return self.spec.gpu_indices if self.spec is not None else ()

    @property
    def holds_gpus(self) -> bool:
        """True while a process may still hold this shard's GPUs."""
        return self.state not in TERMINAL_SHARD_STATES


@dataclass(frozen=True, slots=True)
class NodeBrief:
    """What a list filters and pages nodes on (`Inventory.briefs`); the labels are the
    node's own mappings, which the inventory replaces, never changes in place."""

    id: str
    hostname: str
    state: NodeState
    draining: bool
    labels: Mapping[str, str]
    fabric: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class HeldWeights:
    """A hub snapshot complete on a node's disk, as its agent last reported it."""

    repo: str
    revision: str  # the commit SHA
    bytes: int
    last_used: datetime | None  # when an engine last started on it; None: never

    def short(self) -> str:
        """`org/name@abc1234`."""
        return f"{self.repo}@{self.revision[:7]}"


@dataclass(slots=True)
class Node:
    """A machine running an agent, as the inventory knows it.

    `last_heartbeat` is on the inventory's monotonic clock (for windows and ages);
    `last_heartbeat_at` and `registered_at` are wall-clock times for people.
    """

    id: str
    hostname: str
    agent_version: str
    gpus: tuple[Gpu, ...]
    cpu_count: int
    memory_total: int
    weights_disk_free: int
    gpu_source: str
    labels: Mapping[str, str]
    fabric: Mapping[str, str]
    port_range: tuple[int, int]
    weights_dir: str
    state: NodeState
    draining: bool
    connected: bool
    registered_at: datetime
    last_heartbeat: float
    last_heartbeat_at: datetime
    shards: dict[str, Shard]
    advertise_host: str = ""
    seen_from: str = ""
    interfaces: tuple[NetInterface, ...] = ()
    weights: tuple[HeldWeights, ...] = ()  # the hub snapshots on its disk (heartbeats)

    def address_warning(self) -> str | None:
        """Why this node's engine URLs cannot work from this server, if they cannot."""
        if is_loopback(self.advertise_host) and self.seen_from and not is_loopback(self.seen_from):
            return (
                f"the agent advertises {self.advertise_host} (loopback) for its engines but "
                f"connects from {self.seen_from}: this server cannot reach them; start it "
                "without --advertise-host, or with an address this server can dial"
            )
        return None

    def copy(self) -> Node:
        """A snapshot: GPUs and shards are immutable, so only the shard dict is copied."""
        # Field by field rather than `dataclasses.replace`, which re-inspects the
        # class on every call: the reconciler copies every node on every step.
        return Node(
            self.id,
            self.hostname,
            self.agent_version,
            self.gpus,
            self.cpu_count,
            self.memory_total,
            self.weights_disk_free,
            self.gpu_source,
            self.labels,
            self.fabric,
            self.port_range,
            self.weights_dir,
            self.state,
            self.draining,
            self.connected,
            self.registered_at,
            self.last_heartbeat,
            self.last_heartbeat_at,
            dict(self.shards),
            self.advertise_host,
            self.seen_from,
            self.interfaces,
            self.weights,
        )

    def gpus_in_use(self) -> frozenset[int]:
        """Indices of GPUs assigned to shards that may still hold them."""
        return frozenset(i for s in self.shards.values() if s.holds_gpus for i in s.gpu_indices)


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or `localhost`) is reachable from its own machine only."""
    bare = host.strip("[]").lower()
    if bare == "localhost":
        return True
    try:
        return ipaddress.ip_address(bare.split("%", 1)[0]).is_loopback
    except ValueError:
        return False
