"""A key's queue settings over the admin API (`POST`/`PATCH /admin/api/keys`), on the real store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from store_fixtures import FakeClock, clock_fixture, store_fixture, target_fixture  # noqa: F401

from llmgw.auth import KeyService
from llmgw.router.admin_keys import key_routes
from llmgw.store import Store


@pytest.fixture
async def api(store: Store, store_clock: FakeClock) -> AsyncIterator[httpx.AsyncClient]:
    service = KeyService(keys=store.keys, wall_clock=store_clock)
    app = Starlette(routes=key_routes(service=service, usage=store.usage, wall_clock=store_clock))
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5555))
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        yield client


def error_of(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    error: dict[str, Any] = resp.json()["error"]
    return error


async def test_priority_weight_and_wait_are_set_changed_and_cleared(
    api: httpx.AsyncClient, store: Store
) -> None:
    created = await api.post("/admin/api/keys", json={"name": "plain"})
    assert created.status_code == 201, created.text
    plain = created.json()
    assert (plain["priority"], plain["weight"], plain["max_queue_wait"]) == ("default", 1.0, None)
    created = await api.post(
        "/admin/api/keys",
        json={"name": "etl", "priority": "batch", "weight": 3, "max_queue_wait": 90},
    )
    key = created.json()
    assert (key["priority"], key["weight"], key["max_queue_wait"]) == ("batch", 3.0, 90.0)
    resp = await api.patch(
        f"/admin/api/keys/{key['id']}", json={"priority": "interactive", "max_queue_wait": None}
    )
    assert resp.status_code == 200, resp.text
    stored = await store.keys.get(key["id"])
    assert stored is not None
    assert (stored.priority, stored.weight, stored.max_queue_wait) == ("interactive", 3.0, None)


async def test_bad_queue_fields_name_the_field(api: httpx.AsyncClient) -> None:
    for body, param in (
        ({"name": "a", "priority": "urgent"}, "priority"),
        ({"name": "a", "priority": 1}, "priority"),
        ({"name": "a", "weight": 0}, "weight"),
        ({"name": "a", "weight": "heavy"}, "weight"),
        ({"name": "a", "max_queue_wait": -1}, "max_queue_wait"),
    ):
        error = error_of(await api.post("/admin/api/keys", json=body), 400)
        assert error["param"] == param, error
