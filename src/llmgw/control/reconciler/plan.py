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
  (Its replicas stay in the routers too; see `state.routable`.)
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
- Rollout: a model some of whose replicas run a spec the catalog no longer
  has is rolled (`rollout.step`: new replicas first, old ones drain once new
  ones are Ready) instead of scaled down, unless its rollout is halted
  (`Desired.halted`); then the old replicas keep serving and count as usual.
- Canary: a model with a canary (`versions:`) is planned as two, its own spec
  and its canary, each with the replicas that run it and its share of the
  wanted count by weight (at least one each while any is wanted). Replicas
  that run neither are its own spec's outdated ones and roll as above; after
  an abort the canary's are such, and drain once the others are Ready. A
  stopped canary (`Desired.canary_halted`: a replica of it failed) is planned
  the same way, as if the model had none.
- Clean up: shards of models no longer wanted are drained; shards that have
  already stopped or failed get a stop so that the agent forgets them.

- Multi-node replicas (gangs): the shards of one replica (same
  `ShardSpec.replica_id`, ranks 0..N-1) count as one replica, ready when all
  of them are; in doubt when any node of theirs is, draining when any is. A
  gang missing a rank (stopped, failed, on a lost node, or never started) is
  broken: its remaining shards are stopped (`gang_broken`) and it is replaced
  as a whole. A stop of a gang (drain, scale down) stops every shard of it.
  A gang is started as N starts at once, placed all or nothing
  (`Fleet.place`); rank 0's shard id is the replica id, rank R's is
  "<replica id>-r<R>"; ranks meet at rank 0's management address (`mgmt`)
  and each gets its node's management interface as environment.

No stop goes to a disconnected node; it is retried by the next plan.

Not guaranteed: the actions are decided on a snapshot. The controller
re-plans after every change, and the agent refuses work that conflicts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from llmgw.control.catalog.model import CatalogModel, canary_model
from llmgw.control.inventory.model import Node, Shard, ShardSpec
from llmgw.control.reconciler import rollout
from llmgw.control.reconciler.mgmt import MgmtAddress, mgmt_address, rank_env
from llmgw.control.reconciler.placement import DEFAULT_FILTERS, Filter, Fleet, explain
from llmgw.control.reconciler.rollout import runs_current
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

    # Per gang (by its rank 0 shard id): its other shards, which follow rank 0's stops.
    followers: dict[str, list[tuple[Node, Shard]]] = field(default_factory=dict)

    # The specs of the pending starts (one per replica), to tell a canary's apart.
    pending_specs: list[ShardSpec] = field(default_factory=list)

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
    mgmt_interface: str = "",
) -> Plan:
    """The actions that bring `actual` towards `desired`; see the module docstring.

    `new_shard_id(model)` names each new replica; it is called once per replica
    placed (a multi-node replica's other shards are named after it).
    """
    wanted = {d.model.name: d for d in desired}
    replicas = {name: _Replicas() for name in wanted}
    stops = _count(actual, replicas)
    short: list[tuple[Desired, int]] = []
    rolling: dict[str, str] = {}
    for name in sorted(wanted):
        for want, have in _versions(wanted[name], replicas[name]):
            stops += _drain(want, have)
            outdated = [ns for ns in have.serving if not runs_current(want.model, ns[1].spec)]
            old_ids = {shard.id for _, shard in outdated}
            if outdated and not want.halted:
                moves = rollout.step(
                    wanted=want.replicas,
                    max_surge=want.model.max_surge,
                    max_unavailable=want.model.max_unavailable,
                    current=[ns for ns in have.serving if ns[1].id not in old_ids],
                    current_pending=have.pending,
                    outdated=outdated,
                    routed=actual.routed,
                )
                rolling[name] = moves.detail
                stops += [
                    _stop(node, shard, "rollout", drain=True, detail=moves.detail)
                    for node, shard in moves.stops
                ]
                missing = moves.starts
            else:
                stops += _scale_down(want, have)
                missing = want.replicas - have.count
            if not want.hold and missing > 0:
                short.append((want, missing))
    stops = _with_followers(stops, replicas)
    fleet = Fleet(
        actual.nodes, actual.pending, policy=policy, filters=filters, mgmt_interface=mgmt_interface
    )
    nodes = {n.id: n for n in actual.nodes}
    awake, sleepers = _without_sleepers(actual)
    roomy = (
        Fleet(awake, actual.pending, policy=policy, filters=filters, mgmt_interface=mgmt_interface)
        if sleepers
        else None
    )
    starts, unplaced, making_room = _place(
        short,
        fleet,
        new_shard_id,
        lambda node_id: mgmt_address(nodes[node_id], mgmt_interface),
        _Room(roomy, sleepers, actual.stopping) if roomy is not None else None,
    )
    stops += making_room
    stops.sort(key=lambda s: (s.node_id, s.shard_id))
    in_doubt = {
        name: tuple(sorted(shard.id for _, shard in have.in_doubt))
        for name, have in sorted(replicas.items())
        if have.in_doubt
    }
    return Plan(actions=(*stops, *starts), unplaced=unplaced, in_doubt=in_doubt, rolling=rolling)


