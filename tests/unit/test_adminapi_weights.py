"""`POST /admin/api/nodes/{node_id}/weights/remove` over httpx's ASGI transport.

A real `Inventory`; the agent service's `remove_weights` is a small async
double that answers as a node would (the agent side is tested on its own).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from test_inventory_state import VirtualClock, registration

from llmgw.control.adminapi import node_routes
from llmgw.control.agentsvc import CommandFailed, CommandTimeout, NodeNotConnected
from llmgw.control.inventory import Inventory

ROUTE = "/admin/api/nodes/{}/weights/remove"


class Node:
    """`remove_weights` as the agent service would run it: raise what the node answered."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.answer: Exception | None = None

    async def __call__(self, node_id: str, path: str) -> None:
        self.calls.append((node_id, path))
        if self.answer is not None:
            raise self.answer


@pytest.fixture
def inventory() -> Inventory:
    clock = VirtualClock()
    inventory = Inventory(
        clock=clock, wall_clock=clock.wall, unreachable_after=15.0, lost_after=60.0
    )
    inventory.register(registration("node-a"))
    return inventory


@pytest.fixture
def node() -> Node:
    return Node()


@pytest.fixture
async def client(inventory: Inventory, node: Node) -> AsyncIterator[httpx.AsyncClient]:
    app = Starlette(routes=node_routes(inventory=inventory, remove_weights=node))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        yield client


def error(response: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = response.json()["error"]
    return body


async def test_removes_and_answers_what_was_removed(client: httpx.AsyncClient, node: Node) -> None:
    response = await client.post(ROUTE.format("node-a"), json={"path": "llama-3-8b"})
    assert response.status_code == 200
    assert response.json() == {"node": "node-a", "path": "llama-3-8b", "removed": True}
    assert node.calls == [("node-a", "llama-3-8b")]


async def test_an_unknown_node_is_404_and_nothing_is_sent(
    client: httpx.AsyncClient, node: Node
) -> None:
    response = await client.post(ROUTE.format("ghost"), json={"path": "x"})
    assert response.status_code == 404
    assert error(response)["code"] == "node_not_found"
    assert "ghost" in error(response)["message"]
    assert node.calls == []


@pytest.mark.parametrize(
    ("content", "code"),
    [
        (b"", "invalid_path"),
        (b"{not json", "invalid_json"),
        (b'["llama"]', "invalid_path"),
        (b"{}", "invalid_path"),
        (b'{"path": 3}', "invalid_path"),
        (b'{"path": "  "}', "invalid_path"),
    ],
)
async def test_a_body_without_a_string_path_is_400(
    client: httpx.AsyncClient, node: Node, content: bytes, code: str
) -> None:
    response = await client.post(
        ROUTE.format("node-a"), content=content, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert error(response)["code"] == code
    if code == "invalid_path":
        assert error(response)["param"] == "path"
        assert "inside the node's weights directory" in error(response)["message"]
    assert node.calls == []


@pytest.mark.parametrize(
    ("answer", "status", "code"),
    [
        (
            NodeNotConnected("cannot remove weights 'x' on node 'node-a': no stream", node_id="n"),
            409,
            "node_not_connected",
        ),
        (
            CommandFailed(
                "node 'node-a' refused to remove weights 'x': refusing to remove 'x': shard "
                "'llama-0' is running from it; stop it first",
                node_id="node-a",
                error="refusing to remove 'x': shard 'llama-0' is running from it; stop it first",
            ),
            400,
            "weights_refused",
        ),
        (
            CommandTimeout("node 'node-a' did not answer within 30 s", node_id="node-a"),
            504,
            "node_timeout",
        ),
    ],
)
async def test_what_the_node_answered_maps_to_a_status_with_its_message(
    client: httpx.AsyncClient, node: Node, answer: Exception, status: int, code: str
) -> None:
    node.answer = answer
    response = await client.post(ROUTE.format("node-a"), json={"path": "x"})
    assert response.status_code == status
    assert error(response)["code"] == code
    assert error(response)["message"] == str(answer)
    assert error(response)["type"] == ("api_error" if status >= 500 else "invalid_request_error")


async def test_without_an_agent_service_the_route_is_503(inventory: Inventory) -> None:
    app = Starlette(routes=node_routes(inventory=inventory))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        response = await client.post(ROUTE.format("node-a"), json={"path": "x"})
    assert response.status_code == 503
    assert error(response)["code"] == "not_available"
