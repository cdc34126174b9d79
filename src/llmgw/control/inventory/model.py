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

from llmgw.config.hub import hub_ref

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
class Download:
    """A hub snapshot's download on a node, as its agent last reported it."""

    repo: str
    revision: str  # the commit SHA
    done: int  # bytes on the node's disk
    total: int  # bytes of the snapshot; 0 while the agent lists its files
    rate: float  # bytes per second since it began; 0 until the agent can tell
    files: tuple[str, ...]  # being fetched now, most bytes left first
    started: datetime | None  # on the node's clock; None when the agent did not say

    def short(self) -> str:
        """`org/name@abc1234`."""
        return f"{self.repo}@{self.revision[:7]}"

    @property
    def percent(self) -> int | None:
        """Whole percent done; None while the total is not known."""
        return min(100, self.done * 100 // self.total) if self.total > 0 else None

    @property
    def eta_seconds(self) -> float | None:
        """Seconds left at the rate so far; None while no rate is known."""
        if self.rate <= 0 or self.total <= 0:
            return None
        return max(0.0, (self.total - self.done) / self.rate)

    def view(self) -> dict[str, object]:
        """As the admin API shows it (a shard's or a replica's `download`)."""
        eta = self.eta_seconds
        return {
            "repo": self.repo,
            "revision": self.revision,
            "done_bytes": self.done,
            "total_bytes": self.total,
            "percent": self.percent,
            "rate_bytes_per_second": round(self.rate, 1),
            "eta_seconds": round(eta, 1) if eta is not None else None,
            "file": self.files[0] if self.files else None,
            "files": list(self.files),
            "started": self.started.isoformat() if self.started is not None else None,
        }


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
    download: Download | None = None  # while the shard waits for its weights
    # The LoRA adapters its engine has loaded, least recently loaded first.
    adapters: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class HostReading:
    """The weights disk and host memory as one heartbeat reads them (0 totals: unread)."""

    disk_total: int = 0
    disk_free: int = 0
    memory_total: int = 0
    memory_available: int = 0


@dataclass(frozen=True, slots=True)
class HostLimits:
    """What the agent's flags allow on the node: the weights' share of the disk
    (`--weights-max-use`, a fraction or a size of hub snapshots; both 0: no
    eviction) and the host memory sleeping engines may hold (`--sleep-memory-max`,
    0: no limit beyond what is available)."""

    weights_max_fraction: float = 0.0
    weights_max_bytes: int = 0
    sleep_memory_max: int = 0

    @property
    def evicts(self) -> bool:
        return self.weights_max_fraction > 0 or self.weights_max_bytes > 0

    def describe_weights(self) -> str:
        if self.weights_max_fraction > 0:
            return f"{self.weights_max_fraction * 100:g}% of the disk"
        if self.weights_max_bytes > 0:
            return f"{self.weights_max_bytes} bytes of snapshots"
        return "no limit"


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
    limits: HostLimits = HostLimits()


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
    download: Download | None = None  # while the shard waits for its weights
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


@dataclass(frozen=True, slots=True)
class WeightsDownload:
    """A download a node was told to pull (PullWeights), as its agent last reported it:
    under way (`error` empty) or failed (`error`: the hub's reason)."""

    repo: str
    revision: str  # the commit SHA
    done: int
    total: int  # 0 until the hub's file list is known
    rate: float  # bytes per second; 0 until it can be told
    error: str = ""


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
    host: HostReading = HostReading()  # the weights disk and host memory (heartbeats)
    limits: HostLimits = HostLimits()  # the agent's disk and sleep-memory limits (Register)
    downloads: tuple[WeightsDownload, ...] = ()  # pulls under way or failed (heartbeats)

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
            self.host,
            self.limits,
            self.downloads,
        )

    def snapshot_bytes(self, weights: str) -> int:
        """The size of the hub snapshot `weights` (`org/name@commit`) on this node's
        disk; 0 when the node does not hold it (or `weights` is not one)."""
        repo, _, revision = weights.partition("@")
        for held in self.weights:
            if held.repo == repo and held.revision == revision:
                return held.bytes
        return 0

    def weights_evictable(self) -> int:
        """Bytes of snapshots the agent would evict to make room for a download: those
        of repos no live shard on the node runs, when the agent evicts at all."""
        if not self.limits.evicts:
            return 0
        in_use = {
            ref.repo
            for shard in self.shards.values()
            if shard.holds_gpus
            and shard.spec is not None
            and (ref := hub_ref(shard.spec.weights)) is not None
        }
        return sum(h.bytes for h in self.weights if h.repo not in in_use)

    def weights_room(self) -> int | None:
        """Bytes of new weights the node's disk can take: the free space plus what
        eviction could free, and under a `--weights-max-use` watermark at most what
        the watermark leaves (plus the same). None when the node has not said how
        much is free (an older agent)."""
        host, limits = self.host, self.limits
        if host.disk_total == 0 and host.disk_free == 0:
            return None
        freeable = self.weights_evictable()
        fits = host.disk_free + freeable
        if limits.weights_max_fraction > 0 and host.disk_total > 0:
            used = host.disk_total - host.disk_free
            fits = min(fits, int(limits.weights_max_fraction * host.disk_total) - used + freeable)
        elif limits.weights_max_bytes > 0:
            held = sum(h.bytes for h in self.weights)
            fits = min(fits, limits.weights_max_bytes - held + freeable)
        return max(fits, 0)

    def sleeping_memory(self) -> int:
        """Host memory the node's sleeping shards hold: at sleep level 1 an engine
        keeps its weights in host RAM, so each holds the size of its snapshot (0 for
        weights the node does not report, such as a local path)."""
        return sum(
            self.snapshot_bytes(s.spec.weights)
            for s in self.shards.values()
            if s.state == "sleeping" and s.spec is not None
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
