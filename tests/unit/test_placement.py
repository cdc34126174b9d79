"""Placement: each filter's reason, GPU and port choice, scorers, avoidance, profile fallback."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

import pytest

from llmgw.control.catalog.model import CatalogModel, Profile
from llmgw.control.inventory.model import (
    Gpu,
    HeldWeights,
    Node,
    NodeState,
    Shard,
    ShardSpec,
    ShardState,
)
from llmgw.control.reconciler import (
    Explanation,
    Fleet,
    Pending,
    ProfileVerdict,
    Rejection,
    explain,
)

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
GIB = 1 << 30
H100 = "NVIDIA H100 80GB HBM3"
L40S = "NVIDIA L40S"


def make_gpus(
    count: int, name: str = H100, *, free_gib: float = 79, start: int = 0
) -> tuple[Gpu, ...]:
    total = 80 * GIB if "H100" in name else 48 * GIB
    return tuple(
        Gpu(i, f"GPU-{name[-4:]}-{i}", name, total, int(free_gib * GIB))
        for i in range(start, start + count)
    )


def make_shard(
    shard_id: str,
    model: str,
    *,
    gpus: tuple[int, ...] = (),
    port: int = 0,
    state: ShardState = "ready",
    age: int = 0,
) -> Shard:
    spec = ShardSpec(
        shard_id=shard_id,
        model=model,
        engine="vllm",
        weights=f"org/{model}",
        gpu_indices=gpus,
        port=port,
    )
    return Shard(
        id=shard_id,
        model=model,
        engine="vllm",
        state=state,
        message="",
        pid=None,
        endpoint_url="",
        output_tail=(),
        exit_code=None,
        spec=spec,
        since=EPOCH - timedelta(seconds=age),
    )


def make_node(
    node_id: str,
    *,
    gpus: tuple[Gpu, ...] | None = None,
    state: NodeState = "ready",
    draining: bool = False,
    connected: bool = True,
    labels: Mapping[str, str] | None = None,
    fabric: Mapping[str, str] | None = None,
    port_range: tuple[int, int] = (20000, 20009),
    shards: Sequence[Shard] = (),
) -> Node:
    return Node(
        id=node_id,
        hostname=f"{node_id}.lab",
        agent_version="0.1.0",
        gpus=make_gpus(4) if gpus is None else gpus,
        cpu_count=64,
        memory_total=512 * GIB,
        weights_disk_free=1024 * GIB,
        gpu_source="declared",
        labels=dict(labels or {}),
        fabric=dict(fabric or {}),
        port_range=port_range,
        weights_dir="/var/lib/llmgw",
        state=state,
        draining=draining,
        connected=connected,
        registered_at=EPOCH,
        last_heartbeat=0.0,
        last_heartbeat_at=EPOCH,
        shards={s.id: s for s in shards},
    )


def make_profile(
    name: str = "tp1",
    *,
    gpus: int = 1,
    gpu_memory_gib: int = 0,
    gpu_kind: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> Profile:
    return Profile(
        name=name,
        engine="vllm" if gpus else "sim",
        gpus=gpus,
        gpu_memory=gpu_memory_gib * GIB,
        gpu_kind=gpu_kind,
        labels=dict(labels or {}),
    )


def make_model(name: str = "llama", *profiles: Profile) -> CatalogModel:
    return CatalogModel(name=name, weights=f"org/{name}", profiles=profiles or (make_profile(),))


def reasons(explanation: Explanation, verdict: int = 0) -> dict[str, str]:
    return {r.node_id: r.reason for r in explanation.verdicts[verdict].rejections}


# --- filters and their reasons -----------------------------------------------------


def test_node_state_reasons_and_only_ready_connected_nodes_take_work() -> None:
    nodes = [
        make_node("node-a", state="lost", connected=False),
        make_node("node-b", state="unreachable", connected=False),
        make_node("node-c", draining=True),
        make_node("node-d", connected=False),
        make_node("node-e"),
    ]

    result = explain(make_model(), nodes)

    assert reasons(result) == {
        "node-a": "lost",
        "node-b": "unreachable (no heartbeat)",
        "node-c": "draining",
        "node-d": "disconnected",
    }
    assert result.verdicts[0].fits == ("node-e",)
    assert result.placement is not None
    assert result.placement.node_id == "node-e"


def test_labels_must_match_in_labels_or_fabric() -> None:
    profile = make_profile(labels={"zone": "a", "ib-domain": "pod3"})
    nodes = [
        make_node("node-a", labels={"zone": "a"}, fabric={"ib-domain": "pod3"}),
        make_node("node-b", labels={"zone": "b"}, fabric={"ib-domain": "pod3"}),
        make_node("node-c", labels={"zone": "a"}),
        make_node("node-d", labels={"zone": "a", "ib-domain": "pod3"}),
        make_node("node-e", labels={"zone": "a"}, fabric={"ib-domain": "pod4"}),
    ]

    result = explain(make_model("m", profile), nodes)

    assert reasons(result) == {
        "node-b": "label zone=b, needs zone=a",
        "node-c": "missing label ib-domain=pod3",
        "node-e": "label ib-domain=pod4, needs ib-domain=pod3",
    }
    assert result.verdicts[0].fits == ("node-a", "node-d")


def test_gpu_kind_is_a_case_insensitive_substring_of_the_gpu_name() -> None:
    nodes = [
        make_node("node-a", gpus=make_gpus(2, L40S)),
        make_node("node-b", gpus=make_gpus(2, H100)),
        make_node("node-c", gpus=()),
    ]

    result = explain(make_model("m", make_profile(gpu_kind="h100")), nodes)

    assert reasons(result) == {
        "node-a": "no GPU matches kind 'h100' (has NVIDIA L40S)",
        "node-c": "no GPU matches kind 'h100' (has no GPUs)",
    }
    assert result.placement is not None
    assert result.placement.node_id == "node-b"


def test_free_gpu_count_reason_counts_gpus_held_by_live_shards_only() -> None:
    busy = make_node(
        "node-a",
        shards=[
            make_shard("s1", "other", gpus=(0,), port=20000),
            make_shard("s2", "other", gpus=(1,), port=20001, state="loading"),
            make_shard("s3", "other", gpus=(2,), port=20002, state="failed"),
        ],
    )

    result = explain(make_model("m", make_profile(gpus=3)), [busy, make_node("node-b", gpus=())])

    # The failed shard's GPU is free again; the loading one's is not.
    assert reasons(result) == {"node-a": "2 of 4 GPUs free", "node-b": "no GPUs, needs 3"}


def test_gpu_count_with_a_kind_counts_only_that_kind() -> None:
    mixed = make_node("node-a", gpus=(*make_gpus(1, H100), *make_gpus(3, L40S, start=1)))

    result = explain(make_model("m", make_profile(gpus=2, gpu_kind="H100")), [mixed])

    assert reasons(result) == {"node-a": "1 of 1 H100 GPUs free"}


def test_gpu_memory_reason_names_the_size_in_gib() -> None:
    gpus = (*make_gpus(1, free_gib=79.5), *make_gpus(3, free_gib=30, start=1))
    nodes = [make_node("node-a", gpus=gpus, shards=[make_shard("s", "x", gpus=(3,), port=20000)])]

    result = explain(make_model("m", make_profile(gpus=2, gpu_memory_gib=70)), nodes)

    assert reasons(result) == {"node-a": "3 GPUs free but only 1 with 70 GiB free"}


def test_pending_starts_take_their_gpus_and_ports() -> None:
    pending = [
        Pending("node-a", ShardSpec("p1", "other", "vllm", "w", gpu_indices=(0, 1), port=20000)),
        Pending("node-a", ShardSpec("p2", "other", "vllm", "w", gpu_indices=(2,), port=20001)),
    ]

    result = explain(make_model("m", make_profile(gpus=2)), [make_node("node-a")], pending=pending)

    assert reasons(result) == {"node-a": "1 of 4 GPUs free"}
    single = explain(make_model("m"), [make_node("node-a")], pending=pending)
    assert single.placement is not None
    assert (single.placement.gpu_indices, single.placement.port) == ((3,), 20002)


def test_port_range_exhausted_or_missing() -> None:
    full = make_node(
        "node-a",
        port_range=(20000, 20001),
        shards=[make_shard("s1", "x", port=20000), make_shard("s2", "x", port=20001)],
    )
    unset = make_node("node-b", port_range=(0, 0))
    freed = make_node(
        "node-c",
        port_range=(20000, 20001),
        shards=[
            make_shard("s1", "x", port=20000),
            make_shard("s2", "x", port=20001, state="stopped"),
        ],
    )

    result = explain(make_model("m", make_profile(gpus=0)), [full, unset, freed])

    assert reasons(result) == {
        "node-a": "no free port in 20000-20001",
        "node-b": "reported no port range for engines",
    }
    assert result.placement is not None
    # The range is inclusive, and a stopped shard's port is free again.
    assert (result.placement.node_id, result.placement.port) == ("node-c", 20001)


def test_cpu_profile_skips_the_gpu_filters() -> None:
    nodes = [make_node("node-a", gpus=())]

    result = explain(
        make_model("m", make_profile(gpus=0, gpu_kind="H100", gpu_memory_gib=80)), nodes
    )

    assert result.placement is not None
    assert result.placement.gpu_indices == ()
    assert result.placement.port == 20000


def test_lowest_index_free_matching_gpus_are_chosen() -> None:
    gpus = (*make_gpus(2, free_gib=10), *make_gpus(4, free_gib=79, start=2))
    node = make_node("node-a", gpus=gpus, shards=[make_shard("s", "x", gpus=(2,), port=20000)])

    result = explain(make_model("m", make_profile(gpus=2, gpu_memory_gib=40)), [node])

    assert result.placement is not None
    assert result.placement.gpu_indices == (3, 4)
    assert result.placement.port == 20001


# --- scorers, avoidance, profiles ---------------------------------------------------


def busy_and_empty() -> list[Node]:
    return [
        make_node("node-a", shards=[make_shard("s1", "x", gpus=(0, 1), port=20000)]),
        make_node("node-b"),
    ]


def test_pack_fills_the_busier_node_and_spread_the_emptier() -> None:
    packed = explain(make_model(), busy_and_empty(), policy="pack")
    spread = explain(make_model(), busy_and_empty(), policy="spread")

    assert packed.placement is not None and spread.placement is not None
    assert (packed.placement.node_id, packed.placement.gpu_indices) == ("node-a", (2,))
    assert (spread.placement.node_id, spread.placement.gpu_indices) == ("node-b", (0,))


def test_cpu_profiles_pack_onto_nodes_with_more_shards() -> None:
    nodes = [make_node("node-a"), make_node("node-b", shards=[make_shard("s1", "x", port=20000)])]
    cpu = make_model("m", make_profile(gpus=0))

    packed = explain(cpu, nodes, policy="pack")
    spread = explain(cpu, nodes, policy="spread")

    assert packed.placement is not None and spread.placement is not None
    assert packed.placement.node_id == "node-b"
    assert spread.placement.node_id == "node-a"


def test_ties_go_to_the_lowest_node_id() -> None:
    nodes = [make_node("node-c"), make_node("node-a"), make_node("node-b")]

    for policy in ("pack", "spread"):
        result = explain(make_model(), nodes, policy=policy)
        assert result.placement is not None
        assert result.placement.node_id == "node-a"


def test_avoided_nodes_are_used_only_when_nothing_else_fits() -> None:
    avoid = frozenset({"node-a"})

    elsewhere = explain(make_model(), busy_and_empty(), avoid_nodes=avoid)
    only = explain(make_model(), [busy_and_empty()[0]], avoid_nodes=avoid)

    assert elsewhere.placement is not None and only.placement is not None
    assert elsewhere.placement.node_id == "node-b"
    assert only.placement.node_id == "node-a"


def test_a_port_where_a_start_failed_is_passed_over_while_another_is_free() -> None:
    node = make_node("node-a", port_range=(20000, 20001))
    failed_here = frozenset({("node-a", 20000), ("node-b", 20001)})

    moved = explain(make_model(), [node], avoid_ports=failed_here)
    both = explain(make_model(), [node], avoid_ports=failed_here | {("node-a", 20001)})

    assert moved.placement is not None and both.placement is not None
    assert moved.placement.port == 20001
    assert both.placement.port == 20000  # every port failed: the lowest again, not none


def test_a_node_with_a_replica_of_the_model_is_a_last_resort_before_avoided_nodes() -> None:
    nodes = [
        make_node("node-a", shards=[make_shard("s1", "llama", gpus=(0,), port=20000)]),
        make_node("node-b"),
        make_node("node-c"),
    ]

    result = explain(make_model("llama"), nodes, avoid_nodes=frozenset({"node-b", "node-c"}))

    assert result.placement is not None
    assert result.placement.node_id == "node-a"


def test_the_next_profile_is_tried_when_the_first_fits_nowhere() -> None:
    model = make_model(
        "m",
        make_profile("tp4-h100", gpus=4, gpu_kind="H100"),
        make_profile("tp2-l40s", gpus=2, gpu_kind="L40S"),
        make_profile("tp1", gpus=1),
    )
    nodes = [
        make_node("node-a", gpus=make_gpus(2, L40S)),
        make_node("node-b", gpus=make_gpus(2, H100)),
    ]

    result = explain(model, nodes)

    assert result.placement is not None
    assert (result.placement.node_id, result.placement.profile.name) == ("node-a", "tp2-l40s")
    assert result.verdicts == (
        ProfileVerdict(
            profile="tp4-h100",
            fits=(),
            rejections=(
                Rejection("node-a", "no GPU matches kind 'H100' (has NVIDIA L40S)"),
                Rejection("node-b", "2 of 2 H100 GPUs free"),
            ),
        ),
        ProfileVerdict(
            profile="tp2-l40s",
            fits=("node-a",),
            rejections=(
                Rejection("node-b", "no GPU matches kind 'L40S' (has NVIDIA H100 80GB HBM3)"),
            ),
        ),
    )


def test_nothing_fits_every_profile_has_a_verdict_and_the_summary_names_the_reasons() -> None:
    model = make_model("llama-70b", make_profile("tp4", gpus=4), make_profile("tp8", gpus=8))
    nodes = [
        make_node("node-a", shards=[make_shard("s1", "x", gpus=(0, 1), port=20000)]),
        make_node("node-b", draining=True),
    ]

    result = explain(model, nodes)

    assert result.placement is None
    assert [v.profile for v in result.verdicts] == ["tp4", "tp8"]
    assert result.summary() == (
        "model 'llama-70b' cannot be placed: "
        "profile 'tp4': node-a: 2 of 4 GPUs free; node-b: draining | "
        "profile 'tp8': node-a: 2 of 4 GPUs free; node-b: draining"
    )


def test_summary_of_a_placement_and_of_an_empty_fleet() -> None:
    placed = explain(make_model("llama", make_profile(gpus=2)), [make_node("node-a")])
    empty = explain(make_model("llama"), [])

    assert (
        placed.summary()
        == "model 'llama' fits on node node-a with profile 'tp1' (GPUs 0,1, port 20000)"
    )
    assert empty.summary() == "model 'llama' cannot be placed: profile 'tp1': no nodes registered"


# --- the fast path agrees with the full explanation ---------------------------------


@pytest.mark.parametrize("seed", [11, 12, 13])
@pytest.mark.parametrize("policy", ["pack", "spread"])
def test_fleet_place_agrees_with_explain_as_the_fleet_fills_up(policy: str, seed: int) -> None:
    rng = random.Random(seed)
    nodes = []
    for i in range(30):
        kind = H100 if i % 3 else L40S
        free = [rng.choice((20, 50, 79)) for _ in range(4)]
        gpus = tuple(Gpu(g, f"u{i}-{g}", kind, 80 * GIB, free[g] * GIB) for g in range(4))
        nodes.append(
            make_node(
                f"node-{i:02d}",
                gpus=gpus,
                labels={"zone": "ab"[i % 2]},
                draining=i % 7 == 0,
                port_range=(20000, 20000 + rng.randint(0, 5)),
            )
        )
    models = [
        make_model(
            f"m{j}",
            make_profile(
                "first",
                gpus=rng.choice((1, 2, 4)),
                gpu_memory_gib=rng.choice((0, 40)),
                gpu_kind=rng.choice((None, "H100", "l40s")),
                labels=rng.choice(({}, {"zone": "a"})),
            ),
            make_profile("cpu", gpus=0),
        )
        for j in range(12)
    ]
    fleet = Fleet(nodes, policy="spread" if policy == "spread" else "pack")
    placed_count = 0
    for step in range(150):
        model = models[step % len(models)]
        avoid = frozenset({f"node-{rng.randrange(30):02d}"})
        placed = fleet.place(model, avoid_nodes=avoid)
        assert placed == fleet.explain(model, avoid_nodes=avoid).placement
        if placed is None:
            continue
        fleet.reserve(placed, model.name)
        placed_count += 1
    # The fleet filled up on the way: both found places, then both ran out.
    assert 30 < placed_count < 150


@pytest.mark.parametrize("seed", [21, 22])
@pytest.mark.parametrize("policy", ["pack", "spread"])
def test_fleet_place_of_gangs_agrees_with_explain_as_the_fleet_fills_up(
    policy: str, seed: int
) -> None:
    """Multi-node replicas keep their fitting nodes grouped between placements; the
    groups must follow every reservation (single-node ones included) exactly."""
    rng = random.Random(seed)
    nodes = [
        dataclasses.replace(
            make_node(
                f"node-{i:02d}",
                gpus=make_gpus(4),
                fabric={"ib": f"pod{i // 4}"},
                draining=i % 9 == 0,
                port_range=(20000, 20000 + rng.randint(1, 4)),
            ),
            advertise_host=f"10.0.0.{i}",
        )
        for i in range(24)
    ]
    gang = dataclasses.replace(make_profile("tp2-pp2", gpus=2), nodes=2, fabric="ib")
    models = [
        make_model(f"g{j}", dataclasses.replace(gang, gpus=rng.choice((1, 2, 4)))) for j in range(4)
    ] + [make_model(f"m{j}", make_profile(gpus=rng.choice((1, 2)))) for j in range(4)]
    fleet = Fleet(nodes, policy="spread" if policy == "spread" else "pack")
    gangs_placed = refused = 0
    for _ in range(80):
        model = models[rng.randrange(len(models))]
        avoid = frozenset({f"node-{rng.randrange(24):02d}"})
        placed = fleet.place(model, avoid_nodes=avoid)
        assert placed == fleet.explain(model, avoid_nodes=avoid).placement
        if placed is None:
            refused += 1
            continue
        fleet.reserve(placed, model.name)
        gangs_placed += len(placed.ranks) > 1
    # Both found places, then the fleet filled up.
    assert gangs_placed > 3
    assert refused > 0


def test_a_node_holding_the_pinned_hub_weights_wins_over_pack_spread_and_ids() -> None:
    commit = "c" * 40
    model = dataclasses.replace(make_model(), weights="org/llama@main", weights_commit=commit)
    held = HeldWeights("org/llama", commit, 15_200_000_000, None)
    # node-c holds the snapshot; node-a is the busier node (pack) and the lowest id.
    nodes = [
        busy_and_empty()[0],
        make_node("node-b"),
        dataclasses.replace(make_node("node-c"), weights=(held,)),
    ]
    for policy in ("pack", "spread"):
        result = explain(model, nodes, policy=policy)
        assert result.placement is not None and result.placement.node_id == "node-c"
        fast = Fleet(nodes, policy=policy).place(model)
        assert fast is not None and fast.node_id == "node-c"
    assert explain(model, nodes).verdicts[0].weights == (
        "node-a: must download 15.2 GB (org/llama@ccccccc)",
        "node-b: must download 15.2 GB (org/llama@ccccccc)",
        "node-c: has org/llama@ccccccc on disk",
    )
    # Another commit of the same repo is not the model's weights: pack decides.
    other = dataclasses.replace(model, weights_commit="d" * 40)
    result = explain(other, nodes, policy="pack")
    assert result.placement is not None and result.placement.node_id == "node-a"
    assert result.verdicts[0].weights[2] == "node-c: must download org/llama@ddddddd"
    # A node already running a replica of the model is still passed over for a fresh one.
    busy_holder = dataclasses.replace(
        nodes[2], shards={"r1": make_shard("r1", "llama", port=20000)}
    )
    result = explain(model, [nodes[1], busy_holder], policy="pack")
    assert result.placement is not None and result.placement.node_id == "node-b"
