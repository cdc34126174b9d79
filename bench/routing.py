"""Routing benchmark: cache-, session- and load-aware routing against `llmgw sim` replicas.

The workload is multi-user chat with shared prefixes: G groups, each with a long
shared system prompt, U users per group, conversations that grow over R rounds
(each round's prompt is the previous one plus an answer and a new question), sent
open loop with Poisson arrivals at a fixed rate. Every router gets the same
schedule (seeded), against a fresh fleet of N sim replicas each time (empty
caches), each with a prefix cache too small for every group's prefix but large
enough, fleet-wide, for most of them.

Routers, side by side in one run:

- `round robin` and `ideal` are the client itself sending straight to the sims:
  round robin in arrival order, and each group pinned to replica g mod N (the
  placement a router that knew the workload would choose);
- `llmgw default`: one `llmgw server` with static endpoints and the default
  routing (predicted time to first token); `llmgw <scorers>`: the same with the
  given `router.routing.scorers` weights (`least outstanding` is every weight 0);
- `llmgw x2`: two servers with the default routing, the client alternating
  between them: independent routers, and with `--redis URL` also routers sharing
  their prefix index through Redis (`router.routing.redis_url`), one router
  with the sharing on too (what publishing costs it);
- a control: the same arrival process with no shared prefix (every request's
  system prompt its own), least outstanding against the default routing;
- a busy fleet: the sims compute one prefill at a time each (`--prefill-slots 1`,
  as a GPU does) and requests come at `--busy-rate`, chosen so that the default
  scorers put a prefill load of about 80% on the replicas; the ideal placement,
  least outstanding, the default routing, the scorers and smg (`--busy-only` runs
  just this table).

With `--cells` or `--quick` it runs the routing matrix instead (`routing_matrix.py`:
many workload shapes, each with the ideal placement and smg in the same run).

Reported per router: TTFT p50/p90/p99 (first SSE event), end-to-end p50, output
tokens/s, the fleet's prefix-cache hit rate (the sims' own token counters), the
busiest replica's share of requests against the mean, and the prefill load the
placement put on the replicas: uncached prompt tokens x prefill time per token,
over replicas x the span of the arrivals (above 100%, prefills cannot keep up
once they run one at a time). Results go to
bench/RESULTS.md between the `routing` markers with the command that made them
(`--no-write` prints only).

Not guaranteed: absolute numbers mean only as much as the sim's timing model
(prefill time per uncached token, decode stalled by other prefills); the
client, the routers and the sims share this machine's cores, so on a busy
machine every row is slower. Rows of one run are comparable with each other.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sections import write_section

HOST = "127.0.0.1"
MODEL = "chat"
WORDS = [
    "river", "mountain", "green", "blue", "engine", "cache", "token", "router",
    "replica", "batch", "stream", "value", "memory", "block", "queue", "load",
    "balance", "health", "metric", "simple", "large", "small", "fast", "answer",
]  # fmt: skip
DEFAULT = "default (predicted TTFT)"
SCORERS = "scorers (prefix 3, load 2, kv 1, session 1, rendezvous 1)"

# None: no `scorers` in the config, so the default chooser (predicted TTFT).
DEFAULT_SCORERS: dict[str, dict[str, float] | None] = {
    "least outstanding": {"prefix": 0, "load": 0, "kv": 0, "session": 0, "rendezvous": 0},
    DEFAULT: None,
    SCORERS: {},
    "prefix + load": {"prefix": 3, "load": 2, "kv": 0, "session": 0, "rendezvous": 0},
    "session + load": {"prefix": 0, "load": 2, "kv": 0, "session": 3, "rendezvous": 0},
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


@dataclass(frozen=True)
class Request:
    at: float
    group: int
    session: str
    body: dict[str, Any]


def workload(args: argparse.Namespace, *, shared: bool) -> list[Request]:
    """The schedule: every user's rounds in order, arrivals Poisson at `args.rate`."""
    rng = random.Random(args.seed)
    systems = [_text(rng, args.system_words) for _ in range(args.groups)]
    conversations: list[tuple[int, str, list[dict[str, Any]]]] = []
    for group in range(args.groups):
        for user in range(args.users):
            system = systems[group] if shared else _text(rng, args.system_words)
            messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
            rounds: list[dict[str, Any]] = []
            for turn in range(args.rounds):
                if turn:
                    messages.append({"role": "assistant", "content": _text(rng, 60)})
                messages.append({"role": "user", "content": _text(rng, 40)})
                rounds.append(
                    {
                        "model": MODEL,
                        "messages": list(messages),
                        "max_tokens": args.output_tokens,
                        "stream": True,
                        "stream_options": {"include_usage": True},
                    }
                )
            conversations.append((group, f"g{group}-u{user}", rounds))
    # Interleave: each slot takes the next round of a random conversation that has one left.
    order: list[tuple[int, str, dict[str, Any]]] = []
    pending = [list(c[2]) for c in conversations]
    alive = list(range(len(conversations)))
    while alive:
        index = rng.choice(alive)
        group, session, _ = conversations[index]
        order.append((group, session, pending[index].pop(0)))
        if not pending[index]:
            alive.remove(index)
    at = 0.0
    schedule = []
    for group, session, body in order:
        at += rng.expovariate(args.rate)
        schedule.append(Request(at, group, session, body))
    return schedule


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


