"""plan(): starts, stops and what stays unplaced, as a pure function of desired and actual."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta

from llmgw.control.catalog.model import Canary, CatalogModel, Profile
from llmgw.control.inventory.model import Gpu, Node, NodeState, Shard, ShardSpec, ShardState
from llmgw.control.reconciler import (
    Action,
    Actual,
    Desired,
    Pending,
    PlacementPolicy,
    Plan,
    Start,
    Stop,
    plan,
)

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
GIB = 1 << 30
H100 = "NVIDIA H100 80GB HBM3"
LAUNCH_ARGS = ("--max-model-len", "8192")
LAUNCH_ENV = {"VLLM_LOGGING_LEVEL": "INFO"}


def make_gpus(count: int) -> tuple[Gpu, ...]:
    return tuple(Gpu(i, f"GPU-{i}", H100, 80 * GIB, 79 * GIB) for i in range(count))


def make_shard(
    shard_id: str,
    model: str,
    *,
    gpus: tuple[int, ...] = (),
    port: int = 0,
    state: ShardState = "ready",
    age: int = 0,
) -> Shard:
    # What `make_model`'s profile starts (a shard running anything else is rolled).
    spec = ShardSpec(
        shard_id=shard_id,
        model=model,
        engine="vllm",
        weights=f"org/{model}",
        gpu_indices=gpus,
        port=port,
        engine_args=LAUNCH_ARGS,
        env=LAUNCH_ENV,
        tensor_parallel_size=max(1, len(gpus)),
        gpu_memory_utilization=0.85,
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
    gpus: int = 4,
    state: NodeState = "ready",
    draining: bool = False,
    connected: bool = True,
    labels: Mapping[str, str] | None = None,
    shards: Sequence[Shard] = (),
) -> Node:
    return Node(
        id=node_id,
        hostname=f"{node_id}.lab",
        agent_version="0.1.0",
        gpus=make_gpus(gpus),
        cpu_count=64,
        memory_total=512 * GIB,
        weights_disk_free=1024 * GIB,
        gpu_source="declared",
        labels=dict(labels or {}),
        fabric={},
        port_range=(20000, 20009),
        weights_dir="/var/lib/llmgw",
        state=state,
        draining=draining,
        connected=connected,
        registered_at=EPOCH,
        last_heartbeat=0.0,
        last_heartbeat_at=EPOCH,
        shards={s.id: s for s in shards},
    )


def make_model(
    name: str = "llama", *, gpus: int = 1, profiles: Sequence[Profile] = ()
) -> CatalogModel:
    profile = Profile(
        name=f"tp{gpus}",
        engine="vllm",
        engine_args=LAUNCH_ARGS,
        env=LAUNCH_ENV,
        gpus=gpus,
        gpu_memory_utilization=0.85,
    )
    return CatalogModel(name=name, weights=f"org/{name}", profiles=tuple(profiles) or (profile,))


def ids() -> Callable[[str], str]:
    counter = iter(range(1, 1_000_000))
    return lambda model: f"{model}-r{next(counter)}"


def run(
    desired: Sequence[Desired],
    nodes: Sequence[Node],
    *,
    pending: Sequence[Pending] = (),
    stopping: frozenset[str] = frozenset(),
    policy: PlacementPolicy = "pack",
) -> Plan:
    return plan(
        desired,
        Actual(nodes=nodes, pending=pending, stopping=stopping),
        policy=policy,
        new_shard_id=ids(),
    )


def starts(result: Plan) -> list[Start]:
    return [a for a in result.actions if isinstance(a, Start)]


def stops(result: Plan) -> list[Stop]:
    return [a for a in result.actions if isinstance(a, Stop)]


def where(result: Plan) -> list[tuple[str, str, tuple[int, ...], int]]:
    return [(s.node_id, s.model, s.spec.gpu_indices, s.spec.port) for s in starts(result)]


# --- starting ------------------------------------------------------------------------


def test_from_scratch_every_replica_gets_a_start_with_the_profiles_spec() -> None:
    llama = make_model("llama", gpus=2)

    result = run([Desired(llama, 2)], [make_node("node-a"), make_node("node-b")])

    assert result.unplaced == {}
    assert result.actions == (
        Start(
            node_id="node-a",
            model="llama",
            profile="tp2",
            spec=ShardSpec(
                shard_id="llama-r1",
                model="llama",
                engine="vllm",
                weights="org/llama",
                gpu_indices=(0, 1),
                port=20000,
                engine_args=("--max-model-len", "8192"),
                env={"VLLM_LOGGING_LEVEL": "INFO"},
                tensor_parallel_size=2,
                gpu_memory_utilization=0.85,
            ),
        ),
        # The second replica prefers another node, so one node failing takes one replica.
        Start(
            node_id="node-b",
            model="llama",
            profile="tp2",
            spec=ShardSpec(
                shard_id="llama-r2",
                model="llama",
                engine="vllm",
                weights="org/llama",
                gpu_indices=(0, 1),
                port=20000,
                engine_args=("--max-model-len", "8192"),
                env={"VLLM_LOGGING_LEVEL": "INFO"},
                tensor_parallel_size=2,
                gpu_memory_utilization=0.85,
            ),
        ),
    )


def test_starts_in_one_plan_never_share_a_gpu_or_port() -> None:
    result = run(
        [Desired(make_model("a"), 3), Desired(make_model("b", gpus=1), 1)],
        [make_node("node-a", gpus=4)],
    )

    assert where(result) == [
        ("node-a", "a", (0,), 20000),
        ("node-a", "a", (1,), 20001),
        ("node-a", "a", (2,), 20002),
        ("node-a", "b", (3,), 20003),
    ]


def test_pending_starts_count_as_replicas_and_hold_their_gpus_and_ports() -> None:
    pending = [
        Pending("node-a", ShardSpec("a-r0", "a", "vllm", "org/a", gpu_indices=(0,), port=20000))
    ]

    result = run(
        [Desired(make_model("a"), 2), Desired(make_model("b"), 1)],
        [make_node("node-a")],
        pending=pending,
    )

    assert where(result) == [("node-a", "a", (1,), 20001), ("node-a", "b", (2,), 20002)]


def test_a_pending_start_the_node_already_reports_is_counted_once() -> None:
    node = make_node(
        "node-a", shards=[make_shard("a-r0", "a", gpus=(0,), port=20000, state="loading")]
    )
    pending = [
        Pending("node-a", ShardSpec("a-r0", "a", "vllm", "org/a", gpu_indices=(0,), port=20000))
    ]

    result = run([Desired(make_model("a"), 2)], [node], pending=pending)

    assert where(result) == [("node-a", "a", (1,), 20001)]


def test_largest_models_are_placed_first_then_by_name() -> None:
    result = run(
        [Desired(make_model("a-small"), 1), Desired(make_model("b-big", gpus=4), 1)],
        [make_node("node-a", gpus=4), make_node("node-b", gpus=1)],
    )

    assert where(result) == [
        ("node-a", "b-big", (0, 1, 2, 3), 20000),
        ("node-b", "a-small", (0,), 20000),
    ]


def test_hold_starts_nothing_and_is_not_reported_unplaced() -> None:
    result = run([Desired(make_model("a"), 2, hold=True)], [make_node("node-a", gpus=0)])

    assert result.actions == ()
    assert result.unplaced == {}


def test_avoided_nodes_are_skipped_while_others_fit() -> None:
    nodes = [make_node("node-a"), make_node("node-b")]

    result = run([Desired(make_model("a"), 1, avoid_nodes=frozenset({"node-a"}))], nodes)

    assert where(result) == [("node-b", "a", (0,), 20000)]


def test_a_retry_on_the_same_node_takes_another_port() -> None:
    result = run(
        [Desired(make_model("a"), 1, avoid_ports=frozenset({("node-a", 20000)}))],
        [make_node("node-a")],
    )

    assert where(result) == [("node-a", "a", (0,), 20001)]


def test_unplaced_models_carry_their_explanation() -> None:
    big = make_model("big", gpus=4)
    nodes = [make_node("node-a", gpus=4), make_node("node-b", gpus=4, draining=True)]

    result = run([Desired(big, 3), Desired(make_model("ok", gpus=0), 1)], nodes)

    assert where(result) == [("node-a", "big", (0, 1, 2, 3), 20000), ("node-a", "ok", (), 20001)]
    assert list(result.unplaced) == ["big"]
    explanation = result.unplaced["big"]
    assert explanation.placement is None
    assert explanation.summary() == (
        "model 'big' cannot be placed: profile 'tp4': node-a: 0 of 4 GPUs free; node-b: draining"
    )


# --- lost nodes, draining ------------------------------------------------------------


def test_replicas_on_a_lost_node_are_replaced_elsewhere_and_nothing_is_sent_there() -> None:
    lost = make_node(
        "node-a",
        state="lost",
        connected=False,
        shards=[
            make_shard("a-1", "a", gpus=(0,), port=20000),
            make_shard("x-1", "gone", port=20001),
        ],
    )

    result = run([Desired(make_model("a"), 1)], [lost, make_node("node-b")])

    assert result.actions == tuple(starts(result))
    assert where(result) == [("node-b", "a", (0,), 20000)]


def test_drain_starts_a_replacement_and_stops_the_old_shard_once_it_is_ready() -> None:
    old = make_shard("a-1", "a", gpus=(0,), port=20000)
    draining = make_node("node-a", draining=True, shards=[old])

    first = run([Desired(make_model("a"), 1)], [draining, make_node("node-b")])
    assert where(first) == [("node-b", "a", (0,), 20000)]
    assert stops(first) == []

    loading = make_node(
        "node-b", shards=[make_shard("a-2", "a", gpus=(0,), port=20000, state="loading")]
    )
    second = run([Desired(make_model("a"), 1)], [draining, loading])
    assert second.actions == ()

    ready = make_node("node-b", shards=[make_shard("a-2", "a", gpus=(0,), port=20000)])
    third = run([Desired(make_model("a"), 1)], [draining, ready])
    assert third.actions == (Stop("node-a", "a-1", "a", "node_draining", drain=True),)


def test_a_draining_node_is_emptied_at_once_when_no_replicas_are_wanted() -> None:
    node = make_node(
        "node-a", draining=True, shards=[make_shard("a-1", "a", gpus=(0,), port=20000)]
    )

    result = run([Desired(make_model("a"), 0)], [node])

    assert result.actions == (Stop("node-a", "a-1", "a", "node_draining", drain=True),)


# --- stopping ------------------------------------------------------------------------


def test_scale_down_stops_replicas_not_ready_yet_first_then_the_newest() -> None:
    node = make_node(
        "node-a",
        gpus=8,
        shards=[
            make_shard("a-old", "a", gpus=(0,), port=20000, age=300),
            make_shard("a-new", "a", gpus=(1,), port=20001, age=100),
            make_shard("a-mid", "a", gpus=(2,), port=20002, age=200),
            make_shard("a-loading", "a", gpus=(3,), port=20003, state="loading", age=50),
            make_shard("a-starting", "a", gpus=(4,), port=20004, state="starting", age=10),
        ],
    )

    result = run([Desired(make_model("a"), 2)], [node])

    assert {(s.shard_id, s.reason, s.drain) for s in stops(result)} == {
        ("a-loading", "scale_down", True),
        ("a-starting", "scale_down", True),
        ("a-new", "scale_down", True),
    }
    assert starts(result) == []


def test_scale_down_counts_pending_starts_but_never_trades_a_shard_for_one() -> None:
    ready = [
        make_shard("a-1", "a", gpus=(0,), port=20000, age=20),
        make_shard("a-2", "a", gpus=(1,), port=20001, age=10),
    ]
    spec = ShardSpec("a-3", "a", "vllm", "org/a", gpu_indices=(2,), port=20002)

    # Two Ready replicas and a start in flight, two wanted: nothing is stopped
    # (and nothing started) until the start reports...
    waiting = run(
        [Desired(make_model("a"), 2)],
        [make_node("node-a", shards=ready)],
        pending=[Pending("node-a", spec)],
    )
    assert waiting.actions == ()

    # ...then its shard, not ready yet, is the one drained.
    started = make_shard("a-3", "a", gpus=(2,), port=20002, state="starting")
    reported = run([Desired(make_model("a"), 2)], [make_node("node-a", shards=[*ready, started])])
    assert reported.actions == (Stop("node-a", "a-3", "a", "scale_down", drain=True),)


def test_a_node_back_while_its_replacement_is_still_a_pending_start_keeps_its_replica() -> None:
    back = make_node("node-a", shards=[make_shard("a-1", "a", gpus=(0,), port=20000, age=600)])
    spec = ShardSpec("a-2", "a", "vllm", "org/a", gpu_indices=(0,), port=20000)

    result = run(
        [Desired(make_model("a"), 1)],
        [back, make_node("node-b")],
        pending=[Pending("node-b", spec)],
    )

    assert result.actions == ()


def test_shards_of_a_model_no_longer_in_the_catalog_are_drained_where_reachable() -> None:
    nodes = [
        make_node("node-a", shards=[make_shard("old-1", "old", gpus=(0,), port=20000)]),
        make_node(
            "node-b", connected=False, shards=[make_shard("old-2", "old", gpus=(0,), port=20000)]
        ),
    ]

    result = run([Desired(make_model("a"), 0)], nodes)

    assert result.actions == (Stop("node-a", "old-1", "old", "not_in_catalog", drain=True),)


def test_ended_shards_get_a_stop_so_the_agent_forgets_them() -> None:
    node = make_node(
        "node-a",
        shards=[
            make_shard("a-1", "a", gpus=(0,), port=20000, state="failed"),
            make_shard("a-2", "a", gpus=(1,), port=20001, state="stopped"),
            make_shard("a-3", "a", gpus=(2,), port=20002, state="stopped"),
            make_shard("gone-1", "gone", state="stopped"),
        ],
    )

    result = run([Desired(make_model("a"), 1)], [node], stopping=frozenset({"a-3"}))

    assert stops(result) == [
        Stop("node-a", "a-1", "a", "ended", drain=False),
        Stop("node-a", "a-2", "a", "ended", drain=False),
        Stop("node-a", "gone-1", "gone", "ended", drain=False),
    ]
    # Their GPUs and ports are free again.
    assert where(result) == [("node-a", "a", (0,), 20000)]


def test_shards_being_stopped_are_neither_counted_nor_stopped_again() -> None:
    node = make_node(
        "node-a",
        shards=[
            make_shard("a-1", "a", gpus=(0,), port=20000),
            make_shard("a-2", "a", gpus=(1,), port=20001, state="draining"),
        ],
    )

    result = run([Desired(make_model("a"), 1)], [node], stopping=frozenset({"a-1"}))

    assert result.actions == tuple(starts(result))
    assert where(result) == [("node-a", "a", (2,), 20002)]


def test_steady_state_plans_nothing() -> None:
    node = make_node("node-a", shards=[make_shard("a-1", "a", gpus=(0,), port=20000)])

    result = run([Desired(make_model("a"), 1)], [node])

    assert result == Plan(actions=(), unplaced={})


# --- determinism ---------------------------------------------------------------------


def fleet(rng: random.Random) -> tuple[list[Desired], list[Node]]:
    desired = [
        Desired(make_model(f"m{i}", gpus=rng.choice((0, 1, 2, 4))), rng.randint(0, 3))
        for i in range(12)
    ]
    nodes = []
    for i in range(8):
        shards = []
        for g in range(rng.randint(0, 3)):
            state: ShardState = rng.choice(("ready", "loading", "failed"))
            shards.append(
                make_shard(
                    f"n{i}-s{g}",
                    f"m{rng.randrange(14)}",
                    gpus=(g,),
                    port=20000 + g,
                    state=state,
                    age=g,
                )
            )
        nodes.append(
            make_node(f"node-{i}", gpus=rng.choice((0, 4, 8)), draining=i == 3, shards=shards)
        )
    return desired, nodes


def test_the_same_input_gives_the_same_plan_whatever_the_input_order() -> None:
    desired, nodes = fleet(random.Random(5))

    first = run(desired, nodes)
    again = run(list(reversed(desired)), list(reversed(nodes)))

    assert first == again
    assert first.actions  # the case is not trivial
    actions: list[Action] = list(first.actions)
    stop_keys = [(a.node_id, a.shard_id) for a in actions if isinstance(a, Stop)]
    assert stop_keys == sorted(stop_keys)


# --- a node in doubt ------------------------------------------------------------------


def test_replicas_on_an_unreachable_node_are_replaced_elsewhere_and_kept_where_they_are() -> None:
    doubted = make_node(
        "node-a", state="unreachable", shards=[make_shard("a-1", "a", gpus=(0,), port=20000)]
    )

    result = run([Desired(make_model("a"), 1)], [doubted, make_node("node-b")])

    # Nothing goes to the node in doubt (no stop: it may come back), and its GPU
    # stays taken there; the replacement goes to the other node.
    assert stops(result) == []
    assert where(result) == [("node-b", "a", (0,), 20000)]
    assert result.in_doubt == {"a": ("a-1",)}


def test_a_node_in_doubt_takes_no_replacement_even_when_it_is_the_only_node() -> None:
    doubted = make_node(
        "node-a", state="unreachable", shards=[make_shard("a-1", "a", gpus=(0,), port=20000)]
    )

    result = run([Desired(make_model("a"), 1)], [doubted])

    assert result.actions == ()
    assert result.in_doubt == {"a": ("a-1",)}
    assert "node-a: unreachable (no heartbeat)" in result.unplaced["a"].summary()


def test_a_closed_stream_with_recent_heartbeats_is_not_replaced() -> None:
    # An agent restarting: its replicas leave the routers (the controller's
    # business), but loading the model elsewhere for a few seconds' gap is waste.
    restarting = make_node(
        "node-a", connected=False, shards=[make_shard("a-1", "a", gpus=(0,), port=20000)]
    )

    result = run([Desired(make_model("a"), 1)], [restarting, make_node("node-b")])

    assert result.actions == ()
    assert result.in_doubt == {}


def test_a_start_sent_to_a_node_now_in_doubt_is_not_counted() -> None:
    spec = ShardSpec(shard_id="a-1", model="a", engine="vllm", weights="org/a", port=20000)
    result = run(
        [Desired(make_model("a"), 1)],
        [make_node("node-a", state="unreachable"), make_node("node-b")],
        pending=[Pending("node-a", spec)],
    )

    assert where(result) == [("node-b", "a", (0,), 20000)]


def test_when_the_node_comes_back_the_replacement_still_loading_is_retired() -> None:
    back = make_node("node-a", shards=[make_shard("a-1", "a", gpus=(0,), port=20000, age=600)])
    replacement = make_node(
        "node-b", shards=[make_shard("a-2", "a", gpus=(0,), port=20000, state="loading", age=5)]
    )

    result = run([Desired(make_model("a"), 1)], [back, replacement])

    assert result.actions == (Stop("node-b", "a-2", "a", "scale_down", drain=True),)
    detail = stops(result)[0].detail
    assert detail == (
        "2 replicas for 1 wanted; keeping a-1 on node-a (ready); "
        "Ready ones are kept first, then the oldest"
    )
    assert result.in_doubt == {}


def test_when_both_are_ready_the_older_replica_is_kept() -> None:
    back = make_node("node-a", shards=[make_shard("a-1", "a", gpus=(0,), port=20000, age=600)])
    replacement = make_node(
        "node-b", shards=[make_shard("a-2", "a", gpus=(0,), port=20000, age=30)]
    )

    result = run([Desired(make_model("a"), 1)], [back, replacement])

    assert result.actions == (Stop("node-b", "a-2", "a", "scale_down", drain=True),)


def test_when_the_returning_replica_is_not_ready_the_ready_replacement_is_kept() -> None:
    back = make_node(
        "node-a",
        shards=[make_shard("a-1", "a", gpus=(0,), port=20000, state="loading", age=600)],
    )
    replacement = make_node(
        "node-b", shards=[make_shard("a-2", "a", gpus=(0,), port=20000, age=30)]
    )

    result = run([Desired(make_model("a"), 1)], [back, replacement])

    assert result.actions == (Stop("node-a", "a-1", "a", "scale_down", drain=True),)
    assert "keeping a-2 on node-b (ready)" in stops(result)[0].detail


# --- rollouts ------------------------------------------------------------------------


def with_args(model: CatalogModel, *args: str) -> CatalogModel:
    """`model` with its profile's engine arguments replaced: a change that rolls."""
    profile = dataclasses.replace(model.profiles[0], engine_args=args)
    return dataclasses.replace(model, profiles=(profile,))


