"""A node in doubt is not an outage: real server, two real agents, real `llmgw sim` engines.

A model pinned to one replica runs on one node (A); a client keeps sending
requests while A dies (agent and engines SIGKILLed) or freezes (SIGSTOP, so its
connections stay open and nothing answers). No request may fail: they wait, as
in an activation, while the replacement starts on the other node (B). When a
frozen A comes back (SIGCONT), the surplus replica is retired and exactly one
remains. An engine that dies while its agent lives is replaced while requests
wait, and a standby's router (leader and standby on PostgreSQL) waits too. The
freeze runs with each agent in its own network namespace (tests/netns.py), the
others on loopback.

Timings are shortened through the config file; the tests wait on conditions and
assert outcomes, never durations. Each engine takes 4 s to load, so a replacement
cannot be ready by the time its predecessor has left the router: a request sent
then must wait for it (on a fast machine a sim ready at once served it directly).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import procs
from netns import Host, Network
from procs import Proc, Server, free_port, free_port_block, llmgw, role


def wait_for(check: Callable[[], object], what: str, within: float = 120.0) -> Any:
    """`procs.wait_for` with this module's deadline."""
    return procs.wait_for(check, what, within)


CONFIG = """
control:
  heartbeat_interval: 0.3
  unreachable_after: 1.5
  lost_after: 60
  reconcile_interval: 0.5
  retry_base: 1
  retry_max: 4
  activation_timeout: 180
  activation_keepalive: 0.3
  stop_grace: 5
router: {health: {interval: 0.5}}
models:
  - name: m
    weights: none
    min_replicas: 1
    max_replicas: 1
    profiles: [{name: one-gpu, engine: sim, gpus: 1, engine_args: [--load-time, '4']}]
"""


def status(server: Server) -> dict[str, Any]:
    answer = httpx.get(f"{server.admin}/admin/api/models/m", timeout=10)
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()["status"]
    return found


def replicas(server: Server) -> list[dict[str, Any]]:
    """The replicas that may still hold GPUs (not stopped, failed or being stopped)."""
    found: list[dict[str, Any]] = [
        r
        for r in status(server)["replicas"]
        if r["state"] not in ("stopped", "failed", "stopping", "lost")
    ]
    return found


def routed(server: Server) -> set[str]:
    """Replica ids in this server's router."""
    return {str(e["id"]) for e in server.endpoints()}


def events(server: Server) -> list[dict[str, Any]]:
    answer = httpx.get(f"{server.admin}/admin/api/events", params={"model": "m"}, timeout=10)
    found: list[dict[str, Any]] = answer.json()["events"]
    return found


def engine_pids(*ports: int) -> list[int]:
    """Processes whose command line carries `--port P` for one of `ports` (sim engines)."""
    wanted = {str(port).encode() for port in ports}
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"sim" in argv and any(
            a == b"--port" and b in wanted for a, b in itertools.pairwise(argv)
        ):
            pids.append(int(entry.name))
    return pids


@dataclass
class Load:
    """A client sending one request after another until stopped; records every outcome."""

    url: str
    stream: bool = False
    outcomes: list[tuple[int, str, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Load:
        self._thread = threading.Thread(target=self._run)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(300)

    def _run(self) -> None:
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 4,
        }
        with httpx.Client(timeout=300) as client:
            while not self._stop.is_set():
                began = time.monotonic()
                answer = client.post(f"{self.url}/v1/chat/completions", json=body)
                self.outcomes.append(
                    (
                        answer.status_code,
                        answer.headers.get("x-llmgw-replica", ""),
                        time.monotonic() - began,
                    )
                )
                if answer.status_code != 200:
                    self.outcomes.append((answer.status_code, answer.text, 0.0))
                time.sleep(0.05)

    def served_by(self, replica: str) -> bool:
        return any(status == 200 and rid == replica for status, rid, _ in self.outcomes)

    def failures(self) -> list[tuple[int, str, float]]:
        return [o for o in self.outcomes if o[0] != 200]


def kill_engines(low: int) -> None:
    """SIGKILL the engines of an agent with ports low..low+9: they outlive their agent."""
    for pid in engine_pids(*range(low, low + 10)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def node_states(server: Server) -> dict[str, str]:
    nodes = httpx.get(f"{server.admin}/admin/api/nodes", timeout=10).json()["nodes"]
    return {str(n["id"]): str(n["state"]) for n in nodes}


def agent_argv(node: str, server: str, tmp: Path, low: int) -> list[str]:
    """An agent with its own state directory (engines it would adopt are its own only)."""
    return llmgw(
        "agent", "--server", server, "--node-id", node, "--gpus", "1x24GiB",
        "--weights-dir", str(tmp / node / "weights"), "--state-dir", str(tmp / node / "state"),
        "--port-range", f"{low}-{low + 9}",
    )  # fmt: skip


def stream_lines(server: Server) -> list[str]:
    with httpx.stream(
        "POST",
        f"{server.url}/v1/chat/completions",
        json={
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "stream": True,
        },
        timeout=300,
    ) as answer:
        assert answer.status_code == 200
        return [line for line in answer.iter_lines() if line]


# --- loopback: a node killed outright ------------------------------------------------


@contextlib.contextmanager
def loopback_fleet(tmp: Path) -> Iterator[tuple[Server, dict[str, Proc]]]:
    (tmp / "llmgw.yaml").write_text(CONFIG)
    agent_port = free_port()
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp / "llmgw.yaml"),
        data_dir=tmp / "data",
    )  # fmt: skip
    agents: dict[str, Proc] = {}
    lows: list[int] = []
    try:
        for node in ("node-a", "node-b"):
            lows.append(free_port_block(10))
            agents[node] = Proc(agent_argv(node, f"127.0.0.1:{agent_port}", tmp, lows[-1]))
        wait_for(
            lambda: node_states(server) == {"node-a": "ready", "node-b": "ready"},
            "both agents to register",
        )
        yield server, agents
    except BaseException:
        print(server.proc.output())
        for node, proc in agents.items():
            print(f"--- agent {node}\n{proc.output()}")
        raise
    finally:
        for proc in agents.values():
            proc.stop()
        for low in lows:
            kill_engines(low)
        server.proc.stop()


