"""A node is its certificate, and one node has one stream: real server, agents and engines.

Two fleets, each a real `llmgw server` with one sim model kept at one replica,
and real `llmgw agent` processes on loopback:

- mTLS with certificates from `llmgw certs` (as processes): a second machine
  with its own certificate for the same node id is refused, the real node keeps
  serving; `llmgw nodes remove` revokes the node and it cannot come back.
- plaintext (`--insecure-agents`): a second agent with a node id in use is
  refused, backs off (its Register attempts are counted in the server's
  metrics), and the first keeps serving; an agent killed with SIGKILL and
  started again under its id gets back in.

Waits poll with deadlines; the one fixed window (counting the refused agent's
attempts) asserts a bound on a count, never a duration.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
from procs import Proc, Server, free_port, free_port_block, llmgw, wait_for

CONFIG = (
    "control: {heartbeat_interval: 0.3, unreachable_after: 1.5, lost_after: 3, "
    "reconcile_interval: 0.5, retry_base: 1, retry_max: 4, stop_grace: 5}\n"
    "router: {health: {interval: 0.5}}\n"
    "models:\n"
    "  - name: m\n    weights: none\n    min_replicas: 1\n    keep_alive: -1\n"
    "    profiles: [{name: sim, engine: sim, gpus: 1}]\n"
)
WINDOW_SECONDS = 5.0


def certs(*args: str) -> None:
    done = subprocess.run(
        llmgw("certs", *args), capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


def agent(server: Server, agent_port: int, tmp: Path, name: str, *args: str) -> Proc:
    low = free_port_block(6)
    return Proc(
        llmgw(
            "agent", "--server", f"127.0.0.1:{agent_port}", "--gpus", "1x24GiB",
            "--weights-dir", str(tmp / "weights" / name), "--state-dir", str(tmp / "state" / name),
            "--port-range", f"{low}-{low + 5}", *args,
        )
    )  # fmt: skip


def tls(ca: Path, issued: Path, node: str) -> list[str]:
    return [
        "--tls-ca", str(ca / "ca.crt"),
        "--tls-cert", str(issued / f"node-{node}.crt"),
        "--tls-key", str(issued / f"node-{node}.key"),
    ]  # fmt: skip


def nodes(server: Server) -> dict[str, dict[str, Any]]:
    listed = httpx.get(server.admin + "/admin/api/nodes", timeout=10).json()["nodes"]
    return {n["id"]: n for n in listed}


def connected(server: Server, node: str) -> bool:
    found = nodes(server).get(node)
    return found is not None and bool(found["connected"]) and found["state"] == "ready"


def ready_on(server: Server) -> list[str]:
    """The nodes of the model's Ready replicas."""
    status = httpx.get(server.admin + "/admin/api/models/m", timeout=10).json()["status"]
    return [r["node"] for r in status["replicas"] if r["state"] == "ready"]


def chat(server: Server) -> httpx.Response:
    return httpx.post(
        server.url + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        timeout=30,
    )


def serves(server: Server) -> bool:
    return chat(server).status_code == 200


def registers(server: Server, outcome: str) -> float:
    match = re.search(
        rf'^llmgw_agent_registers_total{{outcome="{outcome}"}} (\S+)$', server.metrics(), re.M
    )
    return float(match.group(1)) if match else 0.0


def node_events(server: Server, node: str) -> list[str]:
    response = httpx.get(server.admin + "/admin/api/events", params={"node": node}, timeout=10)
    return [e["message"] for e in response.json()["events"]]