def _count(actual: Actual, replicas: dict[str, _Replicas]) -> list[Stop]:
    """Sort every shard and pending start into `replicas`; the clean-up stops."""
    stops: list[Stop] = []
    nodes = {n.id: n for n in actual.nodes}
    gangs: dict[str, list[tuple[Node, Shard]]] = {}
    # Ranks of multi-node replicas known to be gone: on a lost node, or being stopped.
    gone: dict[str, set[int]] = {}
    for node in sorted(actual.nodes, key=lambda n: n.id):
        for shard in node.shards.values():
            spec = shard.spec
            if (
                spec is not None
                and spec.nodes > 1
                and (node.state == "lost" or shard.id in actual.stopping)
            ):
                gone.setdefault(spec.replica, set()).add(spec.node_rank)
        if node.state == "lost":
            continue
        for shard in sorted(node.shards.values(), key=lambda s: s.id):
            if shard.id in actual.stopping:
                continue
            if shard.spec is not None and shard.spec.nodes > 1:
                gangs.setdefault(shard.spec.replica, []).append((node, shard))
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
    pending_ranks: dict[str, set[int]] = {}
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
        spec = start.spec
        if spec.nodes > 1:
            # A gang's starts count once: as a pending replica until rank 0 reports,
            # then as the ranks that are on their way.
            pending_ranks.setdefault(spec.replica, set()).add(spec.node_rank)
            if spec.node_rank != 0 or spec.replica in gangs:
                continue
        have.pending += 1
        have.pending_specs.append(spec)
    for replica_id in sorted(gangs):
        stops += _count_gang(
            replica_id,
            gangs[replica_id],
            pending_ranks.get(replica_id, set()),
            gone.get(replica_id, set()),
            replicas,
            settling=actual.settling,
        )
    return stops


def _count_gang(
    replica_id: str,
    members: list[tuple[Node, Shard]],
    pending: set[int],
    gone: set[int],
    replicas: dict[str, _Replicas],
    *,
    settling: bool,
) -> list[Stop]:
    """Count one multi-node replica once, or stop what is left of a broken one.

    A rank is missing when no node reports it running and no start of it is in
    flight. While `settling` (a new leader's first moments, when agents are still
    registering) a missing rank that nothing says is gone may be on a node that
    has not registered yet: the replica is waited for, not stopped.
    """
    first = members[0][1]
    assert first.spec is not None
    size = first.spec.nodes
    have = replicas.get(first.model)
    live = [(n, s) for n, s in members if s.holds_gpus and s.state != "draining"]
    ranks = {s.spec.node_rank for _, s in live if s.spec is not None} | pending
    ended = {
        s.spec.node_rank
        for _, s in members
        if s.spec is not None and (not s.holds_gpus or s.state == "draining")
    } | gone
    stops: list[Stop] = []
    for node, shard in members:
        if not shard.holds_gpus and node.connected:
            stops.append(_stop(node, shard, "ended", drain=False))
    if have is None:
        return stops + [
            _stop(n, s, "not_in_catalog", drain=True)
            for n, s in live
            if n.connected and n.state == "ready"
        ]
    missing = sorted(set(range(size)) - ranks)
    if missing and settling and not set(missing) & ended:
        head = next((m for m in live if m[1].spec is not None and m[1].spec.node_rank == 0), None)
        if head is None:
            have.pending += 1
            have.pending_specs.append(first.spec)
        else:
            have.followers[head[1].id] = [m for m in live if m is not head]
            have.serving.append(head)
        return stops
    if missing:
        names = ", ".join(str(r) for r in missing)
        detail = f"replica {replica_id} lost rank{'s' if len(missing) > 1 else ''} {names}"
        return stops + [
            _stop(n, s, "gang_broken", drain=False, detail=detail)
            for n, s in live
            if n.connected and n.state == "ready"
        ]
    head = next(((n, s) for n, s in live if s.spec is not None and s.spec.node_rank == 0), None)
    if head is None:
        # Rank 0 is still on its way: the replica is a pending start.
        have.pending += 1
        have.pending_specs.append(first.spec)
        return stops
    have.followers[head[1].id] = [(n, s) for n, s in live if s is not head[1]]
    if any(n.state == "unreachable" for n, _ in live):
        have.in_doubt.append(head)
    elif any(n.draining for n, _ in live):
        have.draining.append(head)
    else:
        have.serving.append(head)
        have.ready += not pending and all(s.state == "ready" for _, s in live)
    return stops


