"""The inventory: every node, its GPUs and its shards, as the agents last reported them.

Updated by the agent service (register, heartbeat, shard status, disconnect),
aged by `sweep()` (ready -> unreachable -> lost as heartbeats stop; a heartbeat
brings a node back to ready), and read by the admin API, the metrics collector
and, later, the reconciler. Listeners hear about every change that matters to
placement, synchronously, right after it happened.

Not guaranteed:
- Persistence. The inventory lives in one server process; after a restart it
  is rebuilt from the agents' next registrations (which carry their running
  shards), and the operator's draining flags are forgotten.
- Thread safety. Every call must come from the event loop's thread.
- That listeners may raise: a listener's exception propagates into the report
  that triggered it (and ends that agent's stream). Listeners should only note
  the change (set an `asyncio.Event`, put on a queue) and return.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from llmgw.control.inventory.errors import UnknownNode
from llmgw.control.inventory.model import (
    Gpu,
    GpuUsage,
    HeldWeights,
    HostReading,
    Node,
    NodeBrief,
    NodeRegistration,
    NodeState,
    Shard,
    ShardReport,
    WeightsDownload,
)

log = logging.getLogger("llmgw.control.inventory")

ChangeKind = Literal[
    "node_registered",  # a node registered (first time or again); its shard set was replaced
    "node_state",  # ready / unreachable / lost changed
    "node_disconnected",  # its agent stream closed
    "node_draining",  # the operator's draining flag changed
    "node_removed",  # the operator removed the node (`llmgw nodes remove`); it is gone
    "shard_status",  # a shard was added or its status changed
    "shard_removed",  # a shard is no longer on the node
]

_STATE_RANK: dict[NodeState, int] = {"ready": 0, "unreachable": 1, "lost": 2}


@dataclass(frozen=True, slots=True)
class Change:
    """One change to the inventory, as listeners receive it."""

    kind: ChangeKind
    node_id: str
    shard_id: str | None = None


@dataclass(frozen=True, slots=True)
class Transition:
    """A node state change made by `sweep()`."""

    node_id: str
    old: NodeState
    new: NodeState
    silent_for: float


Listener = Callable[[Change], None]


class Inventory:
    """Nodes keyed by id; every method is synchronous and cheap."""

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        wall_clock: Callable[[], datetime],
        unreachable_after: float,
        lost_after: float,
    ) -> None:
        if not 0 < unreachable_after < lost_after:
            raise ValueError(
                "needs 0 < unreachable_after < lost_after, got "
                f"{unreachable_after:g} / {lost_after:g}"
            )
        self._clock = clock
        self._wall_clock = wall_clock
        self._unreachable_after = unreachable_after
        self._lost_after = lost_after
        self._nodes: dict[str, Node] = {}
        # Nodes told to heartbeat a multiple of the configured interval (a big
        # fleet, see `agentsvc.cadence`): their thresholds are that multiple.
        self._beat_factors: dict[str, float] = {}
        self._listeners: list[Listener] = []

    # ---- listeners ----

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` after every change; returns the function that unsubscribes."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def _emit(self, kind: ChangeKind, node_id: str, shard_id: str | None = None) -> None:
        change = Change(kind, node_id, shard_id)
        for listener in tuple(self._listeners):
            listener(change)

    # ---- reports from agents ----

    def register(self, registration: NodeRegistration) -> Node:
        """Record a node's registration; its reported running shards become its shards.

        A node seen before keeps its draining flag. Shards the inventory knew but
        the agent no longer reports are removed: the agent is the authority on
        what runs on its node, and the reconciler places them again if wanted.
        """
        now, wall = self._clock(), self._wall_clock()
        previous = self._nodes.get(registration.node_id)
        old_shards = previous.shards if previous is not None else {}
        shards = {
            r.shard_id: self._shard(r, old_shards.get(r.shard_id), wall)
            for r in registration.running_shards
        }
        node = Node(
            id=registration.node_id,
            hostname=registration.hostname,
            agent_version=registration.agent_version,
            gpus=tuple(
                Gpu(g.index, g.uuid, g.name, g.memory_total, g.memory_free)
                for g in registration.gpus
            ),
            cpu_count=registration.cpu_count,
            memory_total=registration.memory_total,
            weights_disk_free=registration.weights_disk_free,
            gpu_source=registration.gpu_source,
            labels=dict(registration.labels),
            fabric=dict(registration.fabric),
            port_range=registration.port_range,
            weights_dir=registration.weights_dir,
            state="ready",
            draining=previous.draining if previous is not None else False,
            connected=True,
            registered_at=wall,
            last_heartbeat=now,
            last_heartbeat_at=wall,
            shards=shards,
            advertise_host=registration.advertise_host,
            seen_from=registration.seen_from,
            interfaces=registration.interfaces,
            host=HostReading(
                disk_free=registration.weights_disk_free, memory_total=registration.memory_total
            ),
            limits=registration.limits,
        )
        self._nodes[node.id] = node
        gone = sorted(set(old_shards) - set(shards))
        log.info(
            "node %s registered (%s, agent %s): %d GPUs, %d running shards adopted%s%s",
            node.id,
            node.hostname,
            node.agent_version,
            len(node.gpus),
            len(shards),
            f", {len(gone)} no longer reported" if gone else "",
            ", draining" if node.draining else "",
        )
        self._emit("node_registered", node.id)
        for shard_id in gone:
            self._emit("shard_removed", node.id, shard_id)
        return node.copy()

    def heartbeat(
        self,
        node_id: str,
        gpus: Sequence[GpuUsage],
        weights: Sequence[HeldWeights] | None = None,
        host: HostReading | None = None,
        downloads: Sequence[WeightsDownload] | None = None,
    ) -> None:
        """Record a sign of life, the GPUs' load and (when given) the hub weights on the
        node's disk, its disk and memory, and the pulls under way; an unreachable or
        lost node is ready again."""
        node = self._get(node_id)
        if weights is not None:
            node.weights = tuple(weights)
        if downloads is not None:
            node.downloads = tuple(downloads)
        if host is not None and (host.disk_total or host.memory_total):
            node.host = host
            if host.disk_total:
                node.weights_disk_free = host.disk_free
        now = self._clock()
        silent_for = now - node.last_heartbeat
        node.last_heartbeat = now
        node.last_heartbeat_at = self._wall_clock()
        if gpus:
            # Built directly, not with `dataclasses.replace` (which inspects the class
            # on every call): 10,000 nodes x 8 GPUs every interval.
            usage = {u.index: u for u in gpus}
            node.gpus = tuple(
                g
                if (u := usage.get(g.index)) is None
                else Gpu(
                    g.index,
                    g.uuid,
                    g.name,
                    g.memory_total,
                    u.memory_free,
                    u.utilization,
                    u.memory_used,
                )
                for g in node.gpus
            )
        if node.state != "ready":
            log.info(
                "node %s is ready again (was %s; heard nothing for %.1f s)",
                node_id,
                node.state,
                silent_for,
            )
            node.state = "ready"
            self._emit("node_state", node_id)

    def shard_status(self, node_id: str, report: ShardReport) -> Shard:
        """Record a shard's new status; a shard not seen before is added.

        A status older than the one recorded (by the agent's `since`) is ignored:
        agents may repeat statuses across a reconnect, and the latest one wins.
        """
        node = self._get(node_id)
        previous = node.shards.get(report.shard_id)
        if previous is not None and report.since is not None and report.since < previous.since:
            return previous
        shard = self._shard(report, previous, self._wall_clock())
        node.shards[shard.id] = shard
        self._emit("shard_status", node_id, shard.id)
        return shard

    def heartbeat_factor(self, node_id: str, factor: float) -> None:
        """The node was told to heartbeat every `factor` times the configured interval:
        it is unreachable, then lost, after `factor` times the configured silences."""
        self._get(node_id)
        if factor == 1:
            self._beat_factors.pop(node_id, None)
        else:
            self._beat_factors[node_id] = factor

    def disconnected(self, node_id: str) -> None:
        """The node's stream closed; its state follows its heartbeats from here on."""
        node = self._get(node_id)
        if node.connected:
            node.connected = False
            self._emit("node_disconnected", node_id)

    # ---- time ----

    def sweep(self) -> list[Transition]:
        """Move nodes silent for too long to unreachable, then lost; returns the moves."""
        now = self._clock()
        moves: list[Transition] = []
        factors = self._beat_factors
        for node in tuple(self._nodes.values()):
            silent_for = now - node.last_heartbeat
            factor = factors.get(node.id, 1) if factors else 1
            target: NodeState = "ready"
            if silent_for >= self._lost_after * factor:
                target = "lost"
            elif silent_for >= self._unreachable_after * factor:
                target = "unreachable"
            # Only a heartbeat makes a node ready again; sweeping only ages it.
            if _STATE_RANK[target] <= _STATE_RANK[node.state]:
                continue
            moves.append(Transition(node.id, node.state, target, silent_for))
            node.state = target
        for move in moves:
            factor = factors.get(move.node_id, 1)
            if move.new == "lost":
                log.warning(
                    "node %s is lost: no heartbeat for %.1f s (lost after %g s); "
                    "its replicas belong elsewhere",
                    move.node_id,
                    move.silent_for,
                    self._lost_after * factor,
                )
            else:
                log.warning(
                    "node %s is unreachable: no heartbeat for %.1f s (unreachable after %g s)",
                    move.node_id,
                    move.silent_for,
                    self._unreachable_after * factor,
                )
            self._emit("node_state", move.node_id)
        return moves

    # ---- operator ----

    def set_draining(self, node_id: str, draining: bool) -> Node:
        """Set the operator's draining flag (no new work is placed on a draining node)."""
        node = self._get(node_id)
        if node.draining != draining:
            node.draining = draining
            log.info("node %s %s", node_id, "draining" if draining else "no longer draining")
            self._emit("node_draining", node_id)
        return node.copy()

    def forget(self, node_id: str) -> Node:
        """Remove a node and its shards from the inventory (the operator removed it);
        returns its last snapshot. Raises `UnknownNode`."""
        node = self._nodes.pop(node_id, None)
        if node is None:
            raise UnknownNode(node_id)
        self._beat_factors.pop(node_id, None)
        log.info("node %s removed from the inventory with %d shards", node_id, len(node.shards))
        self._emit("node_removed", node_id)
        for shard_id in sorted(node.shards):
            self._emit("shard_removed", node_id, shard_id)
        return node.copy()

    def forget_shard(self, node_id: str, shard_id: str) -> None:
        """Drop a shard from the node's record (e.g. a stopped one nobody needs to see)."""
        node = self._get(node_id)
        if node.shards.pop(shard_id, None) is not None:
            self._emit("shard_removed", node_id, shard_id)

    # ---- reads ----

    def nodes(self) -> list[Node]:
        """Snapshots of every known node, by id."""
        return [self._nodes[k].copy() for k in sorted(self._nodes)]

    def briefs(self) -> list[NodeBrief]:
        """What lists filter, count and page on, for every node, by id: no GPUs or
        shards are copied (a fleet of 10,000 nodes is listed a page at a time)."""
        return [
            NodeBrief(n.id, n.hostname, n.state, n.draining, n.labels, n.fabric)
            for n in (self._nodes[k] for k in sorted(self._nodes))
        ]

    def node(self, node_id: str) -> Node:
        """A snapshot of one node; raises `UnknownNode`."""
        return self._get(node_id).copy()

    def heartbeat_age(self, node: Node) -> float:
        """Seconds since the node's last heartbeat (or registration), on the inventory's clock."""
        return max(0.0, self._clock() - node.last_heartbeat)

    # ---- helpers ----

    def _get(self, node_id: str) -> Node:
        try:
            return self._nodes[node_id]
        except KeyError:
            raise UnknownNode(node_id) from None

    @staticmethod
    def _shard(report: ShardReport, previous: Shard | None, wall: datetime) -> Shard:
        spec = report.spec if report.spec is not None else (previous.spec if previous else None)
        engine = spec.engine if spec is not None else (previous.engine if previous else "")
        since = report.since if report.since is not None else wall
        if (
            previous is not None
            and previous.state == report.state
            and previous.pid == report.pid
            and previous.endpoint_url == report.endpoint_url
        ):
            # The same engine process in the same state, reported again: a restarted
            # agent adopting it says "since now". It is as old as before, and of two
            # Ready replicas the one that served longest is the one a surplus keeps.
            since = min(since, previous.since)
        return Shard(
            id=report.shard_id,
            model=report.model or (previous.model if previous else ""),
            engine=engine,
            state=report.state,
            message=report.message,
            pid=report.pid,
            endpoint_url=report.endpoint_url,
            output_tail=report.output_tail,
            exit_code=report.exit_code,
            spec=spec,
            since=since,
            download=report.download,
            adapters=report.adapters,
        )
