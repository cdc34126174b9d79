"""The boundary between the wire's `ShardSpec` and the engines' `EngineSpec`.

Converts the protobuf message (where every unset number reads 0) into an
`EngineSpec`, and applies the checks only this node can make: the port is in
the agent's port range and the GPU indices exist here. Engine-specific checks
are the adapter's (`adapter.plan` validates before it builds a command).

Not guaranteed: that the port is free or that the weights exist; a spec that
passes can still fail when its process starts (reported as `failed`).
"""

from __future__ import annotations

from llmgw.agent.errors import SpecError
from llmgw.agent.flags import PortRange
from llmgw.engines import EngineSpec
from llmgw.proto import agent_pb2


def engine_spec(
    spec: agent_pb2.ShardSpec,
    *,
    port_range: PortRange,
    bind_host: str,
    gpu_count: int,
) -> EngineSpec:
    """The engine-neutral spec of a StartShard; `SpecError` names the field at fault."""
    if not spec.shard_id.strip():
        raise SpecError("shard_id", "is empty; every shard needs an id")
    if not spec.engine.strip():
        raise SpecError("engine", "is empty; give vllm, sglang, llamacpp or sim")
    if spec.port not in port_range:
        raise SpecError(
            "port",
            f"{spec.port} is outside this node's port range {port_range}; "
            "choose a port the node registered",
        )
    if spec.nodes > 1 and spec.node_rank == 0 and spec.master_port not in port_range:
        raise SpecError(
            "master_port",
            f"{spec.master_port} is outside this node's port range {port_range}; rank 0's "
            "rendezvous port must be one the node registered",
        )
    missing = [i for i in spec.gpu_indices if i >= gpu_count]
    if missing and gpu_count == 0:
        raise SpecError("gpu_indices", f"GPU {missing[0]} requested but this node has no GPUs")
    if missing:
        raise SpecError(
            "gpu_indices",
            f"GPU {missing[0]} does not exist on this node "
            f"(it has {gpu_count}: indices 0..{gpu_count - 1})",
        )
    return EngineSpec(
        shard_id=spec.shard_id,
        model=spec.model,
        engine=spec.engine,
        weights=spec.weights,
        port=spec.port,
        host=bind_host,
        gpu_indices=tuple(spec.gpu_indices),
        engine_args=tuple(spec.engine_args),
        env=dict(spec.env),
        # proto3 cannot tell "unset" from 0: 0 means the default.
        tensor_parallel_size=spec.tensor_parallel_size or 1,
        pipeline_parallel_size=spec.pipeline_parallel_size or 1,
        gpu_memory_utilization=spec.gpu_memory_utilization or None,
        load_timeout=spec.load_timeout_seconds or None,
        unhealthy_after=spec.unhealthy_after_seconds or None,
        drain_grace=spec.drain_grace_seconds or None,
        nodes=spec.nodes or 1,
        node_rank=spec.node_rank,
        master_addr=spec.master_addr,
        master_port=spec.master_port,
        sleep_mode=spec.sleep_mode,
    )
