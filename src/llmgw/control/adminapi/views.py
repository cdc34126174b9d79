"""JSON views of nodes and shards, as the admin API and `llmgw nodes --json` show them.

Sizes are in bytes, times are ISO 8601 UTC, ages in seconds. A GPU's
`utilization_percent` and `memory_used_bytes` are null until the node's first
heartbeat. A shard waiting for its hub weights has a `download` (bytes done and
total, percent, rate, ETA, and `file`: the file being fetched, with `files` when
several are); null otherwise.
Not guaranteed: field order; add fields freely, never rename one.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from llmgw.control.inventory.model import Node, Shard, ShardSpec


def _iso(ts: datetime) -> str:
    return ts.astimezone(UTC).isoformat()


def spec_view(spec: ShardSpec) -> dict[str, Any]:
    return {
        "weights": spec.weights,
        "gpu_indices": list(spec.gpu_indices),
        "port": spec.port,
        "engine_args": list(spec.engine_args),
        "env": dict(spec.env),
        "tensor_parallel_size": spec.tensor_parallel_size,
        "pipeline_parallel_size": spec.pipeline_parallel_size,
        "gpu_memory_utilization": spec.gpu_memory_utilization,
    }


def shard_view(shard: Shard) -> dict[str, Any]:
    return {
        "id": shard.id,
        "model": shard.model,
        "engine": shard.engine,
        "state": shard.state,
        "message": shard.message,
        "since": _iso(shard.since),
        "pid": shard.pid,
        "endpoint_url": shard.endpoint_url,
        "exit_code": shard.exit_code,
        "output_tail": list(shard.output_tail),
        "gpu_indices": list(shard.gpu_indices),
        "spec": spec_view(shard.spec) if shard.spec is not None else None,
        "download": shard.download.view() if shard.download is not None else None,
    }


def _weights_limit(node: Node) -> dict[str, float | int] | None:
    limits = node.limits
    if limits.weights_max_fraction > 0:
        return {"fraction": limits.weights_max_fraction}
    if limits.weights_max_bytes > 0:
        return {"bytes": limits.weights_max_bytes}
    return None


def node_view(node: Node, heartbeat_age: float) -> dict[str, Any]:
    in_use = node.gpus_in_use()
    return {
        "id": node.id,
        "hostname": node.hostname,
        "agent_version": node.agent_version,
        "state": node.state,
        "draining": node.draining,
        "connected": node.connected,
        "registered_at": _iso(node.registered_at),
        "last_heartbeat_at": _iso(node.last_heartbeat_at),
        "heartbeat_age_seconds": round(heartbeat_age, 3),
        "cpu_count": node.cpu_count,
        "memory_total_bytes": node.memory_total,
        "weights_disk_free_bytes": node.weights_disk_free,
        # The weights disk and host memory as the last heartbeat read them (null:
        # not reported), what a download may take, and the agent's limits.
        "disk_total_bytes": node.host.disk_total or None,
        "weights_room_bytes": node.weights_room(),
        "weights_evictable_bytes": node.weights_evictable(),
        "weights_max_use": _weights_limit(node),
        "memory_available_bytes": node.host.memory_available if node.host.memory_total else None,
        "sleeping_memory_bytes": node.sleeping_memory(),
        "sleep_memory_max_bytes": node.limits.sleep_memory_max or None,
        "weights_dir": node.weights_dir,
        "weights": [
            {
                "repo": w.repo,
                "revision": w.revision,
                "bytes": w.bytes,
                "last_used": _iso(w.last_used) if w.last_used is not None else None,
            }
            for w in node.weights
        ],
        # Downloads ahead of demand (`llmgw models pull`, prefetch): under way, or why
        # one failed (`error`).
        "pulls": [
            {
                "repo": d.repo,
                "revision": d.revision,
                "done_bytes": d.done,
                "total_bytes": d.total,
                "rate_bytes_per_second": round(d.rate, 1),
                "error": d.error or None,
            }
            for d in node.downloads
        ],
        "port_range": list(node.port_range),
        "labels": dict(node.labels),
        "fabric": dict(node.fabric),
        # Where this server sees the agent from, and the host its engine URLs use.
        "seen_from": node.seen_from or None,
        "advertise_host": node.advertise_host or None,
        "address_warning": node.address_warning(),
        "gpu_source": node.gpu_source,
        "gpus": [
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "name": gpu.name,
                "memory_total_bytes": gpu.memory_total,
                "memory_free_bytes": gpu.memory_free,
                "memory_used_bytes": gpu.memory_used,
                "utilization_percent": gpu.utilization,
                "in_use": gpu.index in in_use,
            }
            for gpu in node.gpus
        ],
        "shards": [shard_view(node.shards[k]) for k in sorted(node.shards)],
    }
