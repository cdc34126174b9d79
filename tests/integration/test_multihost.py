"""The fleet across separate network stacks: agents in network namespaces, the server outside.

Every agent runs in a namespace of its own (tests/netns.py) and reaches the
server only through the bridge address; engines the agents start run in the
agents' namespaces. Nothing here is reachable through 127.0.0.1 across them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from netns import Host, Network
from procs import Proc, Server, free_port_block, llmgw, role, wait_for

CONFIG = """
control:
  heartbeat_interval: 0.3
  unreachable_after: 1.5
  lost_after: 4
  reconcile_interval: 0.5
router: {health: {interval: 0.5}}
models:
  - name: chat
    weights: none
    min_replicas: 0
    profiles: [{name: one-gpu, engine: sim, gpus: 1}]
"""


@contextlib.contextmanager
def told_on_failure(server: Server, network: Network) -> Iterator[None]:
    """On a failure, print the server's and the agents' output (pytest shows it)."""
    try:
        yield
    except BaseException:
        print("---- server ----\n" + server.proc.output()[-6000:])
        for host in network.hosts:
            for proc in host.procs:
                print(f"---- {host.namespace}: {proc.argv[4:]} ----\n" + proc.output()[-4000:])
        raise


def free_port_on(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def start_server(
    network: Network, tmp: Path, *args: str, config: str = CONFIG, data_dir: Path | None = None
) -> tuple[Server, int]:
    """A server whose agent listener is on the bridge address only."""
    (tmp / "llmgw.yaml").write_text(config)
    agent_port = free_port_on(network.gateway)
    server = Server(
        "--agent-listen", f"{network.gateway}:{agent_port}",
        "--config", str(tmp / "llmgw.yaml"), *args, data_dir=data_dir,
    )  # fmt: skip
    return server, agent_port


def start_agent(host: Host, node: str, server: str, tmp: Path, *extra: str) -> Proc:
    low = free_port_block(10)
    return host.spawn(
        llmgw(
            "agent", "--server", server, "--node-id", node, "--gpus", "2x24GiB",
            "--weights-dir", str(tmp / node), "--port-range", f"{low}-{low + 9}", *extra,
        )
    )  # fmt: skip


def cli(server: Server, *args: str) -> str:
    done = subprocess.run(
        llmgw(*args, "--admin", server.admin),
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def node_view(server: Server, node: str) -> dict[str, Any] | None:
    answer = httpx.get(f"{server.admin}/admin/api/nodes/{node}", timeout=5)
    if answer.status_code == 404:
        return None
    found: dict[str, Any] = answer.json()
    return found


def test_namespaces_are_separate_stacks(netns: Network) -> None:
    # A listener on the root namespace's loopback is not reachable from a host,
    # while the bridge address is.
    with socket.socket() as loop, socket.socket() as bridge:
        loop.bind(("127.0.0.1", 0))
        loop.listen()
        bridge.bind((netns.gateway, 0))
        bridge.listen()
        host = netns.hosts[0]
        probe = (
            "import socket,sys\n"
            "s=socket.socket();s.settimeout(5)\n"
            "print(s.connect_ex((sys.argv[1],int(sys.argv[2]))))"
        )
        loop_port, bridge_port = loop.getsockname()[1], bridge.getsockname()[1]
        far = host.run(["python3", "-c", probe, "127.0.0.1", str(loop_port)])
        near = host.run(["python3", "-c", probe, netns.gateway, str(bridge_port)])
    assert far.stdout.strip() not in ("", "0"), far
    assert near.stdout.strip() == "0", near
    addresses = host.run(["ip", "-o", "-4", "addr", "show", "dev", "eth0"]).stdout
    assert f"{host.address}/24" in addresses


def test_agent_in_a_namespace_registers(netns: Network, tmp_path: Path) -> None:
    server, agent_port = start_server(netns, tmp_path)
    try:
        with told_on_failure(server, netns):
            agent = start_agent(netns.hosts[0], "far", f"{netns.gateway}:{agent_port}", tmp_path)
            node = wait_for(
                lambda: (n := node_view(server, "far")) and n["state"] == "ready" and n,
                "the agent in its namespace to register",
            )
            assert node["id"] == "far"
            host = netns.hosts[0]
            # The server sees the agent from its namespace's address, and engines are
            # advertised there (the connection's local address), with nothing to warn of.
            assert node["seen_from"] == host.address
            assert node["advertise_host"] == host.address
            assert node["address_warning"] is None
            assert f"node far connects from {host.address}" in server.proc.output()
            shown = cli(server, "nodes", "show", "far")
            assert f"seen from {host.address}, engines advertised at {host.address}" in shown
            assert "warning:" not in shown
            assert agent.popen.poll() is None
    finally:
        server.proc.stop()


def replicas(server: Server, model: str) -> list[dict[str, Any]]:
    status = httpx.get(f"{server.admin}/admin/api/models/{model}", timeout=5).json()["status"]
    found: list[dict[str, Any]] = status["replicas"]
    return found


def chat(server: Server, model: str = "chat") -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=120,
    )


def test_first_request_is_served_by_an_engine_in_a_namespace(
    netns: Network, tmp_path: Path
) -> None:
    server, agent_port = start_server(netns, tmp_path)
    host = netns.hosts[0]
    try:
        start_agent(host, "far", f"{netns.gateway}:{agent_port}", tmp_path)
        wait_for(lambda: (n := node_view(server, "far")) and n["state"] == "ready", "the node")
        answer = chat(server)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"]
        (replica,) = replicas(server, "chat")
        assert replica["endpoint_url"].startswith(f"http://{host.address}:")
        assert replica["state"] == "ready"
        assert replica["reach"]["state"] == "reachable"
        assert replica["reach"]["url"] == replica["endpoint_url"]
        assert "engines on this node are advertised at " + host.address in agent_output(host)
    finally:
        server.proc.stop()


def agent_output(host: Host) -> str:
    return "\n".join(proc.output() for proc in host.procs)


def test_an_agent_advertising_loopback_from_another_host_is_refused_naming_why(
    netns: Network, tmp_path: Path
) -> None:
    server, agent_port = start_server(netns, tmp_path)
    host = netns.hosts[1]
    try:
        start_agent(
            host, "lo", f"{netns.gateway}:{agent_port}", tmp_path, "--advertise-host", "127.0.0.1"
        )
        wait_for(lambda: (n := node_view(server, "lo")) and n["state"] == "ready", "the node")
        answer = chat(server)
        # A clear refusal, not a 502 from dialling 127.0.0.1 (the servers would dial
        # themselves, and whatever listens on that port there); the address and why are
        # the operator's to see (events, log), never an API client's.
        assert answer.status_code == 503, answer.text
        error = answer.json()["error"]
        assert error["code"] == "model_failed"
        assert "127.0.0.1" not in answer.text
        # Never in this server's router.
        assert not any(str(e["url"]).startswith("http://127.0.0.1:") for e in server.endpoints())
        events = httpx.get(
            f"{server.admin}/admin/api/events", params={"node": "lo"}, timeout=10
        ).json()["events"]
        refusals = [
            e["message"] for e in events if "which is not where the node is" in e["message"]
        ]
        assert refusals, events
        assert "at http://127.0.0.1:" in refusals[0]
        assert f"is a loopback address but the node connects from {host.address}" in refusals[0]
        assert "--advertise-host" in refusals[0]
        # The node says why: a loopback address advertised from another host.
        node = node_view(server, "lo")
        assert node is not None
        assert node["seen_from"] == host.address and node["advertise_host"] == "127.0.0.1"
        warning = (
            f"advertises 127.0.0.1 (loopback) for its engines but connects from {host.address}"
        )
        assert warning in node["address_warning"]
        assert warning in cli(server, "nodes", "show", "lo")
        nodes_page = httpx.get(f"{server.admin}/admin/nodes", timeout=10).text
        assert warning in nodes_page
        assert "node lo advertises 127.0.0.1 (loopback)" in server.proc.output()
    finally:
        server.proc.stop()


TWO_NODE_CONFIG = CONFIG.replace("min_replicas: 0", "min_replicas: 1\n    max_replicas: 1")


def ready_on(server: Server, model: str = "chat") -> list[dict[str, Any]]:
    return [r for r in replicas(server, model) if r["state"] == "ready"]


def host_of(netns: Network, node: str) -> Host:
    return netns.hosts[int(node.rsplit("-", 1)[1])]


def test_a_lost_node_is_replaced_on_another_host(netns: Network, tmp_path: Path) -> None:
    server, agent_port = start_server(netns, tmp_path, config=TWO_NODE_CONFIG)
    try:
        with told_on_failure(server, netns):
            for index in (0, 1):
                start_agent(
                    netns.hosts[index], f"n-{index}", f"{netns.gateway}:{agent_port}", tmp_path
                )
            [first] = wait_for(lambda: ready_on(server), "a Ready replica")
            lost = host_of(netns, first["node"])
            assert first["endpoint_url"].startswith(f"http://{lost.address}:")
            assert chat(server).status_code == 200
            # The node's network goes away: no stream, no heartbeats; its engine lives on,
            # unreachable.
            lost.link_down()
            wait_for(
                lambda: (n := node_view(server, first["node"])) and n["state"] == "lost",
                "the node to be lost",
            )
            [second] = wait_for(
                lambda: [r for r in ready_on(server) if r["node"] != first["node"]],
                "a replacement on the other host",
            )
            other = host_of(netns, second["node"])
            assert second["endpoint_url"].startswith(f"http://{other.address}:")
            answer = chat(server)
            assert answer.status_code == 200, answer.text
    finally:
        server.proc.stop()


def test_draining_a_node_moves_its_replica_to_another_host(netns: Network, tmp_path: Path) -> None:
    server, agent_port = start_server(netns, tmp_path, config=TWO_NODE_CONFIG)
    try:
        with told_on_failure(server, netns):
            for index in (0, 1):
                start_agent(
                    netns.hosts[index], f"n-{index}", f"{netns.gateway}:{agent_port}", tmp_path
                )
            [first] = wait_for(lambda: ready_on(server), "a Ready replica")
            out = cli(server, "nodes", "drain", first["node"], "--wait", "--timeout", "120")
            assert "drain" in out
            [moved] = wait_for(lambda: ready_on(server), "the moved replica")
            assert moved["node"] != first["node"]
            assert moved["endpoint_url"].startswith(
                f"http://{host_of(netns, moved['node']).address}:"
            )
            assert [r["id"] for r in replicas(server, "chat")] == [moved["id"]]
            answer = chat(server)
            assert answer.status_code == 200, answer.text
    finally:
        server.proc.stop()


def test_the_standby_reaches_the_engines_itself_and_keeps_serving_after_a_failover(
    netns: Network, tmp_path: Path, database: str
) -> None:
    config = TWO_NODE_CONFIG.replace("control:\n", "control:\n  lease_ttl: 3\n")
    first, first_port = start_server(netns, tmp_path, "--store", database, config=config)
    second: Server | None = None
    try:
        with told_on_failure(first, netns):
            wait_for(lambda: role(first) == "leader", "the first server to lead")
            second, second_port = start_server(netns, tmp_path, "--store", database, config=config)
            assert role(second) == "standby"
            host = netns.hosts[0]
            start_agent(
                host, "n-0", f"{netns.gateway}:{first_port}", tmp_path,
                "--servers", f"{netns.gateway}:{second_port}",
            )  # fmt: skip
            [replica] = wait_for(lambda: ready_on(first), "a Ready replica")
            assert replica["endpoint_url"].startswith(f"http://{host.address}:")
            # The standby's router takes the endpoint only once the standby itself
            # has dialled it (its gate forwards nothing else).
            standby = second
            wait_for(
                lambda: [e["url"] for e in standby.endpoints()] == [replica["endpoint_url"]],
                "the standby's router to take the endpoint",
            )
            assert "cannot reach" not in standby.proc.output()
            assert chat(standby).status_code == 200
            # What the standby found is shown by the standby itself.
            status = httpx.get(f"{standby.admin}/admin/api/models/chat", timeout=5).json()
            [reach] = status["status"]["reachability"]
            assert (reach["replica"], reach["url"]) == (replica["id"], replica["endpoint_url"])
            assert reach["state"] == "reachable" and reach["error"] is None

            os.kill(first.proc.popen.pid, signal.SIGKILL)
            wait_for(lambda: role(standby) == "leader", "the standby to lead")
            wait_for(
                lambda: (n := node_view(standby, "n-0")) and n["connected"] and n,
                "the agent to move to the new leader",
            )
            answer = chat(standby)
            assert answer.status_code == 200, answer.text
            [kept] = wait_for(lambda: ready_on(standby), "the replica, adopted")
            assert kept["id"] == replica["id"]
            assert kept["reach"]["state"] == "reachable"
    finally:
        if second is not None:
            second.proc.stop()
        first.proc.stop()


def test_engines_bind_where_engine_host_says(netns: Network, tmp_path: Path) -> None:
    server, agent_port = start_server(netns, tmp_path)
    host = netns.hosts[2]
    try:
        with told_on_failure(server, netns):
            start_agent(
                host, "dual", f"{netns.gateway}:{agent_port}", tmp_path,
                "--engine-host", host.address,
            )  # fmt: skip
            wait_for(lambda: (n := node_view(server, "dual")) and n["state"] == "ready", "node")
            answer = chat(server)
            assert answer.status_code == 200, answer.text
            (replica,) = replicas(server, "chat")
            port = int(replica["endpoint_url"].rsplit(":", 1)[1])
            # Only on that address: the namespace's own loopback finds nothing there.
            probe = (
                "import socket,sys\n"
                "s=socket.socket();s.settimeout(5)\n"
                "print(s.connect_ex((sys.argv[1],int(sys.argv[2]))))"
            )
            near = host.run(["python3", "-c", probe, host.address, str(port)])
            loop = host.run(["python3", "-c", probe, "127.0.0.1", str(port)])
            assert near.stdout.strip() == "0", near
            assert loop.stdout.strip() not in ("", "0"), loop
    finally:
        server.proc.stop()


def fetch_in(host: Host, url: str) -> Any:
    """GET `url` from inside `host`'s namespace (its loopback is its own); None if no answer."""
    code = (
        "import json,sys,urllib.request\n"
        "try:\n"
        "    print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())\n"
        "except Exception as exc:\n"
        "    print(json.dumps({'unreachable': str(exc)}))"
    )
    done = host.run(["python3", "-c", code, url])
    try:
        return json.loads(done.stdout)
    except ValueError:
        return None