def shard_of(start: Start, state: ShardState, age: int) -> Shard:
    """The shard an agent reports for `start`."""
    base = make_shard(start.spec.shard_id, start.model, state=state, age=age)
    return dataclasses.replace(base, spec=start.spec)


def test_a_change_to_what_runs_rolls_surge_first_and_never_below_the_wanted_ready() -> None:
    old = make_model("llama")
    new = with_args(old, "--max-model-len", "4096")
    shards = [make_shard(f"old-{i}", "llama", gpus=(i,), port=20000 + i, age=100) for i in range(3)]
    node = make_node("node-a", gpus=8, shards=shards)
    counter = ids()
    seen_ready: list[int] = []
    for turn in range(20):
        result = plan(
            [Desired(new, 3)],
            Actual(nodes=[node]),
            policy="pack",
            new_shard_id=counter,
        )
        assert all(s.reason == "rollout" for s in stops(result))
        if not result.actions and not result.rolling:
            break
        # Surge 1: never more than one new replica on its way at a time.
        assert len(starts(result)) <= 1
        kept = {
            k: v for k, v in node.shards.items() if k not in {s.shard_id for s in stops(result)}
        }
        # New replicas load in one turn and are Ready the next.
        kept = {
            k: dataclasses.replace(v, state="ready") if v.state == "loading" else v
            for k, v in kept.items()
        }
        for start in starts(result):
            kept[start.spec.shard_id] = shard_of(start, "loading", -turn)
        node = dataclasses.replace(node, shards=kept)
        seen_ready.append(sum(s.state == "ready" for s in node.shards.values()))
    else:
        raise AssertionError("the rollout did not end in 20 turns")
    assert min(seen_ready) >= 3
    assert len(node.shards) == 3
    assert all(
        s.spec is not None and s.spec.engine_args == new.profiles[0].engine_args
        for s in node.shards.values()
    )
    assert all(s.state == "ready" for s in node.shards.values())


