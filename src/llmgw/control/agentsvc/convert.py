"""Protobuf messages <-> the control plane's dataclasses, at the stream's edge.

Everything past this module sees `llmgw.control.inventory.model` types only.
Validation here is about the wire (a field the protocol requires is missing);
it raises `BadAgentMessage` with a message the agent's operator can act on.

Not guaranteed: exit code 0 and "no exit code" are told apart by state only
(proto3 scalars have no presence): an exit code is kept for stopped and failed
shards and dropped otherwise; pid 0 means "no process".
"""

from __future__ import annotations

import ipaddress
import re
import socket
import urllib.parse
from collections.abc import Iterable
from datetime import UTC, datetime

from llmgw.control.agentsvc.errors import BadAgentMessage
from llmgw.control.inventory.model import (
    TERMINAL_SHARD_STATES,
    Download,
    GpuInfo,
    GpuUsage,
    HeldWeights,
    HostLimits,
    HostReading,
    NetInterface,
    NodeRegistration,
    ShardReport,
    ShardSpec,
    ShardState,
    WeightsDownload,
    is_loopback,
)
from llmgw.proto import agent_pb2

# Matched whole (`fullmatch`: "gpu-a\n" does not pass); control characters are
# refused by `isprintable`. Looser than a certificate's name (`pki.cluster`), so
# nodes of a PKI of the operator's own or of a plaintext listener keep their ids.
_NODE_ID = re.compile(r"[^\s/]{1,253}")
NODE_ID_RULE = "1 to 253 characters without '/', whitespace or control characters"

_STATES: dict[int, ShardState] = {
    agent_pb2.SHARD_STATE_STARTING: "starting",
    agent_pb2.SHARD_STATE_LOADING: "loading",
    agent_pb2.SHARD_STATE_READY: "ready",
    agent_pb2.SHARD_STATE_DRAINING: "draining",
    agent_pb2.SHARD_STATE_STOPPED: "stopped",
    agent_pb2.SHARD_STATE_FAILED: "failed",
    agent_pb2.SHARD_STATE_SLEEPING: "sleeping",
}


def registration(msg: agent_pb2.Register) -> NodeRegistration:
    """A Register message as a `NodeRegistration`; raises `BadAgentMessage`."""
    if not msg.node_id.strip():
        raise BadAgentMessage(
            "Register.node_id is empty: every agent needs a node id (set node_id in the "
            "agent's config, or let it default to the hostname)"
        )
    check_node_id(msg.node_id)
    start, end = msg.port_range_start, msg.port_range_end
    if start > end:
        raise BadAgentMessage(
            f"Register.port_range_start {start} is above port_range_end {end}; "
            "fix the agent's port range"
        )
    hardware = msg.hardware
    return NodeRegistration(
        node_id=msg.node_id,
        hostname=msg.hostname,
        agent_version=msg.agent_version,
        gpus=tuple(
            GpuInfo(g.index, g.uuid, g.name, g.memory_total_bytes, g.memory_free_bytes)
            for g in hardware.gpus
        ),
        cpu_count=hardware.cpu_count,
        memory_total=hardware.memory_total_bytes,
        weights_disk_free=hardware.weights_disk_free_bytes,
        gpu_source=hardware.gpu_source or "none",
        labels=dict(msg.labels),
        fabric=dict(msg.fabric),
        running_shards=tuple(shard_report(s) for s in msg.running_shards),
        port_range=(start, end),
        weights_dir=msg.weights_dir,
        advertise_host=msg.advertise_host,
        interfaces=tuple(
            NetInterface(i.name, tuple(a for a in i.addresses if _is_cidr(a)))
            for i in msg.interfaces
            if i.name
        ),
        limits=HostLimits(
            weights_max_fraction=msg.weights_max_use_fraction
            if 0 < msg.weights_max_use_fraction < 1
            else 0.0,
            weights_max_bytes=msg.weights_max_use_bytes,
            sleep_memory_max=msg.sleep_memory_max_bytes,
        ),
    )


def host_reading(beat: agent_pb2.Heartbeat) -> HostReading:
    """The heartbeat's disk and memory figures (all 0 from older agents)."""
    return HostReading(
        disk_total=beat.disk_total_bytes,
        disk_free=beat.disk_free_bytes,
        memory_total=beat.memory_total_bytes,
        memory_available=beat.memory_available_bytes,
    )


def check_node_id(node_id: str) -> None:
    """Raise `BadAgentMessage` naming the rule unless `node_id` may name a node."""
    if not _NODE_ID.fullmatch(node_id) or not node_id.isprintable():
        raise BadAgentMessage(
            f"Register.node_id {node_id[:80]!r} is not a node id: a node id is {NODE_ID_RULE}; "
            "start the agent with --node-id NAME"
        )


def _is_cidr(text: str) -> bool:
    """An address with a prefix length ("10.0.0.2/24"); anything else an agent sent is dropped."""
    try:
        ipaddress.ip_interface(text)
    except ValueError:
        return False
    return "/" in text