def test_a_killed_node_costs_no_request_and_its_replacement_serves(tmp_path: Path) -> None:
    with loopback_fleet(tmp_path) as (server, agents):
        first = wait_for(
            lambda: [r for r in replicas(server) if r["state"] == "ready"], "a ready replica"
        )[0]
        wait_for(lambda: first["id"] in routed(server), "the replica in the router")
        victim = first["node"]
        other = "node-b" if victim == "node-a" else "node-a"
        port = int(first["endpoint_url"].rsplit(":", 1)[1])
        engines = engine_pids(port)
        assert engines, f"no engine process found on port {port}"

        with Load(server.url) as load:
            wait_for(lambda: load.served_by(first["id"]), "the load to reach the replica")
            agents[victim].signal(signal.SIGKILL)
            for pid in engines:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            # Out of the router once its heartbeats stop (unreachable_after), before
            # any replacement could be ready; meanwhile the router's health checks
            # and connect errors keep requests off the dead engine.
            wait_for(lambda: first["id"] not in routed(server), "the replica to leave the router")

            # A stream that arrives now waits, kept alive by comments, and names
            # the replica that finally serves it.
            lines = stream_lines(server)
            assert lines[0] == ": llmgw is starting model m", lines
            named = [line for line in lines if line.startswith(": llmgw replica ")]
            assert len(named) == 1, lines
            replacement = named[0].removeprefix(": llmgw replica ")
            assert replacement != first["id"]
            assert lines[-1] == "data: [DONE]"
            assert json.loads(lines[lines.index(named[0]) + 1][6:])["choices"]

            wait_for(lambda: load.served_by(replacement), "the load to reach the replacement")

        assert load.failures() == []
        assert {r["node"] for r in replicas(server) if r["id"] == replacement} == {other}
        starts = [e["message"] for e in events(server) if e["kind"] == "start"]
        assert any(replacement in m and f"it replaces {first['id']}" in m for m in starts), starts


def test_an_engine_that_dies_in_service_costs_no_request(tmp_path: Path) -> None:
    with loopback_fleet(tmp_path) as (server, _agents):
        first = wait_for(
            lambda: [r for r in replicas(server) if r["state"] == "ready"], "a ready replica"
        )[0]
        wait_for(lambda: first["id"] in routed(server), "the replica in the router")
        port = int(first["endpoint_url"].rsplit(":", 1)[1])

        with Load(server.url) as load:
            wait_for(lambda: load.served_by(first["id"]), "the load to reach the replica")
            # The agent stays; only its engine dies. Requests wait for the
            # replacement instead of being refused as a model failing to start.
            for pid in engine_pids(port):
                os.kill(pid, signal.SIGKILL)

            def replaced() -> str | None:
                fresh = [r for r in replicas(server) if r["id"] != first["id"]]
                return fresh[0]["id"] if fresh else None

            replacement = wait_for(replaced, "a replacement")
            wait_for(lambda: load.served_by(replacement), "the load to reach the replacement")

        assert load.failures() == []
        failed = [e["message"] for e in events(server) if e["kind"] == "failed"]
        assert any(first["id"] in m for m in failed), failed


