"""The routing matrix: shared-prefix chat of many shapes, each against the ideal and smg.

`python bench/routing.py --cells CELLS` (or `--quick`) runs this instead of the
single workload. A cell is one workload: G groups (a shared system prompt, the
head, of H tokens each), U users per group, `--turns` turns per user (each
turn's prompt is the previous one plus an answer and a new question), against N
sim replicas that each run `--max-running` sequences at once (a batch; more wait
inside the engine), offered L% of the fleet's slots: Poisson arrivals at
L x N x max-running / (estimated slot time), the slot time being the answer's
decode at the sim's inter-token time with L x max-running running. Each replica's
prefix cache holds about 1.5x the heads and conversations the ideal placement
gives it, so the fleet holds every group only when groups are not duplicated much.

In each cell, on a fresh fleet each (empty caches), in the same run:
- `ideal`: the client itself sends group g to replica g mod N (no router);
- `smg`: smg `--policy cache_aware` (SGLang's router), when `--smg` is given;
- `llmgw`: one `llmgw server` with the default routing (predicted TTFT);
- `llmgw scorers`: the same with the weighted scorers, with `--with-scorers`;
- `llmgw x2`: two servers sharing their prefix index through `--redis URL`, the
  client alternating between them, when `--redis` is given.

Cell names: `gGuUrNlLhH` (e.g. `g32u3r4l90h2000`) and `issue` (issue 24's shape:
6 replicas of `--max-running 8`, 32 groups x 3 users x 5 turns, 2,000-token
heads, 24 requests/s). `--cells all` is the whole matrix (groups 8/32/100, users
1/3/10, replicas 4/8, load 50/70/90%, heads 500/2,000/8,000: 162 cells, many
hours); `--quick` the issue's shape and some of the hardest cells.

Reported per cell and router: TTFT p50/p90 (first SSE event), the fleet's
prefix-cache hit rate (the sims' own counters), the mean share of slots running
and the mean requests waiting inside the engines (sampled from each sim every
0.25 s), requests per replica, failures. Cells are written worst first (llmgw's
TTFT p90 over the ideal's), to bench/RESULTS.md between the `routing-matrix`
markers, unless `--no-write`.

Not guaranteed: absolute numbers mean only as much as the sim's timing model, and
the client, routers and sims share this machine's cores; rows of one cell are
comparable with each other.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import math
import os
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from routing import (
    Fleet,
    Request,
    _send,
    pct,
    sim_counters,
    start_server,
    start_sims,
    start_smg,
    workload,
)
from sections import write_section

# Words per answer and per question in `routing.workload` (sim tokens).
_TURN_TOKENS = 100


@dataclass(frozen=True)
class Cell:
    groups: int
    users: int
    replicas: int
    load: int  # percent of the fleet's slots
    head: int  # tokens of each group's shared system prompt
    rate: float | None = None  # requests/s; None: from the load
    label: str | None = None

    @property
    def name(self) -> str:
        if self.label is not None:
            return self.label
        return f"g{self.groups}u{self.users}r{self.replicas}l{self.load}h{self.head}"


ISSUE = Cell(groups=32, users=3, replicas=6, load=85, head=2000, rate=24.0, label="issue")
MATRIX = [
    Cell(g, u, r, load, h)
    for g, u, r, load, h in itertools.product(
        (8, 32, 100), (1, 3, 10), (4, 8), (50, 70, 90), (500, 2000, 8000)
    )
]
# The issue's shape, then cells where one replica cannot hold a group's users (few
# groups, many users), where cold heads dominate (many groups, one user each), with
# long heads, and at 90% of the slots.
QUICK = [
    "issue",
    "g8u10r4l90h2000",
    "g32u3r4l90h8000",
    "g100u1r8l90h2000",
    "g32u10r8l90h500",
    "g8u3r8l70h8000",
]


def parse_cell(text: str) -> Cell:
    if text == "issue":
        return ISSUE
    try:
        rest = text.removeprefix("g")
        groups, rest = rest.split("u", 1)
        users, rest = rest.split("r", 1)
        replicas, rest = rest.split("l", 1)
        load, head = rest.split("h", 1)
        return Cell(int(groups), int(users), int(replicas), int(load), int(head))
    except ValueError as exc:
        raise SystemExit(
            f"cell {text!r}: expected 'issue', 'all' or gGuUrNlLhH (e.g. g32u3r4l90h2000)"
        ) from exc


def cells_of(args: argparse.Namespace) -> list[Cell]:
    names = QUICK if args.quick else [c for c in args.cells.split(",") if c]
    if names == ["all"]:
        return [ISSUE, *MATRIX]
    return [parse_cell(name) for name in names]


def slot_seconds(args: argparse.Namespace, cell: Cell) -> float:
    """A request's estimated time in a slot: its answer at the batch's decode speed."""
    running = cell.load / 100 * args.matrix_max_running
    return args.answer_tokens * (args.itl + args.itl_per_running * running)


def cell_args(args: argparse.Namespace, cell: Cell) -> argparse.Namespace:
    slots = cell.replicas * args.matrix_max_running
    rate = cell.rate or cell.load / 100 * slots / slot_seconds(args, cell)
    per_group = cell.head + cell.users * args.turns * _TURN_TOKENS
    own_groups = math.ceil(cell.groups / cell.replicas)
    return argparse.Namespace(
        **{
            **vars(args),
            "groups": cell.groups,
            "users": cell.users,
            "rounds": args.turns,
            "replicas": cell.replicas,
            "system_words": cell.head,
            "rate": rate,
            "cache_blocks": max(64, math.ceil(1.5 * own_groups * per_group / 16)),
            "output_tokens": args.answer_tokens,
            "max_running": args.matrix_max_running,
        }
    )


@dataclass
class Row:
    router: str
    ttft: list[float]
    hit_rate: float
    busy: float
    waiting: float
    served: list[int]
    failed: int
    extra: dict[str, Any] = field(default_factory=dict)


async def _sample(fleet: Fleet, max_running: int, stop: asyncio.Event) -> tuple[float, float]:
    """Mean share of slots running and mean requests waiting per replica, until `stop`."""
    running: list[float] = []
    waiting: list[float] = []
    async with httpx.AsyncClient(timeout=10) as client:
        while not stop.is_set():
            try:
                stats = await asyncio.gather(*(client.get(u + "/sim/stats") for u in fleet.urls))
            except httpx.HTTPError:
                stats = []  # a busy machine: this sample is skipped, the next one taken
            if stats:
                data = [s.json() for s in stats]
                running.append(statistics.mean(d["running"] for d in data) / max_running)
                waiting.append(statistics.mean(d["waiting"] for d in data))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)
    return (statistics.mean(running), statistics.mean(waiting)) if running else (0.0, 0.0)


async def _drive(
    fleet: Fleet, schedule: list[Request], mode: str, max_running: int
) -> tuple[list[Any], float, float]:
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=2000)
    stop = asyncio.Event()
    sampler = asyncio.ensure_future(_sample(fleet, max_running, stop))
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        start = time.perf_counter() + 0.2
        tasks = []
        for index, req in enumerate(schedule):
            if mode == "ideal":
                url = fleet.urls[req.group % len(fleet.urls)]
            else:
                url = fleet.server_urls[index % len(fleet.server_urls)]
            tasks.append(asyncio.ensure_future(_send(client, url, req, start)))
        results = await asyncio.gather(*tasks, return_exceptions=True)
    stop.set()
    busy, waiting = await sampler
    return list(results), busy, waiting


def run_row(
    args: argparse.Namespace,
    router: str,
    mode: str,
    schedule: list[Request],
    weighted: bool,
    routers: int = 1,
    settings: tuple[str, ...] = (),
) -> Row:
    with tempfile.TemporaryDirectory(prefix="llmgw-matrix-") as tmp:
        workdir = Path(tmp)
        fleet = start_sims(args, workdir)
        try:
            if mode == "smg":
                start_smg(args, fleet, workdir)
            elif mode == "llmgw":
                scorers = {} if weighted else None
                for index in range(routers):
                    start_server(args, fleet, scorers, workdir, f"server-{index}", settings)
            before = sim_counters(fleet)
            outcomes, busy, waiting = asyncio.run(_drive(fleet, schedule, mode, args.max_running))
            after = sim_counters(fleet)
        finally:
            fleet.stop()
    good = [o for o in outcomes if isinstance(o, tuple)]
    pairs = list(zip(after, before, strict=True))
    queries = sum(a["prefix_cache_queries"] - b["prefix_cache_queries"] for a, b in pairs)
    hits = sum(a["prefix_cache_hits"] - b["prefix_cache_hits"] for a, b in pairs)
    return Row(
        router=router,
        ttft=[o[0] for o in good],
        hit_rate=hits / queries if queries else 0.0,
        busy=busy,
        waiting=waiting,
        served=[a["requests_total"] - b["requests_total"] for a, b in pairs],
        failed=len(outcomes) - len(good),
    )


def _ms(value: float) -> str:
    return f"{value * 1000:,.0f} ms"


DETAIL = (
    "| cell | router | TTFT p50 | TTFT p90 | hit rate | slots busy | waiting in engine "
    "| requests per replica | failed |\n|---|---|---|---|---|---|---|---|---|"
)


def detail(cell: Cell, row: Row) -> str:
    return (
        f"| {cell.name} | {row.router} | {_ms(pct(row.ttft, 0.5))} | {_ms(pct(row.ttft, 0.9))} "
        f"| {row.hit_rate:.0%} | {row.busy:.0%} | {row.waiting:.1f} "
        f"| {'/'.join(str(n) for n in row.served)} | {row.failed} |"
    )


SUMMARY = (
    "| cell | requests | rate | llmgw p90 / ideal | llmgw p90 / smg | TTFT p90 ideal / smg "
    "/ llmgw | hit rate ideal / smg / llmgw | 2 routers (Redis) p90 / 1 | failed |"
    "\n|---|---|---|---|---|---|---|---|---|"
)


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "-"


def summary(cell: Cell, args: argparse.Namespace, requests: int, rows: dict[str, Row]) -> str:
    ideal, smg, ours = rows.get("ideal"), rows.get("smg"), rows["llmgw"]
    p90 = {name: pct(row.ttft, 0.9) for name, row in rows.items()}
    return (
        f"| {cell.name} | {requests} | {args.rate:.1f}/s "
        f"| {_ratio(p90['llmgw'], p90['ideal']) if ideal else '-'} "
        f"| {_ratio(p90['llmgw'], p90['smg']) if smg else '-'} "
        f"| {_ms(p90['ideal']) if ideal else '-'} / {_ms(p90['smg']) if smg else '-'} "
        f"/ {_ms(p90['llmgw'])} "
        f"| {f'{ideal.hit_rate:.0%}' if ideal else '-'} / {f'{smg.hit_rate:.0%}' if smg else '-'} "
        f"/ {ours.hit_rate:.0%} "
        f"| {_ratio(p90['x2'], p90['llmgw']) if 'x2' in rows else '-'} "
        f"| {sum(r.failed for r in rows.values())} |"
    )


def run_matrix(args: argparse.Namespace, argv: list[str]) -> int:
    cells = cells_of(args)
    results: list[tuple[Cell, argparse.Namespace, int, dict[str, Row]]] = []
    for cell in cells:
        cargs = cell_args(args, cell)
        schedule = workload(cargs, shared=True)
        print(
            f"cell {cell.name}: {len(schedule)} requests over {schedule[-1].at:.1f} s "
            f"at {cargs.rate:.1f}/s, {cell.replicas} replicas x {cargs.max_running} slots, "
            f"cache {cargs.cache_blocks} blocks each\n{DETAIL}",
            flush=True,
        )
        rows: dict[str, Row] = {}
        plan = [("ideal", "ideal", "ideal: group pinned (client, direct)", False, 1)]
        if args.smg:
            plan.append(("smg", "smg", "smg --policy cache_aware", False, 1))
        plan.append(("llmgw", "llmgw", "llmgw default (predicted TTFT)", False, 1))
        if args.with_scorers:
            plan.append(("scorers", "llmgw", "llmgw scorers (prefix 3, load 2, ...)", True, 1))
        if args.redis:
            plan.append(("x2", "llmgw", "llmgw default, 2 routers, shared index", False, 2))
        # A channel of this run's own, so that other runs on the same Redis do not mix in.
        share = (f"redis_url={args.redis}", f"share_channel=llmgw:matrix:{os.getpid()}")
        for key, mode, label, weighted, routers in plan:
            settings = share if routers > 1 else ()
            rows[key] = run_row(cargs, label, mode, schedule, weighted, routers, settings)
            print(detail(cell, rows[key]), flush=True)
        results.append((cell, cargs, len(schedule), rows))

    def badness(entry: tuple[Cell, argparse.Namespace, int, dict[str, Row]]) -> float:
        rows = entry[3]
        ideal = pct(rows["ideal"].ttft, 0.9)
        return pct(rows["llmgw"].ttft, 0.9) / ideal if ideal > 0 else math.inf

    results.sort(key=badness, reverse=True)
    command = "python bench/routing.py " + shlex.join(argv)
    load = os.getloadavg()
    body = "\n".join(
        [
            "## Routing matrix: predicted TTFT against the ideal placement and smg (sim)",
            "",
            f"`{command.strip()}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"{os.cpu_count()} cores, load average {load[0]:.1f} at the end): "
            f"{len(cells)} cells, worst first (llmgw's TTFT p90 over the ideal's). Sims: "
            f"`--max-running {args.matrix_max_running}`, {args.answer_tokens} output tokens, "
            f"prefill {args.prefill_per_token * 1000:g} ms per uncached token, {args.turns} "
            "turns per user; a fresh fleet per row.",
            "",
            SUMMARY,
            *(summary(cell, cargs, n, rows) for cell, cargs, n, rows in results),
            "",
            DETAIL,
            *(detail(cell, row) for cell, _, _, rows in results for row in rows.values()),
        ]
    )
    print()
    print(body)
    if not args.no_write:
        write_section("routing-matrix", body)
    failed = sum(r.failed for _, _, _, rows in results for r in rows.values())
    return 0 if failed == 0 else 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("matrix (--cells or --quick)")
    group.add_argument(
        "--cells",
        default="",
        help="comma-separated cells to run instead of the single workload: 'issue', "
        "gGuUrNlLhH (e.g. g32u3r4l90h2000), or 'all' (the whole matrix)",
    )
    group.add_argument("--quick", action="store_true", help="the issue's shape and hard cells")
    group.add_argument(
        "--max-running",
        dest="matrix_max_running",
        type=int,
        default=8,
        help="each sim's batch in the matrix (the single workload's sims run 256)",
    )
    group.add_argument("--turns", type=int, default=5, help="turns per user")
    group.add_argument(
        "--answer-tokens",
        type=int,
        default=120,
        help="tokens per answer: about 1.6 s in a slot at the sims' default speed, so the "
        "issue's shape (24/s on 48 slots) is about 85%% busy",
    )
    group.add_argument(
        "--itl", type=float, default=0.01, help="the sims' inter-token seconds (their default)"
    )
    group.add_argument(
        "--itl-per-running",
        type=float,
        default=0.0005,
        help="the sims' extra inter-token seconds per running sequence (their default)",
    )
    group.add_argument(
        "--with-scorers", action="store_true", help="also a row with the weighted scorers"
    )


if __name__ == "__main__":
    sys.exit("run it as: python bench/routing.py --cells CELLS (or --quick)")
