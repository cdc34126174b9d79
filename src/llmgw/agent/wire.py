"""Building the agent's protobuf messages from its own values, in one place.

Pure functions, no I/O. Not guaranteed: anything about the server's reading of
them; see proto/llmgw/agent/v1/agent.proto for the field meanings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from llmgw.agent.flags import PortRange, WeightsLimit
from llmgw.agent.hardware import GpuUsage, HardwareReport, HostUsage
from llmgw.agent.hub import Held, Progress
from llmgw.agent.interfaces import Interface
from llmgw.agent.shard import ShardReport, ShardState
from llmgw.config.hub import HubRef, hub_ref
from llmgw.proto import agent_pb2

_STATES = {
    ShardState.STARTING: agent_pb2.SHARD_STATE_STARTING,
    ShardState.LOADING: agent_pb2.SHARD_STATE_LOADING,
    ShardState.READY: agent_pb2.SHARD_STATE_READY,
    ShardState.DRAINING: agent_pb2.SHARD_STATE_DRAINING,
    ShardState.STOPPED: agent_pb2.SHARD_STATE_STOPPED,
    ShardState.FAILED: agent_pb2.SHARD_STATE_FAILED,
    ShardState.SLEEPING: agent_pb2.SHARD_STATE_SLEEPING,
}


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """What Register says about the node apart from hardware and shards."""

    node_id: str
    hostname: str
    agent_version: str
    labels: Mapping[str, str]
    fabric: Mapping[str, str]
    port_range: PortRange
    weights_dir: Path
    weights_limit: WeightsLimit | None = None  # --weights-max-use (None: no eviction)
    sleep_memory_max: int = 0  # --sleep-memory-max (0: no limit)


def shard_status(report: ShardReport) -> agent_pb2.ShardStatus:
    status = agent_pb2.ShardStatus(
        shard_id=report.shard_id,
        model=report.model,
        state=_STATES[report.state],
        message=report.message,
        pid=report.pid,
        endpoint_url=report.endpoint_url,
        exit_code=report.exit_code or 0,
        since_unix=report.since,
        output_tail=report.output_tail,
        adapters=report.adapters,
    )
    status.spec.CopyFrom(report.spec)
    ref = hub_ref(report.spec.weights)
    if report.download is not None and ref is not None:
        status.download.CopyFrom(
            agent_pb2.Download(
                repo=ref.repo,
                revision=ref.revision,
                done=report.download.done,
                total=report.download.total,
                rate=report.download.rate,
                files=report.download.files,
                started_unix=report.download.started_unix,
            )
        )
    return status


def hardware(report: HardwareReport) -> agent_pb2.Hardware:
    return agent_pb2.Hardware(
        gpus=[
            agent_pb2.Gpu(
                index=gpu.index,
                uuid=gpu.uuid,
                name=gpu.name,
                memory_total_bytes=gpu.memory_total_bytes,
                memory_free_bytes=gpu.memory_free_bytes,
            )
            for gpu in report.gpus
        ],
        cpu_count=report.cpu_count,
        memory_total_bytes=report.memory_total_bytes,
        weights_disk_free_bytes=report.weights_disk_free_bytes,
        gpu_source=report.gpu_source,
    )


def register(
    identity: NodeIdentity,
    machine: HardwareReport,
    shards: Iterable[ShardReport],
    *,
    advertise_host: str = "",
    interfaces: Iterable[Interface] = (),
) -> agent_pb2.AgentMessage:
    limit = identity.weights_limit
    return agent_pb2.AgentMessage(
        register=agent_pb2.Register(
            node_id=identity.node_id,
            hostname=identity.hostname,
            agent_version=identity.agent_version,
            hardware=hardware(machine),
            labels=dict(identity.labels),
            fabric=dict(identity.fabric),
            running_shards=[shard_status(report) for report in shards],
            port_range_start=identity.port_range.start,
            port_range_end=identity.port_range.end,
            weights_dir=str(identity.weights_dir),
            weights_max_use_fraction=limit.fraction or 0.0 if limit is not None else 0.0,
            weights_max_use_bytes=limit.size or 0 if limit is not None else 0,
            sleep_memory_max_bytes=identity.sleep_memory_max,
            follows_heartbeat_interval=True,
            advertise_host=advertise_host,
            interfaces=[
                agent_pb2.NetworkInterface(name=i.name, addresses=list(i.addresses))
                for i in interfaces
            ],
        )
    )


def heartbeat(
    sequence: int,
    usage: Iterable[GpuUsage],
    held: Iterable[Held] = (),
    host: HostUsage | None = None,
    pulls: Iterable[tuple[HubRef, Progress | None, str | None]] = (),
) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(
        heartbeat=agent_pb2.Heartbeat(
            sequence=sequence,
            disk_total_bytes=host.disk_total_bytes if host else 0,
            disk_free_bytes=host.disk_free_bytes if host else 0,
            memory_total_bytes=host.memory_total_bytes if host else 0,
            memory_available_bytes=host.memory_available_bytes if host else 0,
            downloads=[
                agent_pb2.WeightsDownload(
                    repo=ref.repo,
                    revision=ref.revision,
                    done_bytes=progress.done if progress is not None else 0,
                    total_bytes=progress.total if progress is not None else 0,
                    rate_bytes_per_second=progress.rate if progress is not None else 0.0,
                    error=error or "",
                )
                for ref, progress, error in pulls
            ],
            weights=[
                agent_pb2.HeldWeights(
                    repo=h.ref.repo,
                    revision=h.ref.revision,
                    bytes=h.bytes,
                    last_used_unix=h.last_used,
                )
                for h in held
            ],
            gpus=[
                agent_pb2.GpuUsage(
                    index=gpu.index,
                    utilization_percent=gpu.utilization_percent,
                    memory_used_bytes=gpu.memory_used_bytes,
                    memory_free_bytes=gpu.memory_free_bytes,
                )
                for gpu in usage
            ],
        )
    )


def status_message(report: ShardReport) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(shard_status=shard_status(report))


def command_result(command_id: str, error: str | None) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(
        command_result=agent_pb2.CommandResult(
            command_id=command_id, ok=error is None, error=error or ""
        )
    )
