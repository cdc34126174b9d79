"""The controller's state as JSON-able dicts, for the admin API and `llmgw models`.

`ModelControlService` implements the admin API's `ModelControl` protocol on top
of a `Controller`. Times are seconds (floats, rounded) or ISO 8601 UTC strings.
Not guaranteed: a stable shape beyond the fields documented in the admin API.
"""

from __future__ import annotations

from typing import Protocol

from llmgw.control.catalog.model import CatalogModel
from llmgw.control.inventory.model import Node, Shard, ShardSpec
from llmgw.control.reachability import Reach
from llmgw.control.reconciler.autoscale import signals_view
from llmgw.control.reconciler.controller import Controller
from llmgw.control.reconciler.errors import ActivationRefused, NotInCatalog
from llmgw.control.reconciler.state import Event, Failure, ModelState, routable
from llmgw.control.reconciler.types import Explanation


def failure_view(failure: Failure) -> dict[str, object]:
    return {
        "node": failure.node_id,
        "replica": failure.shard_id,
        "message": failure.message,
        "exit_code": failure.exit_code,
        "output_tail": list(failure.output_tail),
        "at": failure.at.isoformat(),
        "summary": failure.describe(),
    }


def explanation_view(explanation: Explanation) -> dict[str, object]:
    placement = explanation.placement
    return {
        "model": explanation.model,
        "placeable": placement is not None,
        "placement": None
        if placement is None
        else {
            "node": placement.node_id,
            "profile": placement.profile.name,
            "gpus": list(placement.gpu_indices),
            "port": placement.port,
            # A multi-node replica: every shard by rank, rank 0 first (it serves).
            "shards": [
                {"node": r.node_id, "rank": rank, "gpus": list(r.gpu_indices), "port": r.port}
                for rank, r in enumerate(placement.ranks)
            ],
            "fabric": placement.fabric or None,
            "rendezvous_port": placement.master_port or None,
        },
        "profiles": [
            {
                "profile": verdict.profile,
                "fits": list(verdict.fits),
                "groups": list(verdict.groups),
                "weights": list(verdict.weights),
                "rejected": [{"node": r.node_id, "reason": r.reason} for r in verdict.rejections],
            }
            for verdict in explanation.verdicts
        ],
        "summary": explanation.summary(),
    }


class Reachability(Protocol):
    """What this server found when it dialled replicas (`ReachabilityGate`)."""

    def reach(self, replica_id: str) -> Reach | None: ...

    def reaches(self, name: str) -> list[Reach]: ...


def state_view(state: ModelState, reach: Reachability | None = None) -> dict[str, object]:
    """`reach`: how this server last found each Ready replica's endpoint, shown per
    replica and, as `reachability`, for every one this server was given (a standby
    routes to replicas its own inventory does not list)."""
    rows: list[tuple[ShardSpec | None, dict[str, object]]] = [
        (
            shard.spec,
            {
                "id": shard.id,
                "node": node.id,
                "node_state": node.state,
                "state": _replica_state(node, shard, state.stopping),
                "engine": shard.engine,
                "engine_args": list(shard.spec.engine_args) if shard.spec is not None else [],
                # "old": it runs a spec the catalog replaced (a rollout replaces it).
                "spec": "old" if shard.id in state.outdated else "current",
                # A model with a canary: the version it runs (None without one).
                "version": state.versions.get(shard.id),
                "endpoint_url": shard.endpoint_url or None,
                # The LoRA adapters its engine has loaded, as its agent reports them.
                "adapters": list(shard.adapters),
                "gpus": list(shard.gpu_indices),
                "message": shard.message,
                "since": shard.since.isoformat(),
                "output_tail": list(shard.output_tail) if shard.state == "failed" else [],
                "download": shard.download.view() if shard.download is not None else None,
                "reach": _reach_view(reach, shard.id),
            },
        )
        for node, shard in state.replicas
    ]
    rows += [
        (
            p.spec,
            {
                "id": p.spec.shard_id,
                "node": p.node_id,
                "node_state": None,
                "state": "placing",
                "engine": p.spec.engine,
                "engine_args": list(p.spec.engine_args),
                "spec": "current",
                "version": state.versions.get(p.spec.shard_id),
                "endpoint_url": None,
                "adapters": [],
                "gpus": list(p.spec.gpu_indices),
                "message": "start sent to the node",
                "since": None,
                "output_tail": [],
                "download": None,
                "reach": None,
            },
        )
        for p in state.pending
    ]
    return {
        "state": state.state,
        "desired_replicas": state.desired,
        # Replicas on a node in doubt are out of the routers: not counted as ready; a
        # multi-node replica counts once, by its rank 0 (the one that serves).
        "ready_replicas": sum(
            1
            for n, s in state.replicas
            if s.state == "ready" and routable(n) and (s.spec is None or s.spec.node_rank == 0)
        ),
        "replicas": _by_replica(rows),
        "in_flight": state.in_flight,
        "load": signals_view(state.model, state.load),
        "idle_seconds": None if state.idle_for is None else round(state.idle_for, 1),
        "last_wake": (
            None
            if state.last_wake is None
            else {"replica": state.last_wake[0], "seconds": round(state.last_wake[1], 3)}
        ),
        "activating": state.activating,
        "failures": state.failures,
        "retry_in_seconds": round(state.retry_in, 1),
        "last_failure": None if state.last_failure is None else failure_view(state.last_failure),
        "unplaceable": None if state.unplaced is None else state.unplaced.summary(),
        "rollout": None
        if state.rollout is None
        else {
            "state": state.rollout.state,
            "step": state.rollout.step,
            "reason": state.rollout.reason or None,
        },
        # Why the model's canary is stopped (a replica of it failed), or None.
        "canary_halt": state.canary_halt,
        "reachability": []
        if reach is None
        else [r.view() for r in reach.reaches(state.model.name)],
    }


