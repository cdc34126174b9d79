"""One node's open stream: its outgoing messages and the commands awaiting answers.

The servicer's writer drains `next_outgoing()`; dispatcher calls `send()` a
command and wait on the future `expect()` gave them; the reader resolves it
with `answer()`. `close()` ends all of it at once: the writer sees the end,
and every waiting command fails with `NodeNotConnected`.

Not guaranteed: back-pressure. The outgoing queue is unbounded; commands are
few (a handful per placement), so a slow agent cannot grow it meaningfully.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from llmgw.control.agentsvc.errors import NodeNotConnected
from llmgw.control.placements import NodeAddress
from llmgw.proto import agent_pb2


@dataclass(frozen=True, slots=True)
class CommandOutcome:
    """A node's answer to one command."""

    ok: bool
    error: str


class NodeSession:
    """The server's side of one agent stream."""

    def __init__(
        self, *, node_id: str, peer: str, key_hash: str | None = None, opened: float = 0.0
    ) -> None:
        self.node_id = node_id
        self.peer = peer
        # The client certificate's key (None on a plaintext stream): a Register
        # with the same key is this node reconnecting; any other is refused.
        self.key_hash = key_hash
        # When the agent last sent anything (servicer's monotonic clock): a stream
        # silent for several heartbeats is treated as dead by a new Register.
        self.last_heard = opened
        # Where the node is (its Register and stream), for judging engine URLs.
        self.where: NodeAddress | None = None
        # How many times the configured heartbeat interval this agent was told, and
        # whether it follows HeartbeatInterval messages (see `cadence.py`).
        self.beat_factor = 1
        self.follows_interval = False
        # Shards told to stop because their reports were refused, not yet answered.
        self.refused_stops: set[str] = set()
        self._outgoing: asyncio.Queue[agent_pb2.ServerMessage | None] = asyncio.Queue()
        self._pending: dict[str, asyncio.Future[CommandOutcome]] = {}
        self._closed_because: str | None = None

    @property
    def closed_because(self) -> str | None:
        """Why the session was closed; None while it is open."""
        return self._closed_because

    def send(self, message: agent_pb2.ServerMessage) -> None:
        """Queue a message for the writer; raises `NodeNotConnected` once closed."""
        if self._closed_because is not None:
            raise NodeNotConnected(
                f"node {self.node_id!r} is not connected: {self._closed_because}",
                node_id=self.node_id,
            )
        self._outgoing.put_nowait(message)

    async def next_outgoing(self) -> agent_pb2.ServerMessage | None:
        """The next message to write, or None when the session is closed."""
        return await self._outgoing.get()

    def expect(self, command_id: str) -> asyncio.Future[CommandOutcome]:
        """A future resolved by the node's answer to `command_id`; `forget()` it when done."""
        future: asyncio.Future[CommandOutcome] = asyncio.get_running_loop().create_future()
        self._pending[command_id] = future
        return future

    def forget(self, command_id: str) -> None:
        self._pending.pop(command_id, None)

    def answer(self, command_id: str, outcome: CommandOutcome) -> bool:
        """Resolve a waiting command; False when nobody waits for it (late or unknown)."""
        future = self._pending.pop(command_id, None)
        if future is None or future.done():
            return False
        future.set_result(outcome)
        return True

    def close(self, reason: str) -> None:
        """End the session: the writer stops, waiting commands fail with `NodeNotConnected`."""
        if self._closed_because is not None:
            return
        self._closed_because = reason
        self._outgoing.put_nowait(None)
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(
                    NodeNotConnected(
                        f"node {self.node_id!r} went away before answering: {reason}",
                        node_id=self.node_id,
                    )
                )
