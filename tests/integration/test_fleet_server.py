"""`llmgw server` as a process with two real `llmgw agent` processes on loopback."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import procs
from procs import Proc, Server, free_port, free_port_block, llmgw


def wait_for(check: Callable[[], object], what: str, within: float = 20.0) -> Any:
    """`procs.wait_for` with this module's deadline."""
    return procs.wait_for(check, what, within)


def agent(node: str, agent_port: int, tmp: Path) -> Proc:
    low = free_port_block(11)
    return Proc(
        llmgw(
            "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", node,
            "--gpus", "2x24GiB", "--fabric", "ib-domain=pod3", "--labels", f"name={node}",
            "--weights-dir", str(tmp / node), "--port-range", f"{low}-{low + 10}",
        )
    )  # fmt: skip


def nodes(server: Server) -> dict[str, dict[str, object]]:
    listed = httpx.get(server.admin + "/admin/api/nodes").json()["nodes"]
    return {n["id"]: n for n in listed}


def start_server(tmp: Path, agent_port: int) -> Server:
    config = tmp / "llmgw.yaml"
    config.write_text("control: {heartbeat_interval: 0.3, unreachable_after: 1.5, lost_after: 3}\n")
    return Server(
        "--endpoint", "x=http://127.0.0.1:1=unused", "--agent-listen", f"127.0.0.1:{agent_port}",
        "--config", str(config), data_dir=tmp / "data", wait_ready=False,
    )  # fmt: skip


def test_agents_register_go_lost_and_come_back_after_a_server_restart(tmp_path: Path) -> None:
    agent_port = free_port()
    server = start_server(tmp_path, agent_port)
    one = agent("node-1", agent_port, tmp_path)
    two = agent("node-2", agent_port, tmp_path)
    try:
        wait_for(lambda: set(nodes(server)) == {"node-1", "node-2"}, "both agents to register")
        for node in nodes(server).values():
            assert node["state"] == "ready"
            assert node["fabric"] == {"ib-domain": "pod3"}
            gpus = node["gpus"]
            assert isinstance(gpus, list) and len(gpus) == 2
        table = subprocess.run(
            llmgw("nodes", "list", "--admin", server.admin),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "node-1" in table and "node-2" in table
        shown = json.loads(
            subprocess.run(
                llmgw("nodes", "show", "node-1", "--admin", server.admin, "--json"),
                capture_output=True, text=True, check=True,
            ).stdout
        )  # fmt: skip
        assert shown["labels"] == {"name": "node-1"}
        metrics = server.metrics()
        assert 'llmgw_nodes{state="ready"} 2.0' in metrics
        assert "llmgw_gpus_total 4.0" in metrics

        # Drain is an operator's flag, visible at once.
        assert (
            httpx.post(server.admin + "/admin/api/nodes/node-1/drain", json={}).status_code == 200
        )
        assert nodes(server)["node-1"]["draining"] is True
        unknown = httpx.post(server.admin + "/admin/api/nodes/nobody/drain", json={})
        assert unknown.status_code == 404
        assert unknown.json()["error"]["code"] == "node_not_found"

        two.signal(signal.SIGKILL)
        wait_for(lambda: nodes(server)["node-2"]["state"] == "unreachable", "node-2 unreachable")
        wait_for(lambda: nodes(server)["node-2"]["state"] == "lost", "node-2 lost")

        # Restart the server: node-1's agent reconnects by itself, no one touches it.
        server.proc.stop()
        server = start_server(tmp_path, agent_port)
        wait_for(lambda: "node-1" in nodes(server), "node-1 to reconnect", within=40)
        assert nodes(server)["node-1"]["state"] == "ready"
    finally:
        one.stop()
        two.stop()
        server.proc.stop()
