"""Weights pulled ahead of demand: `llmgw models pull` and the catalog's `prefetch: N`.

A real `llmgw server`, real agents and `llmgw sim` engines, and the hub stand-in
(see `hub_fleet`): a pull downloads onto the nodes placement would pick without
starting an engine, shows its progress and ends when every node holds the
snapshot, or fails naming the node and the hub's reason; `prefetch` keeps the
weights on N nodes and pulls them again when they are removed.
"""

from __future__ import annotations

import html
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from clitools import cli
from hub_fleet import RATE, SEED, config, models_show, node_view, shards, start_agent, tiny_repo
from hub_standin import HubStandin
from procs import Proc, Server, free_port, llmgw, wait_for


class Fleet:
    """A server and its agents for one test, all stopped after it."""

    def __init__(
        self, tmp: Path, hub: HubStandin, text: str, nodes: tuple[str, ...], extra: tuple[str, ...]
    ) -> None:
        (tmp / "llmgw.yaml").write_text(text)
        agent_port = free_port()
        self.server = Server(
            "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp / "llmgw.yaml"),
            data_dir=tmp / "data",
        )  # fmt: skip
        self.agents: list[Proc] = []
        for node in nodes:
            self.agents.append(start_agent(agent_port, tmp, hub, node, *extra))
        self.nodes = nodes

    def joined(self) -> None:
        for node in self.nodes:
            wait_for(lambda n=node: node_view(self.server, n).get("connected"), f"{node} joined")

    def holders(self, sha: str) -> list[str]:
        nodes = httpx.get(self.server.admin + "/admin/api/nodes", timeout=10).json()["nodes"]
        return sorted(
            n["id"]
            for n in nodes
            if any((w["repo"], w["revision"]) == ("org/tiny", sha) for w in n.get("weights") or [])
        )

    def pull(self, *args: str, model: str = "tiny") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            llmgw("models", "pull", model, "--admin", self.server.admin, "--poll-interval",
                  "0.2", *args),
            capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip

    def stop(self) -> None:
        for agent in self.agents:
            agent.stop()
        self.server.proc.stop()

    def dump(self) -> None:
        print(self.server.proc.output())
        for agent in self.agents:
            print(agent.output())


@pytest.fixture
def fleet_factory(tmp_path: Path, hub: HubStandin) -> Iterator[Any]:
    made: list[Fleet] = []

    def make(
        text: str, nodes: tuple[str, ...] = ("node-a", "node-b"), extra: tuple[str, ...] = ()
    ) -> Fleet:
        fleet = Fleet(tmp_path, hub, text, nodes, extra)
        made.append(fleet)
        fleet.joined()
        return fleet

    try:
        yield make
    finally:
        for fleet in made:
            fleet.stop()
            fleet.dump()  # shown by pytest only when the test failed


