"""A replica that spans two nodes, with real agents and sim ranks in separate network stacks.

Four hosts, each in its own namespace: they reach the server over eth0 (the
server's bridge) and each other over eth1 as well, a management network the
server is not on. Three hosts are in fabric ib-domain=pod-a, one in pod-b.
`control.mgmt_interface` names the management network by its CIDR, so the
ranks must be wired over eth1: the test reads each rank's command line and
environment from /proc and fails if they name anything else.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
from netns import Host, Network
from procs import Server
from test_multihost import (
    chat,
    cli,
    replicas,
    role,
    start_agent,
    start_server,
    told_on_failure,
    wait_for,
)

NETNS_HOSTS = 4
NETNS_EXTRA_NETWORKS = 1

CONFIG = """
control:
  heartbeat_interval: 0.3
  unreachable_after: 1.5
  lost_after: 4
  reconcile_interval: 0.5
  retry_base: 0.5
  retry_max: 2
  mgmt_interface: {mgmt}
router: {{health: {{interval: 0.5}}}}
models:
  - name: big
    weights: none
    min_replicas: 1
    max_replicas: 1
    profiles: [{{name: gang, engine: sim, gpus: 1, nodes: 2, fabric: ib-domain}}]
"""


def engines_in(host: Host) -> dict[int, tuple[list[str], dict[str, str]]]:
    """The sim ranks running in a host's namespace: rank -> (argv, environment)."""
    found: dict[int, tuple[list[str], dict[str, str]]] = {}
    listed = subprocess.run(
        ["ip", "netns", "pids", host.namespace], capture_output=True, text=True, check=False
    ).stdout.split()
    for pid in listed:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
            raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "sim" not in argv or "--node-rank" not in argv:
            continue
        env = dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)
        found[int(argv[argv.index("--node-rank") + 1])] = (argv, env)
    return found


def crash(host: Host) -> None:
    """The host dies: SIGKILL every process in its namespace (agent and engines) at once."""
    pids = subprocess.run(
        ["ip", "netns", "pids", host.namespace], capture_output=True, text=True, check=False
    ).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def ready_gang(server: Server) -> dict[str, Any] | None:
    """The replica once both of its shards are ready: its row (rank 0's) and rank 1's shard."""
    for row in replicas(server, "big"):
        shards = row.get("shards") or []
        if (
            row["state"] == "ready"
            and [s["rank"] for s in shards] == [0, 1]
            and all(s["state"] == "ready" for s in shards)
        ):
            return {"rank0": row, "rank1": shards[1]}
    return None