def test_the_first_step_starts_one_new_replica_and_stops_nothing() -> None:
    old = make_model("llama")
    new = with_args(old, "--max-model-len", "4096")
    shards = [make_shard(f"old-{i}", "llama", gpus=(i,), port=20000 + i) for i in range(3)]

    result = run([Desired(new, 3)], [make_node("node-a", gpus=8, shards=shards)])

    assert stops(result) == []
    assert [s.spec.engine_args for s in starts(result)] == [("--max-model-len", "4096")]
    assert "0 of 3 replicas run the new spec" in result.rolling["llama"]


def test_once_a_new_replica_is_ready_the_oldest_old_one_drains() -> None:
    old = make_model("llama")
    new = with_args(old, "--max-model-len", "4096")
    shards = [
        make_shard(f"old-{i}", "llama", gpus=(i,), port=20000 + i, age=10 + i) for i in range(3)
    ]
    fresh = make_shard("new-0", "llama", gpus=(3,), port=20003)
    fresh = dataclasses.replace(
        fresh,
        spec=dataclasses.replace(fresh.spec, engine_args=("--max-model-len", "4096")),  # type: ignore[arg-type]
    )

    result = run([Desired(new, 3)], [make_node("node-a", gpus=8, shards=[*shards, fresh])])

    assert [(s.shard_id, s.reason, s.drain) for s in stops(result)] == [("old-2", "rollout", True)]
    assert len(starts(result)) == 1