def nodes_cli(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        llmgw("nodes", *args, "--admin", server.admin),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_second_certificate_is_refused_and_a_removed_node_cannot_come_back(
    tmp_path: Path,
) -> None:
    ca, again = tmp_path / "ca", tmp_path / "again"
    certs("init", "--dir", str(ca))
    certs("issue", "--dir", str(ca), "--server", "127.0.0.1")
    certs("issue", "--dir", str(ca), "--node", "node-a")
    # Another machine given a certificate for the same name: same CA, another key.
    certs("issue", "--dir", str(ca), "--node", "node-a", "--out-dir", str(again))
    config = tmp_path / "llmgw.yaml"
    config.write_text(
        CONFIG + "agent_tls:\n"
        f"  cert: {ca / 'server-127.0.0.1.crt'}\n"
        f"  key: {ca / 'server-127.0.0.1.key'}\n"
        f"  ca: {ca / 'ca.crt'}\n"
    )
    agent_port = free_port()
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(config),
        data_dir=tmp_path / "data", insecure_agents=False,
    )  # fmt: skip
    procs: list[Proc] = []
    try:
        real = agent(server, agent_port, tmp_path, "real", *tls(ca, ca, "node-a"))
        procs.append(real)
        wait_for(lambda: ready_on(server) == ["node-a"], "a replica of m ready on node-a")
        wait_for(lambda: serves(server), "m to answer through the router")

        impostor = agent(server, agent_port, tmp_path, "impostor", *tls(ca, again, "node-a"))
        procs.append(impostor)
        wait_for(lambda: registers(server, "taken") >= 1, "the second certificate's Register")
        wait_for(
            lambda: "refused this agent's node id" in impostor.output(),
            "the second agent to say why it was refused",
        )
        said = impostor.output()
        assert "node id 'node-a' belongs to another certificate" in said
        assert "--node-id NAME" in said and "llmgw nodes remove node-a" in said

        # The real node keeps its stream, its replica and the traffic.
        assert connected(server, "node-a")
        assert registers(server, "reconnected") == 0
        assert ready_on(server) == ["node-a"]
        for _ in range(5):
            answer = chat(server)
            assert answer.status_code == 200, answer.text
        assert any(
            "the id belongs to another certificate" in m for m in node_events(server, "node-a")
        )
        assert "closing the old stream" not in server.proc.output()

        # The real agent dies and comes back with its certificate: same key, let in.
        real.signal(signal.SIGKILL)
        real.popen.wait(10)
        accepted = registers(server, "accepted") + registers(server, "reconnected")
        real = agent(server, agent_port, tmp_path, "real", *tls(ca, ca, "node-a"))
        procs.append(real)
        wait_for(
            lambda: registers(server, "accepted") + registers(server, "reconnected") > accepted,
            "the restarted agent to register again",
        )
        wait_for(lambda: connected(server, "node-a"), "node-a connected again")

        # Removed: revoked, disconnected, forgotten; its redial is refused.
        impostor.stop()
        removed = nodes_cli(server, "remove", "node-a", "--reason", "decommissioned")
        assert removed.returncode == 0, removed.stderr
        assert removed.stdout.startswith("node node-a removed: its certificate key sha256:")
        assert "is revoked" in removed.stdout
        wait_for(lambda: registers(server, "revoked") >= 1, "the removed node's redial")
        wait_for(
            lambda: "certificate was revoked (llmgw nodes remove)" in real.output(),
            "the removed agent to say it was revoked",
        )
        assert "decommissioned" in real.output()
        assert "node-a" not in nodes(server)
        assert any("removed: its certificate key" in m for m in node_events(server, "node-a"))
        revoked = registers(server, "revoked")
        wait_for(lambda: registers(server, "revoked") > revoked, "another refused redial")
        assert "node-a" not in nodes(server)

        # Unknown nodes: a clear error line, exit code 2.
        unknown = nodes_cli(server, "remove", "ghost")
        assert unknown.returncode == 2
        assert unknown.stderr.startswith("error: no node 'ghost' to remove")
    except BaseException:
        print(server.proc.output())
        for proc in procs:
            print(proc.output())
        raise
    finally:
        for proc in procs:
            proc.stop()
        server.proc.stop()


def test_a_duplicate_plaintext_node_id_is_refused_backs_off_and_a_restart_gets_back_in(
    tmp_path: Path,
) -> None:
    config = tmp_path / "llmgw.yaml"
    config.write_text(CONFIG)
    agent_port = free_port()
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(config),
        data_dir=tmp_path / "data",
    )  # fmt: skip
    procs: list[Proc] = []
    try:
        first = agent(server, agent_port, tmp_path, "first", "--node-id", "gpu-1")
        procs.append(first)
        wait_for(lambda: ready_on(server) == ["gpu-1"], "a replica of m ready on gpu-1")
        wait_for(lambda: serves(server), "m to answer through the router")

        second = agent(server, agent_port, tmp_path, "second", "--node-id", "gpu-1")
        procs.append(second)
        # Some refusals first, so the window below starts with the backoff under way.
        wait_for(lambda: registers(server, "in_use") >= 3, "three refused Registers", within=120)
        said = second.output()
        assert "refused this agent's node id: node id 'gpu-1' is in use" in said
        assert "--node-id NAME" in said
        before = registers(server, "in_use")
        time.sleep(WINDOW_SECONDS)  # a counting window; the bound holds however slow the host
        during = registers(server, "in_use") - before
        # Full-jitter backoff from a 4 s ceiling: a handful at most (without it: hundreds).
        assert during <= 8, f"{during} refused Registers in {WINDOW_SECONDS:g} s"

        # The first agent kept its stream, its replica and the traffic.
        assert connected(server, "gpu-1")
        assert registers(server, "reconnected") == 0
        assert ready_on(server) == ["gpu-1"]
        answer = chat(server)
        assert answer.status_code == 200, answer.text
        assert any("the node is connected from" in m for m in node_events(server, "gpu-1"))

        # The agent dies without a word and starts again under its id: it gets back in.
        second.stop()
        first.signal(signal.SIGKILL)
        first.popen.wait(10)
        accepted = registers(server, "accepted")
        restarted = agent(server, agent_port, tmp_path, "first", "--node-id", "gpu-1")
        procs.append(restarted)
        wait_for(lambda: registers(server, "accepted") > accepted, "the restart to register")
        wait_for(lambda: connected(server, "gpu-1"), "gpu-1 connected again")
        wait_for(lambda: serves(server), "m to answer after the restart")
    except BaseException:
        print(server.proc.output())
        for proc in procs:
            print(proc.output())
        raise
    finally:
        for proc in procs:
            proc.stop()
        server.proc.stop()