@dataclass
class Fleet:
    sims: list[Proc] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    servers: list[Proc] = field(default_factory=list)
    server_urls: list[str] = field(default_factory=list)

    def stop(self) -> None:
        for proc in [*self.servers, *self.sims]:
            proc.stop()


def start_sims(args: argparse.Namespace, workdir: Path, slots: int = 0) -> Fleet:
    fleet = Fleet()
    for index in range(args.replicas):
        port = free_port()
        argv = [
            sys.executable, "-m", "llmgw", "sim", "--host", HOST, "--port", str(port),
            "--model", MODEL, "--cache-blocks", str(args.cache_blocks),
            "--block-size", "16", "--prefill-per-token", str(args.prefill_per_token),
            "--max-running", str(getattr(args, "max_running", 256)),
            "--itl", str(getattr(args, "itl", 0.01)),
            "--itl-per-running", str(getattr(args, "itl_per_running", 0.0005)),
            "--output-tokens", str(args.output_tokens),
            "--prefill-slots", str(slots),
        ]  # fmt: skip
        fleet.sims.append(Proc(argv, workdir / f"sim-{index}.log"))
        fleet.urls.append(f"http://{HOST}:{port}")
    for proc, url in zip(fleet.sims, fleet.urls, strict=True):
        wait_http(url + "/sim/stats", proc)
    return fleet