def test_a_pull_to_one_of_two_nodes_downloads_there_and_the_model_is_placed_there(
    hub: HubStandin, fleet_factory: Any
) -> None:
    repo = hub.add(tiny_repo())
    sha = repo.refs["main"]
    hub.bytes_per_second = RATE
    fleet = fleet_factory(config(f"org/tiny@{sha}", min_replicas=0))
    # node-b, which placement would not pick by id: the pull puts the weights there.
    done = fleet.pull("--node", "node-b")
    assert done.returncode == 0, done.stderr
    steps = [
        line
        for line in done.stderr.splitlines()
        if f"node-b: downloading org/tiny@{sha[:7]} " in line and "% of 30.0 MB" in line
    ]
    assert steps, done.stderr
    assert f"org/tiny@{sha[:7]} is on node-b after" in done.stdout, done.stdout
    assert fleet.holders(sha) == ["node-b"]
    assert not shards(fleet.server), "a pull starts no engine"
    shown = models_show(fleet.server)
    assert f"pull:        org/tiny@{sha[:7]} done" in shown, shown
    assert "  node-b: done: holds " in shown, shown
    page = html.unescape(httpx.get(fleet.server.admin + "/admin/models/tiny", timeout=10).text)
    assert f'<dd id="pull">org/tiny@{sha[:7]} <span class="badge done">done</span>' in page
    assert "node-b: done: holds " in page
    # Locality: the model's replica goes where the weights are, with no download.
    answer = httpx.post(
        fleet.server.url + "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    [shard] = shards(fleet.server)
    assert node_view(fleet.server, "node-b")["shards"][0]["id"] == shard["id"]
    assert len(hub.file_gets("model.safetensors")) == 1
    # Pulling again where the weights are is done at once, with no download either.
    again = fleet.pull("--node", "node-b", "--json")
    assert again.returncode == 0, again.stderr
    view = json.loads(again.stdout)
    assert view["pull"]["state"] == "done", view
    assert len(hub.file_gets("model.safetensors")) == 1


def test_a_pull_onto_two_nodes_ends_when_both_hold_the_weights(
    hub: HubStandin, fleet_factory: Any
) -> None:
    repo = hub.add(tiny_repo())
    sha = repo.refs["main"]
    hub.bytes_per_second = RATE
    fleet = fleet_factory(config(f"org/tiny@{sha}", min_replicas=0))
    # On a terminal: a progress bar per node, redrawn in place.
    command = " ".join(
        llmgw("models", "pull", "tiny", "--nodes", "2", "--admin", fleet.server.admin,
              "--poll-interval", "0.2")
    )  # fmt: skip
    on_tty = subprocess.run(
        ["script", "-qec", command, "/dev/null"],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert on_tty.returncode == 0, on_tty.stdout
    assert "\x1b[2F" in on_tty.stdout, on_tty.stdout  # two bars, redrawn
    for node in ("node-a", "node-b"):
        assert f"{node:<12} [{'#' * 24}] holds org/tiny@{sha[:7]}" in on_tty.stdout, on_tty.stdout
    assert f"org/tiny@{sha[:7]} is on node-a, node-b after" in on_tty.stdout
    assert fleet.holders(sha) == ["node-a", "node-b"]
    assert len(hub.file_gets("model.safetensors")) == 2
    # Again with --json: done at once, nothing fetched again.
    done = fleet.pull("--nodes", "2", "--json")
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    assert view["pull"]["state"] == "done", view
    assert sorted(r["node"] for r in view["pull"]["nodes"]) == ["node-a", "node-b"]
    assert len(hub.file_gets("model.safetensors")) == 2
    # More nodes than could run the model: refused, saying how many could.
    refused = fleet.pull("--nodes", "3")
    assert refused.returncode == 2, refused.stderr
    assert "onto 3 node(s): only 2 could run it (node-a, node-b)" in refused.stderr
    # The admin API: a bad body is a 400 naming what to send; --no-wait answers at once.
    bad = httpx.post(
        fleet.server.admin + "/admin/api/models/tiny/pull", json={"nodes": 0}, timeout=10
    )
    assert bad.status_code == 400, bad.text
    assert "nodes must be a whole number of at least 1" in bad.json()["error"]["message"]
    unknown = httpx.post(
        fleet.server.admin + "/admin/api/models/tiny/pull", json={"node": ["node-z"]}, timeout=10
    )
    assert unknown.status_code == 404, unknown.text
    assert unknown.json()["error"]["param"] == "node"
    quick = fleet.pull("--node", "node-a", "--no-wait")
    assert quick.returncode == 0, quick.stderr
    assert f"pulling org/tiny@{sha[:7]} onto node-a" in quick.stdout


def test_a_pull_of_a_bad_repo_fails_naming_the_node_and_the_hubs_reason(
    hub: HubStandin, fleet_factory: Any
) -> None:
    repo = hub.add(tiny_repo())
    fleet = fleet_factory(config(f"org/missing@{repo.refs['main']}", min_replicas=0), ("node-a",))
    failed = fleet.pull()
    assert failed.returncode == 1, failed.stderr
    assert "error: node node-a: the hub refused org/missing@" in failed.stderr, failed.stderr
    assert "Repository not found" in failed.stderr, failed.stderr
    shown = models_show(fleet.server)
    assert "pull:        org/missing@" in shown and " failed" in shown, shown
    assert "node-a: failed: the hub refused org/missing@" in shown, shown
    # The node says so too, until a pull of that snapshot replaces it.
    pulls = node_view(fleet.server)["pulls"]
    assert [p["repo"] for p in pulls] == ["org/missing"], pulls
    assert "Repository not found" in pulls[0]["error"], pulls
    node = cli("nodes", "show", "node-a", "--admin", fleet.server.admin)
    assert "weights being pulled ahead of demand:" in node.stdout, node.stdout
    assert f"  org/missing@{repo.refs['main'][:7]}: failed: the hub refused" in node.stdout
    # Local weights: nothing to pull, and the API says so.
    local = httpx.post(
        fleet.server.admin + "/admin/api/models",
        json={"name": "local", "weights": "/srv/m", "profiles": [{"name": "p", "engine": "sim"}]},
        timeout=10,
    )
    assert local.status_code == 201, local.text
    refused = httpx.post(fleet.server.admin + "/admin/api/models/local/pull", json={}, timeout=10)
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "nothing_to_pull"


def test_prefetch_keeps_the_weights_on_n_nodes_and_pulls_them_again_when_removed(
    hub: HubStandin, fleet_factory: Any
) -> None:
    repo = hub.add(tiny_repo())
    sha = repo.refs["main"]
    text = config(f"org/tiny@{sha}", min_replicas=0).replace(
        "    keep_alive: -1\n", "    keep_alive: -1\n    prefetch: 1\n"
    )
    fleet = fleet_factory(text)
    [holder] = wait_for(lambda: fleet.holders(sha), "the weights prefetched onto one node")
    assert not shards(fleet.server), "prefetch starts no engine"
    shown = models_show(fleet.server)
    assert f"prefetch:    org/tiny@{sha[:7]} on 1 of 1 nodes ({holder})" in shown, shown
    page = html.unescape(httpx.get(fleet.server.admin + "/admin/models/tiny", timeout=10).text)
    assert f'<dd id="prefetch">org/tiny@{sha[:7]} on 1 of 1 nodes ({holder})' in page
    assert fleet.holders(sha) == [holder]  # one node, as asked: not every node
    assert len(hub.file_gets("model.safetensors")) == 1
    removed = cli("nodes", "remove-weights", holder, "hub/models--org--tiny", "--admin",
                  fleet.server.admin)  # fmt: skip
    assert removed.returncode == 0, removed.stderr
    wait_for(lambda: len(hub.file_gets("model.safetensors")) == 2, "the weights pulled again")
    # Onto the other node first (the node that lost them rests a while).
    [other] = {"node-a", "node-b"} - {holder}
    wait_for(lambda: fleet.holders(sha) == [other], f"the weights on {other}")


def test_a_pull_over_the_weights_limit_evicts_another_unused_snapshot_never_itself(
    hub: HubStandin, fleet_factory: Any
) -> None:
    first = hub.add(tiny_repo("org/first"))
    second = hub.add(tiny_repo("org/second"))
    text = "control: {heartbeat_interval: 0.3, reconcile_interval: 0.3}\nmodels:\n" + "".join(
        f"  - name: {name}\n    weights: org/{name}@{repo.refs['main']}\n"
        "    profiles: [{name: sim, engine: sim}]\n"
        for name, repo in (("first", first), ("second", second))
    )
    # Room for one 30 MB snapshot, not two.
    fleet = fleet_factory(text, ("node-a",), ("--weights-max-use", "45MB"))

    def held() -> list[str]:
        return [w["repo"] for w in node_view(fleet.server).get("weights") or []]

    done = fleet.pull(model="first")
    assert done.returncode == 0, done.stderr
    assert held() == ["org/first"]
    done = fleet.pull(model="second")
    assert done.returncode == 0, done.stderr
    wait_for(lambda: held() == ["org/second"], "org/first evicted for org/second")
    assert "removed org/first@" in fleet.agents[0].output()


def test_prefetch_is_validated_in_the_config_file_the_api_and_the_cli(
    tmp_path: Path, hub: HubStandin
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "models:\n  - name: m\n    weights: /srv/m\n    prefetch: 2\n"
        "    profiles: [{name: p, engine: sim}]\n"
    )
    result = subprocess.run(
        llmgw("server", "--config", str(bad), "--data-dir", str(tmp_path / "bad")),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert str(bad) in result.stderr and "prefetch" in result.stderr, result.stderr
    assert "needs hub weights" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    repo = hub.add(tiny_repo())
    sha = repo.refs["main"]
    (tmp_path / "llmgw.yaml").write_text(SEED)
    server = Server("--config", str(tmp_path / "llmgw.yaml"), data_dir=tmp_path / "data")
    try:
        body = {"name": "m", "weights": f"org/tiny@{sha}", "prefetch": -1,
                "profiles": [{"name": "p", "engine": "sim"}]}  # fmt: skip
        refused = httpx.post(server.admin + "/admin/api/models", json=body, timeout=30)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == "prefetch", refused.text
        added = cli(
            "models", "add", "--name", "m", "--weights", f"org/tiny@{sha}", "--engine", "sim",
            "--prefetch", "2", "--admin", server.admin,
        )  # fmt: skip
        assert added.returncode == 0, added.stderr
        shown = models_show(server, "m")
        assert f"prefetch:    org/tiny@{sha[:7]} on 0 of 2 nodes" in shown, shown
    except BaseException:
        print(server.proc.output())
        raise
    finally:
        server.proc.stop()