def _by_replica(rows: list[tuple[ShardSpec | None, dict[str, object]]]) -> list[dict[str, object]]:
    """One row per replica, with its `shards` (node, rank, id, state, GPUs) by rank.

    A multi-node replica's row is its rank 0's; a rank whose rank 0 is not listed
    (stopped and forgotten) keeps a row of its own, so nothing running is hidden.
    """
    heads: dict[str, dict[str, object]] = {}
    out: list[dict[str, object]] = []
    followers: list[tuple[str, dict[str, object]]] = []
    for spec, row in rows:
        rank = spec.node_rank if spec is not None else 0
        shard = {
            "node": row["node"],
            "rank": rank,
            "id": row["id"],
            "state": row["state"],
            "gpus": row["gpus"],
        }
        replica = spec.replica if spec is not None else str(row["id"])
        if rank > 0:
            followers.append((replica, {**row, "shards": [shard]}))
            continue
        row["shards"] = [shard]
        heads[replica] = row
        out.append(row)
    for replica, row in followers:
        head = heads.get(replica)
        if head is None:
            out.append(row)
            continue
        listed = head["shards"]
        assert isinstance(listed, list)
        listed.extend(row["shards"])  # type: ignore[arg-type]
        listed.sort(key=lambda s: s["rank"])
    return out


def _reach_view(reach: Reachability | None, replica_id: str) -> dict[str, object] | None:
    found = None if reach is None else reach.reach(replica_id)
    return None if found is None else found.view()


def _replica_state(node: Node, shard: Shard, stopping: frozenset[str]) -> str:
    """The shard's state, except where what the node last said no longer holds:
    `lost`, or `in_doubt` (its node stopped answering: out of the routers, kept in
    case the node comes back). A node whose agent's stream merely closed keeps its
    replicas' states: they go on serving (see `state.routable`)."""
    if node.state == "lost" and shard.holds_gpus:
        return "lost"
    if shard.id in stopping:
        return "stopping"
    if shard.holds_gpus and not routable(node):
        return "in_doubt"
    return shard.state


def event_view(event: Event) -> dict[str, object]:
    return {
        "at": event.at.isoformat(),
        "kind": event.kind,
        "model": event.model,
        "node": event.node_id or None,
        "message": event.message,
    }


class ModelControlService:
    """The admin API's view of the controller (implements `ModelControl`)."""

    def __init__(self, *, controller: Controller, reach: Reachability | None = None) -> None:
        self._controller = controller
        self._reach = reach

    def status(self, name: str) -> dict[str, object]:
        state = self._controller.snapshot(name)
        if state is None:
            return {"state": "unknown"}
        return state_view(state, self._reach)

    def statuses(self) -> dict[str, dict[str, object]]:
        return {
            name: state_view(s, self._reach) for name, s in self._controller.snapshots().items()
        }

    def explain(self, name: str) -> dict[str, object]:
        state = self._controller.snapshot(name)
        if state is None:
            return {
                "model": name,
                "placeable": False,
                "summary": f"model '{name}' is not in the catalog",
            }
        view = explanation_view(self._controller.explanation(state.model))
        view["status"] = state_view(state)
        return view

    def dry_run(self, model: CatalogModel) -> dict[str, object]:
        return explanation_view(self._controller.explanation(model))

    async def activate(self, name: str) -> dict[str, object]:
        """Start a replica now and wait for it; the status, with the error when refused."""
        error: dict[str, object] | None = None
        try:
            self._controller.request_started(name)
            try:
                await self._controller.activate(name)
            finally:
                self._controller.request_finished(name)
        except NotInCatalog as exc:
            return {"state": "unknown", "error": {"message": exc.message, "code": exc.code}}
        except ActivationRefused as exc:
            error = {"message": exc.message, "code": exc.code, "retry_after": exc.retry_after}
        view = self.status(name)
        view["error"] = error
        return view

    def events(self) -> list[dict[str, object]]:
        return [event_view(e) for e in self._controller.events()]
