"""`Dispatcher`: how the control plane gets a command done on a node.

The reconciler's executor depends on this Protocol only; `AgentServicer` is the
implementation (the only thing that can reach a node). Each call sends one
command down the node's stream and returns once the node answered it, or
raises one of the errors in `llmgw.control.agentsvc.errors`.

Not guaranteed: that the work is finished when a call returns. The answer says
the agent accepted and acted on the command (e.g. spawned the engine); the
shard's progress (loading, ready, failed) arrives later as shard statuses in
the inventory.
"""

from __future__ import annotations

from typing import Protocol

from llmgw.control.inventory.model import ShardSpec

__all__ = ["Dispatcher", "ShardSpec"]


class Dispatcher(Protocol):
    async def start_shard(self, node_id: str, spec: ShardSpec) -> None:
        """Start an engine process for `spec` on the node."""
        ...

    async def stop_shard(self, node_id: str, shard_id: str, grace_seconds: float) -> None:
        """Stop a shard: SIGTERM, then SIGKILL after `grace_seconds`."""
        ...

    async def drain_shard(self, node_id: str, shard_id: str, grace_seconds: float) -> None:
        """Let a shard finish its in-flight requests (up to `grace_seconds`), then stop it."""
        ...

    async def sleep_shard(
        self, node_id: str, shard_id: str, level: int, wait_seconds: float
    ) -> None:
        """Put a Ready shard's engine to sleep (level 1: weights to host RAM, 2: dropped);
        returns once it sleeps (the engine gets `wait_seconds`)."""
        ...

    async def wake_shard(self, node_id: str, shard_id: str, wait_seconds: float) -> None:
        """Wake a sleeping shard's engine; returns once it serves again."""
        ...

    async def load_adapter(
        self, node_id: str, shard_id: str, name: str, path: str, wait_seconds: float
    ) -> None:
        """Load LoRA adapter `name` from `path` into a Ready shard's engine; returns once the
        engine has it. `CommandFailed` carries the engine's words when it refuses."""
        ...

    async def unload_adapter(
        self, node_id: str, shard_id: str, name: str, wait_seconds: float
    ) -> None:
        """Unload LoRA adapter `name` from a shard's engine, to make room for another."""
        ...

    async def remove_weights(self, node_id: str, path: str) -> None:
        """Delete weights at `path`, which must be inside the node's weights directory."""
        ...
