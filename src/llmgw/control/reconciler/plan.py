"""`plan(desired, actual)`: the starts and stops that move the fleet towards what is wanted.

A pure function of its inputs: same input, same actions in the same order
(stops by node and shard id, then starts). What it decides, per model:

- Counting: a model's replicas are its shards that may still hold GPUs, are
  not being stopped already (`Actual.stopping`) and are not on a lost node,
  plus its pending starts. A shard the agent is already draining is on its
  way out and is not counted. Shards on lost nodes are neither counted (so
  replacements get placed) nor stopped (nothing can reach them).
- In doubt: shards on an unreachable node (heartbeats missed, not lost yet)
  are not counted either, so a replacement is placed on another node while the
  node may still come back; they are not stopped (nothing can reach them) and
  keep their GPUs and ports on that node. `Plan.in_doubt` names them. A node
  whose stream merely closed, with heartbeats still recent, is not in doubt
  here: an agent restarting comes back within seconds, and a replacement
  started elsewhere for every agent restart would load weights for nothing.
  (Its replicas do leave the routers at once; see the controller.)
- Starts: a model with fewer replicas off draining nodes than wanted, and not
  on hold, gets the missing ones placed one at a time by `Fleet.place`, so two
  starts never share a GPU or port. Models are placed largest first (GPUs of
  their first profile), then by name, so big replicas find whole nodes before
  small ones fragment them. The first replica that fits nowhere ends the
  attempts for that model, and `Plan.unplaced` says why.
- Drain: shards on a draining node keep serving until the model has as many
  ready replicas elsewhere as wanted; then they are drained.
- Scale down: the surplus is drained, replicas not ready yet first, then the
  newest. Pending starts count but are never picked (they are not shards yet),
  and no shard is stopped in favour of a pending start: the start's shard is
  the surplus once it reports.
  This is also how a node that comes back after its replicas were replaced
  loses the surplus: the Ready one is kept, and of two Ready ones the older.
  Each such stop's `detail` says which replicas are kept and why.
- Clean up: shards of models no longer wanted are drained; shards that have
  already stopped or failed get a stop so that the agent forgets them.

No stop goes to a disconnected node; it is retried by the next plan.

Not guaranteed: the actions are decided on a snapshot. The controller
re-plans after every change, and the agent refuses work that conflicts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from llmgw.control.catalog.model import CatalogModel
from llmgw.control.inventory.model import Node, Shard, ShardSpec
from llmgw.control.reconciler.placement import DEFAULT_FILTERS, Filter, Fleet, explain
from llmgw.control.reconciler.types import (
    Actual,
    Desired,
    Explanation,
    Placement,
    PlacementPolicy,
    Plan,
    Start,
    Stop,
    StopReason,
)

# `explain` lives with the filters it runs; it is re-exported for callers of `plan`.
__all__ = ["explain", "plan"]


@dataclass(slots=True)
class _Replicas:
    """One model's replicas as this plan counts them."""

    # Shards off draining nodes, and how many of them are ready.
    serving: list[tuple[Node, Shard]] = field(default_factory=list)
    ready: int = 0
    # Pending starts off draining nodes: serving, but never stopped.
    pending: int = 0
    # Shards on draining nodes, waiting for their replacements.
    draining: list[tuple[Node, Shard]] = field(default_factory=list)
    # Shards on unreachable nodes: not counted, not stopped, replaced elsewhere.
    in_doubt: list[tuple[Node, Shard]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.serving) + self.pending


def plan(
    desired: Sequence[Desired],
    actual: Actual,
    *,
    policy: PlacementPolicy,
    new_shard_id: Callable[[str], str],
    filters: Sequence[Filter] = DEFAULT_FILTERS,
) -> Plan:
    """The actions that bring `actual` towards `desired`; see the module docstring.

    `new_shard_id(model)` names each new shard; it is called once per start.
    """
    wanted = {d.model.name: d for d in desired}
    replicas = {name: _Replicas() for name in wanted}
    stops = _count(actual, replicas)
    short: list[tuple[Desired, int]] = []
    for name in sorted(wanted):
        want, have = wanted[name], replicas[name]
        stops += _drain(want, have)
        stops += _scale_down(want, have)
        if not want.hold and have.count < want.replicas:
            short.append((want, want.replicas - have.count))
    fleet = Fleet(actual.nodes, actual.pending, policy=policy, filters=filters)
    starts, unplaced = _place(short, fleet, new_shard_id)
    stops.sort(key=lambda s: (s.node_id, s.shard_id))
    in_doubt = {
        name: tuple(sorted(shard.id for _, shard in have.in_doubt))
        for name, have in sorted(replicas.items())
        if have.in_doubt
    }
    return Plan(actions=(*stops, *starts), unplaced=unplaced, in_doubt=in_doubt)


