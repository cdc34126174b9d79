"""The admin API from another host needs an admin key; loopback needs none."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from llmgw.auth import ROLE_SCOPE_KEY, KeyAuthenticator, KeyService, OpenAuthenticator
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


async def test_a_key_is_held_to_its_role_on_loopback_too(tmp_path: Path) -> None:
    store = await open_store(store_url(tmp_path, None))
    try:
        await store.upgrade()
        service = KeyService(keys=store.keys, wall_clock=utc_now)
        _, viewer = await service.create(name="watch", admin_role="viewer")
        authenticator = KeyAuthenticator(keys=store.keys, clock=time.monotonic, wall_clock=utc_now)
        seen: list[object] = []

        async def hello(request: Request) -> PlainTextResponse:
            seen.append(request.scope.get(ROLE_SCOPE_KEY, "unset"))
            return PlainTextResponse("ok")

        routes = [Route("/admin/api/nodes", hello), Route("/admin/api/nodes/n/drain", hello,
                                                            methods=["POST"])]  # fmt: skip
        app = admin_guard(Starlette(routes=routes), authenticator=authenticator)
        local = httpx.ASGITransport(app=app, client=("127.0.0.1", 5555))
        async with httpx.AsyncClient(transport=local, base_url="http://gw") as client:
            as_viewer = {"Authorization": f"Bearer {viewer}"}
            assert (await client.get("/admin/api/nodes", headers=as_viewer)).status_code == 200
            refused = await client.post("/admin/api/nodes/n/drain", headers=as_viewer)
            assert refused.status_code == 403
            assert refused.json()["error"]["code"] == "role_not_allowed"
            assert "API key 'watch' has the role viewer" in refused.json()["error"]["message"]
            wrong = await client.get("/admin/api/nodes", headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401
            assert (await client.post("/admin/api/nodes/n/drain")).status_code == 200
        # The viewer's read carried its role; the keyless loopback call carried none
        # (the dashboard takes that as the machine's own admin).
        assert seen == ["viewer", "unset"]

        # Auth mode open has no keys: a loopback caller's token is no one's, and passes.
        open_app = admin_guard(Starlette(routes=routes), authenticator=OpenAuthenticator())
        transport = httpx.ASGITransport(app=open_app, client=("127.0.0.1", 5555))
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            drain = await client.post("/admin/api/nodes/n/drain", headers=as_viewer)
            assert drain.status_code == 200
    finally:
        await store.close()
