"""Node loss benchmark: restart an agent, kill or freeze a node, under steady traffic.

Three scenarios, each on a fresh `llmgw server` (SQLite) with real agents and
`llmgw sim` engines on 127.0.0.1, a model pinned to one replica (`min_replicas:
1`, `max_replicas: 1`) and two client threads sending chat completions
(non-streaming, max_tokens 3) through the router without pause:

- `restart`: one node; its agent gets SIGTERM (then, in the next run, SIGKILL)
  and is started again at once with the same state directory, as a service
  manager would. Engines outlive the agent and the new agent adopts them.
  Measured: requests served and failed from the signal until 2 s after the
  replica is back in the router, the longest request, and whether the replica
  is the same one (adopted, not reloaded).
- `kill`: two nodes; the node holding the replica loses its agent and its
  engine (SIGKILL both). Measured: failed requests, the longest request, and
  the time from the kill until the replica leaves the router, the node is
  unreachable, and the replacement on the other node serves its first request.
- `freeze`: as `kill`, but the agent and engine get SIGSTOP (a node in doubt:
  connections stay open, nothing answers), then SIGCONT once the replacement
  serves. Measured as `kill`, plus the time from SIGCONT until exactly one
  replica is left.

Control-plane timings are the defaults (heartbeat every 5 s, unreachable after
15 s, lost after 60 s), so the time to a replacement is what a user gets out of
the box; `--unreachable-after` shortens it.

Run: `.venv/bin/python bench/node_loss.py [--runs 3]`. Writes the `node-loss`
section of bench/RESULTS.md unless `--no-write`.

Not guaranteed: the same numbers on a loaded machine (process start-up of the
agent and the sim dominate the restart and the replacement).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import os
import platform
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from procs import Proc, Server, free_port, free_port_block, llmgw
from sections import write_section

CONFIG = """
control:
  heartbeat_interval: {heartbeat:g}
  unreachable_after: {unreachable:g}
  lost_after: {lost:g}
  activation_timeout: 600
models:
  - name: m
    weights: none
    min_replicas: 1
    max_replicas: 1
    profiles: [{{name: one-gpu, engine: sim, gpus: 1}}]
