"""A synthetic control plane for the dashboard's tests and its render benchmark.

Real `Inventory`, `Catalog`, `Controller` and `ModelControlService` objects (the
controller is built but never run), filled by registering nodes the way the agent
service does: so the dicts the dashboard gets are exactly what the admin API
returns. Nothing runs: no agents, no engines, no store unless one is passed in.

The mix is fixed by `seed`: most models have ready replicas, some are loading,
some failed (with an engine output tail), some do not fit anywhere (8 GPUs of a
kind no node has), and a few nodes are draining.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from llmgw.auth import KeyService
from llmgw.cli.dashboard_wiring import dashboard_sources
from llmgw.control.catalog import Catalog
from llmgw.control.catalog.catalog import CatalogStore
from llmgw.control.catalog.model import CatalogModel, Profile
from llmgw.control.inventory import Inventory
from llmgw.control.inventory.model import (
    GpuInfo,
    GpuUsage,
    NodeRegistration,
    ShardReport,
    ShardSpec,
    ShardState,
)
from llmgw.control.leadership.lease import LeaderInfo
from llmgw.control.placements import Placement
from llmgw.control.reconciler.controller import Controller
from llmgw.control.reconciler.state import ReadyEndpoint
from llmgw.control.reconciler.views import ModelControlService
from llmgw.metrics import MetricsHistory, RouterTotals
from llmgw.store import ControlServer, Store, UsageRecord
from llmgw.web import DashboardSources

GIB = 1 << 30
START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
FAILED_TAIL = (
    "INFO: starting engine",
    "usage: sim [-h] [--model MODEL] ...",
    "error: unrecognized arguments: --no-such-flag <script>alert(1)</script>",
)


class ManualClock:
    """Monotonic seconds and a wall clock that move together, only when told."""

    def __init__(self) -> None:
        self.mono = 1000.0
        self.now = START

    def monotonic(self) -> float:
        return self.mono

    def wall(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.now += timedelta(seconds=seconds)


class _NoDispatch:
    async def start_shard(self, node_id: str, spec: ShardSpec) -> None:
        raise AssertionError("the dashboard fleet's controller never runs")

    async def stop_shard(self, node_id: str, shard_id: str, grace_seconds: float) -> None:
        raise AssertionError("the dashboard fleet's controller never runs")

    async def drain_shard(self, node_id: str, shard_id: str, grace_seconds: float) -> None:
        raise AssertionError("the dashboard fleet's controller never runs")

    async def sleep_shard(
        self, node_id: str, shard_id: str, level: int, wait_seconds: float
    ) -> None:
        raise AssertionError("no replica sleeps here")

    async def wake_shard(self, node_id: str, shard_id: str, wait_seconds: float) -> None:
        raise AssertionError("no replica sleeps here")

    async def remove_weights(self, node_id: str, path: str) -> None:
        raise AssertionError("the dashboard fleet's controller never runs")


class _NoPlacements:
    async def record(self, placements: Sequence[Placement]) -> None:
        raise AssertionError("the dashboard fleet's controller never runs")

    def settled(self, shard_id: str, *, refused: bool) -> None:
        raise AssertionError("the dashboard fleet's controller never runs")

    def forget(self, shard_ids: Iterable[str]) -> None:
        pass

    def forget_node(self, node_id: str) -> None:
        pass


class _NoPublish:
    def publish(self, names: Sequence[str], endpoints: Sequence[ReadyEndpoint]) -> None:
        pass

    def withdraw(self, names: Sequence[str]) -> None:
        pass


@dataclass
class DashboardFleet:
    clock: ManualClock
    inventory: Inventory
    catalog: Catalog
    controller: Controller
    control: ModelControlService


def make_models(count: int, rng: random.Random) -> list[CatalogModel]:
    models = []
    for i in range(count):
        gpus = rng.choices((1, 2, 4), weights=(60, 30, 10))[0]
        kind = "B200" if i % 17 == 16 else None  # no node has one: never placeable
        profiles = [Profile(name=f"tp{gpus}", engine="sim", gpus=gpus, gpu_kind=kind)]
        if i % 5 == 0:
            profiles.append(Profile(name="cpu", engine="sim", gpus=0))
        models.append(
            CatalogModel(
                name=f"model-{i:03d}",
                weights=f"org/model-{i:03d}",
                profiles=tuple(profiles),
                aliases=(f"m{i}",) if i % 7 == 0 else (),
                min_replicas=1 if i % 3 == 0 else 0,
                max_replicas=2,
            )
        )
    return models


def _shard_reports(
    node: int, gpus: int, models: list[CatalogModel], rng: random.Random, port: int
) -> list[ShardReport]:
    """Shards for one node, filling its GPUs with models' replicas."""
    reports: list[ShardReport] = []
    free = list(range(gpus))
    while free and rng.random() < 0.85:
        model = rng.choice(models)
        need = model.profiles[0].gpus
        if model.profiles[0].gpu_kind is not None or need > len(free):
            break
        taken, free = free[:need], free[need:]
        state: ShardState = rng.choices(("ready", "loading", "failed"), weights=(85, 10, 5))[0]
        shard_id = f"{model.name}-n{node:03d}g{taken[0]}"
        spec = ShardSpec(
            shard_id=shard_id,
            model=model.name,
            engine="sim",
            weights=model.weights,
            gpu_indices=tuple(taken),
            port=port + taken[0],
            engine_args=("--max-num-seqs", "64"),
        )
        reports.append(
            ShardReport(
                shard_id=shard_id,
                model=model.name,
                state=state,
                message="engine exited with status 2" if state == "failed" else "",
                pid=None if state == "failed" else 4000 + node * 10 + taken[0],
                endpoint_url=f"http://10.0.{node // 250}.{node % 250}:{port + taken[0]}"
                if state == "ready"
                else "",
                output_tail=FAILED_TAIL if state == "failed" else (),
                exit_code=2 if state == "failed" else None,
                spec=spec,
                since=START,
            )
        )
    return reports