def _versions(want: Desired, have: _Replicas) -> list[tuple[Desired, _Replicas]]:
    """A model with a canary as two: its own spec and its canary, each with the replicas
    that run it and its share of the wanted count (by weight, at least one each while
    any is wanted). Replicas that run neither are the own spec's (being rolled)."""
    canary = canary_model(want.model)
    if canary is None or want.model.canary is None or want.canary_halted:
        return [(want, have)]
    weight, stable_weight = want.model.canary.weight, want.model.canary.stable_weight
    total = max(want.replicas, 0)
    n_canary = 0 if total == 0 else max(1, round(total * weight / (weight + stable_weight)))
    n_stable = 0 if total == 0 else max(1, total - n_canary)
    ours, theirs = _Replicas(), _Replicas()

    def part(spec: ShardSpec | None) -> _Replicas:
        return theirs if spec is not None and runs_current(canary, spec) else ours

    for node, shard in have.serving:
        part(shard.spec).serving.append((node, shard))
        part(shard.spec).ready += shard.state == "ready"
    for node, shard in have.draining:
        part(shard.spec).draining.append((node, shard))
    for node, shard in have.in_doubt:
        part(shard.spec).in_doubt.append((node, shard))
    for spec in have.pending_specs:
        part(spec).pending += 1
        part(spec).pending_specs.append(spec)
    return [
        (dataclasses.replace(want, model=want.model, replicas=n_stable), ours),
        (dataclasses.replace(want, model=canary, replicas=n_canary, halted=False), theirs),
    ]


def _with_followers(stops: list[Stop], replicas: dict[str, _Replicas]) -> list[Stop]:
    """Each stop of a gang's rank 0 also stops its other ranks, for the same reason."""
    followers = {
        shard_id: members
        for have in replicas.values()
        for shard_id, members in have.followers.items()
    }
    out = list(stops)
    for stop in stops:
        for node, shard in followers.get(stop.shard_id, ()):
            if node.connected and node.state == "ready":
                out.append(_stop(node, shard, stop.reason, drain=stop.drain, detail=stop.detail))
    return out


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


@dataclass(slots=True)
class _Room:
    """The fleet as if sleeping replicas were gone (their GPUs count as free), and
    which sleeping replica holds each (node, GPU)."""

    fleet: Fleet
    sleepers: dict[tuple[str, int], tuple[Node, Shard]]
    stopping: frozenset[str]


def _without_sleepers(
    actual: Actual,
) -> tuple[list[Node], dict[tuple[str, int], tuple[Node, Shard]]]:
    """The nodes without their sleeping single-node shards, and those shards by GPU.

    A sleeping engine released its GPU memory, so placement may use its GPUs: it
    is stopped first (`make_room`)."""
    nodes: list[Node] = []
    sleepers: dict[tuple[str, int], tuple[Node, Shard]] = {}
    for node in actual.nodes:
        asleep = [
            s
            for s in node.shards.values()
            if s.state == "sleeping" and (s.spec is None or s.spec.nodes <= 1)
        ]
        if not asleep:
            nodes.append(node)
            continue
        copy = node.copy()
        for shard in asleep:
            del copy.shards[shard.id]
            for index in shard.gpu_indices:
                sleepers[(node.id, index)] = (node, shard)
        nodes.append(copy)
    return nodes, sleepers


