"""Two `llmgw server` processes on one PostgreSQL store, real agents and sim engines.

Each test gets a database of its own on the real PostgreSQL of this machine.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import procs
import pytest
from procs import Proc, Server, free_port, free_port_block, llmgw


def wait_for(check: Callable[[], object], what: str, within: float = 30.0) -> Any:
    """`procs.wait_for` with this module's deadline and polling interval."""
    return procs.wait_for(check, what, within, every=0.05)


PG = os.environ.get("LLMGW_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
TTL = 3.0
CONFIG = f"""
control:
  heartbeat_interval: 0.3
  unreachable_after: 1.5
  lost_after: 6
  reconcile_interval: 0.5
  lease_ttl: {TTL}
  placement: spread
router: {{health: {{interval: 0.5}}}}
models:
  - name: steady
    weights: none
    min_replicas: 2
    max_replicas: 2
    profiles: [{{name: one-gpu, engine: sim, gpus: 1}}]
"""


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _admin(sql: str) -> None:
    conn = await asyncpg.connect(PG)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def _fetch(url: str, sql: str) -> list[Any]:
    conn = await asyncpg.connect(url)
    try:
        return list(await conn.fetch(sql))
    finally:
        await conn.close()


@pytest.fixture
def database() -> Iterator[str]:
    name = f"llmgw_t_{secrets.token_hex(4)}"
    try:
        _run(_admin(f"CREATE DATABASE {name}"))
    except OSError as exc:
        pytest.fail(f"PostgreSQL is not running on 127.0.0.1:5432 ({exc}); failover tests need it")
    base = PG.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    _run(_admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


def leader(server: Server) -> dict[str, Any]:
    data: dict[str, Any] = httpx.get(server.admin + "/admin/api/leader", timeout=5).json()
    return data


def start_server(tmp: Path, store: str, agent_port: int) -> Server:
    return Server(
        "--store", store, "--agent-listen", f"127.0.0.1:{agent_port}",
        "--config", str(tmp / "llmgw.yaml"), wait_ready=False,
    )  # fmt: skip


def start_agent(node: str, servers: list[int], tmp: Path) -> Proc:
    low = free_port_block(10)
    first, *rest = servers
    more = ["--servers", ",".join(f"127.0.0.1:{p}" for p in rest)] if rest else []
    return Proc(
        llmgw(
            "agent", "--server", f"127.0.0.1:{first}", *more, "--node-id", node,
            "--gpus", "2x24GiB", "--weights-dir", str(tmp / node),
            "--port-range", f"{low}-{low + 9}",
        )
    )  # fmt: skip


def servers(server: Server) -> list[tuple[str, str]]:
    """(server id, role) of every server on the store, as `server` lists them."""
    listed = httpx.get(server.admin + "/admin/api/servers", timeout=5).json()["servers"]
    return [(s["server"], s["role"]) for s in listed]


def replicas(server: Server, model: str) -> list[dict[str, Any]]:
    status = httpx.get(f"{server.admin}/admin/api/models/{model}", timeout=5).json()["status"]
    found: list[dict[str, Any]] = status["replicas"]
    return found


def ready(server: Server, model: str) -> list[dict[str, Any]]:
    return [r for r in replicas(server, model) if r["state"] == "ready"]


def chat(server: Server, model: str) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        timeout=30,
    )


def test_killing_the_leader_hands_over_without_a_failed_request(
    tmp_path: Path, database: str
) -> None:
    (tmp_path / "llmgw.yaml").write_text(CONFIG)
    ports = [free_port(), free_port()]
    first = start_server(tmp_path, database, ports[0])
    procs: list[Proc] = [first.proc]
    try:
        wait_for(lambda: leader(first)["role"] == "leader", "the first server to lead")
        second = start_server(tmp_path, database, ports[1])
        procs.append(second.proc)
        assert leader(second)["role"] == "standby"
        # A standby names the leader once it has read the lease (its first look can come
        # after it answers; on a loaded machine that is a moment later).
        wait_for(
            lambda: leader(second)["leader"] == leader(first)["server"],
            "the standby to name the leader",
        )
        ids = [leader(first)["server"], leader(second)["server"]]
        # Both servers list both, the leader first.
        for server in (first, second):
            wait_for(
                lambda s=server: servers(s) == [(ids[0], "leader"), (ids[1], "standby")],
                "both servers to be listed",
            )
        for node in ("node-1", "node-2"):
            procs.append(start_agent(node, ports, tmp_path))
        wait_for(lambda: len(ready(first, "steady")) == 2, "two Ready replicas")
        before = sorted(r["id"] for r in ready(first, "steady"))
        # The standby's router follows what the leader published.
        wait_for(
            lambda: sorted(e["id"] for e in second.endpoints()) == before,
            "the standby to follow the endpoints",
        )
        assert chat(second, "steady").status_code == 200

        failures: list[str] = []
        served = 0
        stop = threading.Event()

        def traffic() -> None:
            nonlocal served
            while not stop.is_set():
                answer = chat(second, "steady")
                if answer.status_code == 200:
                    served += 1
                else:
                    failures.append(f"{answer.status_code} {answer.text}")
                time.sleep(0.02)

        client = threading.Thread(target=traffic)
        client.start()
        try:
            time.sleep(0.5)
            killed_at = time.monotonic()
            os.kill(first.proc.popen.pid, signal.SIGKILL)
            wait_for(lambda: leader(second)["role"] == "leader", "the standby to lead", 4 * TTL)
            took = time.monotonic() - killed_at
            wait_for(
                lambda: (
                    sorted(
                        n["id"]
                        for n in httpx.get(second.admin + "/admin/api/nodes", timeout=5).json()[
                            "nodes"
                        ]
                        if n["connected"]
                    )
                    == ["node-1", "node-2"]
                ),
                "both agents to move to the new leader",
            )
            wait_for(lambda: len(ready(second, "steady")) == 2, "the replicas to be adopted")
            time.sleep(1.0)
        finally:
            stop.set()
            client.join(30)
        print(f"takeover after {took:.2f} s; {served} requests served, {len(failures)} failed")
        assert failures == []
        assert served > 0
        # Adopted, not restarted: the same replicas, and no start in the new term.
        assert sorted(r["id"] for r in ready(second, "steady")) == before
        events = httpx.get(second.admin + "/admin/api/events", timeout=5).json()["events"]
        assert not [e for e in events if e["kind"] == "start"], events
        assert leader(second)["epoch"] == 2
        # The killed server stays listed, as gone, until the leader forgets it (an hour).
        wait_for(
            lambda: servers(second) == [(ids[1], "leader"), (ids[0], "gone")],
            "the killed server to show as gone",
        )
    finally:
        for proc in reversed(procs):
            proc.stop()


def test_a_paused_leader_that_wakes_up_places_nothing(tmp_path: Path, database: str) -> None:
    (tmp_path / "llmgw.yaml").write_text(CONFIG.replace("min_replicas: 2", "min_replicas: 1"))
    ports = [free_port(), free_port()]
    first = start_server(tmp_path, database, ports[0])
    procs: list[Proc] = [first.proc]
    try:
        wait_for(lambda: leader(first)["role"] == "leader", "the first server to lead")
        second = start_server(tmp_path, database, ports[1])
        procs.append(second.proc)
        procs.append(start_agent("node-1", ports, tmp_path))
        wait_for(lambda: len(ready(first, "steady")) == 1, "a Ready replica")
        [replica] = ready(first, "steady")

        first.proc.popen.send_signal(signal.SIGSTOP)
        try:
            wait_for(lambda: leader(second)["role"] == "leader", "the standby to lead", 4 * TTL)
            wait_for(lambda: len(ready(second, "steady")) == 1, "the replica to be adopted")
        finally:
            first.proc.popen.send_signal(signal.SIGCONT)
        wait_for(lambda: leader(first)["role"] == "standby", "the woken leader to step down")
        time.sleep(TTL)
        # Nothing was placed twice, and every published row is the new leader's.
        assert [r["id"] for r in ready(second, "steady")] == [replica["id"]]
        rows = _run(_fetch(database, "SELECT DISTINCT epoch FROM replica_endpoints"))
        assert [r["epoch"] for r in rows] == [2]
        woken = httpx.get(first.admin + "/admin/api/events", timeout=5).json()["events"]
        assert [e["kind"] for e in woken if e["kind"] == "start"] == ["start"]
        assert "stepping down" in first.proc.output() or "lost the lease" in first.proc.output()
    finally:
        for proc in reversed(procs):
            if proc is first.proc:
                proc.popen.send_signal(signal.SIGCONT)
            proc.stop()


def test_a_standby_refuses_agents_and_names_the_leader(tmp_path: Path, database: str) -> None:
    (tmp_path / "llmgw.yaml").write_text(CONFIG)
    ports = [free_port(), free_port()]
    first = start_server(tmp_path, database, ports[0])
    procs: list[Proc] = [first.proc]
    try:
        wait_for(lambda: leader(first)["role"] == "leader", "the first server to lead")
        second = start_server(tmp_path, database, ports[1])
        procs.append(second.proc)
        # An agent that knows only the standby is refused with a readable reason.
        lonely = start_agent("node-9", [ports[1]], tmp_path)
        procs.append(lonely)
        # A standby that has not read the lease yet says so; once it has, it names
        # the leader's agent listener.
        wait_for(
            lambda: (
                f"is a standby; the leader is {leader(first)['server']}, its agent listener "
                f"is 127.0.0.1:{ports[0]}" in lonely.output()
            ),
            "the agent to log the refusal naming the leader",
        )
        nodes = httpx.get(second.admin + "/admin/api/nodes", timeout=5).json()["nodes"]
        assert nodes == []
        metrics = httpx.get(first.admin + "/metrics", timeout=5).text
        assert f'llmgw_leader{{server="{leader(first)["server"]}"}} 1.0' in metrics
        standby_metrics = httpx.get(second.admin + "/metrics", timeout=5).text
        assert f'llmgw_leader{{server="{leader(second)["server"]}"}} 0.0' in standby_metrics
        # A server that stops cleanly leaves the list at once.
        ids = [leader(first)["server"], leader(second)["server"]]
        wait_for(
            lambda: servers(first) == [(ids[0], "leader"), (ids[1], "standby")],
            "both servers to be listed",
        )
        # For alerts: the servers by role, as the leader last read them (every TTL/3).
        wait_for(
            lambda: (
                'llmgw_servers{role="standby"} 1.0'
                in httpx.get(first.admin + "/metrics", timeout=5).text
            ),
            "the standby to be counted in the metrics",
        )
        assert second.proc.stop() == 0
        assert servers(first) == [(ids[0], "leader")]
    finally:
        for proc in reversed(procs):
            proc.stop()
