"""LoRA adapters on the sim: time to first token by where the adapter is, and how
often a Zipf mix of requests for 20 adapters has to wait for a load.

One `llmgw server`, one `llmgw agent` (`--gpus 4x24GiB`), a base model `base` with
three replicas (`min_replicas: 3`), each an `llmgw sim` started by the agent with the
profile's `adapters: {max_loaded: 4, max_rank: 8}` (`--enable-lora --max-loras 4`)
and `--lora-load-time L` (the sim's default, 0.2 s, unless `--load-time`), and 20
catalog adapters `a01`..`a20` of `base` (directories holding the adapter_config.json
the sim reads, written by tests/lora_adapters.py). Every request streams, asks for
`--max-tokens` tokens, and its TTFT is send to the first `data:` event with content.

1. TTFT, medians over `--rounds` rounds, each round in turn:
     base       the base model itself;
     loaded     an adapter a replica has loaded (the agent reports it);
     not loaded an adapter no replica has: the request waits while the control plane
                picks the replica with the most free slots (unloading the base's
                least valuable idle adapter, the one asked for least lately, when all
                slots are taken) and its agent calls the engine's /v1/load_lora_adapter.
2. Zipf mix: adapter k of 20 with probability proportional to 1/k^s (`--zipf-s`,
   1.1), requests sent at a steady `--rate` per second (open loop, evenly spaced,
   the same seeded sequence in both runs), `--warmup` seconds, then `--seconds`
   measured. Two runs on the same three engines:
     llmgw      through the gateway: the router sends an adapter's request where an
                agent reports it loaded, and asks the control plane to load it when no
                replica has it. A request that waited for a load is one whose stream
                carried the gateway's keep-alive comment (`: llmgw loading adapter ...`
                or `: llmgw is starting model base for adapter ...`); the server runs
                with `activation_keepalive: 0.05`, so any wait longer than 50 ms shows.
     baseline   a router that ignores adapters: each request goes straight to one of
                the three engines' /v1 at random (seeded); the bench itself loads the
                adapter there when that engine does not hold it, through the same
                /v1/load_lora_adapter, first unloading the engine's least recently used
                adapter with no request in flight when its 4 slots are taken (the
                control plane's rule, per engine, one load at a time per engine). A
                request that waited is one the bench had to load for (or that waited
                for such a load of its adapter on its engine).
   Before the baseline the bench unloads every adapter from the engines (the gateway
   is idle by then and sends nothing more). As a cross-check the engines' own load
   counters (`/sim/stats` `lora.loads`) are read before and after each measured window.

Also computed on the same sequence, without timing: how often one cache of all 12 slots
misses under LRU, under the control plane's rule (decayed request count) and under the
clairvoyant rule (Belady), the floor no eviction rule goes under.

Run: `.venv/bin/python bench/adapters.py [--rounds 5] [--rate 8 --warmup 15 --seconds 30]`.
Writes the `adapters` section of bench/RESULTS.md (`adapters-zipf-S` for another
`--zipf-s`) unless `--no-write`.

Not guaranteed: the same numbers on another machine; on a loaded 2-core machine the
server, agent, three sims and this client share the CPU, which widens TTFTs, but the
share of requests that waited depends on placement, not speed, as long as requests
finish well within their spacing.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from lora_adapters import sim_adapter
from procs import Proc, Server, free_port, free_port_block, llmgw, wait_for
from sections import write_section

from llmgw.control.reconciler.adapters import HALF_LIFE

ADAPTERS = [f"a{n:02d}" for n in range(1, 21)]
MAX_LOADED = 4
REPLICAS = 3
KEEPALIVE = 0.05
DEFAULT_ZIPF_S = 1.1


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def catalog(root: Path, load_time: float | None) -> str:
    args = f"[--lora-load-time, '{load_time:g}']" if load_time is not None else "[]"
    adapters = "".join(
        f"  - {{name: {name}, adapter_of: base, weights: {root / name}}}\n" for name in ADAPTERS
    )
    return (
        "control: {heartbeat_interval: 0.3, reconcile_interval: 0.5, "
        f"activation_keepalive: {KEEPALIVE}, activation_timeout: 120}}\n"
        "router: {health: {interval: 0.5}}\n"
        "models:\n"
        f"  - name: base\n    weights: none\n"
        f"    min_replicas: {REPLICAS}\n    max_replicas: {REPLICAS}\n"
        f"    profiles: [{{name: sim, engine: sim, gpus: 1, engine_args: {args},\n"
        f"                adapters: {{max_loaded: {MAX_LOADED}, max_rank: 8}}}}]\n" + adapters
    )


def body(model: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": f"Say something as {model}."}],
        "max_tokens": max_tokens,
        "stream": True,
    }


def has_content(line: str) -> bool:
    if not line.startswith("data: {"):
        return False
    chunk = orjson.loads(line[len("data: ") :])
    return any((c.get("delta") or {}).get("content") for c in chunk.get("choices", []))


@dataclass
class Fleet:
    server: Server
    max_tokens: int
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=120))

    def replicas(self) -> list[dict[str, Any]]:
        answer = httpx.get(f"{self.server.admin}/admin/api/models/base", timeout=10)
        replicas: list[dict[str, Any]] = answer.json()["status"]["replicas"]
        return [r for r in replicas if r["state"] == "ready"]

    def loaded(self) -> set[str]:
        return {a for r in self.replicas() for a in r.get("adapters") or []}

    def ttft(self, model: str) -> tuple[float, bool]:
        """Seconds to the first token of one streaming request through the gateway, and
        whether it carried an adapter keep-alive comment (it waited for a load)."""
        sent = time.perf_counter()
        waited = False
        with self.client.stream(
            "POST", f"{self.server.url}/v1/chat/completions", json=body(model, self.max_tokens)
        ) as answer:
            if answer.status_code != 200:
                raise SystemExit(f"{model}: {answer.status_code} {answer.read()!r}")
            for line in answer.iter_lines():
                if line.startswith(": llmgw") and "adapter" in line:
                    waited = True
                if has_content(line):
                    return time.perf_counter() - sent, waited
        raise SystemExit(f"{model}: the stream ended without a token")


def engine_loads(urls: Sequence[str]) -> int:
    return sum(int(httpx.get(u + "/sim/stats", timeout=10).json()["lora"]["loads"]) for u in urls)


def ttft_rounds(fleet: Fleet, rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"base": [], "loaded": [], "not loaded": []}
    cold = iter(ADAPTERS)
    fleet.ttft("base")  # warm the router's connections to the replicas
    for round_no in range(1, rounds + 1):
        times["base"].append(fleet.ttft("base")[0])
        held = sorted(fleet.loaded())
        if not held:
            # The first round: load one adapter so that one is loaded.
            first = next(cold)
            fleet.ttft(first)
            wait_for(lambda a=first: a in fleet.loaded(), f"{first} reported loaded", 60)
            held = [first]
        got, waited = fleet.ttft(held[0])
        if waited:
            raise SystemExit(f"{held[0]} was reported loaded but its request waited for a load")
        times["loaded"].append(got)
        absent = next(a for a in cold if a not in fleet.loaded())
        got, waited = fleet.ttft(absent)
        if not waited:
            raise SystemExit(f"{absent} was loaded nowhere but its request did not wait")
        times["not loaded"].append(got)
        wait_for(lambda a=absent: a in fleet.loaded(), f"{absent} reported loaded", 60)
        progress(
            f"round {round_no}: "
            + ", ".join(f"{name} {values[-1] * 1000:.0f} ms" for name, values in times.items())
        )
    return times


def zipf_sequence(count: int, s: float, seed: int) -> list[str]:
    weights = [1 / (k**s) for k in range(1, len(ADAPTERS) + 1)]
    return random.Random(seed).choices(ADAPTERS, weights=weights, k=count)


def lru_misses(sequence: Sequence[str], slots: int, skip: int) -> int:
    """Misses after the first `skip` requests of one LRU cache of `slots` adapters fed
    `sequence` in order: the reference for one pool of every replica's slots, without
    timing (no request in flight pins an adapter)."""
    cache: OrderedDict[str, None] = OrderedDict()
    misses = 0
    for index, name in enumerate(sequence):
        if name in cache:
            cache.move_to_end(name)
            continue
        misses += index >= skip
        cache[name] = None
        if len(cache) > slots:
            cache.popitem(last=False)
    return misses


def valued_misses(sequence: Sequence[str], slots: int, skip: int, rate: float) -> int:
    """Misses after the first `skip` requests of one cache of `slots` adapters fed
    `sequence` at `rate` per second that evicts as the control plane does: the adapter
    with the lowest request count decayed by `HALF_LIFE`, then the least recently used
    (no timing: no request in flight pins an adapter)."""
    count: dict[str, float] = {}
    counted: dict[str, float] = {}
    cache: dict[str, int] = {}  # adapter -> index of its last request
    misses = 0

    def value(name: str, now: float) -> float:
        return count.get(name, 0.0) * math.exp2((counted.get(name, now) - now) / HALF_LIFE)

    for index, name in enumerate(sequence):
        now = index / rate
        count[name] = value(name, now) + 1.0
        counted[name] = now
        if name not in cache:
            misses += index >= skip
            if len(cache) >= slots:
                del cache[min(cache, key=lambda a: (value(a, now), cache[a], a))]
        cache[name] = index
    return misses


def optimal_misses(sequence: Sequence[str], slots: int, skip: int) -> int:
    """Misses after the first `skip` requests of the clairvoyant cache of `slots`
    adapters (Belady: evict the one asked for again furthest ahead): no policy misses
    fewer on this sequence."""
    cache: set[str] = set()
    misses = 0
    for index, name in enumerate(sequence):
        if name in cache:
            continue
        misses += index >= skip
        if len(cache) >= slots:
            ahead = sequence[index + 1 :]
            cache.remove(max(cache, key=lambda a: ahead.index(a) if a in ahead else len(sequence)))
        cache.add(name)
    return misses


@dataclass
class Outcome:
    sent_at: float
    adapter: str
    ttft: float = 0.0
    waited: bool = False
    error: str = ""


@dataclass
class MixResult:
    outcomes: list[Outcome]
    measure_from: float
    loads: int  # the engines' own load count over the measured window

    def measured(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.sent_at >= self.measure_from]


async def stream_one(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    max_tokens: int,
    outcome: Outcome,
    sent: float,
) -> None:
    """One streaming request; its TTFT counts from `sent` (the baseline's load included)."""
    try:
        async with client.stream("POST", url, json=body(model, max_tokens)) as answer:
            if answer.status_code != 200:
                outcome.error = f"{answer.status_code} {(await answer.aread())[:200]!r}"
                return
            async for line in answer.aiter_lines():
                if line.startswith(": llmgw") and "adapter" in line:
                    outcome.waited = True
                if not outcome.ttft and has_content(line):
                    outcome.ttft = time.perf_counter() - sent
        if not outcome.ttft:
            outcome.error = "no token"
    except httpx.HTTPError as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"


@dataclass
class Engine:
    """The baseline's view of one engine: its loaded adapters (least recently used
    first) and requests in flight, changed only by this bench."""

    url: str
    root: Path
    loaded: OrderedDict[str, None] = field(default_factory=OrderedDict)
    in_flight: Counter[str] = field(default_factory=Counter)
    cond: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def acquire(self, client: httpx.AsyncClient, adapter: str) -> bool:
        """Make `adapter` loaded here and count a request in flight on it; True when
        the request had to wait for a load."""
        waited = False
        async with self.cond:
            if adapter not in self.loaded:
                waited = True
                if len(self.loaded) >= MAX_LOADED:
                    # Another request may load this adapter here while this one waits.
                    await self.cond.wait_for(
                        lambda: (
                            adapter in self.loaded
                            or any(self.in_flight[a] == 0 for a in self.loaded)
                        )
                    )
            if adapter not in self.loaded:
                if len(self.loaded) >= MAX_LOADED:
                    victim = next(a for a in self.loaded if self.in_flight[a] == 0)
                    await call(client, self.url + "/v1/unload_lora_adapter", lora_name=victim)
                    del self.loaded[victim]
                await call(
                    client,
                    self.url + "/v1/load_lora_adapter",
                    lora_name=adapter,
                    lora_path=str(self.root / adapter),
                )
                self.loaded[adapter] = None
                self.cond.notify_all()
            self.loaded.move_to_end(adapter)
            self.in_flight[adapter] += 1
        return waited

    async def release(self, adapter: str) -> None:
        async with self.cond:
            self.in_flight[adapter] -= 1
            self.cond.notify_all()


async def call(client: httpx.AsyncClient, url: str, **fields: str) -> None:
    answer = await client.post(url, json=fields)
    if answer.status_code != 200:
        raise SystemExit(f"{url} {fields}: {answer.status_code} {answer.text}")


async def baseline_one(
    client: httpx.AsyncClient, engine: Engine, adapter: str, max_tokens: int, outcome: Outcome
) -> None:
    sent = time.perf_counter()
    outcome.waited = await engine.acquire(client, adapter)
    try:
        url = engine.url + "/v1/chat/completions"
        await stream_one(client, url, adapter, max_tokens, outcome, sent)
    finally:
        await engine.release(adapter)


async def run_mix(
    sequence: list[str],
    rate: float,
    warmup: float,
    max_tokens: int,
    *,
    gateway: str | None,
    engines: Sequence[str],
    root: Path,
    seed: int,
) -> MixResult:
    """Send `sequence` at `rate` per second; through `gateway` when given, else at
    random over `engines` with the bench's own loads (the baseline)."""
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
    pick = random.Random(seed + 1)
    state = [Engine(url, root) for url in engines]
    outcomes: list[Outcome] = []
    tasks: list[asyncio.Task[None]] = []
    loads_before = 0
    measure_from = warmup
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        start = time.perf_counter()
        for index, adapter in enumerate(sequence):
            due = start + index / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if index == int(warmup * rate):
                loads_before = await asyncio.to_thread(engine_loads, engines)
            outcome = Outcome(sent_at=due - start, adapter=adapter)
            outcomes.append(outcome)
            if gateway is not None:
                url = gateway + "/v1/chat/completions"
                job = stream_one(client, url, adapter, max_tokens, outcome, time.perf_counter())
            else:
                job = baseline_one(client, pick.choice(state), adapter, max_tokens, outcome)
            tasks.append(asyncio.create_task(job))
        await asyncio.gather(*tasks)
    loads_after = await asyncio.to_thread(engine_loads, engines)
    return MixResult(outcomes, measure_from, loads_after - loads_before)


def unload_everything(engines: Sequence[str]) -> None:
    for url in engines:
        cards = httpx.get(url + "/v1/models", timeout=10).json()["data"]
        for card in cards:
            if card.get("parent"):
                answer = httpx.post(
                    url + "/v1/unload_lora_adapter", json={"lora_name": card["id"]}, timeout=30
                )
                if answer.status_code != 200:
                    raise SystemExit(f"unloading {card['id']} from {url}: {answer.text}")


def summary(result: MixResult) -> dict[str, Any]:
    measured = result.measured()
    ok = [o for o in measured if not o.error]
    waited = [o for o in ok if o.waited]
    ttfts = sorted(o.ttft for o in ok)
    return {
        "requests": len(measured),
        "errors": len(measured) - len(ok),
        "waited": len(waited),
        "share": len(waited) / len(ok) if ok else float("nan"),
        "loads": result.loads,
        "median": statistics.median(ttfts) if ttfts else float("nan"),
        "p95": ttfts[int(0.95 * (len(ttfts) - 1))] if ttfts else float("nan"),
        "first_errors": sorted({o.error for o in measured if o.error})[:3],
        "by_adapter": Counter(o.adapter for o in waited),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--load-time", type=float, default=None, help="the sim's --lora-load-time (default 0.2)"
    )
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--zipf-s", type=float, default=DEFAULT_ZIPF_S)
    parser.add_argument("--rate", type=float, default=8.0, help="requests per second")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds before measuring")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds measured")
    parser.add_argument("--seed", type=int, default=27)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.rounds > len(ADAPTERS) - 1:
        parser.error(f"--rounds: at most {len(ADAPTERS) - 1} (each round loads a new adapter)")
    sequence = zipf_sequence(int((args.warmup + args.seconds) * args.rate), args.zipf_s, args.seed)

    with tempfile.TemporaryDirectory(prefix="llmgw-adapters-") as tmp_dir:
        tmp = Path(tmp_dir)
        root = tmp / "adapters"
        for name in ADAPTERS:
            sim_adapter(root, name, rank=8)
        config = tmp / "llmgw.yaml"
        config.write_text(catalog(root, args.load_time))
        agent_port = free_port()
        low = free_port_block(8)
        server = Server(
            "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(config),
            data_dir=tmp / "data",
        )  # fmt: skip
        agent = Proc(
            llmgw(
                "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", "bench",
                "--gpus", "4x24GiB", "--weights-dir", str(tmp / "weights"),
                "--port-range", f"{low}-{low + 7}",
            )
        )  # fmt: skip
        fleet = Fleet(server, args.max_tokens)
        try:
            wait_for(lambda: len(fleet.replicas()) == REPLICAS, "three Ready replicas", 120)
            engines = [str(r["endpoint_url"]) for r in fleet.replicas()]
            progress(f"replicas ready: {', '.join(engines)}")
            times = ttft_rounds(fleet, args.rounds)
            progress(f"Zipf mix through llmgw: {len(sequence)} requests at {args.rate:g}/s")
            ours = asyncio.run(
                run_mix(
                    sequence, args.rate, args.warmup, args.max_tokens,
                    gateway=server.url, engines=engines, root=root, seed=args.seed,
                )
            )  # fmt: skip
            progress(f"llmgw: {summary(ours)}")
            held = {str(r["id"]): sorted(r.get("adapters") or []) for r in fleet.replicas()}
            unload_everything(engines)
            progress("Zipf mix, baseline (random engine, the bench's own loads)")
            theirs = asyncio.run(
                run_mix(
                    sequence, args.rate, args.warmup, args.max_tokens,
                    gateway=None, engines=engines, root=root, seed=args.seed,
                )
            )  # fmt: skip
            progress(f"baseline: {summary(theirs)}")
        except BaseException:
            progress(server.proc.output()[-5000:])
            raise
        finally:
            fleet.client.close()
            agent.stop()
            server.proc.stop()
    report(args, times, summary(ours), summary(theirs), sequence, held)


