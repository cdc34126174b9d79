"""The admin API from another host needs an admin key; loopback needs none."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from llmgw.auth import KeyAuthenticator, KeyService
from llmgw.router.admin_keys import admin_guard
from llmgw.store import open_store, store_url, utc_now


async def test_remote_clients_need_an_admin_key(tmp_path: Path) -> None:
    store = await open_store(store_url(tmp_path, None))
    try:
        await store.upgrade()
        service = KeyService(keys=store.keys, wall_clock=utc_now)
        _, admin_secret = await service.create(name="ops", admin_role="admin")
        _, user_secret = await service.create(name="app")
        authenticator = KeyAuthenticator(keys=store.keys, clock=time.monotonic, wall_clock=utc_now)

        async def hello(_: object) -> PlainTextResponse:
            return PlainTextResponse("admin")

        app = admin_guard(Starlette(routes=[Route("/x", hello)]), authenticator=authenticator)

        remote = httpx.ASGITransport(app=app, client=("10.1.2.3", 5555))
        async with httpx.AsyncClient(transport=remote, base_url="http://gw") as client:
            anonymous = await client.get("/x")
            assert anonymous.status_code == 401
            assert anonymous.json()["error"]["code"] == "missing_api_key"
            user = await client.get("/x", headers={"Authorization": f"Bearer {user_secret}"})
            assert user.status_code == 403
            assert user.json()["error"]["code"] == "admin_required"
            admin = await client.get("/x", headers={"Authorization": f"Bearer {admin_secret}"})
            assert admin.status_code == 200 and admin.text == "admin"

        local = httpx.ASGITransport(app=app, client=("127.0.0.1", 5555))
        async with httpx.AsyncClient(transport=local, base_url="http://gw") as client:
            assert (await client.get("/x")).status_code == 200
    finally:
        await store.close()