def test_max_unavailable_lets_an_old_replica_go_before_a_new_one_is_ready() -> None:
    old = make_model("llama")
    new = dataclasses.replace(
        with_args(old, "--max-model-len", "4096"), max_surge=0, max_unavailable=1
    )
    shards = [make_shard(f"old-{i}", "llama", gpus=(i,), port=20000 + i) for i in range(3)]

    result = run([Desired(new, 3)], [make_node("node-a", gpus=8, shards=shards)])

    assert len(stops(result)) == 1
    assert len(starts(result)) == 1


def test_a_halted_rollout_keeps_the_old_replicas_and_starts_nothing_new() -> None:
    old = make_model("llama")
    new = with_args(old, "--max-model-len", "4096")
    shards = [make_shard(f"old-{i}", "llama", gpus=(i,), port=20000 + i) for i in range(3)]

    result = run([Desired(new, 3, halted=True)], [make_node("node-a", gpus=8, shards=shards)])

    assert result.actions == ()
    assert result.rolling == {}


def test_a_change_that_leaves_what_runs_alone_restarts_nothing() -> None:
    old = make_model("llama")
    new = dataclasses.replace(old, aliases=("l3",), keep_alive=-1, max_replicas=5)
    shards = [make_shard(f"old-{i}", "llama", gpus=(i,), port=20000 + i) for i in range(3)]

    result = run([Desired(new, 3)], [make_node("node-a", gpus=8, shards=shards)])

    assert result.actions == ()
    assert result.rolling == {}


