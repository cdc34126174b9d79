"""What `plan()` takes and returns: desired replicas, the actual fleet, actions, reasons.

All plain immutable values, so `plan` is a pure function that tests and the
benchmark call directly. The controller builds `Desired` and `Actual` from the
catalog, its own bookkeeping and an inventory snapshot, and executes the
actions through the agent service.

Not guaranteed: that an action still makes sense by the time it runs; the
controller re-plans after every change, and the agent refuses conflicting work.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from llmgw.control.catalog.model import CatalogModel, Profile
from llmgw.control.inventory.model import Node, ShardSpec

PlacementPolicy = Literal["pack", "spread"]


@dataclass(frozen=True, slots=True)
class Desired:
    """How many replicas of one model should run right now.

    `hold`: the model is backing off after a failure; start nothing new for it
    now (stops still happen). `avoid_nodes`: nodes where it failed recently;
    placed there only when no other node fits. `avoid_ports`: (node, port)
    pairs where a start failed recently (say another program holds the port);
    another free port of that node is used when there is one. `halted`: a
    replica of the model's current spec failed while older ones served; the
    rollout stops there (old replicas keep serving) until an operator acts.
    `canary_halted`: a replica of the model's canary failed; the canary is no
    longer started and its replicas drain as after an abort.
    """

    model: CatalogModel
    replicas: int
    hold: bool = False
    avoid_nodes: frozenset[str] = frozenset()
    avoid_ports: frozenset[tuple[str, int]] = frozenset()
    # A rollout of the model's current spec failed: old replicas are kept, not replaced.
    halted: bool = False
    # The model's canary failed: planned as if it had none (its replicas are outdated).
    canary_halted: bool = False


@dataclass(frozen=True, slots=True)
class Pending:
    """A start that was sent but that the node has not reported as a shard yet."""

    node_id: str
    spec: ShardSpec


@dataclass(frozen=True, slots=True)
class Actual:
    """The fleet as the inventory last saw it, plus commands still in flight."""

    nodes: Sequence[Node]
    pending: Sequence[Pending] = ()
    # Shards with a stop or drain in flight: they are neither counted nor stopped again.
    stopping: frozenset[str] = frozenset()
    # A new leader's first moments (agents still registering): a multi-node replica
    # missing a rank that nothing says is gone is waited for rather than stopped.
    settling: bool = False
    # The Ready replicas the router routes to (None: all); a rollout counts only these.
    routed: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class Start:
    """Start shard `spec.shard_id` of `model` on `node_id` with `profile`."""

    node_id: str
    model: str
    profile: str
    spec: ShardSpec


StopReason = Literal[
    "scale_down",
    "node_draining",
    "not_in_catalog",
    "ended",
    "gang_broken",
    "rollout",
    "make_room",
]


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop a shard. `drain`: let in-flight requests finish first.

    Reasons: `scale_down` (more replicas than wanted), `node_draining` (its
    replacement is ready), `not_in_catalog` (no model of that name any more),
    `ended` (the shard already stopped or failed: the stop makes the agent forget it),
    `gang_broken` (another shard of its multi-node replica is gone: the rest stop too),
    `rollout` (it runs a spec the catalog replaced, and enough new replicas are Ready),
    `make_room` (it sleeps, and another model's replica needs its GPUs: it stops
    first, and that replica is placed once its GPUs are free).
    `detail`: for people (events, logs), e.g. which replicas a scale down keeps;
    not part of the action's identity.
    """

    node_id: str
    shard_id: str
    model: str
    reason: StopReason
    drain: bool
    detail: str = field(default="", compare=False)


Action = Start | Stop


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why one node cannot take one replica with one profile, e.g. '2 of 4 GPUs free'."""

    node_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class ProfileVerdict:
    """One profile tried against every node: the nodes that fit, and why the others do not.

    For a multi-node profile `fits` are the nodes that could each take a shard,
    and `groups` says per fabric group why it cannot take the whole replica,
    e.g. "ib-domain=pod3: 1 of 2 nodes with 8 free 80 GiB GPUs".
    """

    profile: str
    fits: tuple[str, ...]
    rejections: tuple[Rejection, ...]
    groups: tuple[str, ...] = ()
    # Per fitting node, for pinned hub weights: "node-a: has org/name@abc1234 on disk"
    # or "node-b: must download 15.2 GB (org/name@abc1234)".
    weights: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one replica would go: its (rank 0) shard's node, GPUs and port.

    A multi-node replica also has `shards`, the placements of ranks 1..N-1 in
    order; `master_port` is the rendezvous port on rank 0's node and `fabric`
    the shared fabric label ("ib-domain=pod3").
    """

    node_id: str
    profile: Profile
    gpu_indices: tuple[int, ...]
    port: int
    shards: tuple[Placement, ...] = ()
    master_port: int = 0
    fabric: str = ""

    @property
    def ranks(self) -> tuple[Placement, ...]:
        """Every shard's placement, rank 0 first."""
        return (self, *self.shards)


@dataclass(frozen=True, slots=True)
class Explanation:
    """The answer to 'where would this go / why is this not running'.

    `placement` is None when no profile fits any node; `verdicts` holds one entry
    per profile tried, in the model's order of preference.
    """

    model: str
    placement: Placement | None
    verdicts: tuple[ProfileVerdict, ...]

    def summary(self) -> str:
        """One line for logs and 503 bodies, e.g. "model 'llama-70b' cannot be
        placed: profile 'tp4': node-a: 2 of 4 GPUs free; node-b: draining".
        """
        if self.placement is not None:
            p = self.placement
            gpus = _gpu_list(p.gpu_indices)
            if p.shards:
                ranks = ", ".join(
                    f"rank {rank} on {r.node_id} (GPUs {_gpu_list(r.gpu_indices)})"
                    for rank, r in enumerate(p.ranks)
                )
                return (
                    f"model '{self.model}' fits on {p.fabric} with profile "
                    f"'{p.profile.name}': {ranks}; rank 0 serves on port {p.port}, "
                    f"rendezvous on port {p.master_port}"
                )
            return (
                f"model '{self.model}' fits on node {p.node_id} with profile "
                f"'{p.profile.name}' (GPUs {gpus}, port {p.port})"
            )
        if not self.verdicts:
            return f"model '{self.model}' cannot be placed: it has no profiles"
        parts = []
        for verdict in self.verdicts:
            reasons = [*verdict.groups]
            reasons += [f"{r.node_id}: {r.reason}" for r in verdict.rejections]
            nodes = "; ".join(reasons) if reasons else "no nodes registered"
            parts.append(f"profile '{verdict.profile}': {nodes}")
        return f"model '{self.model}' cannot be placed: " + " | ".join(parts)


def _gpu_list(indices: tuple[int, ...]) -> str:
    return ",".join(map(str, indices)) or "none"


@dataclass(frozen=True, slots=True)
class Plan:
    """The actions that bring the fleet towards the desired state.

    `unplaced` names the models still short of replicas after this plan, with
    the reason (not counting models on hold). `in_doubt` names, per model, the
    replicas on unreachable nodes that were not counted (and are being replaced).
    `rolling` names the models whose replicas are being replaced by a new spec.
    """

    actions: tuple[Action, ...]
    unplaced: Mapping[str, Explanation] = field(default_factory=dict)
    in_doubt: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Models being rolled to a new spec, with where each stands (`rollout.Step.detail`).
    rolling: Mapping[str, str] = field(default_factory=dict)
