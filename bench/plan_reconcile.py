"""plan() benchmark: one full reconcile of 1,000 nodes x 8 GPUs and 500 models.

Builds a synthetic fleet in memory (`Node` objects as the inventory hands
them out; no server, no agents) and times `llmgw.control.reconciler.plan` on
one core for these cases:

- scratch: nothing runs yet; every replica is placed (pack, then spread).
- steady: everything placed by the scratch plan runs and is ready; the plan
  must be empty (this is what the controller pays on every tick).
- lost node: the node with the most shards is lost; its replicas are placed
  elsewhere.
- drain: the node with the most shards is draining; replacements are started
  and nothing is stopped yet.
- drain, replacements ready: the replacements run and are ready; the
  draining node's shards are stopped.
- rollout of every model: every model's engine arguments change; the first
  step starts one new replica per model (surge 1) and stops nothing; once
  those are ready, the next drains one old replica per model.
- overcommitted: every model wants 4x its replicas; what does not fit gets
  its explanation (every node's reason), which costs more than placing.
- explain(): the dry run for one model on the steady fleet.

Each case is run `--repeat` times (5) after one warm-up, with the garbage
collector on as in the server; the table gives the best and the median wall
time. Each plan's actions are checked against what the case must produce.
The markdown section is printed and written into bench/RESULTS.md between
the `plan-reconcile` markers (appended at the end when they are missing);
`--no-write` only prints.

Not guaranteed: that a real fleet looks like this one. The mix of models is
fixed by a seeded random generator (`--seed`), and the numbers are only
comparable between runs on the same, otherwise idle machine.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from llmgw.control.catalog.model import CatalogModel, Profile
from llmgw.control.inventory.model import Gpu, Node, Shard
from llmgw.control.reconciler import (
    Actual,
    Desired,
    PlacementPolicy,
    Plan,
    Start,
    Stop,
    explain,
    plan,
)

T = TypeVar("T")
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
MARKERS = ("<!-- plan-reconcile:start -->", "<!-- plan-reconcile:end -->")
HEADING = "## plan(): a full reconcile of 1,000 nodes x 8 GPUs and 500 models"
COMMAND = ".venv/bin/python bench/plan_reconcile.py"
TARGET_S = 1.0
GIB = 1 << 30
EPOCH = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
H100 = ("NVIDIA H100 80GB HBM3", 80 * GIB)
L40S = ("NVIDIA L40S", 48 * GIB)


# --- the synthetic fleet ---------------------------------------------------------


def make_nodes(count: int, gpus_per_node: int) -> list[Node]:
    nodes = []
    for i in range(count):
        name, memory = H100 if i % 5 < 3 else L40S
        gpus = tuple(
            Gpu(g, f"GPU-{i:04d}-{g}", name, memory, memory - GIB) for g in range(gpus_per_node)
        )
        nodes.append(
            Node(
                id=f"node-{i:04d}",
                hostname=f"node-{i:04d}.bench",
                # Where its engines are reached: multi-node replicas meet at rank 0's.
                advertise_host=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
                agent_version="0.1.0",
                gpus=gpus,
                cpu_count=128,
                memory_total=1024 * GIB,
                weights_disk_free=4096 * GIB,
                gpu_source="declared",
                labels={"zone": "abcd"[i % 4]},
                fabric={"ib-domain": f"pod{i // 32}"},
                port_range=(20000, 20099),
                weights_dir="/var/lib/llmgw/weights",
                state="ready",
                draining=False,
                connected=True,
                registered_at=EPOCH,
                last_heartbeat=0.0,
                last_heartbeat_at=EPOCH,
                shards={},
            )
        )
    return nodes


def make_models(count: int, rng: random.Random, multi_node: int = 0) -> list[Desired]:
    """1/2/4/8-GPU profiles (50/25/15/10%), some with a kind, labels or a fallback profile.

    The first `multi_node` models span 2 nodes x 8 H100s of one fabric pod, 1 replica each.
    """
    desired = []
    for i in range(multi_node):
        profile = Profile(
            name="tp8-pp2",
            engine="vllm",
            gpus=8,
            gpu_memory=70 * GIB,
            gpu_kind="H100",
            nodes=2,
            fabric="ib-domain",
        )
        model = CatalogModel(
            name=f"model-{i:03d}", weights=f"org/model-{i:03d}", profiles=(profile,)
        )
        desired.append(Desired(model=model, replicas=1))
    for i in range(multi_node, count):
        gpus = rng.choices((1, 2, 4, 8), weights=(50, 25, 15, 10))[0]
        memory = rng.choice((0, 20, 40, 70)) * GIB
        kind = "H100" if memory >= 70 * GIB or rng.random() < 0.2 else None
        labels = {"zone": rng.choice("abcd")} if rng.random() < 0.1 else {}
        profiles = [
            Profile(
                name=f"tp{gpus}",
                engine="vllm",
                gpus=gpus,
                gpu_memory=memory,
                gpu_kind=kind,
                labels=labels,
            )
        ]
        if rng.random() < 0.2:
            profiles.append(
                Profile(
                    name=f"tp{min(8, gpus * 2)}-l40s",
                    engine="vllm",
                    gpus=min(8, gpus * 2),
                    gpu_memory=40 * GIB,
                    gpu_kind="L40S",
                )
            )
        model = CatalogModel(
            name=f"model-{i:03d}", weights=f"org/model-{i:03d}", profiles=tuple(profiles)
        )
        desired.append(Desired(model=model, replicas=rng.randint(1, 3)))
    return desired


def shard_ids(first: int = 0) -> Callable[[str], str]:
    """Shard ids as the controller would name them; `first` keeps a later plan's new
    shards apart from those an earlier one placed."""
    counter = iter(range(first, 1_000_000_000))
    return lambda model: f"{model}-{next(counter):06d}"


def apply(nodes: Sequence[Node], starts: Sequence[Start], *, since: int = 0) -> list[Node]:
    """The fleet after `starts` have run and become ready."""
    shards: dict[str, dict[str, Shard]] = {n.id: dict(n.shards) for n in nodes}
    for offset, start in enumerate(starts):
        shards[start.node_id][start.spec.shard_id] = Shard(
            id=start.spec.shard_id,
            model=start.model,
            engine=start.spec.engine,
            state="ready",
            message="",
            pid=None,
            endpoint_url=f"http://{start.node_id}:{start.spec.port}",
            output_tail=(),
            exit_code=None,
            spec=start.spec,
            since=EPOCH + datetime.timedelta(seconds=since + offset),
        )
    return [replace(n, shards=shards[n.id]) for n in nodes]


def busiest(nodes: Sequence[Node]) -> Node:
    return max(nodes, key=lambda n: (len(n.shards), n.id))


# --- timing ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Row:
    case: str
    policy: str
    starts: int
    stops: int
    unplaced: int
    best: float
    median: float


def measure(fn: Callable[[], T], repeat: int) -> tuple[T, list[float]]:
    result = fn()  # warm-up, and the result that is checked
    times = []
    for _ in range(repeat):
        begin = time.perf_counter()
        fn()
        times.append(time.perf_counter() - begin)
    return result, times


def row(case: str, policy: str, result: Plan, times: list[float]) -> Row:
    starts = sum(isinstance(a, Start) for a in result.actions)
    stops = sum(isinstance(a, Stop) for a in result.actions)
    return Row(
        case, policy, starts, stops, len(result.unplaced), min(times), statistics.median(times)
    )


def check(ok: bool, what: str) -> None:
    if not ok:
        raise SystemExit(f"plan_reconcile: check failed: {what}")


def replicas(actions: Sequence[Start | Stop] | Sequence[Shard]) -> set[str]:
    """The replicas (a multi-node one counts once) that these starts or shards belong to."""
    found = set()
    for item in actions:
        spec = item.spec
        if spec is not None:
            found.add(spec.replica)
    return found


def run(
    nodes_count: int, models_count: int, repeat: int, seed: int, multi_node: int
) -> tuple[list[Row], str]:
    nodes = make_nodes(nodes_count, 8)
    desired = make_models(models_count, random.Random(seed), multi_node)
    wanted = sum(d.replicas for d in desired)
    shards_wanted = sum(d.replicas * d.model.profiles[0].nodes for d in desired)
    rows: list[Row] = []

    def timed(
        case: str,
        policy: PlacementPolicy,
        want: Sequence[Desired],
        actual: Actual,
        first_id: int = 0,
    ) -> Plan:
        result, times = measure(
            lambda: plan(want, actual, policy=policy, new_shard_id=shard_ids(first_id)), repeat
        )
        rows.append(row(case, policy, result, times))
        print(f"{case} ({policy}): best {min(times) * 1000:.1f} ms", file=sys.stderr)
        return result

    scratch = timed("scratch", "pack", desired, Actual(nodes=nodes))
    check(
        len(scratch.actions) == shards_wanted
        and len(replicas(scratch.actions)) == wanted
        and not scratch.unplaced,
        "scratch places every replica",
    )
    spread = timed("scratch", "spread", desired, Actual(nodes=nodes))
    check(len(spread.actions) == shards_wanted, "scratch (spread) places every replica")

    placed = [a for a in scratch.actions if isinstance(a, Start)]
    steady_nodes = apply(nodes, placed)
    steady = timed("steady", "pack", desired, Actual(nodes=steady_nodes))
    check(not steady.actions and not steady.unplaced, "steady state plans nothing")

    victim = busiest(steady_nodes)
    lost_nodes = [
        replace(n, state="lost", connected=False) if n.id == victim.id else n for n in steady_nodes
    ]
    lost = timed("lost node", "pack", desired, Actual(nodes=lost_nodes))
    gone = replicas(list(victim.shards.values()))
    lost_starts = [a for a in lost.actions if isinstance(a, Start)]
    check(
        len(replicas(lost_starts)) == len(gone)
        and all(a.node_id != victim.id for a in lost_starts)
        # Only the other ranks of the lost node's multi-node replicas are stopped.
        and all(isinstance(a, Start) or a.reason == "gang_broken" for a in lost.actions),
        "a lost node's replicas are placed elsewhere, nothing else is stopped",
    )

    if multi_node:
        # A node holding a rank of a multi-node replica is lost: the replica is replaced
        # whole (two starts) and its other rank stopped.
        ranked = next(
            n for n in steady_nodes if any(s.spec and s.spec.nodes > 1 for s in n.shards.values())
        )
        gang_lost = [
            replace(n, state="lost", connected=False) if n.id == ranked.id else n
            for n in steady_nodes
        ]
        member = timed(
            "lost node of a multi-node replica", "pack", desired, Actual(nodes=gang_lost)
        )
        check(
            sum(isinstance(a, Stop) and a.reason == "gang_broken" for a in member.actions)
            == sum(1 for s in ranked.shards.values() if s.spec and s.spec.nodes > 1)
            and sum(isinstance(a, Start) for a in member.actions)
            == sum(s.spec.nodes if s.spec else 1 for s in ranked.shards.values()),
            "a multi-node replica that lost a node is stopped and placed again whole",
        )

    drain_nodes = [replace(n, draining=True) if n.id == victim.id else n for n in steady_nodes]
    drain = timed("drain", "pack", desired, Actual(nodes=drain_nodes))
    check(
        len(replicas(drain.actions)) == len(gone)
        and all(isinstance(a, Start) for a in drain.actions),
        "a drain starts replacements first",
    )
    replaced = apply(
        drain_nodes, [a for a in drain.actions if isinstance(a, Start)], since=len(placed)
    )
    done = timed("drain, replacements ready", "pack", desired, Actual(nodes=replaced))
    stopped = {a.shard_id for a in done.actions if isinstance(a, Stop)}
    old_shards = {
        s.id for n in replaced for s in n.shards.values() if s.spec and s.spec.replica in gone
    }
    check(
        all(isinstance(a, Stop) for a in done.actions) and stopped == old_shards,
        "the draining node's replicas (every rank) stop once their replacements are ready",
    )

    # Every model's engine arguments change at once: each rolls, surge first.
    rolled = [
        replace(
            d,
            model=replace(
                d.model,
                profiles=tuple(
                    replace(p, engine_args=(*p.engine_args, "--rolled")) for p in d.model.profiles
                ),
            ),
        )
        for d in desired
    ]
    roll = timed(
        "rollout of every model, first step",
        "pack",
        rolled,
        Actual(nodes=steady_nodes),
        first_id=100_000,
    )
    check(
        len(roll.rolling) == len(desired)
        and all(isinstance(a, Start) for a in roll.actions)
        and len(replicas(roll.actions)) == len(desired),
        "a rollout of every model starts one new replica each (surge 1) and stops nothing",
    )
    surged = apply(
        steady_nodes, [a for a in roll.actions if isinstance(a, Start)], since=2 * len(placed)
    )
    step = timed("rollout of every model, new replicas ready", "pack", rolled, Actual(nodes=surged))
    step_stops = [a for a in step.actions if isinstance(a, Stop)]
    check(
        all(a.reason == "rollout" for a in step_stops)
        and {a.model for a in step_stops} == {d.model.name for d in desired},
        "once the new replicas are ready, an old replica of every model drains",
    )

    more = [replace(d, replicas=d.replicas * 4) for d in desired]
    over = timed("overcommitted (4x replicas)", "pack", more, Actual(nodes=steady_nodes))
    check(bool(over.unplaced), "an overcommitted fleet leaves models unplaced")

    one = desired[0].model
    dry, times = measure(lambda: explain(one, steady_nodes), repeat)
    check(dry.placement is not None, "the dry run finds a place")
    rows.append(
        Row("explain() one model (dry run)", "pack", 0, 0, 0, min(times), statistics.median(times))
    )

    firsts = [d.model.profiles[0] for d in desired]
    kinds = sum(p.gpu_kind is not None for p in firsts)
    zoned = sum(bool(p.labels) for p in firsts)
    fallbacks = sum(len(d.model.profiles) > 1 for d in desired)
    shape = (
        f"{nodes_count:,} nodes x 8 GPUs ({nodes_count * 8:,} GPUs; 60% H100 80 GB, 40% L40S "
        f"48 GB; 4 zones, fabric pods of 32; ports 20000-20099), {models_count} models wanting "
        f"{wanted:,} replicas ({sum(len(a.spec.gpu_indices) for a in placed):,} GPUs once "
        "placed): 1/2/4/8-GPU profiles drawn 50/25/15/10%, per-GPU memory 0/20/40/70 GiB, "
        f"{kinds} with a GPU kind, {zoned} with a zone label, {fallbacks} with an L40S "
        f"fallback profile, 1-3 replicas each; {multi_node} of them multi-node (2 nodes x 8 "
        f"H100 of one fabric pod, 1 replica each) (seed {seed})."
    )
    return rows, shape


# --- report ----------------------------------------------------------------------


def _tree() -> str:
    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], capture_output=True, text=True, check=False, cwd=RESULTS.parent
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown commit"
    dirty = git("status", "--porcelain", "--", "../src")
    return f"`{commit}`" + (" + uncommitted changes in src/" if dirty else "")


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def report(rows: list[Row], shape: str, repeat: int, load: str) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    worst = max(r.median for r in rows)
    verdict = "met" if worst < TARGET_S else "**missed**"
    lines = [
        f"Run {now} on `nproc` = {os.cpu_count()}, {_cpu()}, Python "
        f"{platform.python_version()} ({platform.python_implementation()}), load average "
        f"before the run {load}. Tree: {_tree()}.",
        "",
        f"Command: `{COMMAND}`",
        "",
        f"Fleet: {shape}",
        "",
        f"One call of `plan()` per case on one core, {repeat} timed runs after a warm-up, "
        "garbage collector on. Every plan's actions are checked (scratch places every "
        "replica, steady plans nothing, the lost node's replicas go elsewhere, a drain "
        "starts replacements and stops the old shards only once those are ready).",
        "",
        "| case | policy | starts | stops | unplaced models | best ms | median ms |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.case} | {r.policy} | {r.starts:,} | {r.stops:,} | {r.unplaced:,} "
            f"| {r.best * 1000:.1f} | {r.median * 1000:.1f} |"
        )
    lines += [
        "",
        f"Target (from the issue): a full reconcile under {TARGET_S:.0f} s — {verdict} "
        f"(slowest median {worst * 1000:.0f} ms).",
        "",
    ]
    return "\n".join(lines)


def write_section(body: str) -> None:
    begin, end = MARKERS
    text = RESULTS.read_text() if RESULTS.exists() else ""
    if begin not in text or end not in text:
        text = text.rstrip("\n") + f"\n\n{HEADING}\n\n{begin}\n{end}\n"
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    RESULTS.write_text(f"{head}{begin}\n{body}{end}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--models", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per case")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--multi-node", type=int, default=100, help="models that span 2 nodes of one fabric"
    )
    parser.add_argument(
        "--no-write", action="store_true", help="print only; leave bench/RESULTS.md alone"
    )
    args = parser.parse_args(argv)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    rows, shape = run(args.nodes, args.models, args.repeat, args.seed, args.multi_node)
    body = report(rows, shape, args.repeat, load)
    print(body)
    if not args.no_write:
        write_section(body)
        print(f"wrote the plan-reconcile section of {RESULTS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
