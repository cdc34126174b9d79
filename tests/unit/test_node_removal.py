"""Removing a node: its key is revoked, its stream closed, the inventory forgets it.

The real agent listener (mTLS or plaintext) and SQLite store of
test_node_identity.py, with the admin route over httpx's ASGI transport; the
test plays the agent with raw stubs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import grpc
import httpx
import pytest
import test_node_identity
from placement_fixtures import placements_fixture  # noqa: F401
from starlette.applications import Starlette
from test_node_identity import Certs, Factory, Served, channel, key_of, refused, register

from llmgw.control.adminapi import node_routes
from llmgw.control.agentsvc import NodeRemoval
from llmgw.control.inventory import UnknownNode
from llmgw.store import Store

serve = test_node_identity.serve  # the fixtures
certs = test_node_identity.certs


class Standby:
    """The leader's view for a standby (`LeaderFleet`): another server leads."""

    def leading(self) -> bool:
        return False

    def leader(self) -> str | None:
        return "ctl-1:4242"

    async def nodes(self) -> list[dict[str, Any]]:
        return []


@asynccontextmanager
async def admin(
    served: Served, *, removal: bool = True, store: Store | None = None, standby: bool = False
) -> AsyncIterator[tuple[httpx.AsyncClient, list[tuple[str, str]]]]:
    events: list[tuple[str, str]] = []
    remove = NodeRemoval(
        identities=(store or served.store).nodeids,
        inventory=served.inventory,
        streams=served.servicer,
        wall_clock=lambda: datetime.now(UTC),
        record_event=lambda node, message: events.append((node, message)),
    )
    app = Starlette(
        routes=node_routes(
            inventory=served.inventory,
            remove_node=remove.remove if removal else None,
            fleet=Standby() if standby else None,
        )
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://admin"
    ) as client:
        yield client, events


def known(served: Served, node_id: str) -> bool:
    try:
        served.inventory.node(node_id)
    except UnknownNode:
        return False
    return True


async def ended(call: object) -> grpc.aio.AioRpcError:
    assert isinstance(call, grpc.aio.StreamStreamCall)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(call.read(), 10)
    return caught.value


async def test_a_removed_node_is_revoked_disconnected_forgotten_and_cannot_reconnect(
    serve: Factory, certs: Certs
) -> None:
    served = await serve()
    async with (
        channel(served.port, certs.node_a, certs.ca) as chan,
        admin(served) as (
            client,
            events,
        ),
    ):
        live = await register(chan, "node-a")
        response = await client.post(
            "/admin/api/nodes/node-a/remove", json={"reason": "decommissioned"}
        )
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["node"] == "node-a" and body["removed"] is True
        assert body["revoked"] is True and body["key_hash"] == key_of(certs.node_a)
        assert body["reason"] == "decommissioned"
        assert body["stream_closed"] is True and body["peer"].startswith("ipv4:127.0.0.1:")
        assert body["forgotten"] is True
        assert "cannot reconnect" in body["message"]

        closed = await ended(live)
        assert closed.code() == grpc.StatusCode.ABORTED
        assert "node node-a was removed: decommissioned" in (closed.details() or "")
        assert not known(served, "node-a") and served.servicer.connected() == []
        assert (await client.get("/admin/api/nodes/node-a")).status_code == 404

        # The agent redials: its key is on the deny-list.
        error = await refused(chan, "node-a")
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "node node-a's certificate was revoked (llmgw nodes remove)" in (
            error.details() or ""
        )
        assert "decommissioned" in (error.details() or "")
        assert not known(served, "node-a")
    [(node, message)] = events
    assert node == "node-a" and message.startswith("node node-a removed: its certificate key")
    assert message.endswith("(decommissioned)")
    [revocation] = await served.store.nodeids.revocations()
    assert (revocation.node_id, revocation.reason) == ("node-a", "decommissioned")


async def test_a_node_known_only_to_the_store_is_revoked(serve: Factory, certs: Certs) -> None:
    # A node offline since this server started: only its key binding knows it.
    served = await serve()
    await served.store.nodeids.claim("node-a", key_of(certs.node_a), now=datetime.now(UTC))
    async with admin(served) as (client, _):
        response = await client.post("/admin/api/nodes/node-a/remove", json={})
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["revoked"], body["stream_closed"], body["forgotten"]) == (True, False, False)
    assert body["reason"] == "removed by the operator"
    assert await served.store.nodeids.is_revoked(key_of(certs.node_a))