def test_old_replicas_not_ready_yet_are_kept_while_too_few_are_ready() -> None:
    # A new leader adopts replicas of the previous spec before they are routed to:
    # they are not stopped for a spec that has no Ready replica yet.
    old = make_model("llama")
    new = with_args(old, "--max-model-len", "4096")
    shards = [
        make_shard(f"old-{i}", "llama", gpus=(i,), port=20000 + i, state="loading")
        for i in range(2)
    ]

    result = run([Desired(new, 2)], [make_node("node-a", gpus=8, shards=shards)])

    assert stops(result) == []
    assert len(starts(result)) == 1


# --- canaries ------------------------------------------------------------------------


def with_canary(model: CatalogModel, weight: int, *args: str) -> CatalogModel:
    """`model` with a canary whose profile runs `args`, at `weight` against 100 - weight."""
    canary = with_args(model, *args)
    return dataclasses.replace(
        model,
        canary=Canary(
            name="v2",
            weight=weight,
            stable_name="v1",
            stable_weight=100 - weight,
            weights=canary.weights,
            profiles=canary.profiles,
        ),
    )


def test_a_canary_gets_its_share_of_the_replicas_by_weight_and_at_least_one() -> None:
    for wanted, weight, canaries in ((1, 10, 1), (3, 10, 1), (10, 10, 1), (10, 30, 3), (4, 50, 2)):
        llama = with_canary(make_model("llama"), weight, "--canary")
        result = run([Desired(llama, wanted)], [make_node("node-a", gpus=16)])
        args = [s.spec.engine_args for s in starts(result)]
        assert args.count(("--canary",)) == canaries, (wanted, weight, args)
        assert args.count(LAUNCH_ARGS) == max(1, wanted - canaries), (wanted, weight, args)


