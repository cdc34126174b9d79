"""Restarting an agent under load: its engines keep serving and the next agent adopts them.

A real `llmgw server` with one pinned sim model, a real agent (engines left
running on exit, the production default), and a steady trickle of chat
requests through the router while the agent is SIGKILLed and restarted, then
SIGTERMed and restarted, each time 1.5 s later (a service manager's restart
delay). Every request must succeed, and go on succeeding while no agent runs:
the control plane keeps a replica in the routers while its agent's stream is
closed (engines outlive their agent), so the router keeps serving it. The
replica must stay the same process (same pid, no reload), and nothing may be
started, drained or recorded as failed. An agent that stays away past
`unreachable_after` gets its replica replaced on another node; back, the surplus
drained is the replacement, not the engine it adopts (which served longest).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
from procs import Proc, Server, free_port, free_port_block, llmgw, wait_for
from rolling import Load
from streams import sim_pids

CONFIG = (
    "control: {heartbeat_interval: 0.3, unreachable_after: 15, lost_after: 30, "
    "reconcile_interval: 0.5, retry_base: 1, retry_max: 4, activation_timeout: 60, "
    "stop_grace: 5}\n"
    "router: {health: {interval: 0.5}}\n"
    "models:\n"
    "  - name: steady\n    weights: none\n    min_replicas: 1\n    keep_alive: -1\n"
    "    profiles: [{name: sim, engine: sim, gpus: 1, engine_args: [--zero-delay]}]\n"
)


def node(server: Server) -> dict[str, Any]:
    nodes = httpx.get(server.admin + "/admin/api/nodes", timeout=10).json()["nodes"]
    found: dict[str, Any] = next(
        (n for n in nodes if n["id"] == "node-r"), {"shards": [], "registered_at": None}
    )
    return found


def ready_shards(server: Server) -> list[dict[str, Any]]:
    return [s for s in node(server)["shards"] if s["state"] == "ready"]


def test_restarting_the_agent_under_load_loses_no_request(tmp_path: Path) -> None:
    (tmp_path / "llmgw.yaml").write_text(CONFIG)
    agent_port = free_port()
    low = free_port_block(5)
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp_path / "llmgw.yaml"),
        data_dir=tmp_path / "data",
    )  # fmt: skip
    argv = llmgw(
        "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", "node-r",
        "--gpus", "1x24GiB", "--weights-dir", str(tmp_path / "weights"),
        "--port-range", f"{low}-{low + 4}", "--adopt-grace", "30",
    )  # fmt: skip
    env = {"LLMGW_AGENT_STOP_ENGINES_ON_EXIT": "0"}  # the default: engines outlive the agent
    agent = Proc(argv, env=env)
    agents = [agent]
    try:
        wait_for(lambda: len(ready_shards(server)) == 1, "the replica to be ready")
        [shard] = ready_shards(server)
        pid = shard["pid"]
        with Load(server.url, "steady", max_tokens=3, pause=0.02) as load:
            wait_for(lambda: load.sent >= 20, "requests to flow")
            for how in ("SIGKILL", "SIGTERM"):
                registered_before = node(server)["registered_at"]
                if how == "SIGKILL":
                    agent.popen.kill()
                else:
                    agent.popen.terminate()
                agent.popen.wait(30)
                gone = time.monotonic()
                if how == "SIGTERM":
                    assert agent.popen.returncode == 0, agent.output()
                    assert "leaving 1 engine running" in agent.output()
                # With no agent, requests are still served by the same engine (they
                # would wait for the agent to come back if the replica left the router).
                sent = load.sent
                wait_for(lambda s=sent: load.sent >= s + 10, f"requests with the agent {how}ed")
                assert not node(server)["connected"]
                assert load.failures == [], load.failures[:5]
                # Restarted 1.5 s later, as a service manager with a restart delay would.
                time.sleep(max(0.0, 1.5 - (time.monotonic() - gone)))
                agent = Proc(argv, env=env)
                agents.append(agent)
                wait_for(
                    lambda b=registered_before: (
                        node(server)["registered_at"] != b and node(server)["connected"]
                    ),
                    f"the agent restarted after {how} to register",
                )
                assert "adopted 1 engine" in agent.output()
                [again] = ready_shards(server)
                assert (again["id"], again["pid"]) == (shard["id"], pid), again
                sent = load.sent
                wait_for(lambda s=sent: load.sent >= s + 20, "requests after the restart")
        assert load.failures == [], load.failures[:5]
        print(f"requests: {load.sent}, failed: 0, longest: {load.longest:.2f}s")
        assert load.sent >= 60
        # Still the same process, ready, and no replica failure was recorded.
        [last] = ready_shards(server)
        assert (last["id"], last["pid"]) == (shard["id"], pid)
        events = httpx.get(
            f"{server.admin}/admin/api/events", params={"model": "steady"}, timeout=10
        ).json()["events"]
        assert not [e for e in events if e["kind"] == "failed"], events
        # One start ever, and no stop: the restarts reloaded and drained nothing.
        assert len([e for e in events if e["kind"] == "start"]) == 1, events
        assert not [e for e in events if e["kind"] == "stop"], events
    except BaseException:
        print(server.proc.output())
        for proc in agents:
            print(proc.output())
        raise
    finally:
        agent.stop()
        server.proc.stop()


def test_an_agent_stopping_its_engines_on_exit_is_a_stop_not_a_failure(tmp_path: Path) -> None:
    (tmp_path / "llmgw.yaml").write_text(CONFIG)
    agent_port = free_port()
    low = free_port_block(5)
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp_path / "llmgw.yaml"),
        data_dir=tmp_path / "data",
    )  # fmt: skip
    agent = Proc(
        llmgw(
            "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", "node-r",
            "--gpus", "1x24GiB", "--weights-dir", str(tmp_path / "weights"),
            "--port-range", f"{low}-{low + 4}", "--stop-engines-on-exit",
        )
    )  # fmt: skip
    try:
        wait_for(lambda: len(ready_shards(server)) == 1, "the replica to be ready")
        [shard] = ready_shards(server)
        agent.popen.terminate()
        assert agent.popen.wait(30) == 0, agent.output()

        def events() -> list[dict[str, Any]]:
            found: list[dict[str, Any]] = httpx.get(
                f"{server.admin}/admin/api/events", params={"model": "steady"}, timeout=10
            ).json()["events"]
            return found

        wait_for(
            lambda: any("stopped by its agent" in e["message"] for e in events()),
            "the stop to be recorded",
        )
        # The stopped replica is not a failure (a replacement the controller may try on
        # the departing node is another matter).
        failed = [e for e in events() if e["kind"] == "failed" and shard["id"] in e["message"]]
        assert failed == [], events()
        assert "shutting down: stopping every engine" in agent.output()
        assert shard["pid"]  # and it is gone: the agent stopped it
        wait_for(lambda: not _alive(shard["pid"]), "the engine to be gone")
    except BaseException:
        print(server.proc.output())
        print(agent.output())
        raise
    finally:
        agent.stop()
        server.proc.stop()


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


SURPLUS_CONFIG = (
    "control: {heartbeat_interval: 0.3, unreachable_after: 1.5, lost_after: 60, "
    "reconcile_interval: 0.5, retry_base: 1, retry_max: 4, activation_timeout: 60, "
    "stop_grace: 5}\n"
    "router: {health: {interval: 0.5}}\n"
    "models:\n"
    "  - name: steady\n    weights: none\n    min_replicas: 1\n    max_replicas: 1\n"
    "    keep_alive: -1\n"
    "    profiles: [{name: sim, engine: sim, gpus: 1, engine_args: [--zero-delay]}]\n"
)


def replicas(server: Server) -> list[dict[str, Any]]:
    """Every node's replicas of `steady` that hold their GPU, with their node."""
    nodes = httpx.get(server.admin + "/admin/api/nodes", timeout=10).json()["nodes"]
    return [
        {**s, "node": n["id"]}
        for n in nodes
        for s in n["shards"]
        if s["state"] not in ("stopped", "failed")
    ]