def start_server(
    args: argparse.Namespace,
    fleet: Fleet,
    scorers: dict[str, float] | None,
    workdir: Path,
    name: str,
    settings: tuple[str, ...] = (),
) -> None:
    port, admin = free_port(), free_port()
    config = workdir / f"{name}.yaml"
    lines = ["endpoints:"]
    for index, url in enumerate(fleet.urls):
        lines += [f"  - id: r{index}", f"    url: {url}", f"    models: [{MODEL}]"]
    # The router's index is sized like the sims' caches: it should not promise
    # prefixes the engines have already evicted (about 6 bytes per sim token).
    index_blocks = max(16, args.cache_blocks * 16 * 6 // 256)
    lines += ["router:", "  routing:", f"    index_blocks: {index_blocks}"]
    lines += [f"    {item.replace('=', ': ', 1)}" for item in (*args.routing, *settings)]
    if scorers is not None:
        lines.append("    scorers:" + ("" if scorers else " {}"))
        lines += [f"      {key}: {value}" for key, value in scorers.items()]
    config.write_text("\n".join(lines) + "\n")
    data = workdir / f"{name}-data"
    argv = [
        sys.executable, "-m", "llmgw", "server", "--config", str(config),
        "--listen", f"{HOST}:{port}", "--admin-listen", f"{HOST}:{admin}",
        "--agent-listen", f"{HOST}:{free_port()}", "--insecure-agents",
        "--data-dir", str(data), "--auth-mode", "open",
    ]  # fmt: skip
    proc = Proc(argv, workdir / f"{name}.log")
    fleet.servers.append(proc)
    wait_http(f"http://{HOST}:{admin}/readyz", proc)
    fleet.server_urls.append(f"http://{HOST}:{port}")


def start_smg(args: argparse.Namespace, fleet: Fleet, workdir: Path) -> None:
    """`smg launch --policy cache_aware` in front of the sims (SGLang's router, Rust)."""
    port = free_port()
    argv = [
        args.smg, "launch", "--host", HOST, "--port", str(port),
        "--worker-urls", *fleet.urls, "--policy", "cache_aware",
        "--prometheus-port", str(free_port()),
    ]  # fmt: skip
    proc = Proc(argv, workdir / "smg.log")
    fleet.servers.append(proc)
    wait_http(f"http://{HOST}:{port}/health", proc)
    fleet.server_urls.append(f"http://{HOST}:{port}")


@dataclass
class Result:
    name: str
    ttft: list[float]
    e2e: list[float]
    tokens: int
    makespan: float
    hit_rate: float
    busiest: float
    failed: int
    busy: float


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


async def _send(
    client: httpx.AsyncClient, url: str, req: Request, start: float
) -> tuple[float, float, int] | None:
    delay = start + req.at - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    sent = time.perf_counter()
    first = 0.0
    tokens = 0
    headers = {"x-session-id": req.session}
    async with client.stream(
        "POST", url + "/v1/chat/completions", json=req.body, headers=headers
    ) as resp:
        if resp.status_code != 200:
            await resp.aread()
            return None
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            if not first:
                first = time.perf_counter()
            if '"usage"' in line and '"completion_tokens"' in line:
                tokens = int(line.split('"completion_tokens":')[1].split(",")[0].split("}")[0])
    return first - sent, time.perf_counter() - sent, tokens


def sim_counters(fleet: Fleet) -> list[dict[str, Any]]:
    return [httpx.get(url + "/sim/stats", timeout=10).json() for url in fleet.urls]


async def drive(fleet: Fleet, schedule: list[Request], mode: str) -> tuple[list[Any], float]:
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        start = time.perf_counter() + 0.2
        tasks = []
        for index, req in enumerate(schedule):
            if mode == "round robin":
                url = fleet.urls[index % len(fleet.urls)]
            elif mode == "ideal":
                url = fleet.urls[req.group % len(fleet.urls)]
            else:
                url = fleet.server_urls[index % len(fleet.server_urls)]
            tasks.append(asyncio.ensure_future(_send(client, url, req, start)))
        results = await asyncio.gather(*tasks, return_exceptions=True)
        return list(results), time.perf_counter() - start


def run_one(
    args: argparse.Namespace,
    name: str,
    mode: str,
    schedule: list[Request],
    scorers: dict[str, float] | None,
    routers: int,
    settings: tuple[str, ...] = (),
    slots: int = 0,
) -> Result | None:
    wanted = [word for word in args.only.split(",") if word]
    if wanted and not any(word in name for word in wanted):
        return None
    runs = [
        _run_once(args, name, mode, schedule, scorers, routers, settings, slots)
        for _ in range(args.repeat)
    ]
    # Repeats pool their samples: percentiles over every request, rates over every run.
    result = Result(
        name=name,
        ttft=[t for r in runs for t in r.ttft],
        e2e=[t for r in runs for t in r.e2e],
        tokens=sum(r.tokens for r in runs),
        makespan=sum(r.makespan for r in runs),
        hit_rate=statistics.mean(r.hit_rate for r in runs),
        busiest=statistics.mean(r.busiest for r in runs),
        failed=sum(r.failed for r in runs),
        busy=statistics.mean(r.busy for r in runs),
    )
    if args.repeat > 1:
        print(row(result), flush=True)
    return result


def _run_once(
    args: argparse.Namespace,
    name: str,
    mode: str,
    schedule: list[Request],
    scorers: dict[str, float] | None,
    routers: int,
    settings: tuple[str, ...],
    slots: int,
) -> Result:
    with tempfile.TemporaryDirectory(prefix="llmgw-routing-") as tmp:
        workdir = Path(tmp)
        fleet = start_sims(args, workdir, slots)
        try:
            if mode == "smg":
                start_smg(args, fleet, workdir)
            for index in range(routers if mode == "llmgw" else 0):
                start_server(args, fleet, scorers, workdir, f"server-{index}", settings)
            before = sim_counters(fleet)
            outcomes, makespan = asyncio.run(drive(fleet, schedule, mode))
            after = sim_counters(fleet)
        finally:
            fleet.stop()
    good = [o for o in outcomes if isinstance(o, tuple)]
    queries = sum(
        a["prefix_cache_queries"] - b["prefix_cache_queries"]
        for a, b in zip(after, before, strict=True)
    )
    hits = sum(
        a["prefix_cache_hits"] - b["prefix_cache_hits"] for a, b in zip(after, before, strict=True)
    )
    served = [a["requests_total"] - b["requests_total"] for a, b in zip(after, before, strict=True)]
    mean = sum(served) / len(served)
    result = Result(
        name=name,
        ttft=[o[0] for o in good],
        e2e=[o[1] for o in good],
        tokens=sum(o[2] for o in good),
        makespan=makespan,
        hit_rate=hits / queries if queries else 0.0,
        busiest=max(served) / mean if mean else math.nan,
        failed=len(outcomes) - len(good),
        busy=(queries - hits) * args.prefill_per_token / (schedule[-1].at * len(served)),
    )
    print(row(result) + (" (one run)" if args.repeat > 1 else ""), flush=True)
    return result


HEADER = (
    "| router | TTFT p50 | TTFT p90 | TTFT p99 | e2e p50 | output tok/s | fleet hit rate "
    "| busiest / mean | prefill load | failed |\n|---|---|---|---|---|---|---|---|---|---|"
)


def row(r: Result) -> str:
    ms = lambda v: f"{v * 1000:,.0f} ms"  # noqa: E731
    return (
        f"| {r.name} | {ms(pct(r.ttft, 0.5))} | {ms(pct(r.ttft, 0.9))} | {ms(pct(r.ttft, 0.99))} "
        f"| {ms(pct(r.e2e, 0.5))} | {r.tokens / r.makespan:,.0f} | {r.hit_rate:.0%} "
        f"| {r.busiest:.2f}x | {r.busy:.0%} | {r.failed} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--groups", type=int, default=24)
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--system-words", type=int, default=3000, help="shared prompt, sim tokens")
    parser.add_argument("--rate", type=float, default=32.0, help="requests per second (Poisson)")
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument("--prefill-per-token", type=float, default=0.0002)
    parser.add_argument(
        "--cache-blocks",
        type=int,
        default=2500,
        help="per replica, 16 tokens each: about half of the groups' prefixes",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--no-control", action="store_true", help="skip the no-shared-prefix control"
    )
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument(
        "--smg",
        default=shutil.which("smg") or "",
        metavar="PATH",
        help="the `smg` command (pip install smg, in a venv of its own) for a row with "
        "its cache_aware policy; found on PATH by default, skipped when absent",
    )
    parser.add_argument(
        "--routing",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a router.routing setting for every llmgw row (e.g. balance_abs=8); repeatable",
    )
    parser.add_argument(
        "--redis",
        default="",
        metavar="URL",
        help="a Redis for rows whose routers share their prefix index "
        "(router.routing.redis_url); skipped when not given",
    )
    parser.add_argument(
        "--busy-rate",
        type=float,
        default=0.0,
        help="requests per second of the busy-fleet table (sims with --prefill-slots 1); "
        "0: skipped",
    )
    parser.add_argument(
        "--busy-only",
        action="store_true",
        help="run only the busy-fleet table (needs --busy-rate); implies --no-write",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per row, each against a fresh fleet; a row pools their samples "
        "(the p90 sits near the share of requests that must miss, so noise moves it)",
    )
    parser.add_argument(
        "--only", default="", help="comma-separated words; run only rows whose name has one"
    )
    # The matrix module builds on this one's helpers: imported here, not at the top.
    import routing_matrix

    routing_matrix.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.cells or args.quick:
        return routing_matrix.run_matrix(args, argv if argv is not None else sys.argv[1:])

    if args.busy_only:
        if not args.busy_rate:
            parser.error("--busy-only needs --busy-rate")
        args.no_write = args.no_control = True
    shared = workload(args, shared=True)
    print(
        f"{len(shared)} requests over {shared[-1].at:.1f} s; {args.replicas} replicas\n{HEADER}",
        flush=True,
    )
    runs: list[Result | None] = []
    if not args.busy_only:
        runs += [
            run_one(args, "round robin (client, direct)", "round robin", shared, None, 0),
            run_one(args, "ideal: group pinned (client, direct)", "ideal", shared, None, 0),
        ]
        for name, scorers in DEFAULT_SCORERS.items():
            runs.append(run_one(args, f"llmgw {name}", "llmgw", shared, scorers, 1))
        runs.append(run_one(args, "llmgw default, 2 routers", "llmgw", shared, None, 2))
        # Scorers, new prefixes by rendezvous alone (no bounded share): routers agree
        # without talking.
        pure = ("cold_balance=100",)
        runs.append(run_one(args, "llmgw scorers, cold_balance 100", "llmgw", shared, {}, 1, pure))
        runs.append(
            run_one(
                args, "llmgw scorers, cold_balance 100, 2 routers", "llmgw", shared, {}, 2, pure
            )
        )
        if args.redis:
            # A channel of this run's own, so that other runs on the same Redis do not mix in.
            share = (f"redis_url={args.redis}", f"share_channel=llmgw:bench:{os.getpid()}")
            runs.append(
                run_one(args, "llmgw default, shared index", "llmgw", shared, None, 1, share)
            )
            runs.append(
                run_one(
                    args, "llmgw default, 2 routers, shared index", "llmgw", shared, None, 2, share
                )
            )
        if args.smg:
            runs.append(run_one(args, "smg --policy cache_aware", "smg", shared, None, 0))
    results = [r for r in runs if r is not None]
    busy: list[Result] = []
    if args.busy_rate:
        fast = workload(argparse.Namespace(**{**vars(args), "rate": args.busy_rate}), shared=True)
        print(f"busy fleet: {args.busy_rate:g}/s, one prefill at a time\n{HEADER}", flush=True)
        ideal = "ideal: group pinned (client, direct)"
        busy.append(run_one(args, ideal, "ideal", fast, None, 0, slots=1))
        for name in ("least outstanding", DEFAULT, SCORERS):
            scorers = DEFAULT_SCORERS[name]
            busy.append(run_one(args, f"llmgw {name}", "llmgw", fast, scorers, 1, slots=1))
        if args.smg:
            busy.append(run_one(args, "smg --policy cache_aware", "smg", fast, None, 0, slots=1))
    control: list[Result] = []
    if not args.no_control:
        alone = workload(args, shared=False)
        print(f"control: no shared prefix\n{HEADER}", flush=True)
        for name in ("least outstanding", DEFAULT):
            result = run_one(args, f"llmgw {name}", "llmgw", alone, DEFAULT_SCORERS[name], 1)
            if result is not None:
                control.append(result)
    busy_done = [r for r in busy if r is not None]
    command = "python bench/routing.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    body = "\n".join(
        [
            "## Routing: cache-, session- and load-aware, on shared-prefix chat (sim)",
            "",
            f"`{command.strip()}` ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores shared "
            f"with other work): {len(shared)} requests ({args.groups} groups x {args.users} "
            f"users x {args.rounds} rounds, {args.system_words}-token shared system prompt), "
            f"Poisson at {args.rate:g}/s, {args.replicas} sim replicas with "
            f"{args.cache_blocks} x 16-token cache blocks each, prefill "
            f"{args.prefill_per_token * 1000:g} ms per uncached token"
            + (f"; each row pools {args.repeat} runs." if args.repeat > 1 else "."),
            "",
            HEADER,
            *(row(r) for r in results),
            *(
                [
                    "",
                    "Control, no shared prefix (every conversation its own system prompt):",
                    "",
                    HEADER,
                ]
                + [row(r) for r in control]
                if control
                else []
            ),
            *(
                [
                    "",
                    f"Busy fleet: the same conversations at {args.busy_rate:g}/s, each sim "
                    "computing one prefill at a time (`--prefill-slots 1`):",
                    "",
                    HEADER,
                ]
                + [row(r) for r in busy_done]
                if busy_done
                else []
            ),
        ]
    )
    print()
    print(body)
    if not args.no_write:
        write_section("routing", body)
    return 0 if all(r.failed == 0 for r in results + control + busy_done) else 1


if __name__ == "__main__":
    sys.exit(main())