def test_a_canary_and_its_model_keep_their_replicas_and_plan_nothing_when_complete() -> None:
    llama = with_canary(make_model("llama"), 10, "--canary")
    first = run([Desired(llama, 3)], [make_node("node-a", gpus=8)])
    node = make_node("node-a", gpus=8, shards=[shard_of(s, "ready", 10) for s in starts(first)])

    assert run([Desired(llama, 3)], [node]).actions == ()
    # Pending starts count for their own version.
    pending = [Pending(s.node_id, s.spec) for s in starts(first)]
    assert run([Desired(llama, 3)], [make_node("node-a", gpus=8)], pending=pending).actions == ()


def test_abort_drains_the_canary_once_the_model_has_its_replicas_and_promote_rolls() -> None:
    plain = make_model("llama")
    llama = with_canary(plain, 10, "--canary")
    first = run([Desired(llama, 3)], [make_node("node-a", gpus=8)])
    node = make_node("node-a", gpus=8, shards=[shard_of(s, "ready", 10) for s in starts(first)])
    canary_ids = [s.spec.shard_id for s in starts(first) if s.spec.engine_args == ("--canary",)]

    # Abort: the canary's replica is outdated; one of the model's own starts first.
    aborted = run([Desired(plain, 3)], [node])
    assert stops(aborted) == []
    assert [s.spec.engine_args for s in starts(aborted)] == [LAUNCH_ARGS]
    replaced = dataclasses.replace(
        node,
        shards={**node.shards, "new": shard_of(starts(aborted)[0], "ready", 0)},
    )
    after = run([Desired(plain, 3)], [replaced])
    assert [(s.shard_id, s.reason) for s in stops(after)] == [(canary_ids[0], "rollout")]
    assert starts(after) == []

    # Promote: the canary's spec is the model's; the others roll to it, surge first.
    promoted = with_args(plain, "--canary")
    rolled = run([Desired(promoted, 3)], [node])
    assert stops(rolled) == []
    assert [s.spec.engine_args for s in starts(rolled)] == [("--canary",)]
    assert "llama" in rolled.rolling