"""


def wait_for(check: Callable[[], Any], what: str, within: float = 180.0) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            found = check()
            if found:
                return found
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


@dataclass
class Sample:
    began: float
    ended: float
    status: int
    replica: str


@dataclass
class Load:
    """Client threads sending one request after another; every outcome kept."""

    url: str
    threads: int = 2
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Load:
        self._workers = [threading.Thread(target=self._run) for _ in range(self.threads)]
        for worker in self._workers:
            worker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(700)

    def _run(self) -> None:
        body = {"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
        with httpx.Client(timeout=700) as client:
            while not self._stop.is_set():
                began = time.monotonic()
                try:
                    answer = client.post(f"{self.url}/v1/chat/completions", json=body)
                    status, replica = answer.status_code, answer.headers.get("x-llmgw-replica", "")
                    if status != 200 and len(self.errors) < 5:
                        self.errors.append(f"{status} {answer.text[:300]}")
                except httpx.HTTPError as exc:
                    status, replica = 0, ""
                    if len(self.errors) < 5:
                        self.errors.append(repr(exc))
                self.samples.append(Sample(began, time.monotonic(), status, replica))

    def first_served_by(self, replica: str, after: float) -> float | None:
        ends = [
            s.ended for s in self.samples if s.status == 200 and s.replica == replica
            and s.began >= after
        ]  # fmt: skip
        return min(ends) if ends else None

    def window(self, start: float, end: float) -> tuple[int, int, float]:
        """Served, failed and the longest request among those in flight in [start, end]."""
        inside = [s for s in self.samples if s.ended >= start and s.began <= end]
        served = sum(1 for s in inside if s.status == 200)
        longest = max((s.ended - s.began for s in inside), default=0.0)
        return served, len(inside) - served, longest


def engine_pids(ports: range) -> list[int]:
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


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


class Fleet:
    """A server and agents (`node-a`, `node-b`, ...), each with its own port block."""

    def __init__(self, tmp: Path, nodes: int, config: str) -> None:
        (tmp / "llmgw.yaml").write_text(config)
        self.tmp = tmp
        self.agent_port = free_port()
        self.server = Server(
            "--agent-listen", f"127.0.0.1:{self.agent_port}",
            "--config", str(tmp / "llmgw.yaml"), data_dir=tmp / "data",
        )  # fmt: skip
        self.ports: dict[str, range] = {}
        self.agents: dict[str, Proc] = {}
        for name in ("node-a", "node-b")[:nodes]:
            low = free_port_block(10)
            self.ports[name] = range(low, low + 10)
            self.agents[name] = self.start_agent(name)

    def argv(self, name: str) -> list[str]:
        low = self.ports[name].start
        return llmgw(
            "agent", "--server", f"127.0.0.1:{self.agent_port}", "--node-id", name,
            "--gpus", "1x24GiB", "--weights-dir", str(self.tmp / name / "weights"),
            "--state-dir", str(self.tmp / name / "state"),
            "--port-range", f"{low}-{low + 9}",
        )  # fmt: skip

    def start_agent(self, name: str) -> Proc:
        # Engines outlive the agent: the production default.
        proc = Proc(self.argv(name), env={"LLMGW_AGENT_STOP_ENGINES_ON_EXIT": "0"})
        self.agents[name] = proc
        return proc

    def replicas(self) -> list[dict[str, Any]]:
        answer = httpx.get(f"{self.server.admin}/admin/api/models/m", timeout=10)
        found: list[dict[str, Any]] = [
            r
            for r in answer.json()["status"]["replicas"]
            if r["state"] not in ("stopped", "failed", "stopping", "lost")
        ]
        return found

    def node_state(self, name: str) -> str:
        nodes = httpx.get(f"{self.server.admin}/admin/api/nodes", timeout=10).json()["nodes"]
        return next((str(n["state"]) for n in nodes if n["id"] == name), "absent")

    def routed(self) -> set[str]:
        return {str(e["id"]) for e in self.server.endpoints()}

    def close(self) -> None:
        for name, proc in self.agents.items():
            signal_all([proc.popen.pid, *engine_pids(self.ports[name])], signal.SIGCONT)
            proc.stop()
            signal_all(engine_pids(self.ports[name]), signal.SIGKILL)
        self.server.proc.stop()


@contextlib.contextmanager
def fleet(nodes: int, config: str) -> Iterator[Fleet]:
    with tempfile.TemporaryDirectory(prefix="llmgw-nodeloss-") as tmp:
        running = Fleet(Path(tmp), nodes, config)
        try:
            wait_for(
                lambda: all(running.node_state(n) == "ready" for n in running.agents),
                "every agent to register",
            )
            yield running
        except BaseException:
            if os.environ.get("LLMGW_BENCH_LOGS"):
                logs = Path(os.environ["LLMGW_BENCH_LOGS"])
                (logs / "server.log").write_text(running.server.proc.output())
                for name, proc in running.agents.items():
                    (logs / f"{name}.log").write_text(proc.output())
            raise
        finally:
            running.close()


def ready_replica(f: Fleet) -> dict[str, Any]:
    replica: dict[str, Any] = wait_for(
        lambda: next((r for r in f.replicas() if r["state"] == "ready"), None), "a ready replica"
    )
    wait_for(lambda: replica["id"] in f.routed(), "the replica in the router")
    return replica


def registered_at(f: Fleet, name: str) -> str:
    nodes = httpx.get(f"{f.server.admin}/admin/api/nodes", timeout=10).json()["nodes"]
    return next((str(n["registered_at"]) for n in nodes if n["id"] == name), "")


def restart_run(how: str, config: str) -> dict[str, Any]:
    with fleet(1, config) as f:
        first = ready_replica(f)
        before = registered_at(f, "node-a")
        with Load(f.server.url) as load:
            wait_for(lambda: len(load.samples) >= 20, "requests to flow")
            agent = f.agents["node-a"]
            hit = time.monotonic()
            agent.popen.send_signal(signal.SIGTERM if how == "SIGTERM" else signal.SIGKILL)
            agent.popen.wait(30)
            f.start_agent("node-a")
            wait_for(
                lambda: registered_at(f, "node-a") != before and first["id"] in f.routed(),
                "the restarted agent to register and its replica to be routed",
            )
            back = time.monotonic()
            time.sleep(2.0)
        served, failed, longest = load.window(hit, back + 2.0)
        return {
            "scenario": f"agent restart ({how})",
            "served": served,
            "failed": failed,
            "longest": longest,
            "back": back - hit,
            "same_replica": [r["id"] for r in f.replicas()] == [first["id"]],
            "errors": load.errors,
        }


def loss_run(how: str, config: str) -> dict[str, Any]:
    """`how`: kill (SIGKILL agent and engine) or freeze (SIGSTOP, later SIGCONT)."""
    with fleet(2, config) as f:
        first = ready_replica(f)
        victim = first["node"]
        other = "node-b" if victim == "node-a" else "node-a"
        pids = [f.agents[victim].popen.pid, *engine_pids(f.ports[victim])]
        with Load(f.server.url) as load:
            wait_for(lambda: len(load.samples) >= 20, "requests to flow")
            hit = time.monotonic()
            signal_all(pids, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
            # One poll loop, so each moment is seen when it happens, whatever the order.
            seen: dict[str, float] = {}
            replacement = ""
            deadline = hit + 600
            while "serving" not in seen and time.monotonic() < deadline:
                now = time.monotonic()
                with contextlib.suppress(httpx.HTTPError):
                    if "withdrawn" not in seen and first["id"] not in f.routed():
                        seen["withdrawn"] = now
                    if "unreachable" not in seen and f.node_state(victim) != "ready":
                        seen["unreachable"] = now
                    if not replacement:
                        replacement = next(
                            (r["id"] for r in f.replicas() if r["node"] == other), ""
                        )
                if replacement:
                    served_at = load.first_served_by(replacement, hit)
                    if served_at is not None:
                        seen["serving"] = served_at
                time.sleep(0.02)
            if "serving" not in seen:
                raise RuntimeError(f"no replacement served within 600 s: {seen}")
            withdrawn, unreachable, serving = (
                seen.get("withdrawn", math.nan),
                seen.get("unreachable", math.nan),
                seen["serving"],
            )
            end = serving
            settled = None
            if how == "freeze":
                resumed = time.monotonic()
                signal_all(pids, signal.SIGCONT)

                def one_left() -> bool:
                    left = f.replicas()
                    return len(left) == 1 and f.routed() == {left[0]["id"]}

                wait_for(one_left, "exactly one replica to remain")
                settled = time.monotonic() - resumed
                end = time.monotonic()
            time.sleep(2.0)
        served, failed, longest = load.window(hit, end + 2.0)
        return {
            "scenario": f"node {'killed' if how == 'kill' else 'frozen'}",
            "served": served,
            "failed": failed,
            "longest": longest,
            "withdrawn": withdrawn - hit,
            "unreachable": unreachable - hit,
            "serving": serving - hit,
            "settled": settled,
            "errors": load.errors,
        }


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--heartbeat", type=float, default=5.0)
    parser.add_argument("--unreachable-after", type=float, default=15.0)
    parser.add_argument("--lost-after", type=float, default=60.0)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    config = CONFIG.format(
        heartbeat=args.heartbeat, unreachable=args.unreachable_after, lost=args.lost_after
    )
    restarts: list[dict[str, Any]] = []
    losses: list[dict[str, Any]] = []
    for i in range(args.runs):
        for how in ("SIGTERM", "SIGKILL"):
            restarts.append(restart_run(how, config))
            print(f"run {i + 1}: {restarts[-1]}", file=sys.stderr)
        for how in ("kill", "freeze"):
            losses.append(loss_run(how, config))
            print(f"run {i + 1}: {losses[-1]}", file=sys.stderr)
    for result in restarts + losses:
        for error in result["errors"]:
            print(f"failed ({result['scenario']}): {error}", file=sys.stderr)
    restart_rows = "\n".join(
        f"| {r['scenario']} | {r['served']} | {r['failed']} | {r['longest']:.2f} "
        f"| {r['back']:.2f} | {'yes' if r['same_replica'] else 'no'} |"
        for r in restarts
    )
    loss_rows = "\n".join(
        f"| {r['scenario']} | {r['served']} | {r['failed']} | {r['longest']:.2f} "
        f"| {r['withdrawn']:.2f} | {r['unreachable']:.2f} | {r['serving']:.2f} "
        f"| {_seconds(r['settled'])} |"
        for r in losses
    )
    failed = sum(r["failed"] for r in restarts + losses)
    serving = [r["serving"] for r in losses]
    command = "`" + " ".join([".venv/bin/python", "bench/node_loss.py", *sys.argv[1:]]) + "`"
    defaults = (args.heartbeat, args.unreachable_after, args.lost_after) == (5.0, 15.0, 60.0)
    which = " (the defaults)" if defaults else ""
    body = f"""## Node loss: an agent restarted, a node killed or frozen, under traffic

