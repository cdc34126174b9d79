"""The dashboard behind the login on the API port: the portal forwards its pages,
hands down who is logged in and the CSRF token, and checks the token on changes."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from argon2 import PasswordHasher
from dashboard_fleet import DashboardFleet, fleet_sources
from prometheus_client import CollectorRegistry

from llmgw.auth import Passwords, UserService
from llmgw.router.admin import create_admin_app
from llmgw.router.endpoints import EjectionPolicy, EndpointPool
from llmgw.store import Store, open_store, store_url
from llmgw.web import create_admin_portal, create_dashboard_routes

PASSWORD = "correct horse battery staple"
HX = {"HX-Request": "true"}


@dataclass
class Site:
    portal: httpx.AsyncClient
    admin: httpx.AsyncClient
    fleet: DashboardFleet
    store: Store


async def _sleep(_: float) -> None:
    pass


@pytest.fixture(name="site")
async def site_fixture(tmp_path: Path) -> AsyncIterator[Site]:
    store = await open_store(store_url(tmp_path / "data", None))
    await store.upgrade()
    try:
        cheap = Passwords(hasher=PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1))
        users = UserService(users=store.users, passwords=cheap)
        await users.create("alice", PASSWORD, role="admin")
        await users.create("bob", PASSWORD, role=None)
        sources, fleet = await fleet_sources(store, nodes=3, models=4)
        admin_app = create_admin_app(
            pool=EndpointPool(policy=EjectionPolicy(3, 1.0, 30.0), clock=fleet.clock.monotonic),
            registry=CollectorRegistry(),
            clock=fleet.clock.monotonic,
            extra_routes=create_dashboard_routes(sources=sources),
        )
        portal = create_admin_portal(
            users=store.users,
            sessions=store.sessions,
            admin_app=admin_app,
            session_ttl=3600.0,
            slowdown_after=3,
            slowdown_max=10.0,
            clock=fleet.clock.monotonic,
            wall_clock=lambda: datetime.now(UTC),
            secure_cookies=False,
            sleep=_sleep,
            passwords=cheap,
        )
        async with (
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=portal, client=("203.0.113.9", 1234)),
                base_url="http://gw",
            ) as through_portal,
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=admin_app, client=("127.0.0.1", 1234)),
                base_url="http://admin",
            ) as admin,
        ):
            yield Site(through_portal, admin, fleet, store)
    finally:
        await store.close()


async def log_in(client: httpx.AsyncClient, name: str) -> str:
    """Logs in (the client keeps the cookie); the session's CSRF token."""
    answer = await client.post("/admin/login", data={"username": name, "password": PASSWORD})
    assert answer.status_code == 303, answer.text
    client.cookies.set("llmgw_session", answer.cookies["llmgw_session"])
    token: str = (await client.get("/admin/api/session")).json()["csrf_token"]
    return token


async def test_every_page_is_served_behind_the_login(site: Site) -> None:
    paths = ("/admin/", "/admin/nodes", "/admin/models", "/admin/models/model-001",
             "/admin/usage", "/admin/keys", "/admin/events", "/admin/usage.csv")  # fmt: skip
    for path in paths:
        anonymous = await site.portal.get(path, headers={"Accept": "text/html"})
        assert anonymous.status_code == 303, path
        assert anonymous.headers["location"] == "/admin/login"
    await log_in(site.portal, "alice")
    for path in paths:
        assert (await site.portal.get(path)).status_code == 200, path
    page = (await site.portal.get("/admin/")).text
    for url in re.findall(r'(?:href|src)="(/admin/static/[^"]+)"', page):
        assert (await site.portal.get(url)).status_code == 200


async def test_pages_carry_the_user_and_the_csrf_token_only_through_the_portal(
    site: Site,
) -> None:
    csrf = await log_in(site.portal, "alice")
    page = (await site.portal.get("/admin/nodes")).text
    assert f'hx-headers=\'{{"X-CSRF-Token": "{csrf}"}}\'' in page
    assert "<span>alice</span>" in page
    assert f'<input type="hidden" name="csrf_token" value="{csrf}">' in page  # log out

    direct = (await site.admin.get("/admin/nodes")).text
    assert "hx-headers" not in direct and "/admin/logout" not in direct


