"""Removing a node (`llmgw nodes remove`): revoke its key, close its stream, forget it.

In this order, so the agent's immediate redial already meets the deny-list:
1. the key that owns the node id goes on the store's deny-list, and the id is
   freed (a node that joins again with a new key takes it back);
2. the node's stream on this server is closed;
3. the node and its shards leave the inventory (the reconciler places its
   replicas elsewhere);
4. an event says what was done.

Not guaranteed:
- Stopping the node's engines. The server no longer talks to the node, so its
  engine processes keep running until its agent is stopped on that machine.
- Keeping out a node without a certificate. A node that connected over a
  plaintext listener (`--insecure-agents`) has no key to revoke: it is
  forgotten, and its agent registers again unless it is stopped.
- Closing the stream on another server. Only the leader holds agent streams
  (the admin API refuses removal on a standby, naming the leader). The
  deny-list is shared by every server: any server refuses the node at its
  next Register.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from llmgw.control.inventory.errors import UnknownNode
from llmgw.control.inventory.model import Node
from llmgw.store import NodeBinding, Revocation

log = logging.getLogger("llmgw.control.agentsvc")

DEFAULT_REASON = "removed by the operator"


class RevocableIdentities(Protocol):
    """The store's `NodeIdentityRepository` satisfies it."""

    async def binding(self, node_id: str) -> NodeBinding | None: ...

    async def revoke(self, node_id: str, *, now: datetime, reason: str) -> Revocation | None: ...


class RemovableNodes(Protocol):
    """The `Inventory` satisfies it."""

    def node(self, node_id: str) -> Node: ...

    def forget(self, node_id: str) -> Node: ...


class Streams(Protocol):
    """The `AgentServicer` satisfies it."""

    def disconnect(self, node_id: str, reason: str) -> str | None: ...


@dataclass(frozen=True, slots=True)
class Removed:
    """What removing a node did."""

    node_id: str
    revocation: Revocation | None  # None: the node had no certificate key
    closed_peer: str | None  # the stream closed, or None when it had none here
    forgotten: bool  # it was in this server's inventory

    def summary(self) -> str:
        """One sentence for people (the event, the CLI)."""
        parts = []
        if self.revocation is not None:
            parts.append(
                f"its certificate key sha256:{self.revocation.key_hash[:16]} is revoked (it cannot "
                "reconnect; to bring the machine back, join it again with a new token)"
            )
        else:
            parts.append(
                "it had no certificate key to revoke (it connected without TLS): its agent "
                "registers again unless it is stopped on that machine"
            )
        if self.closed_peer is not None:
            parts.append(f"its stream from {self.closed_peer} was closed")
        if self.forgotten:
            parts.append("it is forgotten and its replicas are placed elsewhere")
        return f"node {self.node_id} removed: " + "; ".join(parts)


class NodeRemoval:
    """Removes nodes; built by the composition root, used by the admin API."""

    def __init__(
        self,
        *,
        identities: RevocableIdentities,
        inventory: RemovableNodes,
        streams: Streams,
        wall_clock: Callable[[], datetime],
        record_event: Callable[[str, str], None] | None = None,
    ) -> None:
        self._identities = identities
        self._inventory = inventory
        self._streams = streams
        self._wall_clock = wall_clock
        self._record_event = record_event

    async def remove(self, node_id: str, reason: str = DEFAULT_REASON) -> Removed:
        """Remove `node_id`; `UnknownNode` when neither the inventory nor the store knows it.

        Store failures (`StoreError`) propagate before anything has changed.
        """
        known = self._known(node_id)
        if not known and await self._identities.binding(node_id) is None:
            raise UnknownNode(node_id)
        revocation = await self._identities.revoke(node_id, now=self._wall_clock(), reason=reason)
        # No await from here on: the stream closes and the node leaves the inventory
        # together, so its handler never marks a forgotten node disconnected.
        peer = self._streams.disconnect(node_id, f"node {node_id} was removed: {reason}")
        forgotten = self._known(node_id)
        if forgotten:
            self._inventory.forget(node_id)
        removed = Removed(node_id, revocation, peer, forgotten)
        log.warning("%s (%s)", removed.summary(), reason)
        if self._record_event is not None:
            self._record_event(node_id, f"{removed.summary()} ({reason})")
        return removed

    def _known(self, node_id: str) -> bool:
        try:
            self._inventory.node(node_id)
        except UnknownNode:
            return False
        return True