def build_fleet(
    *,
    nodes: int = 100,
    gpus_per_node: int = 8,
    models: int = 200,
    seed: int = 7,
    catalog_store: CatalogStore | None = None,
) -> DashboardFleet:
    rng = random.Random(seed)
    clock = ManualClock()
    inventory = Inventory(
        clock=clock.monotonic, wall_clock=clock.wall, unreachable_after=15.0, lost_after=60.0
    )
    catalog_models = make_models(models, rng)
    catalog = Catalog(repo=catalog_store, config_models=catalog_models, config_file="llmgw.yaml")
    controller = Controller(
        catalog=catalog,
        inventory=inventory,
        dispatcher=_NoDispatch(),
        placements=_NoPlacements(),
        publisher=_NoPublish(),
        clock=clock.monotonic,
        wall_clock=clock.wall,
        policy="pack",
        interval=1.0,
        retry_base=1.0,
        retry_max=30.0,
        activation_timeout=60.0,
        stop_grace=5.0,
    )
    for i in range(nodes):
        kind, memory = ("NVIDIA H100 80GB HBM3", 80 * GIB) if i % 3 else ("NVIDIA L40S", 48 * GIB)
        node_id = f"node-{i:03d}"
        inventory.register(
            NodeRegistration(
                node_id=node_id,
                hostname=f"{node_id}.fleet.example",
                agent_version="0.1.0",
                gpus=tuple(
                    GpuInfo(g, f"GPU-{i:03d}-{g}", kind, memory, memory - GIB)
                    for g in range(gpus_per_node)
                ),
                cpu_count=96,
                memory_total=768 * GIB,
                weights_disk_free=2048 * GIB,
                gpu_source="declared",
                labels={"zone": "abcd"[i % 4], "team": "inference"},
                fabric={"ib-domain": f"pod{i // 25}"},
                running_shards=tuple(_shard_reports(i, gpus_per_node, catalog_models, rng, 20000)),
                port_range=(20000, 20099),
                weights_dir="/var/lib/llmgw/weights",
            )
        )
        inventory.heartbeat(
            node_id,
            [
                GpuUsage(g, rng.uniform(0, 100), int(memory * rng.uniform(0.05, 0.95)), 0)
                for g in range(gpus_per_node)
            ],
        )
        if i % 20 == 19:
            inventory.set_draining(node_id, True)
    return DashboardFleet(
        clock=clock,
        inventory=inventory,
        catalog=catalog,
        controller=controller,
        control=ModelControlService(controller=controller),
    )


