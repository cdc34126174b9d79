"""Fairness benchmark: a light tenant's latency while another floods a saturated fleet.

A fleet of N `llmgw sim` replicas (each running at most `--max-running` sequences
at once, queuing the rest FIFO as an engine does) behind one `llmgw server` with
API keys. Two keys of the same weight send open-loop Poisson streams of chat
requests: `light` at `--light-rate` and `flood` at `--flood-factor` times that,
together well over what the fleet completes, for `--duration` seconds. Each
request's prompt is its own (no prefix-cache effects) and its max_tokens is drawn
from a range around `--output-tokens` (`--output-spread`; answers differ in length,
and with all the same length a full batch finishes in step). Four or five runs
against the same sims, one after the other, `--rounds` times (each round with a
workload of its own; the table pools the rounds):

- `idle`: the light key alone (its TTFT on an idle fleet: the reference);
- `FCFS`: both keys, the server without `max_in_flight` (what llmgw did before the
  queue: every request goes straight to an engine and waits in the engine's FIFO);
- `fair queue`: both keys, `router.max_in_flight` = the sims' `--max-running`, so
  requests wait in the router's queue and leave by weighted fair share (every
  other queue setting at its default);
- `fair queue, reserve R`: the same with `router.queue.reserve` = `--reserve`
  (the most places kept for keys under their fair share), when given;
- `priorities`: an `interactive` key at the light rate and a `batch` key flooding,
  through the fair queue.

Reported per run: the light (or interactive) key's TTFT p50/p90, how long its
requests waited in the router's queue (p50/p90, from their usage records: the rest
of the TTFT is the engine and the machine) and how many of them were answered, its
share of the requests completed in the window against its max-min fair share (its
demand, when that is under half the fleet's throughput), the fleet's throughput in
the window (requests the sims completed per second), fleet utilisation (mean
running sequences over the slots, sampled from `/sim/stats`), the most requests seen
waiting in one engine's own queue (0: the router's queue held them all) and the
flooding key's 429s. Results go to bench/RESULTS.md between the `fairness` markers with the command
(`--no-write` prints only).

Not guaranteed: absolute numbers hold only for the sim's timing model and this
machine; the client, the router and the sims share its cores, so a busy machine
slows every row. Rows of one run are comparable with each other.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import shlex
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sections import write_section

from llmgw.config.queue import QueueConfig

HOST = "127.0.0.1"
MODEL = "bench-model"
WORDS = [
    "river", "mountain", "green", "blue", "engine", "cache", "token", "router",
    "replica", "batch", "stream", "value", "memory", "block", "queue", "load",
]  # fmt: skip


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


class Proc:
    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log.open("wb")
        self.proc = subprocess.Popen(
            argv, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def wait_http(url: str, proc: Proc, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            raise RuntimeError(f"{proc.proc.args} exited; see {proc.log.name}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout:g}s")


def llmgw(*args: str) -> list[str]:
    return [sys.executable, "-m", "llmgw", *args]


def create_key(data_dir: Path, name: str, priority: str) -> str:
    out = subprocess.run(
        [*llmgw("keys", "create", "--name", name, "--priority", priority, "--json"),
         "--data-dir", str(data_dir)],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    secret: str = json.loads(out.stdout)["secret"]
    return secret


@dataclass(frozen=True)
class Send:
    at: float
    key: str
    body: dict[str, object]


def output_range(args: argparse.Namespace) -> tuple[int, int]:
    """The fewest and most output tokens a request asks for."""
    n, spread = args.output_tokens, args.output_spread
    return max(1, round(n * (1 - spread))), max(1, round(n * (1 + spread)))


def schedule(args: argparse.Namespace, rates: dict[str, float], seed: int) -> list[Send]:
    rng = random.Random(seed)
    sends = []
    low, high = output_range(args)
    for key, rate in rates.items():
        at = rng.expovariate(rate)
        while at < args.duration:
            prompt = " ".join(rng.choice(WORDS) for _ in range(args.prompt_words))
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": rng.randint(low, high),
                "stream": True,
            }
            sends.append(Send(at, key, body))
            at += rng.expovariate(rate)
    return sorted(sends, key=lambda s: s.at)


@dataclass
class KeyResult:
    sent: int = 0
    ok: int = 0
    refused: int = 0
    failed: int = 0
    ttft: list[float] = field(default_factory=list)


@dataclass
class Run:
    name: str
    watched: str
    keys: dict[str, KeyResult]
    throughput: float
    utilisation: float
    window_completed: dict[str, int]
    # The most requests waiting in one engine's own queue at a sample.
    engine_waiting: int = 0
    # Seconds each of the watched key's answered requests waited in the router's
    # queue, from the usage records (what of its TTFT was queueing).
    queued: list[float] = field(default_factory=list)
    # Each round's fleet throughput (one entry for a single run).
    throughputs: list[float] = field(default_factory=list)
    # The places the reserve kept, the mean of the samples over the window.
    kept: float = math.nan


def pooled(runs: list[Run]) -> Run:
    """The rounds of one mode as one run: every request's TTFT and queue wait,
    the completed counts summed, throughput and utilisation averaged."""
    first = runs[0]
    keys: dict[str, KeyResult] = {}
    for key in first.keys:
        merged = keys[key] = KeyResult()
        for run in runs:
            one = run.keys[key]
            merged.sent += one.sent
            merged.ok += one.ok
            merged.refused += one.refused
            merged.failed += one.failed
            merged.ttft += one.ttft
    return Run(
        name=first.name,
        watched=first.watched,
        keys=keys,
        throughput=sum(r.throughput for r in runs) / len(runs),
        utilisation=sum(r.utilisation for r in runs) / len(runs),
        window_completed={k: sum(r.window_completed[k] for r in runs) for k in first.keys},
        engine_waiting=max(r.engine_waiting for r in runs),
        queued=[q for r in runs for q in r.queued],
        throughputs=[r.throughput for r in runs],
        kept=sum(r.kept for r in runs) / len(runs),
    )


def _last_usage_id(data: Path) -> int:
    with sqlite3.connect(data / "llmgw.db") as db:
        (last,) = db.execute("SELECT COALESCE(MAX(id), 0) FROM usage_records").fetchone()
    return int(last)


def _queue_waits(data: Path, key: str, after: int) -> list[float]:
    """The queue wait of every answered request of the key named `key` since usage id `after`."""
    with sqlite3.connect(data / "llmgw.db") as db:
        rows = db.execute(
            "SELECT u.queue_ms FROM usage_records u JOIN api_keys k ON u.key_id = k.id "
            "WHERE k.name = ? AND u.id > ? AND u.status = 200",
            (key, after),
        ).fetchall()
    return [float(ms or 0.0) / 1000.0 for (ms,) in rows]


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


async def _one(
    client: httpx.AsyncClient,
    url: str,
    secret: str,
    send: Send,
    start: float,
    result: KeyResult,
    finished: list[tuple[str, float]],
) -> None:
    delay = start + send.at - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    result.sent += 1
    sent = time.perf_counter()
    first = 0.0
    try:
        async with client.stream(
            "POST",
            url + "/v1/chat/completions",
            json=send.body,
            headers={"authorization": f"Bearer {secret}"},
        ) as resp:
            if resp.status_code == 429:
                await resp.aread()
                result.refused += 1
                return
            if resp.status_code != 200:
                await resp.aread()
                result.failed += 1
                return
            async for line in resp.aiter_lines():
                if line.startswith("data:") and not first:
                    first = time.perf_counter()
                if line.startswith("event: error"):
                    result.failed += 1
                    return
    except httpx.HTTPError:
        result.failed += 1
        return
    result.ok += 1
    result.ttft.append(first - sent)
    finished.append((send.key, time.perf_counter() - start))


async def _sample_running(
    urls: list[str],
    admin: str,
    stop: asyncio.Event,
    samples: list[int],
    waiting: list[int],
    kept: list[int],
) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        while not stop.is_set():
            total = 0
            try:
                for url in urls:
                    stats = (await client.get(url + "/sim/stats")).json()
                    total += int(stats["running"])
                    waiting.append(int(stats["waiting"]))
                for model in (await client.get(admin + "/admin/api/queue")).json()["models"]:
                    kept.append(int(model.get("reserve", 0)))
            except httpx.TransportError:
                # A sim closed a kept-alive connection as it was reused (a busy
                # machine): this sample is lost, the next one is taken as usual.
                pass
            else:
                samples.append(total)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)


def _completed(urls: list[str]) -> int:
    return sum(
        int(httpx.get(u + "/sim/stats", timeout=10).json()["requests_completed"]) for u in urls
    )


async def drive(
    args: argparse.Namespace,
    server: str,
    admin: str,
    sims: list[str],
    secrets: dict[str, str],
    sends: list[Send],
) -> tuple[dict[str, KeyResult], float, float, dict[str, int], int, float]:
    results = {key: KeyResult() for key in secrets}
    finished: list[tuple[str, float]] = []
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=2000)
    samples: list[int] = []
    waiting: list[int] = []
    kept: list[int] = []
    stop = asyncio.Event()
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        before = _completed(sims)
        start = time.perf_counter() + 0.2
        sampler = asyncio.ensure_future(_sample_running(sims, admin, stop, samples, waiting, kept))
        tasks = [
            asyncio.ensure_future(
                _one(client, server, secrets[s.key], s, start, results[s.key], finished)
            )
            for s in sends
        ]
        await asyncio.sleep(max(0.0, start + args.duration - time.perf_counter()))
        in_window = _completed(sims) - before
        stop.set()
        await sampler
        await asyncio.gather(*tasks)
    window = {
        key: sum(1 for k, t in finished if k == key and t <= args.duration) for key in secrets
    }
    slots = len(sims) * args.max_running
    utilisation = (sum(samples) / len(samples) / slots) if samples else math.nan
    mean_kept = sum(kept) / len(kept) if kept else math.nan
    return (
        results, in_window / args.duration, utilisation, window, max(waiting, default=0), mean_kept
    )  # fmt: skip


def wait_idle(sims: list[str]) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        stats = [httpx.get(u + "/sim/stats", timeout=10).json() for u in sims]
        if all(s["running"] == 0 and s["waiting"] == 0 for s in stats):
            return
        time.sleep(0.2)
    raise RuntimeError("the sims did not drain within 300 s")


def run_mode(
    args: argparse.Namespace,
    workdir: Path,
    data: Path,
    sims: list[str],
    name: str,
    queue: bool,
    secrets: dict[str, str],
    rates: dict[str, float],
    watched: str,
    reserve: float | None = None,
    seed: int = 1,
) -> Run:
    port, admin = free_port(), free_port()
    config = workdir / f"{name.replace(' ', '-')}.yaml"
    lines = ["endpoints:"]
    for index, url in enumerate(sims):
        lines += [f"  - id: r{index}", f"    url: {url}", f"    models: [{MODEL}]"]
    if queue:
        lines += ["router:", f"  max_in_flight: {args.max_running}"]
        if reserve is not None:
            lines += ["  queue:", f"    reserve: {reserve}"]
    config.write_text("\n".join(lines) + "\n")
    proc = Proc(
        llmgw(
            "server", "--config", str(config), "--listen", f"{HOST}:{port}",
            "--admin-listen", f"{HOST}:{admin}", "--agent-listen", f"{HOST}:{free_port()}",
            "--insecure-agents", "--data-dir", str(data),
        ),
        workdir / f"{name.replace(' ', '-')}.log",
    )  # fmt: skip
    after = _last_usage_id(data)
    try:
        wait_http(f"http://{HOST}:{admin}/readyz", proc)
        wait_idle(sims)
        sends = schedule(args, rates, seed)
        results, throughput, utilisation, window, engine_waiting, kept = asyncio.run(
            drive(args, f"http://{HOST}:{port}", f"http://{HOST}:{admin}", sims, secrets, sends)
        )
    finally:
        proc.stop()  # the usage recorder writes what it holds on the way out
    run = Run(name, watched, results, throughput, utilisation, window, engine_waiting, kept=kept)
    run.queued = _queue_waits(data, watched, after)
    print(row(run, None), flush=True)
    return run


HEADER = (
    "| run | watched key TTFT p50 | TTFT p90 | p90 vs idle | its queue wait p50 / p90 "
    "| answered | share of completed (fair share) | fleet throughput | utilisation "
    "| most waiting in an engine | places kept (mean) | flood 429s |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def row(run: Run, idle_p90: float | None) -> str:
    watched = run.keys[run.watched]
    p50, p90 = pct(watched.ttft, 0.5), pct(watched.ttft, 0.9)
    total = sum(run.window_completed.values())
    share = run.window_completed[run.watched] / total if total else math.nan
    # Max-min fair share: its own demand while that is under half of what was completed.
    fair = min(watched.sent, total / 2) / total if total else math.nan
    others = [r for k, r in run.keys.items() if k != run.watched]
    refused = sum(r.refused for r in others)
    ratio = f"{p90 / idle_p90:.2f}x" if idle_p90 else "-"
    return (
        f"| {run.name} | {p50 * 1000:,.0f} ms | {p90 * 1000:,.0f} ms | {ratio} "
        f"| {pct(run.queued, 0.5) * 1000:,.0f} / {pct(run.queued, 0.9) * 1000:,.0f} ms "
        f"| {watched.ok}/{watched.sent} | {share:.1%} ({fair:.1%}) "
        f"| {run.throughput:.2f} req/s | {run.utilisation:.0%} | {run.engine_waiting} "
        f"| {'-' if math.isnan(run.kept) else f'{run.kept:.1f}'} "
        f"| {refused if others else '-'} |"
    )


def _kept(reserve: float, places: int) -> int:
    """The most places a reserve keeps, as the queue counts them."""
    if places < 2:
        return 0
    return min(places - 1, int(reserve * places + 0.5))


def unqueued_cost(replicas: int, rounds: int = 100_000) -> float:
    """Seconds the queue adds to a request that does not wait (model not saturated):
    `wait_turn`, the balancer's room filter and `done`, in this process."""
    from llmgw.router.endpoints import EjectionPolicy, EndpointPool, EndpointSpec
    from llmgw.router.queue import RequestQueue, Ticket
    from llmgw.router.saturation import Saturation

    async def measure() -> float:
        clock = asyncio.get_running_loop().time
        pool = EndpointPool(policy=EjectionPolicy(3, 1.0, 8.0), clock=clock)
        specs = [EndpointSpec(f"r{i}", f"http://{HOST}:{i + 1}", (MODEL,)) for i in range(replicas)]
        pool.set_model_endpoints(MODEL, specs)
        saturation = Saturation(
            pool=pool, clock=clock, default_limit=64, model_limit=lambda name: None
        )
        queue = RequestQueue(
            saturation=saturation,
            clock=clock,
            max_size=1000,
            aging=10,
            recheck=0.5,
            retry_after=5,
            reserve=QueueConfig().reserve,
        )
        ticket = Ticket("key")
        endpoints = pool.by_model[MODEL]
        start = time.perf_counter()
        for _ in range(rounds):
            await queue.wait_turn(MODEL, ticket, keepalive=None, interval=5)
            saturation.with_room(MODEL, endpoints)
            queue.done(MODEL, ticket.key)
        return (time.perf_counter() - start) / rounds

    return asyncio.run(measure())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--max-running", type=int, default=4, help="sequences per sim")
    parser.add_argument("--light-rate", type=float, default=2.5, help="requests/s")
    parser.add_argument("--flood-factor", type=float, default=10.0)
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of sending")
    parser.add_argument("--prompt-words", type=int, default=600)
    parser.add_argument("--output-tokens", type=int, default=32, help="mean max_tokens")
    parser.add_argument(
        "--output-spread", type=float, default=0.5,
        help="max_tokens is drawn uniformly within this fraction of --output-tokens "
        "either side (0: every request the same length)",
    )  # fmt: skip
    parser.add_argument(
        "--rounds", type=int, default=3,
        help="run every mode this many times, one round after the other (each round "
        "its own workload seed); the table pools the rounds",
    )  # fmt: skip
    parser.add_argument("--itl", type=float, default=0.02)
    parser.add_argument("--prefill-per-token", type=float, default=0.0005)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--reserve", type=float, default=None,
        help="also run the fair queue with this router.queue.reserve",
    )  # fmt: skip
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    if not 0 <= args.output_spread < 1:
        parser.error(f"--output-spread must be at least 0 and below 1, got {args.output_spread:g}")
    if args.rounds < 1:
        parser.error(f"--rounds must be 1 or more, got {args.rounds}")

    light, flood = args.light_rate, args.light_rate * args.flood_factor
    with tempfile.TemporaryDirectory(prefix="llmgw-fairness-") as tmp:
        workdir = Path(tmp)
        data = workdir / "data"
        secrets = {
            "light": create_key(data, "light", "default"),
            "flood": create_key(data, "flood", "default"),
            "interactive": create_key(data, "interactive", "interactive"),
            "batch": create_key(data, "batch", "batch"),
        }
        sim_procs: list[Proc] = []
        sims: list[str] = []
        try:
            for index in range(args.replicas):
                port = free_port()
                sim_procs.append(
                    Proc(
                        llmgw(
                            "sim",
                            "--host",
                            HOST,
                            "--port",
                            str(port),
                            "--model",
                            MODEL,
                            "--max-running",
                            str(args.max_running),
                            "--itl",
                            str(args.itl),
                            "--prefill-per-token",
                            str(args.prefill_per_token),
                            "--cache-blocks",
                            "0",
                            "--seed",
                            str(index),
                        ),
                        workdir / f"sim-{index}.log",
                    )
                )
                sims.append(f"http://{HOST}:{port}")
            for proc, url in zip(sim_procs, sims, strict=True):
                wait_http(url + "/sim/stats", proc)
            pair = {"light": secrets["light"], "flood": secrets["flood"]}
            print(HEADER, flush=True)
            rounds: list[list[Run]] = []
            for number in range(args.rounds):
                seed = args.seed + number
                rounds.append([
                    run_mode(args, workdir, data, sims, "idle (light alone)", True,
                             {"light": secrets["light"]}, {"light": light}, "light", seed=seed),
                    run_mode(args, workdir, data, sims, "FCFS (no queue)", False, pair,
                             {"light": light, "flood": flood}, "light", seed=seed),
                    run_mode(args, workdir, data, sims, "fair queue", True, pair,
                             {"light": light, "flood": flood}, "light", seed=seed),
                    *([run_mode(args, workdir, data, sims,
                                f"fair queue, reserve {args.reserve:g}", True, pair,
                                {"light": light, "flood": flood}, "light",
                                reserve=args.reserve, seed=seed)]
                      if args.reserve is not None else []),
                    run_mode(args, workdir, data, sims, "priorities: interactive vs batch flood",
                             True, {"interactive": secrets["interactive"],
                                    "batch": secrets["batch"]},
                             {"interactive": light, "batch": flood}, "interactive", seed=seed),
                ])  # fmt: skip
        finally:
            for proc in sim_procs:
                proc.stop()
    runs = [pooled([one[mode] for one in rounds]) for mode in range(len(rounds[0]))]
    cost = unqueued_cost(args.replicas)
    idle_p90 = pct(runs[0].keys["light"].ttft, 0.9)
    fcfs, fair = runs[1], runs[2]
    places = args.replicas * args.max_running
    default_kept = _kept(QueueConfig().reserve, places)
    compared = [fair, *([runs[3]] if args.reserve is not None else [])]
    low, high = output_range(args)

    def ratios(run: Run) -> str:
        each = [t / f for t, f in zip(run.throughputs, fcfs.throughputs, strict=True)]
        mean = f"{run.throughput / fcfs.throughput:.2f}x"
        if len(each) == 1:
            return mean
        return f"{mean} (rounds: {', '.join(f'{r:.2f}' for r in each)})"

    command = "python bench/fairness.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    body = "\n".join(
        [
            "## Fairness: a light key while another floods",
            "",
            f"`{command.strip()}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"{os.cpu_count()} cores shared with other work): {args.replicas} sim replicas, "
            f"{args.max_running} sequences each (the rest wait FIFO in the engine), "
            f"{args.prompt_words}-word prompts (prefill {args.prefill_per_token * 1000:g} ms "
            f"per token), {low}-{high} output tokens (uniform) at {args.itl * 1000:g} ms; "
            f"light key {light:g} req/s, flooding key {flood:g} req/s (same weight), "
            f"Poisson, {args.duration:g} s of sending"
            + (f", {args.rounds} rounds pooled" if args.rounds > 1 else "")
            + "; fair queue: router.max_in_flight "
            f"{args.max_running} ({places} places), the other queue settings at their "
            f"defaults (wait budget 30 s, reserve {QueueConfig().reserve:g}: up to "
            f"{default_kept} of the {places} places kept, as many as the light key's "
            "requests need)"
            + (
                f"; reserve {args.reserve:g}: up to {_kept(args.reserve, places)} kept."
                if args.reserve is not None
                else "."
            ),
            "",
            HEADER,
            *(row(r, idle_p90) for r in runs),
            "",
            "Throughput vs FCFS (target >= 0.95x): "
            + ", ".join(f"{r.name} {ratios(r)}" for r in compared)
            + ". Light key TTFT p90 vs idle (target <= 1.5x): "
            f"FCFS {pct(fcfs.keys['light'].ttft, 0.9) / idle_p90:.2f}x, "
            + ", ".join(
                f"{r.name} {pct(r.keys['light'].ttft, 0.9) / idle_p90:.2f}x" for r in compared
            )
            + ".",
            "",
            f"What the queue adds to a request that does not wait (the model has room): "
            f"{cost * 1e6:.1f} us per request, measured in-process (wait_turn, the balancer's "
            f"room filter and done over {args.replicas} replicas with a max_in_flight and "
            "the default reserve), against the router overhead target of 0.5 ms p50.",
        ]
    )
    print()
    print(body)
    if not args.no_write:
        write_section("fairness", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
