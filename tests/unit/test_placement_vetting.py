"""Which shard reports are believed: the pure verdict on a report, its record and the node's address."""

from __future__ import annotations

import pytest

from llmgw.control.agentsvc.convert import on_this_host
from llmgw.control.inventory.model import NetInterface, ShardReport, ShardSpec
from llmgw.control.placements import NodeAddress, Placement, spec_from_json, spec_json, vet

SPEC = ShardSpec(
    shard_id="llama-1", model="llama", engine="vllm", weights="/w/llama", gpu_indices=(0, 1),
    port=20001, engine_args=("--max-model-len", "8192"), env={"A": "1"},
)  # fmt: skip
PLACED = Placement(node_id="gpu-1", profile="tp2", spec=SPEC)
WHERE = NodeAddress(advertise_host="10.0.0.5", seen_from="10.0.0.5", port_range=(20000, 20099))


def report(url: str = "http://10.0.0.5:20001", **fields: object) -> ShardReport:
    values: dict[str, object] = {
        "shard_id": "llama-1", "model": "llama", "state": "ready", "endpoint_url": url,
        "spec": ShardSpec(shard_id="llama-1", model="llama", engine="sim", weights="", port=9),
    }  # fmt: skip
    values.update(fields)
    return ShardReport(**values)  # type: ignore[arg-type]


def test_a_recorded_shard_at_the_node_s_address_is_believed_with_the_recorded_spec() -> None:
    verdict = vet("gpu-1", report(), PLACED, WHERE)
    assert verdict.refused is None and not verdict.stop
    assert verdict.report is not None
    assert verdict.report.spec == SPEC  # not the engine, GPUs and port the node claimed
    assert verdict.report.endpoint_url == "http://10.0.0.5:20001"
    # A report without a model takes the record's; trailing slashes and case do not matter.
    quiet = vet("gpu-1", report("HTTP://10.0.0.5:20001/", model=""), PLACED, WHERE)
    assert quiet.report is not None and quiet.report.model == "llama"


def test_a_shard_never_placed_on_that_node_is_refused_and_stopped() -> None:
    unknown = vet("gpu-1", report(shard_id="x1"), None, WHERE)
    assert unknown.report is None and unknown.stop and unknown.kind == "unplaced"
    assert unknown.refused == (
        "node gpu-1 reported shard x1 of model llama that was never placed there; not served"
    )
    elsewhere = vet("gpu-2", report(), PLACED, WHERE)
    assert elsewhere.report is None and elsewhere.stop
    assert (
        elsewhere.refused is not None and "node gpu-2 reported shard llama-1" in elsewhere.refused
    )
    # A stopped or failed one runs nothing (a shard that ended, reported again): dropped.
    ended = vet("gpu-1", report(shard_id="x1", state="stopped"), None, WHERE)
    assert ended.report is None and ended.refused is None and not ended.stop


def test_a_recorded_shard_reported_as_another_model_is_refused() -> None:
    verdict = vet("gpu-1", report(model="secret-model"), PLACED, WHERE)
    assert verdict.report is None and verdict.stop and verdict.kind == "model"
    assert verdict.refused == (
        "node gpu-1 reported shard llama-1 of model secret-model, but it was placed there for "
        "model llama; not served"
    )


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://10.0.0.6:20001", "its host 10.0.0.6 is not the node's address (10.0.0.5)"),
        ("http://metadata.internal:20001", "its host metadata.internal is not the node's"),
        ("http://10.0.0.5:20002", "its port 20002 is not the port the shard was placed on (20001)"),
        ("http://10.0.0.5", "its port None is not the port"),
        ("http://10.0.0.5:99999", "not a URL with a valid port"),
        ("ftp://10.0.0.5:20001", "its scheme is not http or https"),
        ("http://user:pw@10.0.0.5:20001", "it carries credentials"),
        ("http://10.0.0.5:20001/admin", "it carries a path, query or fragment"),
        ("http://10.0.0.5:20001?x=1", "it carries a path, query or fragment"),
    ],
)
def test_a_recorded_shard_at_an_address_not_the_node_s_is_failed_and_stopped(
    url: str, says: str
) -> None:
    verdict = vet("gpu-1", report(url), PLACED, WHERE)
    assert verdict.stop and verdict.kind == "endpoint"
    assert verdict.refused is not None and says in verdict.refused, verdict.refused
    assert f"at {url}, which is not where the node is" in verdict.refused
    # The reconciler sees it failed (it backs off and places it again), never Ready.
    assert verdict.report is not None
    assert (verdict.report.state, verdict.report.endpoint_url) == ("failed", "")
    assert verdict.report.message == verdict.refused