def _place(
    short: list[tuple[Desired, int]],
    fleet: Fleet,
    new_shard_id: Callable[[str], str],
    mgmt: Callable[[str], MgmtAddress | str],
    room: _Room | None = None,
) -> tuple[list[Start], dict[str, Explanation], list[Stop]]:
    """Starts for the missing replicas; what cannot be placed; and the sleeping
    replicas to stop first where only their GPUs would let a replica be placed."""
    starts: list[Start] = []
    unplaced: dict[str, Explanation] = {}
    making_room: dict[str, Stop] = {}
    short.sort(key=lambda item: (-_size(item[0].model), item[0].model.name))
    for want, missing in short:
        model = want.model
        for _ in range(missing):
            placement = fleet.place(
                model, avoid_nodes=want.avoid_nodes, avoid_ports=want.avoid_ports
            )
            if placement is None:
                stops = _make_room(room, want) if room is not None else None
                if stops is None:
                    unplaced[model.name] = fleet.explain(
                        model, avoid_nodes=want.avoid_nodes, avoid_ports=want.avoid_ports
                    )
                for stop in stops or ():
                    making_room.setdefault(stop.shard_id, stop)
                break
            fleet.reserve(placement, model.name)
            if room is not None:
                room.fleet.reserve(placement, model.name)
            starts += _starts(model, placement, new_shard_id(model.name), mgmt)
    return starts, dict(sorted(unplaced.items())), list(making_room.values())


def _make_room(room: _Room, want: Desired) -> list[Stop] | None:
    """The stops of the sleeping replicas whose GPUs would let `want` be placed (empty
    when they are already stopping), or None when it would not fit even without them;
    the start comes once they are gone."""
    model = want.model
    spot = room.fleet.place(model, avoid_nodes=want.avoid_nodes, avoid_ports=want.avoid_ports)
    if spot is None:
        return None
    room.fleet.reserve(spot, model.name)
    victims: dict[str, tuple[Node, Shard]] = {}
    for rank in spot.ranks:
        for index in rank.gpu_indices:
            found = room.sleepers.get((rank.node_id, index))
            if found is not None and found[1].id not in room.stopping:
                victims[found[1].id] = found
    detail = f"model {model.name} needs its GPUs"
    return [
        _stop(node, shard, "make_room", drain=False, detail=detail)
        for node, shard in victims.values()
    ]


def _size(model: CatalogModel) -> int:
    return model.profiles[0].gpus * model.profiles[0].nodes if model.profiles else 0


def _starts(
    model: CatalogModel,
    placement: Placement,
    replica_id: str,
    mgmt: Callable[[str], MgmtAddress | str],
) -> list[Start]:
    """One start per shard: rank 0 first, then the other ranks of a multi-node replica,
    each with its management network's environment (`mgmt.rank_env`)."""
    profile = placement.profile
    gang = profile.nodes > 1
    # Placement only picks nodes with a management address (filter_mgmt).
    networks = [mgmt(r.node_id) if gang else "" for r in placement.ranks]
    master_addr = networks[0].address if isinstance(networks[0], MgmtAddress) else ""
    starts = []
    for rank, shard in enumerate(placement.ranks):
        network = networks[rank]
        env = (
            rank_env(profile.engine, network, profile.env)
            if isinstance(network, MgmtAddress)
            else profile.env
        )
        spec = ShardSpec(
            shard_id=replica_id if rank == 0 else f"{replica_id}-r{rank}",
            model=model.name,
            engine=profile.engine,
            weights=model.launch_weights,
            gpu_indices=shard.gpu_indices,
            port=shard.port,
            engine_args=profile.engine_args,
            env=env,
            tensor_parallel_size=profile.tensor_parallel,
            pipeline_parallel_size=profile.pipeline_parallel,
            gpu_memory_utilization=profile.gpu_memory_utilization,
            load_timeout=profile.load_timeout or 0.0,
            unhealthy_after=profile.unhealthy_after or 0.0,
            drain_grace=profile.drain_grace or 0.0,
            nodes=profile.nodes,
            node_rank=rank,
            master_addr=master_addr,
            master_port=placement.master_port if gang else 0,
            replica_id=replica_id if gang else "",
            sleep_mode=model.sleep_after is not None,
        )
        starts.append(
            Start(node_id=shard.node_id, model=model.name, profile=profile.name, spec=spec)
        )
    return starts


def _stop(node: Node, shard: Shard, reason: StopReason, *, drain: bool, detail: str = "") -> Stop:
    return Stop(
        node_id=node.id,
        shard_id=shard.id,
        model=shard.model,
        reason=reason,
        drain=drain,
        detail=detail,
    )
