"""Agent restart benchmark: SIGKILL or SIGTERM an agent under steady traffic and
restart it at once; how many requests fail, how long the longest one waits, and
whether the engine is adopted (same process) rather than reloaded.

Per run: one `llmgw server` (SQLite), one agent, one pinned sim model with one
replica, two client threads sending chat completions through the router without
pause. The agent is killed (SIGKILL, then in a second phase SIGTERM, which leaves
its engines running) and started again immediately, as a service manager
would. Measured per phase: the time from the kill until the new agent has
registered with the engine adopted, the requests served and failed from 1 s
before the kill until 2 s after the re-registration, the longest request in
that window, and whether the replica's pid is unchanged.

Run: `.venv/bin/python bench/agent_restart.py [--runs 3]`. Writes the
`agent-restart` section of bench/RESULTS.md unless `--no-write`.

Not guaranteed: the same numbers on a loaded machine; the new agent's start
(Python imports, gRPC) dominates the gap, and while the agent's stream is down
the control plane keeps the node's replicas out of the routers, so requests
wait for it instead of failing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from procs import Proc, Server, free_port, free_port_block, llmgw
from sections import write_section

CONFIG = """
control:
  heartbeat_interval: 0.3
  unreachable_after: 15
  lost_after: 30
  reconcile_interval: 0.5
router: {health: {interval: 0.5}}
models:
  - name: steady
    weights: none
    min_replicas: 1
    keep_alive: -1
    profiles: [{name: sim, engine: sim, gpus: 1, engine_args: [--zero-delay]}]
"""


def wait_for(check: Callable[[], bool], what: str, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"timed out waiting for {what}")


def node(server: Server) -> dict[str, Any]:
    nodes = httpx.get(server.admin + "/admin/api/nodes", timeout=5).json()["nodes"]
    for found in nodes:
        if found["id"] == "node-b":
            result: dict[str, Any] = found
            return result
    return {"shards": [], "registered_at": None, "connected": False}


def ready_pids(server: Server) -> list[int]:
    return [s["pid"] for s in node(server)["shards"] if s["state"] == "ready"]


class Clients:
    """Two threads of back-to-back chat requests; counts only while `counting`."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.served = 0
        self.failed = 0
        self.longest = 0.0
        self.samples: list[str] = []
        self.counting = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run) for _ in range(2)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def reset(self) -> None:
        with self._lock:
            self.served = self.failed = 0
            self.longest = 0.0

    def _run(self) -> None:
        with httpx.Client(timeout=60) as http:
            while not self._stop.is_set():
                began = time.monotonic()
                try:
                    answer = http.post(
                        f"{self.url}/v1/chat/completions",
                        json={"model": "steady", "max_tokens": 3,
                              "messages": [{"role": "user", "content": "hi"}]},
                    )  # fmt: skip
                    ok, text = answer.status_code == 200, f"{answer.status_code} {answer.text}"
                except httpx.HTTPError as exc:
                    ok, text = False, repr(exc)
                took = time.monotonic() - began
                if not self.counting.is_set():
                    continue
                with self._lock:
                    self.longest = max(self.longest, took)
                    if ok:
                        self.served += 1
                    else:
                        self.failed += 1
                        if len(self.samples) < 3:
                            self.samples.append(text[:300])


def one_run(tmp: Path) -> list[dict[str, Any]]:
    (tmp / "llmgw.yaml").write_text(CONFIG)
    agent_port = free_port()
    low = free_port_block(5)
    env = {
        "LLMGW_AGENT_STATE_DIR": str(tmp / "agent-state"),
        "LLMGW_AGENT_STOP_ENGINES_ON_EXIT": "0",
    }
    argv = llmgw(
        "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", "node-b",
        "--gpus", "1x24GiB", "--weights-dir", str(tmp / "weights"),
        "--port-range", f"{low}-{low + 4}",
    )  # fmt: skip
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp / "llmgw.yaml"),
        data_dir=tmp / "data",
    )  # fmt: skip
    agents = [Proc(argv, env=env)]
    clients = Clients(server.url)
    phases: list[dict[str, Any]] = []
    try:
        wait_for(lambda: len(ready_pids(server)) == 1, "the replica to be ready")
        [pid] = ready_pids(server)
        clients.start()
        for how in (signal.SIGKILL, signal.SIGTERM):
            clients.reset()
            clients.counting.set()
            time.sleep(1.0)
            before = node(server)["registered_at"]
            killed = time.monotonic()
            agents[-1].popen.send_signal(how)
            agents[-1].popen.wait(30)
            agents.append(Proc(argv, env=env))
            wait_for(
                lambda b=before: node(server)["registered_at"] != b and node(server)["connected"],
                "the new agent to register",
            )
            back = time.monotonic() - killed
            time.sleep(2.0)
            clients.counting.clear()
            phases.append(
                {
                    "signal": how.name,
                    "back": back,
                    "served": clients.served,
                    "failed": clients.failed,
                    "longest": clients.longest,
                    "same_pid": ready_pids(server) == [pid],
                }
            )
        return phases
    finally:
        clients.stop()
        for sample in clients.samples:
            print(f"failed: {sample}", file=sys.stderr)
        # The last agent leaves its engine running: stop it through its state file.
        for state in (tmp / "agent-state").glob("engines/*/state.json"):
            for engine in json.loads(state.read_text())["engines"]:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(engine["pid"], signal.SIGKILL)
        for proc in reversed(agents):
            proc.stop()
        server.proc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="llmgw-agent-restart-") as tmp:
            phases = one_run(Path(tmp))
        for phase in phases:
            results.append({"run": i + 1, **phase})
            print(f"run {i + 1}: {phase}", file=sys.stderr)
    rows = "\n".join(
        f"| {r['run']} | {r['signal']} | {r['back']:.2f} | {r['served']} | {r['failed']} "
        f"| {r['longest']:.2f} | {'yes' if r['same_pid'] else 'NO'} |"
        for r in results
    )
    failed = sum(r["failed"] for r in results)
    longest = statistics.median(r["longest"] for r in results)
    body = f"""## Agent restart under load

Command: `.venv/bin/python bench/agent_restart.py --runs {args.runs}`
({os.cpu_count()} cores, Python {platform.python_version()}, SQLite store, one server, one
agent restarted at once after SIGKILL and after SIGTERM, one pinned sim replica, two client
threads through the router).

| run | signal | agent back (s) | served | failed | longest request (s) | same engine pid |
|--:|:--|--:|--:|--:|--:|:--|
{rows}

Failed requests in all runs: {failed} (target: 0). Median longest request {longest:.2f} s.
The engine outlives its agent (its own session, output to a log file, no parent-death
signal) and the restarted agent re-adopts it from its state file, so the replica is never
reloaded. While the agent's stream is down the control plane keeps the node's replicas out
of the routers; requests wait for the agent to come back (the longest request is about
the agent's start-up time) rather than fail.
"""
    print(body)
    if not args.no_write:
        write_section("agent-restart", body)


if __name__ == "__main__":
    main()