def _count(actual: Actual, replicas: dict[str, _Replicas]) -> list[Stop]:
    """Sort every shard and pending start into `replicas`; the clean-up stops."""
    stops: list[Stop] = []
    nodes = {n.id: n for n in actual.nodes}
    for node in sorted(actual.nodes, key=lambda n: n.id):
        if node.state == "lost":
            continue
        for shard in sorted(node.shards.values(), key=lambda s: s.id):
            if shard.id in actual.stopping:
                continue
            have = replicas.get(shard.model)
            if not shard.holds_gpus:
                if node.connected:
                    stops.append(_stop(node, shard, "ended", drain=False))
            elif have is None:
                if node.connected:
                    stops.append(_stop(node, shard, "not_in_catalog", drain=True))
            elif shard.state == "draining":
                continue
            elif node.state == "unreachable":
                have.in_doubt.append((node, shard))
            elif node.draining:
                have.draining.append((node, shard))
            else:
                have.serving.append((node, shard))
                have.ready += shard.state == "ready"
    for start in actual.pending:
        target = nodes.get(start.node_id)
        have = replicas.get(start.spec.model)
        # A start the node already reports is counted as its shard; one sent to
        # a node that is gone or lost will never run, and one sent to a node in
        # doubt is as uncertain as the node's shards.
        if (
            have is None
            or target is None
            or target.state != "ready"
            or target.draining
            or start.spec.shard_id in target.shards
        ):
            continue
        have.pending += 1
    return stops


def _drain(want: Desired, have: _Replicas) -> list[Stop]:
    """Drain shards off draining nodes once enough replicas elsewhere are ready."""
    if have.ready < want.replicas:
        return []
    return [
        _stop(node, shard, "node_draining", drain=True)
        for node, shard in have.draining
        if node.connected
    ]


def _scale_down(want: Desired, have: _Replicas) -> list[Stop]:
    """Drain the surplus: replicas not ready yet first, then the newest."""
    wanted = max(want.replicas, 0)
    # Pending starts count, but a shard is never traded for a start that has not
    # reported yet: that start's shard is retired once it reports (not ready, so first).
    surplus = min(have.count - wanted, len(have.serving) - wanted)
    if surplus <= 0:
        return []
    candidates = [(node, shard) for node, shard in have.serving if node.connected]
    # Stable sorts: by id, then newest first, then not-ready before ready.
    candidates.sort(key=lambda ns: ns[1].since, reverse=True)
    candidates.sort(key=lambda ns: ns[1].state == "ready")
    victims = candidates[:surplus]
    gone = {shard.id for _, shard in victims}
    kept = [(node, shard) for node, shard in have.serving if shard.id not in gone]
    detail = _surplus_detail(have.count, want.replicas, kept, have.pending)
    return [_stop(node, shard, "scale_down", drain=True, detail=detail) for node, shard in victims]


def _surplus_detail(count: int, wanted: int, kept: list[tuple[Node, Shard]], pending: int) -> str:
    """Why these replicas stop and which stay, e.g. "2 replicas for 1 wanted;
    keeping a-1 on node-a (ready); Ready ones are kept first, then the oldest"."""
    text = f"{count} replica{'' if count == 1 else 's'} for {max(wanted, 0)} wanted"
    parts = [
        f"{shard.id} on {node.id} ({shard.state})"
        for node, shard in sorted(kept, key=lambda ns: (ns[1].since, ns[1].id))
    ]
    if pending:
        parts.append(f"{pending} start{'' if pending == 1 else 's'} in flight")
    if not parts:
        return text
    return f"{text}; keeping {', '.join(parts)}; Ready ones are kept first, then the oldest"


def _place(
    short: list[tuple[Desired, int]], fleet: Fleet, new_shard_id: Callable[[str], str]
) -> tuple[list[Start], dict[str, Explanation]]:
    starts: list[Start] = []
    unplaced: dict[str, Explanation] = {}
    short.sort(key=lambda item: (-_size(item[0].model), item[0].model.name))
    for want, missing in short:
        model = want.model
        for _ in range(missing):
            placement = fleet.place(
                model, avoid_nodes=want.avoid_nodes, avoid_ports=want.avoid_ports
            )
            if placement is None:
                unplaced[model.name] = fleet.explain(
                    model, avoid_nodes=want.avoid_nodes, avoid_ports=want.avoid_ports
                )
                break
            fleet.reserve(placement, model.name)
            starts.append(_start(model, placement, new_shard_id(model.name)))
    return starts, dict(sorted(unplaced.items()))


def _size(model: CatalogModel) -> int:
    return model.profiles[0].gpus if model.profiles else 0


def _start(model: CatalogModel, placement: Placement, shard_id: str) -> Start:
    profile = placement.profile
    spec = ShardSpec(
        shard_id=shard_id,
        model=model.name,
        engine=profile.engine,
        weights=model.weights,
        gpu_indices=placement.gpu_indices,
        port=placement.port,
        engine_args=profile.engine_args,
        env=profile.env,
        tensor_parallel_size=profile.tensor_parallel,
        gpu_memory_utilization=profile.gpu_memory_utilization,
        load_timeout=profile.load_timeout or 0.0,
        unhealthy_after=profile.unhealthy_after or 0.0,
        drain_grace=profile.drain_grace or 0.0,
    )
    return Start(node_id=placement.node_id, model=model.name, profile=profile.name, spec=spec)


def _stop(node: Node, shard: Shard, reason: StopReason, *, drain: bool, detail: str = "") -> Stop:
    return Stop(
        node_id=node.id,
        shard_id=shard.id,
        model=shard.model,
        reason=reason,
        drain=drain,
        detail=detail,
    )