Command: {command}
({os.cpu_count()} cores, Python {platform.python_version()}, SQLite store, everything on
127.0.0.1; control-plane timings: heartbeat every {args.heartbeat:g} s, unreachable after
{args.unreachable_after:g} s, lost after {args.lost_after:g} s{which}; a model pinned to one
sim replica; two client threads sending non-streaming chat completions without pause).
Served/failed count the requests in flight from the signal until 2 s after the end of
the scenario; "longest" is the longest of those requests, in seconds.

### (a) Restarting the agent (engines outlive it; the new agent adopts them)

"back" is the time from the signal until the restarted agent has registered and its
replica is in the router again; "same replica" says the replica was adopted, not
started again.

| scenario | served | failed | longest (s) | back (s) | same replica |
|---|--:|--:|--:|--:|--:|
{restart_rows}

### (b, c) Losing the node that holds the only replica (two-node fleet)

Seconds from the signal until the replica left the router ("out"), the node turned
unreachable, and the replacement on the other node served its first request ((c):
the time from a node's loss to its replacement serving). For the frozen node, "one
left" is the time from SIGCONT until the surplus replica was retired and exactly
one remained.

| scenario | served | failed | longest (s) | out | unreachable | replacement serves | one left |
|---|--:|--:|--:|--:|--:|--:|--:|
{loss_rows}

Failed requests over all runs: {failed}. Median time from a node's loss to its
replacement serving: {statistics.median(serving):.2f} s, of which the wait for the
node to miss its heartbeats is most: `unreachable_after` counts from the node's last
heartbeat, which came up to one heartbeat interval before the signal. A killed node's
replica leaves the router at once (its agent's stream closes), a frozen node's when it
turns unreachable; requests meanwhile wait as in an activation, and requests already
waiting on the frozen engine are moved to the replacement, so the longest request is
about the time to the replacement. The engine start itself (sim) takes about a second
or two here. A shorter `unreachable_after` shortens the wait and makes a slow network
look like a lost node sooner.
"""
    print(body)
    if not args.no_write:
        write_section("node-loss", body)


if __name__ == "__main__":
    main()