def test_an_agent_back_after_its_replica_was_replaced_keeps_the_one_that_served_longest(
    tmp_path: Path,
) -> None:
    # The agent of the node serving `steady` stays away past unreachable_after: a
    # replacement starts on the other node. Back, it adopts its engine, which looks
    # new to it ("ready since now"); the surplus drained must be the replacement.
    (tmp_path / "llmgw.yaml").write_text(SURPLUS_CONFIG)
    agent_port = free_port()
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp_path / "llmgw.yaml"),
        data_dir=tmp_path / "data",
    )  # fmt: skip
    env = {"LLMGW_AGENT_STOP_ENGINES_ON_EXIT": "0"}
    argvs: dict[str, list[str]] = {}
    agents: dict[str, Proc] = {}
    lows: list[int] = []
    try:
        for name in ("node-r", "node-s"):
            low = free_port_block(5)
            lows.append(low)
            argvs[name] = llmgw(
                "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", name,
                "--gpus", "1x24GiB", "--weights-dir", str(tmp_path / name / "w"),
                "--state-dir", str(tmp_path / name / "s"), "--port-range", f"{low}-{low + 4}",
                "--adopt-grace", "60",
            )  # fmt: skip
            agents[name] = Proc(argvs[name], env=env)

        def one_ready() -> dict[str, Any] | None:
            ready = [r for r in replicas(server) if r["state"] == "ready"]
            return ready[0] if len(ready) == 1 else None

        first = wait_for(one_ready, "the replica to be ready", within=120)
        home, other = first["node"], ({"node-r", "node-s"} - {first["node"]}).pop()
        agents[home].popen.kill()
        agents[home].popen.wait(30)

        def replaced() -> bool:
            return any(r["node"] == other and r["state"] == "ready" for r in replicas(server))

        wait_for(replaced, "a replacement to be ready on the other node", within=120)
        agents[home] = Proc(argvs[home], env=env)

        def settled() -> list[dict[str, Any]] | None:
            left = replicas(server)
            return left if len(left) == 1 and left[0]["state"] == "ready" else None

        [kept] = wait_for(settled, "the surplus to be drained", within=120)
        assert (kept["id"], kept["pid"]) == (first["id"], first["pid"]), kept
        events = httpx.get(
            f"{server.admin}/admin/api/events", params={"model": "steady"}, timeout=10
        ).json()["events"]
        stops = [e["message"] for e in events if e["kind"] == "stop"]
        assert any(f"keeping {first['id']}" in m for m in stops), stops
    except BaseException:
        print(server.proc.output())
        for name, proc in agents.items():
            print(f"--- agent {name}\n{proc.output()}")
        raise
    finally:
        for proc in agents.values():
            proc.stop()
        server.proc.stop()
        # Engines outlive their agents: stop those the agents started.
        for low in lows:
            for port in range(low, low + 5):
                for pid in sim_pids(str(port)):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
