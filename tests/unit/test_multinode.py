"""Multi-node replicas: profile fields, gang placement, plan() over gangs, launch lines per rank."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from llmgw.agent import interfaces, wire
from llmgw.agent.flags import PortRange
from llmgw.agent.hardware import HardwareReport
from llmgw.agent.wire import NodeIdentity
from llmgw.cli.models import explain_text
from llmgw.control.agentsvc import convert
from llmgw.control.catalog.errors import InvalidModel
from llmgw.control.catalog.model import CatalogModel, Profile
from llmgw.control.catalog.validate import model_to_dict, parse_model
from llmgw.control.inventory.model import (
    Gpu,
    NetInterface,
    Node,
    NodeState,
    Shard,
    ShardSpec,
    ShardState,
)
from llmgw.control.reconciler import Actual, Desired, Pending, Plan, Start, Stop, explain, plan
from llmgw.control.reconciler.mgmt import MGMT_LABEL, MgmtAddress, mgmt_address
from llmgw.control.reconciler.state import ModelState
from llmgw.control.reconciler.views import explanation_view, state_view
from llmgw.engines import EngineSettings, EngineSpec, ProfileError, adapter_for

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
GIB = 1 << 30
H100 = "NVIDIA H100 80GB HBM3"


def node(
    node_id: str,
    *,
    pod: str | None = "pod3",
    gpus: int = 8,
    free: int | None = None,
    shards: Sequence[Shard] = (),
    state: NodeState = "ready",
    draining: bool = False,
) -> Node:
    fabric: Mapping[str, str] = {} if pod is None else {"ib-domain": pod}
    held = list(shards)
    if free is not None:
        held.append(blocker(f"{node_id}-other", tuple(range(free, gpus))))
    return Node(
        id=node_id,
        hostname=f"{node_id}.lab",
        agent_version="0.1.0",
        gpus=tuple(Gpu(i, f"GPU-{i}", H100, 80 * GIB, 80 * GIB) for i in range(gpus)),
        cpu_count=64,
        memory_total=512 * GIB,
        weights_disk_free=1024 * GIB,
        gpu_source="declared",
        labels={},
        fabric=fabric,
        port_range=(20000, 20009),
        weights_dir="/var/lib/llmgw",
        state=state,
        draining=draining,
        connected=True,
        registered_at=EPOCH,
        last_heartbeat=0.0,
        last_heartbeat_at=EPOCH,
        shards={s.id: s for s in held},
        advertise_host=f"10.1.0.{node_id[-1]}",
    )


def blocker(shard_id: str, gpus: tuple[int, ...]) -> Shard:
    spec = ShardSpec(shard_id=shard_id, model="other", engine="vllm", weights="o", gpu_indices=gpus)
    return Shard(shard_id, "other", "vllm", "ready", "", None, "", (), None, spec, EPOCH)


def gang_profile(**changes: object) -> Profile:
    base = Profile(
        name="tp8-pp2",
        engine="vllm",
        gpus=8,
        gpu_memory=80 * GIB,
        nodes=2,
        fabric="ib-domain",
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def big_model(profile: Profile | None = None) -> CatalogModel:
    return CatalogModel(
        name="llama-405b", weights="org/llama-405b", profiles=(profile or gang_profile(),)
    )


def gang_shard(
    shard_id: str,
    rank: int,
    *,
    replica: str = "big",
    state: ShardState = "ready",
    port: int = 20000,
    master_port: int = 0,
) -> Shard:
    spec = ShardSpec(
        shard_id=shard_id,
        model="llama-405b",
        engine="vllm",
        weights="org/llama-405b",
        gpu_indices=tuple(range(8)),
        port=port,
        tensor_parallel_size=8,
        pipeline_parallel_size=2,
        nodes=2,
        node_rank=rank,
        master_addr="10.1.0.1",
        master_port=master_port,
        replica_id=replica,
    )
    return Shard(
        id=shard_id,
        model="llama-405b",
        engine="vllm",
        state=state,
        message="",
        pid=None,
        endpoint_url="http://10.1.0.1:20000" if rank == 0 else "",
        output_tail=(),
        exit_code=1 if state == "failed" else None,
        spec=spec,
        since=EPOCH,
    )


def run(desired: Sequence[Desired], nodes: Sequence[Node], **actual: object) -> Plan:
    counter = iter(range(1, 1000))
    return plan(
        desired,
        Actual(nodes=nodes, **actual),  # type: ignore[arg-type]
        policy="pack",
        new_shard_id=lambda model: f"{model}-{next(counter)}",
    )


def starts(result: Plan) -> list[Start]:
    return [a for a in result.actions if isinstance(a, Start)]


def stops(result: Plan) -> list[Stop]:
    return [a for a in result.actions if isinstance(a, Stop)]


# ---- profile fields ----


def profile_body(**profile: object) -> dict[str, object]:
    return {
        "name": "llama-405b",
        "weights": "org/llama-405b",
        "profiles": [{"engine": "vllm", "gpus": 8, **profile}],
    }


def test_a_multi_node_profile_derives_tp_within_a_node_and_one_stage_per_node() -> None:
    model = parse_model(profile_body(nodes=2, fabric="ib-domain"))
    profile = model.profiles[0]
    assert (profile.nodes, profile.fabric) == (2, "ib-domain")
    assert (profile.tensor_parallel, profile.pipeline_parallel) == (8, 2)
    assert parse_model(model_to_dict(model)) == model
    spanning = parse_model(profile_body(nodes=2, fabric="ib-domain", tensor_parallel_size=16))
    assert (spanning.profiles[0].tensor_parallel, spanning.profiles[0].pipeline_parallel) == (16, 1)


@pytest.mark.parametrize(
    ("fields", "path", "words"),
    [
        ({"nodes": 2}, "profiles.0", "nodes is 2 but fabric is not set"),
        ({"fabric": "ib-domain"}, "profiles.0.fabric", "set but nodes is 1"),
        ({"nodes": 2, "fabric": "ib-domain=pod3"}, "profiles.0.fabric", "key only"),
        ({"nodes": 0}, "profiles.0.nodes", "greater than or equal to 1"),
        (
            {"nodes": 2, "fabric": "ib", "tensor_parallel_size": 17},
            "profiles.0.tensor_parallel_size",
            "more than gpus x nodes (8 x 2)",
        ),
        (
            {"nodes": 2, "fabric": "ib", "tensor_parallel_size": 4},
            "profiles.0.nodes",
            "(4) x pipeline_parallel_size (2) must equal gpus x nodes (8 x 2 = 16)",
        ),
        (
            {"nodes": 2, "fabric": "ib", "pipeline_parallel_size": 4},
            "profiles.0.pipeline_parallel_size",
            "more than the replica's 16 GPUs",
        ),
        (
            {"nodes": 2, "fabric": "ib", "engine_args": ["--nnodes", "3"]},
            "profiles.0.engine_args",
            "set the profile's nodes and fabric instead",
        ),
    ],
)
def test_bad_multi_node_profiles_name_the_field(
    fields: dict[str, object], path: str, words: str
) -> None:
    with pytest.raises(InvalidModel) as caught:
        parse_model(profile_body(**fields))
    assert caught.value.field == path
    assert "profile 'vllm'" in str(caught.value)
    assert words in str(caught.value)


def test_engines_that_cannot_span_nodes_are_refused() -> None:
    with pytest.raises(InvalidModel) as caught:
        parse_model(
            {
                "name": "tiny",
                "weights": "/m/tiny.gguf",
                "profiles": [{"engine": "llamacpp", "nodes": 2, "fabric": "ib-domain"}],
            }
        )
    assert caught.value.field == "profiles.0.nodes"
    assert "llamacpp cannot span nodes" in str(caught.value)


# ---- gang placement ----


def test_a_gang_is_placed_on_nodes_sharing_the_fabric_value() -> None:
    nodes = [node("n1", pod="pod3"), node("n2", pod="pod4"), node("n3", pod="pod4")]
    found = explain(big_model(), nodes)
    assert found.placement is not None
    assert found.placement.fabric == "ib-domain=pod4"
    assert [r.node_id for r in found.placement.ranks] == ["n2", "n3"]
    assert found.placement.port == 20000 and found.placement.master_port == 20001
    assert "fits on ib-domain=pod4" in found.summary()
    assert "rank 1 on n3" in found.summary()


def test_partial_placement_is_refused_with_reasons_per_fabric_group() -> None:
    nodes = [
        node("n1", pod="pod3"),
        node("n2", pod="pod3", free=2),
        node("n3", pod="pod4"),
        node("n4", pod=None),
    ]
    found = explain(big_model(), nodes)
    assert found.placement is None
    verdict = found.verdicts[0]
    assert verdict.groups == (
        "ib-domain=pod3: 1 of 2 nodes with 8 free 80 GiB GPUs",
        "ib-domain=pod4: 1 of 2 nodes with 8 free 80 GiB GPUs",
    )
    reasons = {r.node_id: r.reason for r in verdict.rejections}
    assert reasons["n4"] == "no fabric label ib-domain (the profile spans 2 nodes of one fabric)"
    assert reasons["n2"] == "2 of 8 GPUs free"
    summary = found.summary()
    assert "ib-domain=pod3: 1 of 2 nodes with 8 free 80 GiB GPUs" in summary
    assert "n4: no fabric label ib-domain" in summary
    # plan() places nothing at all rather than half a replica.
    result = run([Desired(big_model(), 1)], nodes)
    assert starts(result) == []
    assert "ib-domain=pod3: 1 of 2 nodes" in result.unplaced["llama-405b"].summary()


def test_plan_starts_every_rank_with_its_rendezvous() -> None:
    nodes = [node("n1"), node("n2"), node("n3", pod="pod9")]
    result = run([Desired(big_model(), 1)], nodes)
    made = starts(result)
    assert [(s.node_id, s.spec.shard_id, s.spec.node_rank) for s in made] == [
        ("n1", "llama-405b-1", 0),
        ("n2", "llama-405b-1-r1", 1),
    ]
    for start in made:
        spec = start.spec
        assert (spec.nodes, spec.replica_id) == (2, "llama-405b-1")
        assert (spec.master_addr, spec.master_port) == ("10.1.0.1", 20001)
        assert (spec.tensor_parallel_size, spec.pipeline_parallel_size) == (8, 2)
        assert spec.gpu_indices == tuple(range(8))
    # The starts in flight hold their GPUs and ports: the next plan adds nothing.
    pending = [Pending(s.node_id, s.spec) for s in made]
    assert starts(run([Desired(big_model(), 1)], nodes, pending=pending)) == []
    # Two replicas: the second one needs two more nodes of one fabric, and there are none.
    again = run([Desired(big_model(), 2)], nodes, pending=pending)
    assert starts(again) == []
    assert "ib-domain=pod9: 1 of 2 nodes" in again.unplaced["llama-405b"].summary()


def test_a_running_gang_counts_as_one_replica_and_holds_its_rendezvous_port() -> None:
    nodes = [
        node("n1", shards=[gang_shard("big", 0, master_port=20001)]),
        node("n2", shards=[gang_shard("big-r1", 1)]),
    ]
    result = run([Desired(big_model(), 1)], nodes)
    assert result.actions == ()
    # A rank 1 still on its way counts as present.
    half = [node("n1", shards=[gang_shard("big", 0, master_port=20001)]), node("n2")]
    rank1 = gang_shard("big-r1", 1).spec
    assert rank1 is not None
    assert run([Desired(big_model(), 1)], half, pending=[Pending("n2", rank1)]).actions == ()


@pytest.mark.parametrize("how", ["failed", "lost", "missing"])
def test_a_broken_gang_is_stopped_on_every_node_and_replaced(how: str) -> None:
    rank0 = gang_shard("big", 0, master_port=20001)
    rank1 = gang_shard("big-r1", 1, state="failed" if how == "failed" else "ready")
    n2 = node(
        "n2", shards=[] if how == "missing" else [rank1], state="lost" if how == "lost" else "ready"
    )
    nodes = [node("n1", shards=[rank0]), n2, node("n3"), node("n4")]
    result = run([Desired(big_model(), 1)], nodes)
    broken = [s for s in stops(result) if s.reason == "gang_broken"]
    assert [(s.node_id, s.shard_id, s.drain) for s in broken] == [("n1", "big", False)]
    assert broken[0].detail == "replica big lost rank 1"
    if how == "failed":
        assert ("n2", "big-r1", "ended") in [
            (s.node_id, s.shard_id, s.reason) for s in stops(result)
        ]
    # The replacement is a whole gang on nodes that are free (n1's GPUs are held until
    # its rank 0 has stopped; a lost node takes nothing).
    expected = ["n3", "n4"] if how == "lost" else ["n2", "n3"]
    assert sorted(s.node_id for s in starts(result)) == expected


def test_scale_down_and_drain_stop_every_rank() -> None:
    nodes = [
        node("n1", shards=[gang_shard("big", 0, master_port=20001)]),
        node("n2", shards=[gang_shard("big-r1", 1)]),
    ]
    down = run([Desired(big_model(), 0)], nodes)
    assert sorted((s.node_id, s.shard_id, s.reason) for s in stops(down)) == [
        ("n1", "big", "scale_down"),
        ("n2", "big-r1", "scale_down"),
    ]
    # Draining a follower's node drains the replica, once a replacement is ready.
    draining = [nodes[0], replace(nodes[1], draining=True), node("n3"), node("n4")]
    first = run([Desired(big_model(), 1)], draining)
    assert sorted(s.node_id for s in starts(first)) == ["n3", "n4"]
    assert stops(first) == []
    ready = [
        *draining[:2],
        node("n3", shards=[gang_shard("new", 0, replica="new", master_port=20001)]),
        node("n4", shards=[gang_shard("new-r1", 1, replica="new")]),
    ]
    second = run([Desired(big_model(), 1)], ready)
    assert sorted((s.node_id, s.shard_id, s.reason) for s in stops(second)) == [
        ("n1", "big", "node_draining"),
        ("n2", "big-r1", "node_draining"),
    ]


def test_a_gang_on_a_node_in_doubt_is_replaced_but_not_stopped() -> None:
    nodes = [
        node("n1", shards=[gang_shard("big", 0, master_port=20001)]),
        node("n2", shards=[gang_shard("big-r1", 1)], state="unreachable"),
        node("n3"),
        node("n4"),
    ]
    result = run([Desired(big_model(), 1)], nodes)
    assert stops(result) == []
    assert result.in_doubt == {"llama-405b": ("big",)}
    assert sorted(s.node_id for s in starts(result)) == ["n3", "n4"]


# ---- launch lines ----

SETTINGS = EngineSettings(python="/opt/engines/bin/python", vllm_command="/opt/vllm/bin/vllm")


def rank_spec(engine: str, rank: int) -> EngineSpec:
    return EngineSpec(
        shard_id=f"big-{rank}",
        model="llama-405b",
        engine=engine,
        weights="org/llama-405b",
        port=20000,
        host="10.1.0.1",
        gpu_indices=tuple(range(8)),
        tensor_parallel_size=8,
        pipeline_parallel_size=2,
        nodes=2,
        node_rank=rank,
        master_addr="192.168.50.1",
        master_port=20001,
    )


def test_vllm_ranks_use_the_documented_multiprocessing_flags() -> None:
    adapter = adapter_for("vllm", settings=SETTINGS)
    head = adapter.plan(rank_spec("vllm", 0))
    tail = ["--nnodes", "2", "--node-rank", "0", "--master-addr", "192.168.50.1"]
    assert list(head.argv[-10:-2]) == [*tail, "--master-port", "20001"]
    assert "--headless" not in head.argv and head.ready_path == "/health"
    follower = adapter.plan(rank_spec("vllm", 1))
    assert list(follower.argv[-11:-2]) == [
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "192.168.50.1",
        "--master-port",
        "20001",
        "--headless",
    ]
    assert follower.ready_path == ""
    assert "--tensor-parallel-size" in follower.argv and "--pipeline-parallel-size" in follower.argv


def test_sglang_ranks_use_dist_init_addr() -> None:
    adapter = adapter_for("sglang", settings=SETTINGS)
    for rank in (0, 1):
        launch = adapter.plan(rank_spec("sglang", rank))
        assert list(launch.argv[-6:]) == [
            "--nnodes",
            "2",
            "--node-rank",
            str(rank),
            "--dist-init-addr",
            "192.168.50.1:20001",
        ]
        assert launch.ready_path == ("/health" if rank == 0 else "")
    v6 = replace(rank_spec("sglang", 1), master_addr="fd00::1")
    assert "[fd00::1]:20001" in adapter.plan(v6).argv


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"node_rank": 2}, "node_rank"),
        ({"master_addr": ""}, "master_addr"),
        ({"master_port": 0}, "master_port"),
        ({"gpu_indices": (0, 1, 2, 3)}, "gpu_indices"),
    ],
)
def test_bad_rank_specs_are_refused(changes: dict[str, object], field: str) -> None:
    adapter = adapter_for("vllm", settings=SETTINGS)
    with pytest.raises(ProfileError) as caught:
        adapter.plan(replace(rank_spec("vllm", 1), **changes))  # type: ignore[arg-type]
    assert caught.value.field == field


def test_models_explain_shows_the_ranks_and_the_short_fabric_groups() -> None:
    placed = explanation_view(explain(big_model(), [node("n1"), node("n2")]))
    assert placed["placement"]["shards"] == [  # type: ignore[index]
        {"node": "n1", "rank": 0, "gpus": list(range(8)), "port": 20000},
        {"node": "n2", "rank": 1, "gpus": list(range(8)), "port": 20000},
    ]
    assert explain_text(placed).splitlines()[0] == (
        "model llama-405b: the next replica goes to ib-domain=pod3 (profile tp8-pp2): "
        "rank 0 on n1 (GPUs 0,1,2,3,4,5,6,7), rank 1 on n2 (GPUs 0,1,2,3,4,5,6,7)"
    )
    short = explain_text(explanation_view(explain(big_model(), [node("n1"), node("n2", pod="x")])))
    assert (
        "  fabric groups short of nodes:\n    ib-domain=pod3: 1 of 2 nodes with 8 free 80 GiB GPUs"
        in short
    )


# ---- the management network ----


def dual_homed(node_id: str, host: int, **changes: object) -> Node:
    """A node reaching the server on eth0 (10.77.0.x) with a management link eth1 (10.88.0.x)."""
    base = node(node_id)
    interfaces = (
        NetInterface("lo", ("127.0.0.1/8",)),
        NetInterface("eth0", (f"10.77.0.{host}/24",)),
        NetInterface("eth1", (f"10.88.0.{host}/24", f"fd88::{host}/64")),
        NetInterface("eth10", (f"10.99.0.{host}/24",)),
    )
    made = replace(base, advertise_host=f"10.77.0.{host}", interfaces=interfaces)
    return replace(made, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("setting", "labels", "expected"),
    [
        ("eth1", {}, MgmtAddress("eth1", "10.88.0.2")),
        ("10.88.0.0/16", {}, MgmtAddress("eth1", "10.88.0.2")),
        ("fd88::/64", {}, MgmtAddress("eth1", "fd88::2")),
        ("", {}, MgmtAddress("eth0", "10.77.0.2")),
        ("eth0", {MGMT_LABEL: "eth10"}, MgmtAddress("eth10", "10.99.0.2")),
    ],
)
def test_the_management_address_by_name_cidr_default_or_node_label(
    setting: str, labels: dict[str, str], expected: MgmtAddress
) -> None:
    assert mgmt_address(dual_homed("n2", 2, labels=labels), setting) == expected


def test_a_node_without_the_management_network_cannot_take_a_rank() -> None:
    nodes = [dual_homed("n1", 1), dual_homed("n2", 2), node("n3", pod="pod3")]
    found = explain(big_model(), nodes, mgmt_interface="10.88.0.0/24")
    assert found.placement is not None
    assert [r.node_id for r in found.placement.ranks] == ["n1", "n2"]
    reasons = {r.node_id: r.reason for r in found.verdicts[0].rejections}
    assert reasons["n3"] == (
        "reports no network interfaces, so control.mgmt_interface '10.88.0.0/24' cannot be matched"
    )
    lacking = explain(big_model(), [dual_homed("n1", 1), dual_homed("n2", 2)], mgmt_interface="ib0")
    assert lacking.placement is None
    assert "n1: has no interface ib0 (control.mgmt_interface); it has lo 127.0.0.1/8, eth0" in (
        lacking.summary()
    )


def test_ranks_are_wired_over_the_management_network() -> None:
    profile = gang_profile(env={"GLOO_SOCKET_IFNAME": "eth1", "NCCL_DEBUG": "INFO"})
    nodes = [dual_homed("n1", 1), dual_homed("n2", 2)]
    result = plan(
        [Desired(big_model(profile), 1)],
        Actual(nodes=nodes),
        policy="pack",
        new_shard_id=lambda model: "big",
        mgmt_interface="eth1",
    )
    made = {s.spec.node_rank: s.spec for s in starts(result)}
    assert {r: (s.master_addr, s.master_port) for r, s in made.items()} == {
        0: ("10.88.0.1", 20001),
        1: ("10.88.0.1", 20001),
    }
    assert dict(made[1].env) == {
        # The exact-name form: a bare "eth1" would match eth10 too.
        "NCCL_SOCKET_IFNAME": "=eth1",
        "GLOO_SOCKET_IFNAME": "eth1",  # the profile's own value wins (the same here)
        "VLLM_HOST_IP": "10.88.0.2",
        "NCCL_DEBUG": "INFO",
    }
    assert made[0].env["VLLM_HOST_IP"] == "10.88.0.1"
    sglang = plan(
        [Desired(big_model(gang_profile(engine="sglang")), 1)],
        Actual(nodes=nodes),
        policy="pack",
        new_shard_id=lambda model: "big",
        mgmt_interface="eth1",
    )
    assert [s.spec.env["SGLANG_HOST_IP"] for s in starts(sglang)] == ["10.88.0.1", "10.88.0.2"]


def test_agents_report_their_interfaces_and_the_server_keeps_them() -> None:
    found = interfaces.discover()
    loopback = next(i for i in found if i.name == "lo")
    assert "127.0.0.1/8" in loopback.addresses
    message = wire.register(
        NodeIdentity(
            node_id="n1",
            hostname="n1",
            agent_version="0",
            labels={},
            fabric={},
            port_range=PortRange(20000, 20009),
            weights_dir=Path("/w"),
        ),
        HardwareReport(
            gpus=(), cpu_count=1, memory_total_bytes=1, weights_disk_free_bytes=1, gpu_source="none"
        ),
        (),
        advertise_host="10.77.0.1",
        interfaces=(*found, interfaces.Interface("bad0", ("10.0.0.1/24", "nonsense"))),
    )
    registered = convert.registration(message.register)
    kept = {i.name: i.addresses for i in registered.interfaces}
    assert kept["lo"] == loopback.addresses
    assert kept["bad0"] == ("10.0.0.1/24",)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--nnodes", "2", "--node-rank", "2"], "must be below --nnodes (2)"),
        (["--nnodes", "2", "--node-rank", "1"], "give --master-addr and --master-port"),
    ],
)
def test_sim_rank_flags_are_checked(args: list[str], words: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "llmgw", "sim", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert words in done.stderr


def test_a_multi_node_replica_is_one_row_with_its_shards_by_rank() -> None:
    head = gang_shard("big", 0, master_port=20001)
    follower = gang_shard("big-r1", 1, state="loading")
    n1, n2 = node("n1", shards=[head]), node("n2", shards=[follower])
    solo = blocker("solo", (0,))
    state = ModelState(
        model=big_model(),
        desired=1,
        replicas=((n2, follower), (n1, head), (n2, solo)),
        pending=(),
        stopping=frozenset(),
        in_flight=0,
        idle_for=None,
        failures=0,
        last_failure=None,
        retry_in=0.0,
        unplaced=None,
        activating=False,
    )
    view = state_view(state)
    rows = view["replicas"]
    assert isinstance(rows, list)
    assert [r["id"] for r in rows] == ["big", "solo"]
    assert rows[0]["shards"] == [
        {"node": "n1", "rank": 0, "id": "big", "state": "ready", "gpus": list(range(8))},
        {"node": "n2", "rank": 1, "id": "big-r1", "state": "loading", "gpus": list(range(8))},
    ]
    assert [(s["node"], s["rank"]) for s in rows[1]["shards"]] == [("n2", 0)]
    # The gang counts once, by its rank 0; the single-node replica too.
    assert view["ready_replicas"] == 2


def test_a_new_leader_waits_for_ranks_on_nodes_that_have_not_registered_yet() -> None:
    # Only rank 0's node is back after a control-plane restart.
    nodes = [node("n1", shards=[gang_shard("big", 0, master_port=20001)]), node("n3")]
    waiting = run([Desired(big_model(), 1)], nodes, settling=True)
    assert waiting.actions == ()
    # Once the window is over, the missing rank is given up: the replica is broken.
    broken = run([Desired(big_model(), 1)], nodes)
    assert [(s.shard_id, s.reason) for s in stops(broken)] == [("big", "gang_broken")]
    # A rank known to be gone (its node lost) is not waited for, settling or not.
    lost = [*nodes, node("n2", shards=[gang_shard("big-r1", 1)], state="lost")]
    assert [s.reason for s in stops(run([Desired(big_model(), 1)], lost, settling=True))] == [
        "gang_broken"
    ]