async def test_a_plaintext_node_is_forgotten_and_told_it_had_nothing_to_revoke(
    serve: Factory, certs: Certs
) -> None:
    served = await serve(tls=False)
    async with channel(served.port, None, certs.ca) as chan, admin(served) as (client, _):
        live = await register(chan, "node-a")
        response = await client.post("/admin/api/nodes/node-a/remove", json={"reason": "gone"})
        assert response.status_code == 200, response.text
        body = response.json()
        assert (body["revoked"], body["key_hash"], body["forgotten"]) == (False, None, True)
        assert "no certificate key to revoke" in body["message"]
        assert "registers again unless it is stopped" in body["message"]
        assert (await ended(live)).code() == grpc.StatusCode.ABORTED
        assert not known(served, "node-a")
    assert await served.store.nodeids.revocations() == []


async def test_an_unknown_node_is_404_and_nothing_changes(serve: Factory, certs: Certs) -> None:
    served = await serve()
    async with admin(served) as (client, events):
        response = await client.post("/admin/api/nodes/ghost/remove", json={"reason": "x"})
    assert response.status_code == 404
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["code"], error["type"], error["param"]) == (
        "node_not_found",
        "invalid_request_error",
        "node_id",
    )
    assert "no node 'ghost' to remove" in error["message"]
    assert events == [] and await served.store.nodeids.revocations() == []


@pytest.mark.parametrize(
    ("body", "what"),
    [
        (b"{not json", "not valid JSON"),
        (b'{"reason": 5}', "reason of 1 to 500"),
        (b'{"reason": "   "}', "reason of 1 to 500"),
        (b'["reason"]', "reason of 1 to 500"),
        (b'{"reason": "' + b"x" * 501 + b'"}', "reason of 1 to 500"),
    ],
)
async def test_a_bad_body_is_400_and_nothing_changes(
    serve: Factory, certs: Certs, body: bytes, what: str
) -> None:
    served = await serve()
    async with channel(served.port, certs.node_a, certs.ca) as chan, admin(served) as (client, _):
        live = await register(chan, "node-a")
        response = await client.post(
            "/admin/api/nodes/node-a/remove",
            content=body,
            headers={"Content-Type": "application/json"},
        )
        assert response.status_code == 400
        assert what in response.json()["error"]["message"]
        assert served.servicer.connected() == ["node-a"] and known(served, "node-a")
        await live.done_writing()
    assert await served.store.nodeids.revocations() == []


async def test_a_standby_refuses_naming_the_leader_and_nothing_changes(
    serve: Factory, certs: Certs
) -> None:
    served = await serve()
    await served.store.nodeids.claim("node-a", key_of(certs.node_a), now=datetime.now(UTC))
    async with admin(served, standby=True) as (client, events):
        response = await client.post("/admin/api/nodes/node-a/remove", json={})
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "not_leader" and "ctl-1:4242" in error["message"]
    assert events == [] and not await served.store.nodeids.is_revoked(key_of(certs.node_a))


async def test_without_an_agent_service_removal_is_503(serve: Factory, certs: Certs) -> None:
    served = await serve()
    async with admin(served, removal=False) as (client, _):
        response = await client.post("/admin/api/nodes/node-a/remove", json={})
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "not_available"


async def test_a_store_that_cannot_answer_is_503_and_nothing_changes(
    serve: Factory, certs: Certs
) -> None:
    served = await serve(tls=False)
    broken = await serve(tls=False, migrated=False)  # its store has no tables
    async with (
        channel(served.port, None, certs.ca) as chan,
        admin(served, store=broken.store) as (
            client,
            events,
        ),
    ):
        live = await register(chan, "node-a")
        response = await client.post("/admin/api/nodes/node-a/remove", json={})
        assert response.status_code == 503
        error = response.json()["error"]
        assert error["code"] == "store_unavailable"
        assert "node 'node-a' was not removed, nothing changed" in error["message"]
        assert served.servicer.connected() == ["node-a"] and known(served, "node-a")
        await live.done_writing()
    assert events == []
