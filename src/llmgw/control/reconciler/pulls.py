"""Hub weights pulled onto nodes ahead of demand: `llmgw models pull` and `prefetch: N`.

`WeightsPuller.pull(name, count=, nodes=)` picks the nodes (given by id, or the
first `count` that placement would pick for a replica: nodes holding the
weights first, then by fit) and sends each a PullWeights; an agent answers once
the download is under way and reports its progress, then its failure, in its
heartbeats, and the snapshot among its held weights once complete. `view(name)`
reads the pull's state per node from that inventory: `done` (the node holds the
snapshot), `downloading` (with progress), `failed` (the agent's refusal or the
hub's reason) or `waiting` (asked, not reported yet).

`run()` keeps a model's weights on `prefetch` nodes: every interval it counts
the connected nodes holding the snapshot and those still pulling it, and pulls
onto the next candidates when fewer; weights removed from a node (by an
operator, or evicted by the agent's `--weights-max-use`) are pulled again,
onto another node that could run the model, or onto the same one after
`retry_after` seconds. A node whose pull failed is not asked again for
`retry_after` seconds either. Only the leader runs it.

Not guaranteed: that the agents keep prefetched weights (an agent over its
weights limit evicts the least recently used snapshot no engine runs on, which
may be a prefetched one; it is pulled back, elsewhere first; two prefetched
models that do not fit one node's limit together are pulled there in turn, at
most once per `retry_after`);
that a pull survives a leader change (the downloads go on on the nodes, and the
new leader's prefetch pass counts them, but `models show` forgets an
operator's pull); multi-node profiles (pulls are for single-node profiles).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from llmgw.config.hub import HubRef, hub_ref
from llmgw.control.agentsvc.errors import AgentServiceError
from llmgw.control.catalog.model import CatalogModel
from llmgw.control.inventory.model import Node, WeightsDownload
from llmgw.control.reconciler.disk import decimal_size
from llmgw.control.reconciler.placement import Fleet
from llmgw.control.reconciler.types import PlacementPolicy

log = logging.getLogger("llmgw.control.pulls")

NodePullState = Literal["waiting", "downloading", "done", "failed", "gone"]


class PullRefused(Exception):
    """A pull that cannot be made; `status`, `code` and `param` are for the error body."""

    def __init__(self, message: str, *, status: int, code: str, param: str | None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.param = param


class PullDispatcher(Protocol):
    async def pull_weights(self, node_id: str, repo: str, revision: str) -> None:
        """Tell the node to download the snapshot; returns once it is under way."""
        ...


class PullCatalog(Protocol):
    def models(self) -> list[CatalogModel]: ...

    def get(self, name: str) -> CatalogModel | None: ...


class PullInventory(Protocol):
    def nodes(self) -> list[Node]: ...


@dataclass
class _Asked:
    """One node asked to pull: when (the inventory's clock) and, if it refused, why."""

    at: float
    refused: str | None = None
    answered: float | None = None  # when the node said the download is under way
    gone_at: float | None = None  # when prefetch first saw the pulled weights gone


@dataclass
class _Pull:
    ref: HubRef
    nodes: dict[str, _Asked] = field(default_factory=dict)


class WeightsPuller:
    """Pulls of hub snapshots onto nodes: an operator's (`pull`) and `prefetch`'s (`run`)."""

    def __init__(
        self,
        *,
        catalog: PullCatalog,
        inventory: PullInventory,
        dispatcher: PullDispatcher,
        clock: Callable[[], float],
        policy: PlacementPolicy = "pack",
        mgmt_interface: str = "",
        interval: float = 2.0,
        retry_after: float = 30.0,
        leading: Callable[[], bool] = lambda: True,
        leader: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._catalog = catalog
        self._inventory = inventory
        self._dispatcher = dispatcher
        self._clock = clock
        self._policy: PlacementPolicy = policy
        self._mgmt = mgmt_interface
        self._interval = interval
        self._retry_after = retry_after
        self._leading = leading
        self._leader = leader
        self._pulls: dict[str, _Pull] = {}  # an operator's last pull, per model
        self._prefetch: dict[str, _Pull] = {}  # what prefetch asked for, per model

    async def pull(
        self, name: str, *, count: int | None = None, nodes: Sequence[str] = ()
    ) -> dict[str, object]:
        """Pull `name`'s weights onto `nodes`, or onto the `count` (default 1) nodes
        placement would pick; the pull's view once every node answered."""
        if not self._leading():
            leader = self._leader()
            where = f"the leader, {leader}," if leader else "the leader (none is known right now)"
            raise PullRefused(
                f"this server is a standby; only {where} talks to agents: run the pull "
                "against the leader's admin listener",
                status=409,
                code="not_leader",
                param=None,
            )
        model, ref = self._model(name)
        fleet_nodes = {n.id: n for n in self._inventory.nodes()}
        if nodes:
            chosen = list(dict.fromkeys(nodes))
            for node_id in chosen:
                node = fleet_nodes.get(node_id)
                if node is None:
                    raise PullRefused(
                        f"node {node_id!r} is not in the fleet; `llmgw nodes list` shows the nodes",
                        status=404,
                        code="node_not_found",
                        param="node",
                    )
                if not node.connected:
                    raise PullRefused(
                        f"node {node_id!r} is not connected (its agent is down or "
                        "reconnecting); pull onto a connected node, or wait for it",
                        status=409,
                        code="node_not_connected",
                        param="node",
                    )
        else:
            wanted = 1 if count is None else count
            if wanted < 1:
                raise PullRefused(
                    f"nodes must be at least 1, got {wanted}",
                    status=400,
                    code="invalid_parameter",
                    param="nodes",
                )
            fit = self._candidates(model)
            if len(fit) < wanted:
                raise PullRefused(
                    f"cannot pull {ref.short()} for model {model.name!r} onto {wanted} "
                    f"node(s): only {len(fit)} could run it"
                    + (f" ({', '.join(fit)})" if fit else "")
                    + "; `llmgw models explain` says why the others cannot",
                    status=409,
                    code="not_enough_nodes",
                    param="nodes",
                )
            chosen = fit[:wanted]
        pull = _Pull(ref=ref)
        self._pulls[model.name] = pull
        await self._ask(pull, chosen, fleet_nodes)
        return self.view(model.name)

    def _model(self, name: str) -> tuple[CatalogModel, HubRef]:
        model = self._catalog.get(name)
        if model is None:
            raise PullRefused(
                f"model {name!r} is not in the catalog; `llmgw models list` shows the models",
                status=404,
                code="model_not_found",
                param="name",
            )
        ref = hub_ref(model.launch_weights)
        if ref is None or not ref.pinned:
            raise PullRefused(
                f"model {model.name!r} has weights {model.weights!r}, not a hub snapshot "
                "pinned to a commit: there is nothing to pull (its engine reads them as given)",
                status=409,
                code="nothing_to_pull",
                param="name",
            )
        return model, ref

    def _candidates(self, model: CatalogModel) -> list[str]:
        fleet = Fleet(
            [n for n in self._inventory.nodes() if n.connected],
            policy=self._policy,
            mgmt_interface=self._mgmt,
        )
        return fleet.candidates(model)

    async def _ask(self, pull: _Pull, node_ids: Sequence[str], nodes: dict[str, Node]) -> None:
        """Send PullWeights to each node at once, noting each refusal."""
        held = {n for n in node_ids if n in nodes and _holds(nodes[n], pull.ref)}

        async def ask(node_id: str) -> None:
            asked = pull.nodes[node_id] = _Asked(at=self._clock())
            if node_id in held:
                return
            try:
                await self._dispatcher.pull_weights(node_id, pull.ref.repo, pull.ref.revision)
                asked.answered = self._clock()
            except AgentServiceError as exc:
                asked.refused = str(exc)
                log.warning("pulling %s onto %s failed: %s", pull.ref.short(), node_id, exc)

        await asyncio.gather(*(ask(n) for n in node_ids))

    def view(self, name: str) -> dict[str, object]:
        """Where an operator's pull of `name` stands, and where `prefetch` keeps it."""
        model = self._catalog.get(name)
        nodes = {n.id: n for n in self._inventory.nodes()}
        pull = self._pulls.get(name)
        out: dict[str, object] = {"pull": None, "prefetched": None}
        if pull is not None:
            rows = [self._node_row(pull, node_id, nodes.get(node_id)) for node_id in pull.nodes]
            states = {r["state"] for r in rows}
            state = (
                "failed"
                if "failed" in states
                else "done"
                if states == {"done"}
                else "gone"
                if states <= {"done", "gone"}
                else "pulling"
            )
            out["pull"] = {"weights": pull.ref.short(), "state": state, "nodes": rows}
        if model is not None and model.prefetch > 0:
            ref = hub_ref(model.launch_weights)
            if ref is not None and ref.pinned:
                holding = sorted(n.id for n in nodes.values() if _holds(n, ref))
                asked = self._prefetch.get(name)
                pulling = (
                    [
                        self._node_row(asked, node_id, nodes.get(node_id))
                        for node_id in asked.nodes
                        if node_id not in holding
                    ]
                    if asked is not None and asked.ref == ref
                    else []
                )
                pulling = [r for r in pulling if r["state"] != "gone"]
                out["prefetched"] = {
                    "wanted": model.prefetch,
                    "weights": ref.short(),
                    "held_on": holding,
                    "pulling": pulling,
                }
        return out

    def _node_row(self, pull: _Pull, node_id: str, node: Node | None) -> dict[str, object]:
        asked = pull.nodes[node_id]
        state, message, done, total = self._node_state(pull.ref, asked, node)
        return {"node": node_id, "state": state, "message": message, "done": done, "total": total}

    def _node_state(
        self, ref: HubRef, asked: _Asked, node: Node | None
    ) -> tuple[NodePullState, str, int, int]:
        if asked.refused is not None:
            return "failed", asked.refused, 0, 0
        if node is None:
            return "failed", "the node left the fleet", 0, 0
        for held in node.weights:
            if (held.repo, held.revision) == (ref.repo, ref.revision):
                size = held.bytes
                return "done", f"holds {ref.short()} ({decimal_size(size)})", size, size
        # Reports older than the ask may carry an earlier pull's failure.
        fresh = node.last_heartbeat > asked.at
        download = _download(node, ref)
        if download is not None and fresh and download.error:
            return "failed", download.error, download.done, download.total
        if download is not None and not download.error:
            return "downloading", _describe(ref, download), download.done, download.total
        if not node.connected:
            return "waiting", "the node is not connected; its agent goes on when it is back", 0, 0
        # The agent reports a pull from its answer on until the snapshot is held: a
        # later report with neither means the weights went away (removed, evicted).
        if asked.answered is not None and node.last_heartbeat > asked.answered:
            return "gone", f"{ref.short()} is no longer on the node (removed or evicted)", 0, 0
        return "waiting", f"asked to pull {ref.short()}", 0, 0

    async def run(self) -> None:
        """Keep every model's weights on its `prefetch` nodes, forever (leader only)."""
        while True:
            await self.prefetch_pass()
            await asyncio.sleep(self._interval)

    async def prefetch_pass(self) -> None:
        """One pass: pull each `prefetch` model's weights where fewer nodes keep them."""
        nodes = {n.id: n for n in self._inventory.nodes()}
        now = self._clock()
        for model in self._catalog.models():
            ref = hub_ref(model.launch_weights)
            if model.prefetch <= 0 or ref is None or not ref.pinned:
                self._prefetch.pop(model.name, None)
                continue
            pull = self._prefetch.get(model.name)
            if pull is None or pull.ref != ref:
                pull = self._prefetch[model.name] = _Pull(ref=ref)
            keeping: set[str] = set()
            resting: set[str] = set()
            for node in nodes.values():
                if not node.connected:
                    continue
                if _holds(node, ref):
                    keeping.add(node.id)
                    continue
                asked = pull.nodes.get(node.id)
                if asked is None:
                    continue
                state = self._node_state(ref, asked, node)[0]
                if state == "gone" and asked.gone_at is None:
                    asked.gone_at = now
                if state == "failed" and now - asked.at < self._retry_after:
                    resting.add(node.id)
                elif state == "gone" and now - (asked.gone_at or now) < self._retry_after:
                    # Evicted (or removed) there: another node first, so that two
                    # prefetched models on a full disk do not evict each other in turn.
                    resting.add(node.id)
                elif state in ("waiting", "downloading"):
                    keeping.add(node.id)
            missing = model.prefetch - len(keeping)
            if missing <= 0:
                continue
            fit = [n for n in self._candidates(model) if n not in keeping | resting]
            chosen = fit[:missing]
            if chosen:
                log.info(
                    "prefetch of model %s: pulling %s onto %s (%d of %d nodes keep it)",
                    model.name,
                    ref.short(),
                    ", ".join(chosen),
                    len(keeping),
                    model.prefetch,
                )
                await self._ask(pull, chosen, nodes)


def _holds(node: Node, ref: HubRef) -> bool:
    return any((w.repo, w.revision) == (ref.repo, ref.revision) for w in node.weights)


def _download(node: Node, ref: HubRef) -> WeightsDownload | None:
    for download in node.downloads:
        if (download.repo, download.revision) == (ref.repo, ref.revision):
            return download
    return None


def _describe(ref: HubRef, download: WeightsDownload) -> str:
    """`downloading org/name@abc1234 41% of 15.2 GB, 2 min left`, as the agent's own."""
    if download.total <= 0:
        return f"downloading {ref.short()} (listing its files)"
    percent = min(100, int(100 * download.done / download.total))
    text = f"downloading {ref.short()} {percent}% of {decimal_size(download.total)}"
    if download.rate > 0 and download.done < download.total:
        seconds = (download.total - download.done) / download.rate
        left = f"{max(1, round(seconds))} s" if seconds < 90 else f"{math.ceil(seconds / 60)} min"
        text += f", {left} left"
    return text