def report(
    args: argparse.Namespace,
    times: dict[str, list[float]],
    ours: dict[str, Any],
    theirs: dict[str, Any],
    sequence: list[str],
    held: dict[str, list[str]],
) -> None:
    med = {name: statistics.median(values) * 1000 for name, values in times.items()}
    load = "0.2 s (the sim's default)" if args.load_time is None else f"{args.load_time:g} s"
    command = (
        f".venv/bin/python bench/adapters.py --rounds {args.rounds} --max-tokens "
        f"{args.max_tokens} --zipf-s {args.zipf_s:g} --rate {args.rate:g} --warmup "
        f"{args.warmup:g} --seconds {args.seconds:g} --seed {args.seed}"
        + (f" --load-time {args.load_time:g}" if args.load_time is not None else "")
    )
    weights = [1 / (k**args.zipf_s) for k in range(1, len(ADAPTERS) + 1)]
    top = sum(weights[: REPLICAS * MAX_LOADED]) / sum(weights)
    counts = Counter(sequence)
    skip = int(args.warmup * args.rate)
    slots = REPLICAS * MAX_LOADED
    measured = len(sequence) - skip
    lru = lru_misses(sequence, slots, skip) / measured
    valued = valued_misses(sequence, slots, skip, args.rate) / measured
    best = optimal_misses(sequence, slots, skip) / measured
    tail = 1 - top
    met = "met" if ours["share"] <= 0.05 else "NOT met"
    if ours["share"] <= 0.05:
        why = "."
    elif best > 0.05:
        why = (
            f": no eviction rule can meet it on this sequence, the clairvoyant one misses "
            f"{best:.1%} (every request for an adapter not loaded must load it, and the "
            f"{len(ADAPTERS) - slots} least asked-for adapters carry {tail:.1%} of requests)."
        )
    else:
        why = (
            f": only a clairvoyant rule gets under 5% here ({best:.1%}); a rule that knows "
            "only the past keeps the most asked-for adapters loaded and still misses most "
            f"requests for the other {len(ADAPTERS) - slots}, which carry {tail:.1%} of "
            f"requests (the same rule computed without timing: {valued:.1%})."
        )

    def row(name: str, s: dict[str, Any]) -> str:
        return (
            f"| {name} | {s['requests']} | {s['errors']} | {s['waited']} | {s['share']:.1%} | "
            f"{s['loads']} | {s['median'] * 1000:.0f} | {s['p95'] * 1000:.0f} |"
        )

    lines = [
        "## LoRA adapters: TTFT by where the adapter is; loads under a Zipf mix"
        + ("" if args.zipf_s == DEFAULT_ZIPF_S else f" (s = {args.zipf_s:g})"),
        "",
        f"Command: `{command}`",
        f"({os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
        f"{os.getloadavg()[0]:.1f} at the end: a machine shared with other work, so small "
        f"settings.) One server, one agent, base model `base` with {REPLICAS} sim replicas "
        f"(`adapters: {{max_loaded: {MAX_LOADED}, max_rank: 8}}`), the sim's adapter load "
        f"time {load}, {len(ADAPTERS)} catalog adapters; streaming requests of "
        f"{args.max_tokens} tokens; TTFT = send to first content token.",
        "",
        f"TTFT through the gateway, medians of {args.rounds} rounds:",
        "",
        "| request for | TTFT median (ms) | each round (ms) |",
        "|---|--:|---|",
        *(
            f"| {label} | {med[case]:.0f} | {', '.join(f'{v * 1000:.0f}' for v in times[case])} |"
            for case, label in (
                ("base", "the base model"),
                ("loaded", "an adapter already loaded"),
                ("not loaded", "an adapter loaded nowhere"),
            )
        ),
        "",
        f"The not-loaded case costs {med['not loaded'] - med['base']:.0f} ms over the base "
        f"(the engine's own load: {0.2 if args.load_time is None else args.load_time:g} s); "
        f"a loaded adapter {round(med['loaded'] - med['base']):+d} ms.",
        "",
        f"Zipf mix: {len(ADAPTERS)} adapters, P(k) proportional to 1/k^{args.zipf_s:g} "
        f"(the {REPLICAS * MAX_LOADED} most asked for, as many as there are slots, get "
        f"{top:.0%} of requests), {args.rate:g} requests/s evenly spaced, {args.warmup:g} s "
        f"warm-up then {args.seconds:g} s measured, the same seeded sequence in both runs "
        f"({len(counts)} distinct adapters asked for over the whole run; the most asked, "
        f"{counts.most_common(1)[0][0]}, {counts.most_common(1)[0][1]} times of {len(sequence)}).",
        "",
        "| run | requests | errors | waited for a load | share | engine loads | "
        "TTFT median (ms) | TTFT p95 (ms) |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
        row("llmgw (adapter-aware routing, loads by the control plane)", ours),
        row("baseline (random engine, the bench loads on a miss, LRU per engine)", theirs),
        "",
        f"Target: at most 5% of requests wait for a load once warm: {met} "
        f"({ours['share']:.1%} against the baseline's {theirs['share']:.1%}){why}",
        "",
        f"For reference, one cache of all {slots} slots fed the same sequence (computed, "
        "no timing, no request in flight pinning an adapter), share of measured requests "
        "that miss:",
        "",
        "| eviction rule over one pool of all slots | misses |",
        "|---|--:|",
        f"| least recently used (llmgw's rule before) | {lru:.1%} |",
        f"| lowest request count halving every {HALF_LIFE:g} s, then least recently used "
        f"(llmgw's rule) | {valued:.1%} |",
        f"| clairvoyant (Belady: the one asked for again furthest ahead), the floor | {best:.1%} |",
        "",
    ]
    for name, s in (("llmgw", ours), ("baseline", theirs)):
        waits = ", ".join(f"{a} {n}" for a, n in sorted(s["by_adapter"].items()))
        lines.append(f"Requests that waited, by adapter ({name}): {waits or 'none'}.")
    lines.append(
        "Adapters loaded per replica at the end of the llmgw run: "
        + "; ".join(f"{rid}: {', '.join(names)}" for rid, names in sorted(held.items()))
        + "."
    )
    for name, s in (("llmgw", ours), ("baseline", theirs)):
        if s["errors"]:
            lines.append(f"{name} errors (first kinds): {'; '.join(s['first_errors'])}.")
    body_text = "\n".join(lines)
    print(body_text)
    if not args.no_write:
        # The default mix has the section it always had; another skew has its own.
        write_section(
            "adapters" if args.zipf_s == DEFAULT_ZIPF_S else f"adapters-zipf-{args.zipf_s:g}",
            body_text,
        )


if __name__ == "__main__":
    main()
