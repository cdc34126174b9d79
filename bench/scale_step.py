"""Scaling on a load step: how soon the added replica serves, per load target.

One `llmgw server` (control plane, default `control:` and router settings) and one
`llmgw agent` (`--gpus 4x24GiB`) serve two catalog models that differ only in their
load target: `by-flight` (`target_in_flight: 4`) and `by-queue`
(`target_queue_depth: 2`). Both are `llmgw sim --itl 0.02 --max-running 4
--load-time L` engines (a replica runs four sequences at once; more wait in the
engine, as in a full vLLM batch), min_replicas 1, max_replicas 2,
scale_down_delay 3 s.

A round, for one model with its one replica Ready: CLIENTS client threads start
at once (the step, at t0), each sending streaming chat requests (max_tokens 40,
about 0.8 s each) back to back. Timed from t0: the `scale` event that adds the
replica (the reconciler's decision; from GET /admin/api/events) and the first
response headers from the new replica (`x-llmgw-replica`: it serves). Then the
clients stop and the model goes back to one replica before the next round. Rounds
alternate between the models.

target_in_flight reacts when a request starts (the router tells the controller at
once); target_queue_depth reads what the engines report on their /metrics
(`router.routing.metrics_interval`, 1 s) and the routers' queues, which reach the
leader with the demand sync (1 s). Results go to bench/RESULTS.md between the
`scale-step` markers; `--no-write` only prints.

Not guaranteed: the numbers hold for this machine only; on 2 cores the clients,
the server, the agent and the engines share the CPU.
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from activation import (
    HOST,
    LLMGW,
    BenchError,
    Processes,
    _cpu,
    _free_port,
    _get_json,
    _status,
    _tree,
    wait_until,
)
from sections import write_section

MODELS = {"by-flight": "target_in_flight: 4", "by-queue": "target_queue_depth: 2"}
SIM_ARGS = ["--itl", "0.02", "--max-running", "4"]


@dataclass
class Round:
    model: str
    decided: float  # s after the step: the scale event
    serving: float  # s after the step: first response headers from the new replica


class Fleet:
    def __init__(self, procs: Processes, tmp: Path, load_time: float) -> None:
        self.procs = procs
        self.port = _free_port()
        self.admin = _free_port()
        agent_port = _free_port()
        args = json.dumps([*SIM_ARGS, "--load-time", str(load_time)])
        config = tmp / "llmgw.yaml"
        config.write_text(
            "models:\n"
            + "".join(
                f"  - name: {name}\n    weights: none\n    min_replicas: 1\n"
                f"    max_replicas: 2\n    scale_down_delay: 3\n    {target}\n"
                f"    profiles: [{{name: sim, engine: sim, gpus: 1, engine_args: {args}}}]\n"
                for name, target in MODELS.items()
            )
        )
        procs.start(
            "server",
            [
                *LLMGW, "server", "--config", str(config),
                "--listen", f"{HOST}:{self.port}", "--admin-listen", f"{HOST}:{self.admin}",
                "--agent-listen", f"{HOST}:{agent_port}", "--data-dir", str(tmp / "data"),
                "--auth-mode", "open", "--insecure-agents",
            ],
        )  # fmt: skip
        wait_until(lambda: _status(self.admin, "/healthz") == 200, "the server", 60, self.alive)
        low = _free_port()
        procs.start(
            "agent",
            [
                *LLMGW, "agent", "--server", f"{HOST}:{agent_port}", "--node-id", "bench-node",
                "--gpus", "4x24GiB", "--weights-dir", str(tmp / "weights"),
                "--port-range", f"{low}-{low + 19}", "--state-dir", str(tmp / "agent-state"),
                "--stop-engines-on-exit",
            ],
        )  # fmt: skip

    def alive(self) -> None:
        self.procs.check_alive("server")
        if "agent" in self.procs.logs:
            self.procs.check_alive("agent")

    def ready(self, model: str) -> list[str]:
        status = _get_json(self.admin, f"/admin/api/models/{model}")["status"]
        return sorted(r["id"] for r in status["replicas"] if r["state"] == "ready")

    def settled(self, model: str) -> bool:
        status = _get_json(self.admin, f"/admin/api/models/{model}")["status"]
        return len(status["replicas"]) == 1 and status["replicas"][0]["state"] == "ready"

    def scale_events(self, model: str) -> list[dict[str, Any]]:
        events = _get_json(self.admin, f"/admin/api/events?model={model}")["events"]
        return [e for e in events if e["kind"] == "scale"]


def _chat(port: int, model: str) -> tuple[str, float]:
    """One streaming request: the replica that served it and when its headers came."""
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "tell me a story"}],
            "max_tokens": 40,
            "stream": True,
        }
    )
    conn = http.client.HTTPConnection(HOST, port, timeout=120)
    try:
        conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
        resp = conn.getresponse()
        at = time.monotonic()
        replica = resp.getheader("x-llmgw-replica") or ""
        resp.read()
        if resp.status != 200:
            raise BenchError(f"{model} answered {resp.status}")
        return replica, at
    finally:
        conn.close()


def run_round(fleet: Fleet, model: str, clients: int) -> Round:
    wait_until(lambda: fleet.settled(model), f"{model} at one replica", 120, fleet.alive)
    before = set(fleet.ready(model))
    seen = len(fleet.scale_events(model))
    stop = threading.Event()
    first_new: list[float] = []
    errors: list[str] = []

    def client() -> None:
        while not stop.is_set():
            try:
                replica, at = _chat(fleet.port, model)
            except (OSError, http.client.HTTPException, BenchError) as exc:
                errors.append(str(exc))
                return
            if replica and replica not in before:
                first_new.append(at)

    wall0 = datetime.datetime.now(datetime.UTC)
    t0 = time.monotonic()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: bool(first_new) or bool(errors), f"{model}'s new replica to serve",
                   120, fleet.alive)  # fmt: skip
    finally:
        stop.set()
        for thread in threads:
            thread.join(120)
    if errors:
        raise BenchError(f"a client of {model} failed: {errors[0]}")
    events = fleet.scale_events(model)  # newest first
    up = [e for e in events[: len(events) - seen] if not e["message"].startswith("load lower")]
    if not up:
        raise BenchError(f"{model} got a replica without a scale event: {events[:3]}")
    decided = min((datetime.datetime.fromisoformat(e["at"]) - wall0).total_seconds() for e in up)
    return Round(model, decided, min(first_new) - t0)


def report(rounds: list[Round], command: str, load: str, clients: int, load_time: float) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"Run {now} on `nproc` = {os.cpu_count()}, {_cpu()}, Python "
        f"{platform.python_version()}, load average before the run {load}. Tree: {_tree()}.",
        "",
        f"Command: `{command}`",
        "",
        f"A step from no load to {clients} clients on a model with one Ready replica "
        f"(sim `{' '.join(SIM_ARGS)} --load-time {load_time:g}`, four sequences at once), "
        "max_replicas 2; seconds from the step (medians, best-worst over the rounds):",
        "",
        "| target | rounds | scale decided | added replica serving |",
        "|---|---:|---:|---:|",
    ]
    medians = {}
    for model, target in MODELS.items():
        mine = [r for r in rounds if r.model == model]
        decided = [r.decided for r in mine]
        serving = [r.serving for r in mine]
        medians[model] = statistics.median(serving)
        lines.append(
            f"| `{target}` | {len(mine)} | {statistics.median(decided):.2f} "
            f"({min(decided):.2f}-{max(decided):.2f}) | {statistics.median(serving):.2f} "
            f"({min(serving):.2f}-{max(serving):.2f}) |"
        )
    ratio = medians["by-queue"] / medians["by-flight"]
    lines += [
        "",
        f"target_queue_depth's added replica served {ratio:.2f}x as late as "
        "target_in_flight's (medians, same run). target_in_flight decides when a "
        "request starts; target_queue_depth waits for the engines' next /metrics read "
        "(every 1 s) and the next demand pass (every 1 s), and decides only once "
        "more than two requests wait (a seventh client on one replica of four sequences).",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per target")
    parser.add_argument("--clients", type=int, default=12, help="clients after the step")
    parser.add_argument("--load-time", type=float, default=1.0, help="the sim's load time (s)")
    parser.add_argument("--no-write", action="store_true", help="only print the results")
    args = parser.parse_args()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    with tempfile.TemporaryDirectory(prefix="llmgw-scale-step-") as tmp:
        procs = Processes(Path(tmp))
        try:
            fleet = Fleet(procs, Path(tmp), args.load_time)
            rounds = [
                run_round(fleet, model, args.clients)
                for _ in range(args.rounds)
                for model in MODELS
            ]
        except BenchError as exc:
            print(f"scale_step: {exc}", file=sys.stderr)
            for name in ("server", "agent"):
                print(procs.tail(name), file=sys.stderr)
            raise SystemExit(1) from exc
        finally:
            procs.close()
    body = "## Scaling on a load step\n\n" + report(
        rounds, command, load, args.clients, args.load_time
    )
    print(body)
    if not args.no_write:
        write_section("scale-step", body)


if __name__ == "__main__":
    main()