def fake_events(count: int) -> list[dict[str, object]]:
    """Events shaped like `GET /admin/api/events` (the controller keeps its own
    private list; the benchmark needs a full one without running it)."""
    kinds = ("start", "ready", "stop", "failed", "unplaceable", "activate")
    return [
        {
            "at": (START - timedelta(seconds=i * 7)).isoformat(),
            "kind": kinds[i % len(kinds)],
            "model": f"model-{i % 200:03d}",
            "node": f"node-{i % 100:03d}" if i % 6 != 4 else None,
            "message": f"event {i}: replica model-{i % 200:03d}-x on node-{i % 100:03d} GPUs [0, 1]",
        }
        for i in range(count)
    ]


async def seed_store(
    store: Store,
    clock: ManualClock,
    *,
    keys: int = 40,
    models: int = 200,
    records: int = 20_000,
    days: int = 30,
    seed: int = 7,
) -> KeyService:
    """`keys` API keys and `records` requests spread over the last `days` days."""
    rng = random.Random(seed)
    service = KeyService(keys=store.keys, wall_clock=clock.wall)
    ids = []
    for i in range(keys):
        key, _ = await service.create(
            name=f"team-{i:02d}", rpm=600 if i % 3 == 0 else None, budget_tokens=None
        )
        ids.append(key.id)
    batch = []
    for n in range(records):
        batch.append(
            UsageRecord(
                ts=clock.now - timedelta(seconds=rng.uniform(0, days * 86400)),
                request_id=f"req-{n}",
                key_id=rng.choice(ids),
                model=f"model-{int(rng.paretovariate(1.2)) % models:03d}",
                endpoint="e",
                status=200 if rng.random() > 0.02 else 502,
                prompt_tokens=rng.randint(10, 2000),
                completion_tokens=rng.randint(1, 500),
                latency_ms=rng.uniform(50, 4000),
                ttft_ms=None,
                streamed=False,
            )
        )
        if len(batch) == 5000:
            await store.usage.record_batch(batch)
            batch = []
    if batch:
        await store.usage.record_batch(batch)
    return service


def full_history(*, interval: float = 10.0, seed: int = 7) -> MetricsHistory:
    """An hour of router history, as if the server had run for one (on its own clock)."""
    rng = random.Random(seed)
    clock = ManualClock()
    totals = [0.0, 0.0, 0.0, 0.0]

    def sample() -> RouterTotals:
        return RouterTotals(*totals)

    history = MetricsHistory(sample=sample, clock=clock.monotonic, interval=interval)
    for _ in range(int(3600 / interval) + 1):
        requests = rng.randint(50, 400)
        totals[0] += requests
        totals[1] += rng.randint(0, requests // 50)
        streams = rng.randint(10, requests)
        totals[2] += streams * rng.uniform(0.05, 0.6)
        totals[3] += streams
        clock.advance(interval)
        history.tick()
    return history


class FixedLeader:
    """A `LeaderSource` that always says this server leads."""

    def __init__(self, server: str = "ctl-1:4242") -> None:
        self.server = server

    def info(self) -> LeaderInfo:
        return LeaderInfo(
            server=self.server,
            role="leader",
            leader=self.server,
            epoch=3,
            since=START,
            expires_at=START + timedelta(seconds=15),
            agent_address="ctl-1:9443",
            role_since=START,
        )


def fixed_servers() -> list[ControlServer]:
    """The leader of `FixedLeader` and a standby, both seen just now."""
    return [
        ControlServer(
            server=name, hostname=name.split(":")[0], version="0.1.0",
            api_url=f"http://{name.split(':')[0]}:8080", agent_address=f"{name.split(':')[0]}:9443",
            started_at=START, last_seen=START,
        )
        for name in ("ctl-1:4242", "ctl-2:4343")
    ]  # fmt: skip


async def fleet_sources(
    store: Store,
    *,
    nodes: int = 4,
    models: int = 6,
    history: MetricsHistory | None = None,
) -> tuple[DashboardSources, DashboardFleet]:
    """Dashboard sources over a small fleet whose catalog writes go to `store`."""
    fleet = build_fleet(nodes=nodes, models=models, catalog_store=store.catalog)
    await fleet.catalog.load()
    sources = dashboard_sources(
        inventory=fleet.inventory,
        catalog=fleet.catalog,
        model_control=fleet.control,
        keys=KeyService(keys=store.keys, wall_clock=fleet.clock.wall),
        usage=store.usage,
        leadership=FixedLeader(),
        servers=fixed_servers,
        lease_ttl=15.0,
        history=history if history is not None else full_history(),
        wall_clock=fleet.clock.wall,
    )
    return sources, fleet
