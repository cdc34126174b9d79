"""A node in a network namespace of its own joins with a printed token and fails over to a standby.

Two `llmgw server` processes share one PostgreSQL store and one cluster key
file; their agent listeners are on the bridge address (tests/netns.py), with
the default security (mTLS with the cluster CA kept in the store). The agent
runs in its own namespace, dials the leader's bridge address with the token
the leader printed, serves a sim model, and when the leader dies reconnects to
the standby, whose own certificate (issued from the same CA for its address)
the agent accepts. Waits poll with deadlines.
"""

from __future__ import annotations

import contextlib
import re
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from netns import Host, Network
from procs import Proc, Server, free_port_block, llmgw, wait_for

CONFIG = """
control:
  heartbeat_interval: 0.3
  unreachable_after: 1.5
  lost_after: 6
  reconcile_interval: 0.5
  lease_ttl: 3
router: {health: {interval: 0.5}}
models:
  - name: sim-ns
    weights: none
    min_replicas: 1
    profiles: [{name: one-gpu, engine: sim, gpus: 1}]
"""


def free_port_on(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def leads(server: Server) -> bool:
    try:
        info = httpx.get(server.admin + "/admin/api/leader", timeout=5).json()
    except httpx.HTTPError:
        return False
    return bool(info.get("role") == "leader")


def node_ready(server: Server, node: str) -> bool:
    try:
        nodes = httpx.get(server.admin + "/admin/api/nodes", timeout=5).json()["nodes"]
    except httpx.HTTPError:
        return False
    return any(n["id"] == node and n["state"] == "ready" for n in nodes)


def chat(server: Server) -> int:
    try:
        return httpx.post(
            f"{server.url}/v1/chat/completions",
            json={"model": "sim-ns", "messages": [{"role": "user", "content": "hi"}],
                  "max_tokens": 3},
            timeout=60,
        ).status_code  # fmt: skip
    except httpx.HTTPError:
        return 0


@contextlib.contextmanager
def told_on_failure(procs: list[Proc]) -> Iterator[None]:
    """Print every process's output on a failure; stop them all on every exit path."""
    try:
        yield
    except BaseException:
        for proc in procs:
            print(f"---- {proc.argv[:6]} ----\n" + proc.output()[-6000:])
        raise
    finally:
        for proc in procs:
            proc.stop()


@pytest.mark.timeout(300)
def test_a_namespaced_node_joins_with_the_printed_token_and_fails_over_to_the_standby(
    netns: Network, database: str, tmp_path: Path
) -> None:
    (tmp_path / "llmgw.yaml").write_text(CONFIG)
    key_file = tmp_path / "cluster.key"
    ports = [free_port_on(netns.gateway), free_port_on(netns.gateway)]

    def start(port: int) -> Server:
        return Server(
            "--store", database, "--agent-listen", f"{netns.gateway}:{port}",
            "--cluster-key-file", str(key_file), "--config", str(tmp_path / "llmgw.yaml"),
            insecure_agents=False, wait_ready=False,
        )  # fmt: skip

    procs: list[Proc] = []
    with told_on_failure(procs):
        first = start(ports[0])
        procs.append(first.proc)
        wait_for(lambda: leads(first), "the first server to lead")
        second = start(ports[1])
        procs.append(second.proc)
        printed = wait_for(
            lambda: re.search(
                rf"llmgw agent --server {re.escape(netns.gateway)}:{ports[0]} --token (\S+)",
                first.proc.output(),
            ),
            "the first server to print the join command",
        )
        host: Host = netns.hosts[0]
        low = free_port_block(6)
        agent = host.spawn(
            llmgw(
                "agent", "--server", f"{netns.gateway}:{ports[0]}",
                "--servers", f"{netns.gateway}:{ports[1]}",
                "--token", printed.group(1), "--node-id", "ns-node", "--gpus", "1x24GiB",
                "--state-dir", str(tmp_path / "state"), "--weights-dir", str(tmp_path / "w"),
                "--port-range", f"{low}-{low + 5}",
            )
        )  # fmt: skip
        procs.append(agent)
        wait_for(lambda: node_ready(first, "ns-node"), "the namespaced node to join", 90)
        assert f"joined the cluster through {netns.gateway}:{ports[0]}" in agent.output()
        wait_for(lambda: chat(first) == 200, "a request served by the node's engine", 90)

        first.proc.signal(signal.SIGKILL)
        wait_for(lambda: leads(second), "the standby to take over", 60)
        wait_for(
            lambda: f"registered as ns-node with {netns.gateway}:{ports[1]}" in agent.output(),
            "the node to reconnect to the new leader",
            90,
        )
        assert "refused" not in agent.output().split("registered as ns-node")[-1]
        wait_for(lambda: chat(second) == 200, "a request served after the failover", 90)
