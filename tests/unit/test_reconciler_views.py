"""How a model's replicas are shown while their node is in doubt."""

from __future__ import annotations

from datetime import UTC, datetime

from llmgw.control.catalog.model import CatalogModel, Profile
from llmgw.control.inventory.model import Node, NodeState, Shard, ShardSpec
from llmgw.control.reconciler.state import ModelState
from llmgw.control.reconciler.views import state_view

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def node(node_id: str, *, state: NodeState = "ready", connected: bool = True) -> Node:
    return Node(
        id=node_id,
        hostname=node_id,
        agent_version="0.1.0",
        gpus=(),
        cpu_count=8,
        memory_total=0,
        weights_disk_free=0,
        gpu_source="declared",
        labels={},
        fabric={},
        port_range=(20000, 20009),
        weights_dir="/w",
        state=state,
        draining=False,
        connected=connected,
        registered_at=EPOCH,
        last_heartbeat=0.0,
        last_heartbeat_at=EPOCH,
        shards={},
    )


def shard(shard_id: str) -> Shard:
    return Shard(
        id=shard_id,
        model="m",
        engine="sim",
        state="ready",
        message="",
        pid=1,
        endpoint_url="http://10.0.0.2:20000",
        output_tail=(),
        exit_code=None,
        spec=ShardSpec(shard_id=shard_id, model="m", engine="sim", weights="none", port=20000),
        since=EPOCH,
    )


def view(*replicas: tuple[Node, Shard]) -> dict[str, object]:
    model = CatalogModel(
        name="m", weights="none", profiles=(Profile(name="sim", engine="sim", gpus=1),)
    )
    return state_view(
        ModelState(
            model=model,
            desired=1,
            replicas=replicas,
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
    )


def states(shown: dict[str, object]) -> dict[str, str]:
    replicas = shown["replicas"]
    assert isinstance(replicas, list)
    return {str(r["id"]): str(r["state"]) for r in replicas}


def test_a_replica_on_an_unreachable_node_is_in_doubt_and_not_counted_ready() -> None:
    shown = view((node("a", state="unreachable"), shard("a-1")))

    assert states(shown) == {"a-1": "in_doubt"}
    assert shown["ready_replicas"] == 0
    assert shown["state"] == "starting"


def test_a_replica_whose_agent_stream_closed_keeps_serving() -> None:
    # Engines outlive their agent: a restarting agent is no doubt about its replicas.
    shown = view((node("a", connected=False), shard("a-1")), (node("b"), shard("b-1")))

    assert states(shown) == {"a-1": "ready", "b-1": "ready"}
    assert shown["ready_replicas"] == 2
    assert shown["state"] == "ready"


def test_a_replica_on_a_lost_node_is_lost() -> None:
    shown = view((node("a", state="lost", connected=False), shard("a-1")))

    assert states(shown) == {"a-1": "lost"}
    assert shown["state"] == "stopped"
