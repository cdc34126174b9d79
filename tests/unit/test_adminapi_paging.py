"""Paging and filtering the admin API's node list on the server, over httpx's ASGI transport."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette
from test_inventory_state import VirtualClock, registration

from llmgw.control.adminapi import node_routes
from llmgw.control.adminapi.paging import MAX_LIMIT
from llmgw.control.inventory import Inventory

NODES = 25


@pytest.fixture
def inventory() -> Inventory:
    clock = VirtualClock()
    inventory = Inventory(
        clock=clock, wall_clock=clock.wall, unreachable_after=15.0, lost_after=60.0
    )
    # Registered out of order: pages follow the ids, not arrival.
    for i in reversed(range(NODES)):
        base = registration(f"node-{i:03d}")
        zone = "b" if i % 5 == 0 else "a"
        inventory.register(dataclasses.replace(base, labels={"zone": zone}))
    inventory.set_draining("node-007", True)
    return inventory


@pytest.fixture
async def client(inventory: Inventory) -> AsyncIterator[httpx.AsyncClient]:
    app = Starlette(routes=node_routes(inventory=inventory))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://admin"
    ) as client:
        yield client


async def test_pages_walk_every_node_once_in_id_order(client: httpx.AsyncClient) -> None:
    seen: list[str] = []
    after: str | None = None
    pages = 0
    while True:
        params = {"limit": "10"} | ({"after": after} if after else {})
        body = (await client.get("/admin/api/nodes", params=params)).json()
        pages += 1
        assert body["total"] == NODES
        seen += [n["id"] for n in body["nodes"]]
        after = body["next_after"]
        if after is None:
            break
        assert after == seen[-1]
    assert pages == 3
    assert seen == [f"node-{i:03d}" for i in range(NODES)]


async def test_without_a_limit_every_node_is_listed(client: httpx.AsyncClient) -> None:
    body = (await client.get("/admin/api/nodes")).json()
    assert len(body["nodes"]) == body["total"] == NODES and body["next_after"] is None


async def test_filters_apply_before_paging(client: httpx.AsyncClient) -> None:
    zone_b = (await client.get("/admin/api/nodes", params={"q": "zone=b", "limit": 2})).json()
    assert zone_b["total"] == 5
    assert [n["id"] for n in zone_b["nodes"]] == ["node-000", "node-005"]
    assert zone_b["next_after"] == "node-005"

    draining = (await client.get("/admin/api/nodes", params={"state": "draining"})).json()
    assert [n["id"] for n in draining["nodes"]] == ["node-007"]
    ready = (await client.get("/admin/api/nodes", params={"state": "ready"})).json()
    assert ready["total"] == NODES  # draining is a flag, the node is still ready

    both = (await client.get("/admin/api/nodes", params={"q": "ZONE=A node-01"})).json()
    assert [n["id"] for n in both["nodes"]] == [f"node-{i:03d}" for i in range(11, 20) if i != 15]


@pytest.mark.parametrize(
    ("params", "param", "words"),
    [
        ({"limit": "0"}, "limit", f"between 1 and {MAX_LIMIT}"),
        ({"limit": str(MAX_LIMIT + 1)}, "limit", "page with after"),
        ({"limit": "ten"}, "limit", "whole number"),
        ({"state": "sleepy"}, "state", "one of draining, lost, ready, unreachable"),
        ({"q": "x" * 201}, "q", "longer than 200"),
    ],
)
async def test_a_bad_parameter_is_a_400_naming_it(
    client: httpx.AsyncClient, params: dict[str, str], param: str, words: str
) -> None:
    response = await client.get("/admin/api/nodes", params=params)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, "invalid_parameter")
    assert words in error["message"]