def test_the_port_must_be_inside_the_node_s_port_range_and_the_host_not_link_local() -> None:
    outside = NodeAddress(advertise_host="10.0.0.5", seen_from="", port_range=(21000, 21099))
    verdict = vet("gpu-1", report(), PLACED, outside)
    assert verdict.refused is not None
    assert "its port 20001 is outside the node's port range 21000-21099" in verdict.refused
    metadata = NodeAddress(advertise_host="169.254.169.254", seen_from="", port_range=(1, 65535))
    verdict = vet("gpu-1", report("http://169.254.169.254:20001"), PLACED, metadata)
    assert verdict.refused is not None and "link-local" in verdict.refused


def test_loopback_is_refused_from_a_node_on_another_host_only() -> None:
    assert on_this_host("127.0.0.1") and on_this_host("::1")
    assert not on_this_host("192.0.2.77")  # TEST-NET-1: never an address of this host
    remote = NodeAddress(advertise_host="127.0.0.1", seen_from="10.0.0.5", port_range=(1, 65535))
    verdict = vet("gpu-1", report("http://127.0.0.1:20001"), PLACED, remote)
    assert verdict.refused is not None and verdict.stop
    assert "its host 127.0.0.1 is a loopback address but the node connects from 10.0.0.5" in (
        verdict.refused
    )
    # A node on the server's own host (its stream from loopback or one of the host's
    # addresses) may have its engines on loopback.
    local = NodeAddress(
        advertise_host="127.0.0.1", seen_from="10.0.0.5", port_range=(1, 65535), same_host=True
    )
    assert vet("gpu-1", report("http://127.0.0.1:20001"), PLACED, local).refused is None


def test_an_agent_that_advertises_no_host_is_held_to_the_address_it_connects_from() -> None:
    old = NodeAddress(advertise_host="", seen_from="10.0.0.9", port_range=(20000, 20099))
    assert vet("gpu-1", report("http://10.0.0.9:20001"), PLACED, old).refused is None
    assert vet("gpu-1", report(), PLACED, old).refused is not None
    ipv6 = NodeAddress(advertise_host="[FD00::5]", seen_from="", port_range=(20000, 20099))
    assert vet("gpu-1", report("http://[fd00::5]:20001"), PLACED, ipv6).refused is None


def test_a_rank_of_a_multi_node_replica_may_be_at_a_management_address() -> None:
    gang = ShardSpec(
        shard_id="big-1", model="big", engine="vllm", weights="", port=20001, nodes=2,
        master_addr="192.168.7.5", replica_id="big-1",
    )  # fmt: skip
    placed = Placement(node_id="gpu-1", profile="tp8x2", spec=gang)
    where = NodeAddress(
        advertise_host="10.0.0.5", seen_from="10.0.0.5", port_range=(20000, 20099),
        interfaces=(NetInterface("ib0", ("192.168.7.5/24",)), NetInterface("eth1", ("172.16.0.5/16",))),
    )  # fmt: skip
    for url in ("http://10.0.0.5:20001", "http://192.168.7.5:20001", "http://172.16.0.5:20001"):
        assert (
            vet("gpu-1", report(url, shard_id="big-1", model="big"), placed, where).refused is None
        )
    single = vet("gpu-1", report("http://172.16.0.5:20001"), PLACED, where)
    assert single.refused is not None  # a one-node replica: the advertised address only


def test_a_spec_reads_back_from_its_json_form() -> None:
    assert spec_from_json(spec_json(SPEC)) == SPEC
    assert spec_from_json({**spec_json(SPEC), "from_a_newer_server": 1}) == SPEC
