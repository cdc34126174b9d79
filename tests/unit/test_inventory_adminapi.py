"""The nodes admin routes, over httpx's ASGI transport."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette
from test_inventory_state import VirtualClock, ready_shard, registration

from llmgw.control.adminapi import node_routes
from llmgw.control.inventory import GpuUsage, Inventory


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def inventory(clock: VirtualClock) -> Inventory:
    inventory = Inventory(
        clock=clock, wall_clock=clock.wall, unreachable_after=15.0, lost_after=60.0
    )
    inventory.register(registration("node-b"))
    inventory.register(registration("node-a", shards=(ready_shard("llama-0", gpus=(1,)),)))
    inventory.heartbeat(
        "node-a", [GpuUsage(index=1, utilization=50.0, memory_used=60 << 30, memory_free=20 << 30)]
    )
    clock.advance(4.0)
    return inventory


@pytest.fixture
async def client(inventory: Inventory) -> AsyncIterator[httpx.AsyncClient]:
    app = Starlette(routes=node_routes(inventory=inventory))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://admin"
    ) as client:
        yield client


async def test_list_nodes(client: httpx.AsyncClient) -> None:
    response = await client.get("/admin/api/nodes")
    assert response.status_code == 200
    nodes = response.json()["nodes"]
    assert [n["id"] for n in nodes] == ["node-a", "node-b"]
    a = nodes[0]
    assert (a["state"], a["draining"], a["connected"], a["heartbeat_age_seconds"]) == (
        "ready",
        False,
        True,
        4.0,
    )
    assert a["fabric"] == {"ib-domain": "pod3"}
    assert [(g["index"], g["in_use"], g["utilization_percent"]) for g in a["gpus"]] == [
        (0, False, None),
        (1, True, 50.0),
    ]
    assert a["gpus"][1]["memory_used_bytes"] == 60 << 30
    assert [(s["id"], s["state"], s["engine"], s["gpu_indices"]) for s in a["shards"]] == [
        ("llama-0", "ready", "vllm", [1])
    ]
    assert a["shards"][0]["spec"]["port"] == 20001


async def test_show_one_node_and_unknown_nodes(client: httpx.AsyncClient) -> None:
    response = await client.get("/admin/api/nodes/node-b")
    assert response.status_code == 200
    assert response.json()["hostname"] == "node-b.lab"

    missing = await client.get("/admin/api/nodes/ghost")
    assert missing.status_code == 404
    error = missing.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "node_not_found" and error["type"] == "invalid_request_error"
    assert "ghost" in error["message"]


async def test_drain_and_undrain(client: httpx.AsyncClient, inventory: Inventory) -> None:
    drained = await client.post("/admin/api/nodes/node-a/drain")
    assert drained.status_code == 200 and drained.json()["draining"] is True
    assert inventory.node("node-a").draining
    assert (await client.post("/admin/api/nodes/node-a/drain")).json()["draining"] is True

    undrained = await client.post("/admin/api/nodes/node-a/undrain")
    assert undrained.status_code == 200 and undrained.json()["draining"] is False
    assert not inventory.node("node-a").draining

    missing = await client.post("/admin/api/nodes/ghost/drain")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "node_not_found"
    assert (await client.get("/admin/api/nodes/node-a/drain")).status_code == 405