def test_a_stopped_canary_is_not_started_again_and_its_replicas_drain_like_an_abort() -> None:
    llama = with_canary(make_model("llama"), 10, "--canary")
    first = run([Desired(llama, 3)], [make_node("node-a", gpus=8)])
    own = [s for s in starts(first) if s.spec.engine_args == LAUNCH_ARGS]
    # The canary's replica failed and is gone: none of it starts again; the model's own
    # spec takes the whole count.
    node = make_node("node-a", gpus=8, shards=[shard_of(s, "ready", 10) for s in own])
    stopped = run([Desired(llama, 3, canary_halted=True)], [node])
    assert stops(stopped) == []
    assert [s.spec.engine_args for s in starts(stopped)] == [LAUNCH_ARGS]
    assert run([Desired(llama, 3)], [node]).actions != ()  # not stopped: it would start again

    # A canary replica still Ready drains once the model's own are, as after an abort.
    every = make_node("node-a", gpus=8, shards=[shard_of(s, "ready", 10) for s in starts(first)])
    canary_ids = [s.spec.shard_id for s in starts(first) if s.spec.engine_args == ("--canary",)]
    waiting = run([Desired(llama, 3, canary_halted=True)], [every])
    assert stops(waiting) == []
    assert [s.spec.engine_args for s in starts(waiting)] == [LAUNCH_ARGS]
    replaced = dataclasses.replace(
        every, shards={**every.shards, "new": shard_of(starts(waiting)[0], "ready", 0)}
    )
    after = run([Desired(llama, 3, canary_halted=True)], [replaced])
    assert [(s.shard_id, s.reason) for s in stops(after)] == [(canary_ids[0], "rollout")]
    assert starts(after) == []