def test_a_two_node_replica_is_wired_over_the_management_network_and_replaced_whole(
    netns: Network, tmp_path: Path
) -> None:
    _, _, prefix = netns.extra[0]
    mgmt = f"{prefix}0/24"
    server, agent_port = start_server(netns, tmp_path, config=CONFIG.format(mgmt=mgmt))
    address = f"{netns.gateway}:{agent_port}"
    hosts = {f"n-{i}": netns.hosts[i] for i in range(4)}
    try:
        with told_on_failure(server, netns):
            for name, host in hosts.items():
                pod = "pod-b" if name == "n-3" else "pod-a"
                start_agent(host, name, address, tmp_path, "--fabric", f"ib-domain={pod}")
            gang = wait_for(lambda: ready_gang(server), "both ranks of the replica", within=120)
            head, follower = gang["rank0"], gang["rank1"]
            assert head["node"] != follower["node"]
            assert {head["node"], follower["node"]} <= {"n-0", "n-1", "n-2"}
            head_host, follower_host = hosts[head["node"]], hosts[follower["node"]]

            # One replica, its shards listed by node and rank (admin API, CLI).
            assert len(replicas(server, "big")) == 1
            shown = json.loads(cli(server, "models", "show", "big", "--json"))
            (row,) = shown["status"]["replicas"]
            assert [(s["node"], s["rank"]) for s in row["shards"]] == [
                (head["node"], 0),
                (follower["node"], 1),
            ]
            text = cli(server, "models", "show", "big")
            assert f"spans 2 nodes: rank 0 on {head['node']} (ready), rank 1 on " in text
            page = httpx.get(f"{server.admin}/admin/models/big", timeout=10).text
            assert f"rank 0 on {head['node']} (ready), rank 1 on {follower['node']}" in page

            # Rank 0 serves through the router and is the only one published.
            answer = chat(server, "big")
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-llmgw-replica"] == head["id"]
            assert head["endpoint_url"].startswith(f"http://{head_host.address}:")
            published = [e for e in server.endpoints() if "big" in e["models"]]  # type: ignore[operator]
            assert [(e["id"], e["url"]) for e in published] == [(head["id"], head["endpoint_url"])]

            # Each rank got the same launch line as vLLM's and the management network.
            (rank0_argv, rank0_env) = engines_in(head_host)[0]
            (rank1_argv, rank1_env) = engines_in(follower_host)[1]
            master = head_host.extra_addresses[0]
            assert master.startswith(prefix)
            for argv in (rank0_argv, rank1_argv):
                assert flag(argv, "--nnodes") == "2"
                assert flag(argv, "--master-addr") == master
                assert flag(argv, "--master-port") == flag(rank0_argv, "--master-port")
            for env in (rank0_env, rank1_env):
                assert env["NCCL_SOCKET_IFNAME"] == "=eth1"
                assert env["GLOO_SOCKET_IFNAME"] == "eth1"
            # Rank 0's rendezvous listens on its management address only, bound to eth1
            # (as Gloo binds to GLOO_SOCKET_IFNAME).
            listening = head_host.run(["ss", "-ltnH"]).stdout
            assert f"{master}%eth1:{flag(rank0_argv, '--master-port')}" in listening

            # Rank 1's node dies (agent and engine): rank 0 exits as an NCCL abort
            # would, and the replica is stopped and placed again whole.
            lost_at = time.monotonic()
            crash(follower_host)
            replaced = wait_for(
                lambda: (g := ready_gang(server)) and g["rank0"]["id"] != head["id"] and g,
                "a new two-node replica",
                within=180,
            )
            served = wait_for(
                lambda: chat(server, "big").status_code == 200, "the model to serve again"
            )
            took = time.monotonic() - lost_at
            print(f"member loss to serving again: {took:.1f} s")
            assert served
            nodes = {replaced["rank0"]["node"], replaced["rank1"]["node"]}
            assert follower["node"] not in nodes and nodes <= {"n-0", "n-1", "n-2"}
            assert "n-3" not in nodes  # another fabric
            events = httpx.get(
                f"{server.admin}/admin/api/events", params={"model": "big"}, timeout=10
            ).json()["events"]
            # Rank 0 failed once its follower left (as an NCCL abort ends a rank), which
            # counts as the model's failure: the replacement came after the backoff.
            failed = [e for e in events if e["kind"] == "failed"]
            assert any(
                e["node"] == head["node"] and f"replica {head['id']} " in e["message"]
                for e in failed
            ), "\n".join(f"{e['kind']} {e['node']}: {e['message']}" for e in events)
    finally:
        server.proc.stop()


# A new leader waits this long (control.lost_after) for ranks on nodes that have not
# registered with it yet; agents reconnecting with backoff need more than the 4 s above.
SLOW_LOSS = ("lost_after: 4", "lost_after: 30")


def start_fleet(
    netns: Network, tmp_path: Path, *, lost_after: tuple[str, str] = ("", "")
) -> tuple[Server, int, dict[str, Host]]:
    """The server and four agents (n-3 in another fabric pod)."""
    _, _, prefix = netns.extra[0]
    config = CONFIG.format(mgmt=f"{prefix}0/24").replace(*lost_after)
    server, agent_port = start_server(netns, tmp_path, config=config)
    hosts = {f"n-{i}": netns.hosts[i] for i in range(4)}
    for name, host in hosts.items():
        pod = "pod-b" if name == "n-3" else "pod-a"
        start_agent(
            host, name, f"{netns.gateway}:{agent_port}", tmp_path, "--fabric", f"ib-domain={pod}"
        )
    return server, agent_port, hosts


