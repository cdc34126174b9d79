"""Failover benchmark: SIGKILL the leader under steady traffic; how long until the
standby leads, and how many client requests fail.

Per run: a fresh PostgreSQL database, two `llmgw server` processes on it (the
first leads), two agents that know both servers, a model with two sim replicas
(one per node). Two client threads send chat completions through the standby's
router without pause. Then the leader gets SIGKILL. Measured: the time from the
kill until the standby reports itself leader (`GET /admin/api/leader`, polled
every 20 ms), until both agents are connected to it, and the requests served
and failed through the standby from 1 s before the kill until 2 s after the
replicas were adopted. The lease TTL is 3 s (renewed every second).

Run: `.venv/bin/python bench/failover.py [--runs 3]` (needs PostgreSQL at
127.0.0.1:5432, or LLMGW_TEST_PG_URL). Writes the `failover` section of
bench/RESULTS.md unless `--no-write`.

Not guaranteed: the same numbers on a loaded machine; the agents' reconnect
and the time since the leader's last renewal (the lease runs out TTL after it) dominate
and both vary.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import secrets
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from procs import Proc, Server, free_port, free_port_block, llmgw
from sections import write_section

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


async def _sql(sql: str) -> None:
    conn = await asyncpg.connect(PG)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def wait_for(
    check: Callable[[], bool], what: str, within: float = 30.0, step: float = 0.02
) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except httpx.HTTPError:
            pass
        time.sleep(step)
    raise RuntimeError(f"timed out waiting for {what}")


def role(server: Server) -> str:
    data: dict[str, Any] = httpx.get(server.admin + "/admin/api/leader", timeout=5).json()
    return str(data["role"])


def connected(server: Server) -> list[str]:
    nodes = httpx.get(server.admin + "/admin/api/nodes", timeout=5).json()["nodes"]
    return sorted(n["id"] for n in nodes if n["connected"])


def ready(server: Server) -> int:
    status = httpx.get(server.admin + "/admin/api/models/steady", timeout=5).json()["status"]
    return int(status["ready_replicas"])


def one_run(tmp: Path) -> dict[str, float]:
    name = f"llmgw_b_{secrets.token_hex(4)}"
    asyncio.run(_sql(f"CREATE DATABASE {name}"))
    store = f"{PG.rsplit('/', 1)[0]}/{name}"
    (tmp / "llmgw.yaml").write_text(CONFIG)
    ports = [free_port(), free_port()]
    procs: list[Proc] = []

    def server(port: int) -> Server:
        s = Server(
            "--store", store, "--agent-listen", f"127.0.0.1:{port}",
            "--config", str(tmp / "llmgw.yaml"), wait_ready=False,
        )  # fmt: skip
        procs.append(s.proc)
        return s

    try:
        first = server(ports[0])
        wait_for(lambda: role(first) == "leader", "the first server to lead")
        second = server(ports[1])
        for node in ("node-1", "node-2"):
            low = free_port_block(10)
            procs.append(
                Proc(
                    llmgw(
                        "agent", "--server", f"127.0.0.1:{ports[0]}",
                        "--servers", f"127.0.0.1:{ports[1]}", "--node-id", node,
                        "--gpus", "2x24GiB", "--weights-dir", str(tmp / node),
                        "--state-dir", str(tmp / node / "state"),
                        "--stop-engines-on-exit",
                        "--port-range", f"{low}-{low + 9}",
                    )
                )
            )  # fmt: skip
        wait_for(lambda: ready(first) == 2, "two Ready replicas")
        wait_for(lambda: len(second.endpoints()) == 2, "the standby to follow")
        served, failed = [0], [0]
        samples: list[str] = []
        counting = threading.Event()
        stop = threading.Event()

        def client() -> None:
            with httpx.Client(timeout=30) as http:
                while not stop.is_set():
                    answer = http.post(
                        f"{second.url}/v1/chat/completions",
                        json={"model": "steady", "max_tokens": 3,
                              "messages": [{"role": "user", "content": "hi"}]},
                    )  # fmt: skip
                    if counting.is_set():
                        if answer.status_code == 200:
                            served[0] += 1
                        else:
                            failed[0] += 1
                            if len(samples) < 3:
                                samples.append(f"{answer.status_code} {answer.text[:300]}")

        clients = [threading.Thread(target=client) for _ in range(2)]
        for thread in clients:
            thread.start()
        try:
            counting.set()
            time.sleep(1.0)
            killed = time.monotonic()
            os.kill(first.proc.popen.pid, signal.SIGKILL)
            wait_for(lambda: role(second) == "leader", "the standby to lead")
            takeover = time.monotonic() - killed
            wait_for(lambda: connected(second) == ["node-1", "node-2"], "agents to move")
            agents = time.monotonic() - killed
            wait_for(lambda: ready(second) == 2, "adoption")
            adopted = time.monotonic() - killed
            time.sleep(2.0)
        finally:
            stop.set()
            for thread in clients:
                thread.join(30)
        for sample in samples:
            print(f"failed: {sample}", file=sys.stderr)
        return {
            "takeover": takeover,
            "agents": agents,
            "adopted": adopted,
            "served": served[0],
            "failed": failed[0],
        }
    finally:
        if os.environ.get("LLMGW_BENCH_LOGS"):
            for i, proc in enumerate(procs):
                Path(os.environ["LLMGW_BENCH_LOGS"], f"proc{i}.log").write_text(proc.output())
        for proc in reversed(procs):
            proc.stop()
        asyncio.run(_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    results = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="llmgw-failover-") as tmp:
            results.append(one_run(Path(tmp)))
        print(f"run {i + 1}: {results[-1]}", file=sys.stderr)
    rows = "\n".join(
        f"| {i + 1} | {r['takeover']:.2f} | {r['agents']:.2f} | {r['adopted']:.2f} "
        f"| {int(r['served'])} | {int(r['failed'])} |"
        for i, r in enumerate(results)
    )
    median = statistics.median(r["takeover"] for r in results)
    lost = int(sum(r["failed"] for r in results))
    requests = (
        "Requests through the standby never failed: its router keeps the endpoints it "
        "followed,\nand the engines keep serving while the control plane changes hands; the "
        "new leader\nadopts the running replicas rather than starting new ones."
        if lost == 0
        else f"{lost} requests through the standby failed (see the table and the samples "
        "printed on stderr)."
    )
    body = f"""## Failover: the leader is killed under traffic

Command: `.venv/bin/python bench/failover.py --runs {args.runs}`
({os.cpu_count()} cores, Python {platform.python_version()}, PostgreSQL store, lease TTL {TTL:g} s,
two servers, two agents, two sim replicas, two client threads through the standby's router).

| run | standby leads (s) | agents moved (s) | replicas adopted (s) | served | failed |
|--:|--:|--:|--:|--:|--:|
{rows}

Median takeover {median:.2f} s against the target of TTL + 1 s = {TTL + 1:g} s. The standby
tries to take the lease every TTL/3 and also wakes just after the expiry of the lease it
last read, so a takeover lands about TTL after the leader's last renewal (plus the store's
round trip): at most TTL after the kill, less the time since that renewal.
{requests}
"""
    print(body)
    if not args.no_write:
        write_section("failover", body)


if __name__ == "__main__":
    main()