def test_each_server_routes_only_to_what_it_can_reach_itself(
    netns: Network, tmp_path: Path
) -> None:
    # The leader and the agent share the root namespace; the standby runs in a
    # namespace of its own, on the same SQLite store. The agent advertises
    # 127.0.0.1: the leader can dial its engine, the standby cannot.
    config = TWO_NODE_CONFIG.replace("control:\n", "control:\n  lease_ttl: 3\n")
    data = tmp_path / "data"
    leader, leader_port = start_server(netns, tmp_path, config=config, data_dir=data)
    host = netns.hosts[2]
    api = free_port_block(3)
    admin, agents = api + 1, api + 2
    standby = host.spawn(
        llmgw(
            "server", "--listen", f"{host.address}:{api}", "--admin-listen", f"127.0.0.1:{admin}",
            "--agent-listen", f"{host.address}:{agents}", "--data-dir", str(data),
            "--config", str(tmp_path / "llmgw.yaml"), "--auth-mode", "open", "--insecure-agents",
        )
    )  # fmt: skip
    agent: Proc | None = None
    try:
        with told_on_failure(leader, netns):
            status_url = f"http://127.0.0.1:{admin}/admin/api/models/chat"
            wait_for(
                lambda: (
                    (a := fetch_in(host, f"http://127.0.0.1:{admin}/admin/api/leader"))
                    and a.get("role") == "standby"
                ),
                "the standby in its namespace",
            )
            low = free_port_block(10)
            agent = Proc(
                llmgw(
                    "agent", "--server", f"{netns.gateway}:{leader_port}", "--node-id", "root",
                    "--gpus", "1x24GiB", "--weights-dir", str(tmp_path / "root"),
                    "--port-range", f"{low}-{low + 9}", "--advertise-host", "127.0.0.1",
                )
            )  # fmt: skip
            [replica] = wait_for(lambda: ready_on(leader), "a Ready replica")
            url = replica["endpoint_url"]
            assert url.startswith("http://127.0.0.1:")
            # The leader (same machine as the engine) reaches it and serves.
            assert chat(leader).status_code == 200
            [mine] = httpx.get(f"{leader.admin}/admin/api/models/chat", timeout=5).json()["status"][
                "reachability"
            ]
            assert mine["state"] == "reachable"
            # The standby follows the leader's endpoints, dials the engine itself, fails,
            # and keeps it out of its router, saying why.
            theirs = wait_for(
                lambda: [
                    r
                    for r in (fetch_in(host, status_url) or {})
                    .get("status", {})
                    .get("reachability", [])
                    if r["state"] == "unreachable"
                ],
                "the standby to find the engine unreachable",
            )
            assert theirs[0]["url"] == url
            assert theirs[0]["error"].startswith("cannot connect to 127.0.0.1:")
            endpoints = fetch_in(host, f"http://127.0.0.1:{admin}/admin/api/endpoints")
            assert endpoints["endpoints"] == []
            refused = httpx.post(
                f"http://{host.address}:{api}/v1/chat/completions",
                json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]},
                timeout=60,
            )
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "replica_unreachable"
            assert chat(leader).status_code == 200
    finally:
        if agent is not None:
            agent.stop()
        standby.stop()
        leader.proc.stop()