def test_draining_a_follower_node_moves_the_whole_replica_replacement_first(
    netns: Network, tmp_path: Path
) -> None:
    server, _, _ = start_fleet(netns, tmp_path)
    try:
        with told_on_failure(server, netns):
            gang = wait_for(lambda: ready_gang(server), "both ranks of the replica", within=120)
            old, follower = gang["rank0"], gang["rank1"]
            out = cli(server, "nodes", "drain", follower["node"], "--wait", "--timeout", "120")
            assert "drain" in out
            moved = wait_for(
                lambda: (g := ready_gang(server)) and g["rank0"]["id"] != old["id"] and g,
                "the replica on other nodes",
            )
            # The old replica stopped on both of its nodes, and only after the new one
            # was ready (the stop events come after the new replica's ready events).
            wait_for(lambda: len(replicas(server, "big")) == 1, "the old replica to be gone")
            nodes = {moved["rank0"]["node"], moved["rank1"]["node"]}
            assert follower["node"] not in nodes and "n-3" not in nodes
            events = httpx.get(
                f"{server.admin}/admin/api/events", params={"model": "big"}, timeout=10
            ).json()["events"][::-1]
            order = [(e["kind"], e["message"]) for e in events]
            ready_at = max(
                i
                for i, (kind, text) in enumerate(order)
                if kind == "ready" and moved["rank0"]["id"] in text
            )
            stops = [
                i for i, (kind, text) in enumerate(order) if kind == "stop" and old["id"] in text
            ]
            assert len(stops) == 2 and min(stops) > ready_at, order
            assert chat(server, "big").status_code == 200
    finally:
        server.proc.stop()


def test_a_restarted_control_plane_adopts_every_rank(netns: Network, tmp_path: Path) -> None:
    server, agent_port, _ = start_fleet(netns, tmp_path, lost_after=SLOW_LOSS)
    try:
        with told_on_failure(server, netns):
            gang = wait_for(lambda: ready_gang(server), "both ranks of the replica", within=120)
            server.proc.stop()
            server = Server(
                "--agent-listen", f"{netns.gateway}:{agent_port}",
                "--config", str(tmp_path / "llmgw.yaml"), data_dir=server.data_dir,
            )  # fmt: skip
            again = wait_for(lambda: ready_gang(server), "the replica adopted", within=120)
            assert again["rank0"]["id"] == gang["rank0"]["id"]
            assert again["rank1"]["id"] == gang["rank1"]["id"]
            assert chat(server, "big").status_code == 200
            events = httpx.get(
                f"{server.admin}/admin/api/events", params={"model": "big"}, timeout=10
            ).json()["events"]
            assert not [e for e in events if e["kind"] in ("start", "stop")], events
    finally:
        server.proc.stop()


def test_half_a_fabric_is_refused_and_a_killed_rank_engine_restarts_the_replica(
    netns: Network, tmp_path: Path
) -> None:
    _, _, prefix = netns.extra[0]
    server, agent_port = start_server(netns, tmp_path, config=CONFIG.format(mgmt=f"{prefix}0/24"))
    address = f"{netns.gateway}:{agent_port}"
    hosts = {f"n-{i}": netns.hosts[i] for i in range(4)}
    try:
        with told_on_failure(server, netns):
            # One node of each pod: no fabric group has the two nodes a replica needs.
            for name, pod in (("n-0", "pod-a"), ("n-3", "pod-b")):
                start_agent(hosts[name], name, address, tmp_path, "--fabric", f"ib-domain={pod}")
            why = wait_for(
                lambda: (
                    "ib-domain=pod-b" in (text := cli(server, "models", "explain", "big"))
                    and "ib-domain=pod-a" in text
                    and text
                ),
                "both nodes in the explanation",
            )
            assert "ib-domain=pod-a: 1 of 2 nodes with 1 free GPU" in why
            assert "ib-domain=pod-b: 1 of 2 nodes with 1 free GPU" in why
            assert replicas(server, "big") == []
            status = httpx.get(f"{server.admin}/admin/api/models/big", timeout=5).json()["status"]
            assert "ib-domain=pod-a: 1 of 2 nodes" in status["unplaceable"]
            # A second node in pod-a: the replica is placed there, whole.
            start_agent(hosts["n-1"], "n-1", address, tmp_path, "--fabric", "ib-domain=pod-a")
            gang = wait_for(lambda: ready_gang(server), "both ranks of the replica", within=120)
            assert {gang["rank0"]["node"], gang["rank1"]["node"]} == {"n-0", "n-1"}

            # Rank 1's engine dies (its agent lives): the agent reports the failure,
            # rank 0 is stopped, and the replica starts again after the backoff.
            follower_host = hosts[gang["rank1"]["node"]]
            rank1_pid = next(pid for pid, rank in engine_pids(follower_host).items() if rank == 1)
            os.kill(rank1_pid, signal.SIGKILL)
            again = wait_for(
                lambda: (g := ready_gang(server)) and g["rank0"]["id"] != gang["rank0"]["id"] and g,
                "the replica started again",
                within=120,
            )
            assert {again["rank0"]["node"], again["rank1"]["node"]} == {"n-0", "n-1"}
            assert chat(server, "big").status_code == 200
            events = httpx.get(
                f"{server.admin}/admin/api/events", params={"model": "big"}, timeout=10
            ).json()["events"]
            text = "\n".join(f"{e['kind']} {e['node']}: {e['message']}" for e in events)
            assert f"replica {gang['rank1']['id']} on node" in text and "failed" in text, text
            # Rank 0 ends either way: stopped by the control plane because its other
            # shard is gone, or on its own first, having seen rank 1 leave (a race).
            rank0 = f"replica {gang['rank0']['id']} on node"
            assert "another shard of its multi-node replica is gone" in text or any(
                rank0 in line and "rank 1 left the replica" in line for line in text.splitlines()
            ), text
    finally:
        server.proc.stop()