def peer_host(peer: str) -> str:
    """The address in a gRPC peer string (`ipv4:10.0.0.7:5123`, `ipv6:[::1]:5123`)."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return peer
    rest = urllib.parse.unquote(rest)
    host = (rest.rsplit(":", 1)[0] if ":" in rest else rest).strip("[]")
    # A listener on [::] sees IPv4 agents as ::ffff:a.b.c.d; show the IPv4 address.
    try:
        mapped = ipaddress.IPv6Address(host).ipv4_mapped
    except ValueError:
        return host
    return host if mapped is None else str(mapped)


def on_this_host(address: str) -> bool:
    """Whether `address` (a peer's) is loopback or one of this host's own addresses: a
    socket binds to an address only where the host has it (no packet is sent)."""
    if is_loopback(address):
        return True
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return False
    family = socket.AF_INET6 if parsed.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        try:
            sock.bind((address, 0))
        except OSError:
            return False
    return True


def gpu_usage(gpus: Iterable[agent_pb2.GpuUsage]) -> list[GpuUsage]:
    return [
        GpuUsage(g.index, g.utilization_percent, g.memory_used_bytes, g.memory_free_bytes)
        for g in gpus
    ]


def held_weights(weights: Iterable[agent_pb2.HeldWeights]) -> list[HeldWeights]:
    return [
        HeldWeights(
            repo=w.repo,
            revision=w.revision,
            bytes=w.bytes,
            last_used=(
                datetime.fromtimestamp(w.last_used_unix, UTC) if w.last_used_unix > 0 else None
            ),
        )
        for w in weights
    ]


def weights_downloads(downloads: Iterable[agent_pb2.WeightsDownload]) -> list[WeightsDownload]:
    return [
        WeightsDownload(
            repo=d.repo,
            revision=d.revision,
            done=d.done_bytes,
            total=d.total_bytes,
            rate=d.rate_bytes_per_second,
            error=d.error,
        )
        for d in downloads
    ]


def shard_report(msg: agent_pb2.ShardStatus) -> ShardReport:
    """A ShardStatus message as a `ShardReport`; raises `BadAgentMessage`."""
    if not msg.shard_id:
        raise BadAgentMessage("ShardStatus.shard_id is empty; every shard status names its shard")
    state = _STATES.get(msg.state)
    if state is None:
        raise BadAgentMessage(
            f"ShardStatus for shard {msg.shard_id!r} has no state (got {msg.state}); "
            "the agent must send one of starting, loading, ready, draining, stopped, failed, "
            "sleeping"
        )
    return ShardReport(
        shard_id=msg.shard_id,
        model=msg.model,
        state=state,
        message=msg.message,
        pid=msg.pid or None,
        endpoint_url=msg.endpoint_url,
        output_tail=tuple(msg.output_tail),
        # A shard that failed before its process existed (its weights could not be
        # downloaded) has no exit code; proto3 would read it as 0.
        exit_code=msg.exit_code if state in TERMINAL_SHARD_STATES and msg.pid else None,
        spec=shard_spec(msg.spec) if msg.HasField("spec") else None,
        since=datetime.fromtimestamp(msg.since_unix, UTC) if msg.since_unix > 0 else None,
        download=download(msg.download) if msg.HasField("download") else None,
        adapters=tuple(msg.adapters),
    )


def download(msg: agent_pb2.Download) -> Download:
    return Download(
        repo=msg.repo,
        revision=msg.revision,
        done=msg.done,
        total=msg.total,
        rate=max(0.0, msg.rate),
        files=tuple(msg.files),
        started=datetime.fromtimestamp(msg.started_unix, UTC) if msg.started_unix > 0 else None,
    )


def shard_spec(msg: agent_pb2.ShardSpec) -> ShardSpec:
    return ShardSpec(
        shard_id=msg.shard_id,
        model=msg.model,
        engine=msg.engine,
        weights=msg.weights,
        gpu_indices=tuple(msg.gpu_indices),
        port=msg.port,
        engine_args=tuple(msg.engine_args),
        env=dict(msg.env),
        tensor_parallel_size=msg.tensor_parallel_size or 1,
        pipeline_parallel_size=msg.pipeline_parallel_size or 1,
        gpu_memory_utilization=msg.gpu_memory_utilization,
        load_timeout=msg.load_timeout_seconds,
        unhealthy_after=msg.unhealthy_after_seconds,
        drain_grace=msg.drain_grace_seconds,
        nodes=msg.nodes or 1,
        node_rank=msg.node_rank,
        master_addr=msg.master_addr,
        master_port=msg.master_port,
        replica_id=msg.replica_id,
        sleep_mode=msg.sleep_mode,
    )


def shard_spec_message(spec: ShardSpec) -> agent_pb2.ShardSpec:
    return agent_pb2.ShardSpec(
        shard_id=spec.shard_id,
        model=spec.model,
        engine=spec.engine,
        weights=spec.weights,
        gpu_indices=list(spec.gpu_indices),
        port=spec.port,
        engine_args=list(spec.engine_args),
        env=dict(spec.env),
        tensor_parallel_size=spec.tensor_parallel_size,
        pipeline_parallel_size=spec.pipeline_parallel_size,
        gpu_memory_utilization=spec.gpu_memory_utilization,
        load_timeout_seconds=spec.load_timeout,
        unhealthy_after_seconds=spec.unhealthy_after,
        drain_grace_seconds=spec.drain_grace,
        nodes=spec.nodes,
        node_rank=spec.node_rank,
        master_addr=spec.master_addr,
        master_port=spec.master_port,
        replica_id=spec.replica_id,
        sleep_mode=spec.sleep_mode,
    )
