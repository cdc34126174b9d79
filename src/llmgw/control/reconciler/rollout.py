"""Rollouts: replacing a model's replicas with a changed spec, surge first, one step at a time.

A pure planner beside `plan()`. A replica is *outdated* when what it runs (its
`ShardSpec`: engine, engine arguments, weights, GPU count, parallel sizes, GPU
memory share, nodes, the profile's environment) matches none of its model's
profiles any more; `runs_current` says so. A model with outdated replicas is
rolling, and `step` decides, from what serves now, what happens next:

- Stops: an outdated replica that is not Ready (or not routed to yet) serves
  nothing and is drained while the Ready replicas already reach `wanted -
  max_unavailable` (below that it may be one just adopted by a new leader, soon
  Ready); a Ready one is drained only while the Ready replicas (new and old)
  stay at or above `wanted - max_unavailable` without it. Oldest first.
- Starts: replicas of the new spec while fewer than `wanted` run it, and no
  more than `wanted + max_surge` run in all.

So with the defaults (surge 1, unavailable 0) one new replica starts, becomes
Ready, then one old one drains, and so on; the model never has fewer Ready
replicas than wanted. Changes that leave what runs alone (aliases, limits,
keep-alive, load targets) make no replica outdated, so they apply in place; the
agent's timeouts (load, health, drain grace) restart nothing either and apply to
replicas started afterwards. The rollout ends when no replica is outdated.

A halted rollout (a replica of the new spec failed: see the controller) is not
planned here: `plan` keeps the old replicas as they are and starts no new ones
for the surge.

Not guaranteed: that a replica started before the change and still pending
(not reported yet) is replaced at once; pending starts count as new ones, and
once reported an outdated one is replaced like any other. Placement
constraints that do not change the launch (GPU kind, memory per GPU, labels)
apply to new replicas only and do not roll the running ones. Where a rollout
stands is known to the leader, which plans it; a standby's admin API shows none.
An old replica drains once its replacement is routed to by the leader's router;
other servers' routers check the new replica on their own and may add it a
moment later.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmgw.control.catalog.model import CatalogModel, Profile, launch_key
from llmgw.control.inventory.model import Node, Shard, ShardSpec

# Re-exported: the reconciler keys stopped rollouts by it.
spec_key = launch_key


def runs_current(model: CatalogModel, spec: ShardSpec | None) -> bool:
    """Whether a replica with `spec` runs what one of `model`'s profiles would start now.

    A replica whose spec is unknown is taken as current: nothing says otherwise,
    and restarting it on a guess would cost a load for nothing.
    """
    if spec is None:
        return True
    return any(_same_launch(model, profile, spec) for profile in model.profiles)


def _same_launch(model: CatalogModel, profile: Profile, spec: ShardSpec) -> bool:
    return (
        spec.engine == profile.engine
        and spec.weights == model.launch_weights
        and spec.engine_args == profile.engine_args
        and len(spec.gpu_indices) == profile.gpus
        and spec.tensor_parallel_size == profile.tensor_parallel
        and spec.pipeline_parallel_size == profile.pipeline_parallel
        and spec.gpu_memory_utilization == profile.gpu_memory_utilization
        and spec.nodes == profile.nodes
        # An engine is started able to sleep or not: a change of sleep_after restarts it.
        and spec.sleep_mode == (model.sleep_after is not None)
        # A multi-node rank's environment adds its network's variables to the profile's.
        and all(spec.env.get(key) == value for key, value in profile.env.items())
        and (profile.nodes > 1 or len(spec.env) == len(profile.env))
    )


@dataclass(frozen=True, slots=True)
class Step:
    """What a rolling model does next: the outdated replicas to drain, the new ones to start."""

    stops: tuple[tuple[Node, Shard], ...]
    starts: int
    # For people: e.g. "2 of 3 replicas run the new spec; 1 new replica Ready ...".
    detail: str


def step(
    *,
    wanted: int,
    max_surge: int,
    max_unavailable: int,
    current: Sequence[tuple[Node, Shard]],
    current_pending: int,
    outdated: Sequence[tuple[Node, Shard]],
    routed: frozenset[str] | None = None,
) -> Step:
    """The next step of a rollout; see the module docstring.

    `current`: serving replicas that run the new spec; `current_pending`: starts
    not reported yet (they run the new spec); `outdated`: serving replicas that
    run an old one. Replicas on disconnected nodes are never stopped here.
    `routed`: the replicas the router sends requests to (None: every Ready one); a
    Ready replica counts as Ready here only once it is routed to, so an old one never
    leaves the router before its replacement is in it.
    """
    wanted = max(wanted, 0)

    def ready(shard: Shard) -> bool:
        return shard.state == "ready" and (routed is None or shard.id in routed)

    current_ready = sum(ready(s) for _, s in current)
    old_ready = sum(ready(s) for _, s in outdated)
    budget = current_ready + old_ready - max(wanted - max_unavailable, 0)
    stops: list[tuple[Node, Shard]] = []
    for node, shard in sorted(outdated, key=lambda ns: (ns[1].since, ns[1].id)):
        if not node.connected:
            continue
        if not ready(shard):
            # Serving nothing yet; but it may be an old replica just adopted or not yet
            # checked by the router, so it goes only while the Ready ones suffice.
            if budget >= 0:
                stops.append((node, shard))
        elif budget > 0:
            stops.append((node, shard))
            budget -= 1
    new = len(current) + current_pending
    total = new + len(outdated) - len(stops)
    starts = max(0, min(wanted - new, wanted + max_surge - total))
    detail = (
        f"{new} of {wanted} replica{'' if wanted == 1 else 's'} run the new spec "
        f"({current_ready} Ready), {len(outdated)} the old one ({old_ready} Ready)"
    )
    return Step(stops=tuple(stops), starts=starts, detail=detail)