def engine_pids(host: Host) -> dict[int, int]:
    """pid -> rank of the sim ranks in a host's namespace."""
    found: dict[int, int] = {}
    listed = subprocess.run(
        ["ip", "netns", "pids", host.namespace], capture_output=True, text=True, check=False
    ).stdout.split()
    for pid in listed:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        except OSError:
            continue
        if "sim" in argv and "--node-rank" in argv:
            found[int(pid)] = int(argv[argv.index("--node-rank") + 1])
    return found


def test_a_standby_takes_over_a_running_multi_node_replica(
    netns: Network,
    tmp_path: Path,
    database: str,
) -> None:
    _, _, prefix = netns.extra[0]
    config = (
        CONFIG.format(mgmt=f"{prefix}0/24")
        .replace("control:\n", "control:\n  lease_ttl: 3\n")
        .replace(*SLOW_LOSS)
    )
    first, first_port = start_server(netns, tmp_path, "--store", database, config=config)
    second: Server | None = None
    try:
        with told_on_failure(first, netns):
            wait_for(lambda: role(first) == "leader", "the first server to lead")
            second, second_port = start_server(netns, tmp_path, "--store", database, config=config)
            standby = second
            assert role(standby) == "standby"
            for index in (0, 1):
                start_agent(
                    netns.hosts[index], f"n-{index}", f"{netns.gateway}:{first_port}", tmp_path,
                    "--servers", f"{netns.gateway}:{second_port}", "--fabric", "ib-domain=pod-a",
                )  # fmt: skip
            gang = wait_for(lambda: ready_gang(first), "both ranks of the replica", within=120)
            head = gang["rank0"]
            # The standby routes to rank 0 only, as the leader does.
            wait_for(
                lambda: [e["url"] for e in standby.endpoints()] == [head["endpoint_url"]],
                "the standby's router to take rank 0",
            )
            assert chat(standby, "big").status_code == 200

            os.kill(first.proc.popen.pid, signal.SIGKILL)
            wait_for(lambda: role(standby) == "leader", "the standby to lead")
            kept = wait_for(lambda: ready_gang(standby), "the replica, adopted", within=120)
            assert kept["rank0"]["id"] == head["id"]
            assert kept["rank1"]["id"] == gang["rank1"]["id"]
            answer = chat(standby, "big")
            assert answer.status_code == 200, answer.text
            events = httpx.get(
                f"{standby.admin}/admin/api/events", params={"model": "big"}, timeout=10
            ).json()["events"]
            assert not [e for e in events if e["kind"] in ("start", "stop")], events
    finally:
        if second is not None:
            second.proc.stop()
        first.proc.stop()
