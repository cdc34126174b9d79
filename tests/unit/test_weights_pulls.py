"""The control plane's weights pulls: which nodes, what each node's state reads as, prefetch."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from test_placement import busy_and_empty, make_model, make_node

from llmgw.control.agentsvc.errors import CommandFailed
from llmgw.control.catalog.model import CatalogModel
from llmgw.control.inventory.model import HeldWeights, Node, WeightsDownload
from llmgw.control.reconciler import Fleet
from llmgw.control.reconciler.pulls import PullRefused, WeightsPuller

COMMIT = "c" * 40
HELD = HeldWeights("org/llama", COMMIT, 15_200_000_000, None)


def pinned(**changes: Any) -> CatalogModel:
    return dataclasses.replace(
        make_model(), weights="org/llama@main", weights_commit=COMMIT, **changes
    )


class Fakes:
    """A catalog, an inventory and a dispatcher that records each PullWeights."""

    def __init__(self, models: list[CatalogModel], nodes: list[Node]) -> None:
        self.models_ = models
        self.nodes_ = {n.id: n for n in nodes}
        self.sent: list[tuple[str, str, str]] = []
        self.refuse: dict[str, str] = {}
        self.now = 100.0

    def models(self) -> list[CatalogModel]:
        return self.models_

    def get(self, name: str) -> CatalogModel | None:
        return next((m for m in self.models_ if m.name == name), None)

    def nodes(self) -> list[Node]:
        return list(self.nodes_.values())

    async def pull_weights(self, node_id: str, repo: str, revision: str) -> None:
        if node_id in self.refuse:
            raise CommandFailed(self.refuse[node_id], node_id=node_id, error=self.refuse[node_id])
        self.sent.append((node_id, repo, revision))

    def beat(self, node_id: str, **changes: Any) -> None:
        """A heartbeat from the node, after everything so far."""
        self.now += 1
        self.nodes_[node_id] = dataclasses.replace(
            self.nodes_[node_id], last_heartbeat=self.now, **changes
        )

    def puller(self) -> WeightsPuller:
        return WeightsPuller(
            catalog=self, inventory=self, dispatcher=self, clock=lambda: self.now, retry_after=30
        )


def test_candidates_put_the_holders_first_then_the_policys_order() -> None:
    model = pinned()
    nodes = [*busy_and_empty(), dataclasses.replace(make_node("node-c"), weights=(HELD,))]
    assert Fleet(nodes, policy="pack").candidates(model) == ["node-c", "node-a", "node-b"]
    assert Fleet(nodes, policy="spread").candidates(model) == ["node-c", "node-b", "node-a"]
    draining = [dataclasses.replace(nodes[0], draining=True), *nodes[1:]]
    assert Fleet(draining).candidates(model) == ["node-c", "node-b"]


async def test_a_pull_reads_each_nodes_state_from_its_reports() -> None:
    fakes = Fakes([pinned()], [make_node("node-a"), make_node("node-b")])
    puller = fakes.puller()
    view = await puller.pull("llama", count=2)
    assert sorted(fakes.sent) == [("node-a", "org/llama", COMMIT), ("node-b", "org/llama", COMMIT)]
    pull = view["pull"]
    assert isinstance(pull, dict) and pull["state"] == "pulling"
    assert {r["state"] for r in pull["nodes"]} == {"waiting"}
    fakes.beat("node-a", downloads=(WeightsDownload("org/llama", COMMIT, 500, 1000, 100.0),))
    fakes.beat("node-b", downloads=(WeightsDownload("org/llama", COMMIT, 0, 0, 0, "no"),))
    rows = {r["node"]: r for r in puller.view("llama")["pull"]["nodes"]}  # type: ignore[index]
    assert rows["node-a"]["message"] == "downloading org/llama@ccccccc 50% of 1.0 kB, 5 s left"
    assert (rows["node-b"]["state"], rows["node-b"]["message"]) == ("failed", "no")
    assert puller.view("llama")["pull"]["state"] == "failed"  # type: ignore[index]
    fakes.beat("node-a", downloads=(), weights=(HELD,))
    fakes.beat("node-b", downloads=(), weights=(HELD,))
    assert puller.view("llama")["pull"]["state"] == "done"  # type: ignore[index]
    # Removed after the pull: gone, not waiting for ever.
    fakes.beat("node-b", weights=())
    rows = {r["node"]: r for r in puller.view("llama")["pull"]["nodes"]}  # type: ignore[index]
    assert rows["node-b"]["state"] == "gone"


async def test_an_earlier_failure_is_not_read_as_the_new_pulls() -> None:
    failed = WeightsDownload("org/llama", COMMIT, 0, 0, 0, "the hub refused it")
    node = dataclasses.replace(make_node("node-a"), downloads=(failed,), last_heartbeat=100.0)
    fakes = Fakes([pinned()], [node])
    fakes.now = 200.0
    puller = fakes.puller()
    view = await puller.pull("llama", nodes=["node-a"])
    assert view["pull"]["nodes"][0]["state"] == "waiting"  # type: ignore[index]


async def test_pulls_that_cannot_be_made_are_refused_saying_why() -> None:
    local = dataclasses.replace(make_model("local"), weights="/srv/local")
    fakes = Fakes([pinned(), local], [make_node("node-a")])
    fakes.refuse["node-a"] = "node 'node-a' refused: no weights directory"
    puller = fakes.puller()
    cases = [
        ({"name": "nope"}, 404, "model_not_found"),
        ({"name": "local"}, 409, "nothing_to_pull"),
        ({"name": "llama", "count": 2}, 409, "not_enough_nodes"),
        ({"name": "llama", "nodes": ["node-z"]}, 404, "node_not_found"),
    ]
    for kwargs, status, code in cases:
        with pytest.raises(PullRefused) as refused:
            await puller.pull(**kwargs)
        assert (refused.value.status, refused.value.code) == (status, code), refused.value
    standby = WeightsPuller(
        catalog=fakes, inventory=fakes, dispatcher=fakes, clock=lambda: 0.0,
        leading=lambda: False, leader=lambda: "ctl-1:42",
    )  # fmt: skip
    with pytest.raises(PullRefused) as refused:
        await standby.pull("llama")
    assert refused.value.code == "not_leader" and "the leader, ctl-1:42," in refused.value.message
    view = await puller.pull("llama")
    [row] = view["pull"]["nodes"]  # type: ignore[index]
    assert (row["state"], row["message"]) == (
        "failed",
        "node 'node-a' refused: no weights directory",
    )


async def test_prefetch_pulls_onto_n_nodes_and_again_where_the_weights_went() -> None:
    nodes = [make_node("node-a"), make_node("node-b"), make_node("node-c")]
    fakes = Fakes([pinned(prefetch=2)], nodes)
    puller = fakes.puller()
    await puller.prefetch_pass()
    assert [s[0] for s in fakes.sent] == ["node-a", "node-b"]
    await puller.prefetch_pass()  # still downloading: not asked again, nor a third node
    assert len(fakes.sent) == 2
    fakes.beat("node-a", weights=(HELD,))
    fakes.beat("node-b", weights=(HELD,))
    kept = puller.view("llama")["prefetched"]
    assert kept == {
        "wanted": 2,
        "weights": "org/llama@ccccccc",
        "held_on": ["node-a", "node-b"],
        "pulling": [],
    }
    # node-b's copy is evicted: pulled again, onto another node first.
    fakes.beat("node-b", weights=())
    await puller.prefetch_pass()
    assert [s[0] for s in fakes.sent[2:]] == ["node-c"]
    # node-c fails, and node-b lost its copy just now: both rest, nothing is asked.
    fakes.beat("node-c", downloads=(WeightsDownload("org/llama", COMMIT, 0, 0, 0, "full"),))
    await puller.prefetch_pass()
    assert len(fakes.sent) == 3
    # Past the retry wait, placement's first choice is asked again.
    fakes.now += 31
    await puller.prefetch_pass()
    assert [s[0] for s in fakes.sent[3:]] == ["node-b"]