async def test_a_change_through_the_portal_needs_the_csrf_token(site: Site) -> None:
    csrf = await log_in(site.portal, "alice")
    node = "node-000"
    forged = await site.portal.post(f"/admin/nodes/{node}/drain", headers=HX)
    assert forged.status_code == 403
    assert forged.headers["content-type"].startswith("text/html")  # shown on the page
    assert "CSRF token" in html.unescape(forged.text)
    assert not site.fleet.inventory.node(node).draining

    no_htmx = await site.portal.post(f"/admin/nodes/{node}/drain", headers={"X-CSRF-Token": csrf})
    assert no_htmx.status_code == 403 and not site.fleet.inventory.node(node).draining

    done = await site.portal.post(
        f"/admin/nodes/{node}/drain", headers={**HX, "X-CSRF-Token": csrf}
    )
    assert done.status_code == 200 and f"node {node} is draining" in done.text
    assert site.fleet.inventory.node(node).draining

    created = await site.portal.post(
        "/admin/keys", data={"name": "via-portal"}, headers={**HX, "X-CSRF-Token": csrf}
    )
    assert created.status_code == 200 and 'id="new-secret"' in created.text
    assert [k.name for k in await site.store.keys.list()] == ["via-portal"]


async def test_a_key_edit_through_the_portal_needs_the_csrf_token(site: Site) -> None:
    csrf = await log_in(site.portal, "alice")
    created = await site.portal.post(
        "/admin/keys", data={"name": "team-b", "rpm": "60"}, headers={**HX, "X-CSRF-Token": csrf}
    )
    assert created.status_code == 200, created.text
    (key,) = await site.store.keys.list()
    # Opening the form is a read: no token needed.
    form = await site.portal.get(f"/admin/keys/{key.id}/edit", headers=HX)
    assert form.status_code == 200 and 'name="rpm" value="60"' in form.text

    edit = {"name": "team-b", "rpm": "30"}
    forged = await site.portal.post(f"/admin/keys/{key.id}/edit", data=edit, headers=HX)
    assert forged.status_code == 403 and "CSRF token" in html.unescape(forged.text)
    assert await site.store.keys.list() == [key]

    done = await site.portal.post(
        f"/admin/keys/{key.id}/edit", data=edit, headers={**HX, "X-CSRF-Token": csrf}
    )
    assert done.status_code == 200 and "key team-b updated" in done.text
    assert [k.rpm for k in await site.store.keys.list()] == [30]


async def test_a_refresh_after_the_session_ended_goes_to_the_login(site: Site) -> None:
    answer = await site.portal.get("/admin/nodes", headers=HX)
    assert answer.status_code == 401
    assert answer.headers["hx-redirect"] == "/admin/login"
    assert "node-000" not in answer.text


async def test_someone_without_admin_rights_sees_no_dashboard(site: Site) -> None:
    await log_in(site.portal, "bob")
    for path in ("/admin/", "/admin/nodes", "/admin/teams/nope"):
        answer = await site.portal.get(path)
        assert answer.status_code == 403, path
        assert "node-000" not in answer.text
    # The stylesheet holds no data; a team's page needs it for users without a role.
    style = await site.portal.get("/admin/static/dashboard.css")
    assert style.status_code == 200 and "node-000" not in style.text


async def test_only_dashboard_and_api_paths_are_forwarded(site: Site) -> None:
    await log_in(site.portal, "alice")
    for path in ("/metrics", "/healthz", "/admin/metrics", "/admin/readyz",
                 "/admin/nodes-and-more", "/admin/static/../metrics"):  # fmt: skip
        answer = await site.portal.get(path)
        assert answer.status_code == 404, path
        assert "llmgw_" not in answer.text
