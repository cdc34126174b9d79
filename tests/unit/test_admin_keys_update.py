"""`PATCH /admin/api/keys/{ref}`: the key routes over ASGI on the real store (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from store_fixtures import START, FakeClock, clock_fixture, store_fixture, target_fixture  # noqa: F401

from llmgw.auth import KeyService
from llmgw.router.admin_keys import key_routes
from llmgw.store import Store

LATER = "2025-06-01T00:00:00+00:00"


@pytest.fixture
async def api(store: Store, store_clock: FakeClock) -> AsyncIterator[httpx.AsyncClient]:
    service = KeyService(keys=store.keys, wall_clock=store_clock)
    app = Starlette(routes=key_routes(service=service, usage=store.usage, wall_clock=store_clock))
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5555))
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        yield client


async def create(api: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    created = await api.post("/admin/api/keys", json=body)
    assert created.status_code == 201, created.text
    key: dict[str, Any] = created.json()
    return key


def error_of(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    error: dict[str, Any] = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


async def test_each_field_is_set_and_the_others_kept(api: httpx.AsyncClient, store: Store) -> None:
    key = await create(api, name="team-a", models=["m1"], rpm=5, tpm=500)
    steps: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({"name": "team-b"}, {"name": "team-b"}),
        ({"models": ["m1", "m2"]}, {"models": ["m1", "m2"]}),
        ({"rpm": 60}, {"rpm": 60}),
        ({"tpm": 1000}, {"tpm": 1000}),
        ({"budget_tokens": 100, "period": "day"}, {"budget_tokens": 100, "budget_period": "day"}),
        ({"budget_tokens": 200}, {"budget_tokens": 200}),
        ({"period": "month"}, {"budget_period": "month"}),
        ({"expires_at": LATER}, {"expires_at": LATER, "state": "active"}),
        ({"admin": True}, {"is_admin": True, "admin_role": "admin"}),
        ({"role": "viewer"}, {"is_admin": False, "admin_role": "viewer"}),
        ({"role": "operator"}, {"admin_role": "operator"}),
    ]
    expected = dict(key)
    del expected["secret"]
    for body, fields in steps:
        resp = await api.patch(f"/admin/api/keys/{key['id']}", json=body)
        assert resp.status_code == 200, resp.text
        expected.update(fields)
        assert resp.json() == expected, body
    assert (await api.get("/admin/api/keys")).json()["keys"] == [expected]
    # The secret is unchanged: the store still finds the key by its hash.
    stored = await store.keys.get(key["id"])
    assert stored is not None and stored.prefix == key["prefix"]


async def test_null_clears_each_optional_field(api: httpx.AsyncClient) -> None:
    key = await create(
        api,
        name="team-a",
        models=["m1"],
        rpm=5,
        tpm=500,
        budget_tokens=100,
        period="day",
        expires_at=LATER,
        admin=True,
    )
    url = f"/admin/api/keys/{key['id']}"
    for body, field in [
        ({"models": None}, "models"),
        ({"rpm": None}, "rpm"),
        ({"tpm": None}, "tpm"),
        ({"expires_at": None}, "expires_at"),
    ]:
        resp = await api.patch(url, json=body)
        assert resp.status_code == 200, resp.text
        assert resp.json()[field] is None
    # Clearing the budget clears its period too.
    cleared = (await api.patch(url, json={"budget_tokens": None})).json()
    assert (cleared["budget_tokens"], cleared["budget_period"]) == (None, None)
    assert (cleared["name"], cleared["is_admin"], cleared["state"]) == ("team-a", True, "active")
    assert (await api.patch(url, json={"admin": False})).json()["is_admin"] is False
    assert (await api.patch(url, json={"role": "viewer"})).json()["admin_role"] == "viewer"
    assert (await api.patch(url, json={"role": None})).json()["admin_role"] is None


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"rpm": "fast"}, "rpm", "'rpm' must be an integer"),
        ({"rpm": True}, "rpm", "'rpm' must be an integer"),
        ({"tpm": 0}, "tpm", "tpm must be at least 1 (clear it for no limit), got 0"),
        ({"budget_tokens": 10}, "budget_tokens", "budget_tokens needs period day|month"),
        ({"period": "day"}, "period", "period only applies with budget_tokens"),
        ({"period": 7}, "period", "'period' must be 'day' or 'month'"),
        ({"models": "m1"}, "models", "'models' must be an array of model names"),
        ({"models": []}, "models", "models lists no model"),
        ({"name": None}, "name", "'name' must be a string; leave it out to keep"),
        ({"name": ""}, "name", "name must be 1 to 200 characters"),
        ({"admin": None}, "admin", "'admin' must be true or false"),
        (
            {"role": "root"},
            "role",
            "role must be admin, operator, viewer or none (a client key), got 'root'",
        ),
        ({"role": 1}, "role", "'role' must be admin, operator, viewer or null"),
        ({"role": "admin", "admin": True}, "role", "give either 'role' or 'admin'"),
        ({"expires_at": "tomorrow"}, "expires_at", "not an ISO 8601 time"),
        ({"expires_at": "2001-01-01T00:00:00Z"}, "expires_at", "is in the past"),
        ({"nme": "x"}, "nme", "unknown field 'nme'"),
        ({"secret": "sk-x"}, "secret", "/rotate gives the key a new one"),
    ],
)
async def test_bad_values_are_400_naming_the_field(
    api: httpx.AsyncClient, body: dict[str, Any], param: str, message: str
) -> None:
    key = await create(api, name="k", rpm=5)
    error = error_of(await api.patch("/admin/api/keys/k", json=body), 400)
    assert error["param"] == param
    assert message in error["message"]
    listed = (await api.get("/admin/api/keys")).json()["keys"]
    assert [(k["name"], k["rpm"], k["budget_tokens"]) for k in listed] == [("k", 5, None)]
    assert listed[0]["id"] == key["id"]


async def test_empty_and_malformed_bodies(api: httpx.AsyncClient) -> None:
    await create(api, name="k")
    for content in (b"{}", b"", b"  "):
        error = error_of(await api.patch("/admin/api/keys/k", content=content), 400)
        assert error["message"].startswith("nothing to change: send at least one of admin, ")
        assert error["param"] is None
    assert error_of(await api.patch("/admin/api/keys/k", content=b"{"), 400)["code"] == (
        "invalid_json"
    )
    not_object = error_of(await api.patch("/admin/api/keys/k", json=[1]), 400)
    assert not_object["message"] == "the body must be a JSON object"


async def test_unknown_revoked_and_taken_names(api: httpx.AsyncClient) -> None:
    a = await create(api, name="a")
    b = await create(api, name="b")
    unknown = error_of(await api.patch("/admin/api/keys/nobody", json={"rpm": 5}), 404)
    assert unknown["code"] == "not_found" and "'nobody'" in unknown["message"]
    taken = error_of(await api.patch("/admin/api/keys/a", json={"name": "b"}), 409)
    assert f"an active key named 'b' already exists ({b['id']})" in taken["message"]
    assert (await api.post("/admin/api/keys/a/revoke")).status_code == 200
    revoked = error_of(await api.patch(f"/admin/api/keys/{a['id']}", json={"rpm": 5}), 409)
    assert "is revoked and cannot be changed; create a new key" in revoked["message"]
    # The revoked key's name is free again.
    renamed = await api.patch("/admin/api/keys/b", json={"name": "a"})
    assert renamed.status_code == 200 and renamed.json()["name"] == "a"