def test_a_standby_s_router_waits_too_when_a_node_is_killed(tmp_path: Path, database: str) -> None:
    (tmp_path / "llmgw.yaml").write_text(CONFIG)
    ports = [free_port(), free_port()]

    def start_server(port: int) -> Server:
        return Server(
            "--store", database, "--agent-listen", f"127.0.0.1:{port}",
            "--config", str(tmp_path / "llmgw.yaml"), wait_ready=False,
        )  # fmt: skip

    leader = start_server(ports[0])
    standby: Server | None = None
    agents: dict[str, Proc] = {}
    lows: dict[str, int] = {}
    try:
        wait_for(lambda: role(leader) == "leader", "the first server to lead")
        standby = start_server(ports[1])
        for node in ("node-a", "node-b"):
            lows[node] = free_port_block(10)
            argv = agent_argv(node, f"127.0.0.1:{ports[0]}", tmp_path, lows[node])
            agents[node] = Proc([*argv, "--servers", f"127.0.0.1:{ports[1]}"])
        wait_for(
            lambda: node_states(leader) == {"node-a": "ready", "node-b": "ready"},
            "both agents to register",
        )
        first = wait_for(
            lambda: [r for r in replicas(leader) if r["state"] == "ready"], "a ready replica"
        )[0]
        wait_for(lambda: routed(standby) == {first["id"]}, "the standby to follow")
        victim = first["node"]
        engines = engine_pids(int(first["endpoint_url"].rsplit(":", 1)[1]))

        with Load(standby.url) as load:
            wait_for(lambda: load.served_by(first["id"]), "the load to reach the replica")
            agents[victim].signal(signal.SIGKILL)
            for pid in engines:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            # The leader takes the replica out at once; the standby follows.
            wait_for(lambda: first["id"] not in routed(standby), "the standby to drop it")

            def replaced() -> str | None:
                fresh = [r for r in replicas(leader) if r["id"] != first["id"]]
                return fresh[0]["id"] if fresh and fresh[0]["state"] == "ready" else None

            replacement = wait_for(replaced, "a replacement")
            wait_for(lambda: load.served_by(replacement), "the standby to route to it")

        assert load.failures() == []
        assert role(standby) == "standby"
    except BaseException:
        print(leader.proc.output())
        if standby is not None:
            print(standby.proc.output())
        raise
    finally:
        for proc in agents.values():
            proc.stop()
        for low in lows.values():
            kill_engines(low)
        if standby is not None:
            standby.proc.stop()
        leader.proc.stop()


# --- network namespaces: a node frozen, then back ----------------------------------------


def free_port_on(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def namespace_pids(host: Host) -> list[int]:
    listed = subprocess.run(
        ["ip", "netns", "pids", host.namespace],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    return [int(p) for p in listed.split() if p.isdigit()]


def signal_host(host: Host, sig: int) -> None:
    """Send `sig` to every process in the host's namespace (its agent and engines)."""
    for pid in namespace_pids(host):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def test_a_frozen_node_costs_no_request_and_its_return_retires_the_surplus(
    netns: Network, tmp_path: Path
) -> None:
    (tmp_path / "llmgw.yaml").write_text(CONFIG)
    agent_port = free_port_on(netns.gateway)
    server = Server(
        "--agent-listen", f"{netns.gateway}:{agent_port}",
        "--config", str(tmp_path / "llmgw.yaml"), data_dir=tmp_path / "data",
    )  # fmt: skip
    hosts = {"node-a": netns.hosts[0], "node-b": netns.hosts[1]}
    agents: dict[str, Proc] = {}
    frozen: Host | None = None
    try:
        for node, host in hosts.items():
            low = free_port_block(10)
            address = f"{netns.gateway}:{agent_port}"
            agents[node] = host.spawn(agent_argv(node, address, tmp_path, low))
        wait_for(
            lambda: node_states(server) == {"node-a": "ready", "node-b": "ready"},
            "both agents to register",
        )
        first = wait_for(
            lambda: [r for r in replicas(server) if r["state"] == "ready"], "a ready replica"
        )[0]
        wait_for(lambda: first["id"] in routed(server), "the replica in the router")
        victim = first["node"]
        other = "node-b" if victim == "node-a" else "node-a"
        assert hosts[victim].address in first["endpoint_url"]

        with Load(server.url) as load:
            wait_for(lambda: load.served_by(first["id"]), "the load to reach the replica")
            frozen = hosts[victim]
            signal_host(frozen, signal.SIGSTOP)

            def replaced() -> str | None:
                fresh = [
                    r for r in replicas(server) if r["node"] == other and r["state"] == "ready"
                ]
                return fresh[0]["id"] if fresh else None

            replacement = wait_for(replaced, "a replacement on the other node")
            wait_for(lambda: load.served_by(replacement), "the load to reach the replacement")
            assert first["id"] not in routed(server)

            signal_host(frozen, signal.SIGCONT)
            frozen = None

            # Back: both replicas run for a moment, then the surplus is drained.
            def settled() -> bool:
                left = replicas(server)
                return len(left) == 1 and routed(server) == {left[0]["id"]}

            wait_for(settled, "exactly one replica to remain")
            kept = replicas(server)[0]["id"]
            wait_for(lambda: load.served_by(kept), "the load to reach the kept replica")

        assert load.failures() == []
        stops = [e["message"] for e in events(server) if e["kind"] == "stop"]
        retired = {first["id"], replacement} - {kept}
        assert len(retired) == 1
        (gone,) = retired
        assert any(
            gone in m and "2 replicas for 1 wanted" in m and f"keeping {kept}" in m for m in stops
        ), stops
    except BaseException:
        print(server.proc.output())
        for node, proc in agents.items():
            print(f"--- agent {node}\n{proc.output()}")
        raise
    finally:
        if frozen is not None:
            signal_host(frozen, signal.SIGCONT)
        server.proc.stop()
