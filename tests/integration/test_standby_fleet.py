"""A standby's admin API and `llmgw nodes` show the fleet as the leader sees it.

Two real `llmgw server` processes on one PostgreSQL database (a fresh one per
test), real agents; the standby has no agent streams of its own.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
from procs import Proc, Server, free_port, free_port_block, llmgw, role, wait_for

TTL = 3.0
CONFIG = f"""
control:
  heartbeat_interval: 0.3
  unreachable_after: 1.5
  lost_after: 30
  reconcile_interval: 0.5
  lease_ttl: {TTL}
models:
  - name: steady
    weights: none
    min_replicas: 1
    profiles: [{{name: one-gpu, engine: sim, gpus: 1}}]
"""


def nodes(server: Server) -> dict[str, dict[str, Any]]:
    listed = httpx.get(server.admin + "/admin/api/nodes", timeout=5).json()["nodes"]
    return {n["id"]: n for n in listed}


def fleet_as_seen(server: Server) -> dict[str, tuple[str, bool, int]]:
    """Node id -> (state, connected, shard count)."""
    return {k: (n["state"], n["connected"], len(n["shards"])) for k, n in nodes(server).items()}


def start_server(tmp: Path, store: str, agent_port: int) -> Server:
    return Server(
        "--store", store, "--agent-listen", f"127.0.0.1:{agent_port}",
        "--config", str(tmp / "llmgw.yaml"), wait_ready=False,
    )  # fmt: skip


def start_agent(node: str, ports: list[int], tmp: Path) -> Proc:
    low = free_port_block(10)
    return Proc(
        llmgw(
            "agent", "--server", f"127.0.0.1:{ports[0]}",
            "--servers", ",".join(f"127.0.0.1:{p}" for p in ports[1:]), "--node-id", node,
            "--gpus", "2x24GiB", "--weights-dir", str(tmp / node),
            "--state-dir", str(tmp / node / "state"),
            "--port-range", f"{low}-{low + 9}",
        )
    )  # fmt: skip


def cli_nodes(server: Server) -> list[dict[str, Any]]:
    out = subprocess.run(
        llmgw("nodes", "list", "--admin", server.admin, "--json"),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    listed: list[dict[str, Any]] = json.loads(out)
    return listed


def test_a_standby_shows_the_leaders_fleet_and_so_does_a_leader_that_stepped_down(
    tmp_path: Path, database: str
) -> None:
    (tmp_path / "llmgw.yaml").write_text(CONFIG)
    ports = [free_port(), free_port()]
    first = start_server(tmp_path, database, ports[0])
    procs: list[Proc] = [first.proc]
    try:
        wait_for(lambda: role(first) == "leader", "the first server to lead")
        second = start_server(tmp_path, database, ports[1])
        procs.append(second.proc)
        wait_for(lambda: role(second) == "standby", "the second server to stand by")
        procs += [start_agent(n, ports, tmp_path) for n in ("node-1", "node-2")]
        wanted = {"node-1": ("ready", True), "node-2": ("ready", True)}
        wait_for(
            lambda: {k: v[:2] for k, v in fleet_as_seen(first).items()} == wanted,
            "both nodes on the leader",
        )
        wait_for(lambda: sum(v[2] for v in fleet_as_seen(first).values()) == 1, "the replica")
        # The standby has no agent stream, yet shows what the leader shows.
        wait_for(lambda: fleet_as_seen(second) == fleet_as_seen(first), "the standby's view")
        view = nodes(second)["node-1"]
        assert "leader_view_at" in view and view["heartbeat_age_seconds"] < 30
        assert len(view["gpus"]) == 2
        assert httpx.get(second.admin + "/admin/api/nodes/node-2", timeout=5).json()["id"] == (
            "node-2"
        )
        missing = httpx.get(second.admin + "/admin/api/nodes/nobody", timeout=5)
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "node_not_found"
        drain = httpx.post(second.admin + "/admin/api/nodes/node-1/drain", json={}, timeout=5)
        assert drain.status_code == 409, drain.text
        assert drain.json()["error"]["code"] == "not_leader"
        # `llmgw nodes list` pointed at the standby lists them too.
        assert sorted(n["id"] for n in cli_nodes(second)) == ["node-1", "node-2"]
        # So does its dashboard, which sends the operator to the leader to drain.
        page = httpx.get(second.admin + "/admin/nodes", timeout=10).text
        assert 'data-node="node-1"' in page and 'data-node="node-2"' in page
        refused = httpx.post(
            second.admin + "/admin/nodes/node-1/drain", headers={"HX-Request": "true"}, timeout=10
        )
        assert refused.status_code == 409, refused.text
        assert "this server is a standby" in refused.text

        # The leader pauses past its lease: the standby takes over, the agents move
        # to it, and the old leader wakes up as a standby. Its own inventory holds
        # the nodes as it last saw them; its admin API shows the new leader's view.
        first.proc.popen.send_signal(signal.SIGSTOP)
        try:
            wait_for(lambda: role(second) == "leader", "the standby to lead", 6 * TTL)
            wait_for(
                lambda: {k: v[:2] for k, v in fleet_as_seen(second).items()} == wanted,
                "both agents on the new leader",
            )
        finally:
            first.proc.popen.send_signal(signal.SIGCONT)
        wait_for(lambda: role(first) == "standby", "the woken leader to step down")
        wait_for(lambda: fleet_as_seen(first) == fleet_as_seen(second), "the old leader's view")
        assert {k: v[:2] for k, v in fleet_as_seen(first).items()} == wanted
    except BaseException:
        for proc in procs[:2]:
            print(proc.output()[-3000:])
        raise
    finally:
        for proc in reversed(procs):
            if proc is first.proc:
                proc.popen.send_signal(signal.SIGCONT)
            proc.stop()
