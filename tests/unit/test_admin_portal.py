"""The admin portal on the API port: login, logout, CSRF, admin rights, expiry, slowdown.

Driven over ASGI with a real SQLite store and the real admin app (endpoints and
key routes), so an authenticated request returns what the admin listener would.
Cookies are handled by hand, so each test sees exactly what the browser gets.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from argon2 import PasswordHasher
from dashboard_fleet import fleet_sources
from prometheus_client import CollectorRegistry

from llmgw.auth import KeyService, OpenAuthenticator, Passwords, UserService, session_id
from llmgw.config import RouterConfig
from llmgw.limits import Limiter
from llmgw.metrics import RouterMetrics
from llmgw.router.admin import create_admin_app
from llmgw.router.admin_keys import key_routes
from llmgw.router.app import RouterApp
from llmgw.router.balancer import Balancer
from llmgw.router.endpoints import EjectionPolicy, EndpointPool, EndpointSpec
from llmgw.router.proxy import Proxy
from llmgw.router.upstream import Upstream
from llmgw.store import Store, UsageRecord, open_store, store_url
from llmgw.web import create_admin_portal, create_dashboard_routes

ALICE_PW = "correct horse battery staple"
BOB_PW = "bob has a long password"
WRONG = "wrong user name or password"
TTL = 3600.0
CHEAP = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)


class Clock:
    """Monotonic seconds and a wall clock that move together, only when told."""

    def __init__(self) -> None:
        self.mono = 5000.0
        self.now = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)

    def monotonic(self) -> float:
        return self.mono

    def wall(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.now += timedelta(seconds=seconds)


@dataclass
class Sleeps:
    delays: list[float] = field(default_factory=list)

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


@dataclass
class Portal:
    store: Store
    clock: Clock
    sleeps: Sleeps
    client: Callable[..., httpx.AsyncClient]
    app: Callable[..., Awaitable[None]]


async def make_portal(
    tmp_path: Path, *, secure: bool = False, passwords: Passwords | None = None
) -> tuple[Portal, Store]:
    store = await open_store(store_url(tmp_path / "data", None))
    await store.upgrade()
    users = UserService(users=store.users, passwords=Passwords(hasher=CHEAP))
    await users.create("alice", ALICE_PW, role="admin")
    await users.create("bob", BOB_PW, role=None)
    await users.create("carol", "carol's long password", role="admin")
    await users.disable("carol")
    clock = Clock()
    pool = EndpointPool(policy=EjectionPolicy(3, 1.0, 30.0), clock=clock.monotonic)
    pool.set_model_endpoints("llama", [EndpointSpec("gpu1", "http://10.0.0.1:8000", ("llama",))])
    admin_app = create_admin_app(
        pool=pool,
        registry=CollectorRegistry(),
        clock=clock.monotonic,
        extra_routes=[
            *key_routes(
                service=KeyService(keys=store.keys, wall_clock=clock.wall),
                usage=store.usage,
                wall_clock=clock.wall,
            ),
            *create_dashboard_routes(sources=(await fleet_sources(store, nodes=2, models=3))[0]),
        ],
    )
    sleeps = Sleeps()
    app = create_admin_portal(
        users=store.users,
        sessions=store.sessions,
        admin_app=admin_app,
        session_ttl=TTL,
        slowdown_after=3,
        slowdown_max=10.0,
        clock=clock.monotonic,
        wall_clock=clock.wall,
        secure_cookies=secure,
        sleep=sleeps,
        passwords=passwords or Passwords(hasher=CHEAP),
    )

    def client(address: str = "203.0.113.7") -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=app, client=(address, 40000))
        return httpx.AsyncClient(transport=transport, base_url="http://gw")

    return Portal(store, clock, sleeps, client, app), store


@pytest.fixture(name="portal")
async def portal_fixture(tmp_path: Path) -> AsyncIterator[Portal]:
    portal, store = await make_portal(tmp_path)
    try:
        yield portal
    finally:
        await store.close()


async def login(
    client: httpx.AsyncClient, name: str, password: str, **headers: str
) -> httpx.Response:
    return await client.post(
        "/admin/login", data={"username": name, "password": password}, headers=headers
    )


def token_of(response: httpx.Response) -> str:
    cookie = response.headers["set-cookie"]
    assert cookie.startswith("llmgw_session=")
    return cookie.split(";")[0].removeprefix("llmgw_session=")


def cookie(token: str) -> dict[str, str]:
    return {"Cookie": f"llmgw_session={token}"}


async def logged_in(client: httpx.AsyncClient, name: str, password: str) -> tuple[str, str]:
    """The session token and its CSRF token."""
    response = await login(client, name, password)
    assert response.status_code == 303, response.text
    token = token_of(response)
    session = await client.get("/admin/api/session", headers=cookie(token))
    assert session.status_code == 200
    return token, session.json()["csrf_token"]


async def test_login_use_the_admin_api_and_logout(portal: Portal) -> None:
    async with portal.client() as client:
        form = await client.get("/admin/login")
        assert form.status_code == 200
        assert '<form method=post action="/admin/login">' in form.text
        assert "frame-ancestors 'none'" in form.headers["content-security-policy"]

        response = await login(client, "alice", ALICE_PW)
        assert response.status_code == 303
        assert response.headers["location"] == "/admin/"
        token = token_of(response)

        endpoints = await client.get("/admin/api/endpoints", headers=cookie(token))
        assert endpoints.status_code == 200
        assert [e["id"] for e in endpoints.json()["endpoints"]] == ["gpu1"]

        session = (await client.get("/admin/api/session", headers=cookie(token))).json()
        assert session["user"] == "alice" and session["admin"] is True
        assert session["expires_at"] == (portal.clock.now + timedelta(seconds=TTL)).isoformat()
        csrf = session["csrf_token"]

        # The dashboard, with who is logged in and the token its changes send.
        home = await client.get("/admin/", headers=cookie(token))
        assert home.status_code == 200
        assert "<span>alice</span>" in home.text and csrf in home.text

        created = await client.post(
            "/admin/api/keys",
            json={"name": "team-a"},
            headers={**cookie(token), "X-CSRF-Token": csrf},
        )
        assert created.status_code == 201, created.text
        assert [k.name for k in await portal.store.keys.list()] == ["team-a"]

        out = await client.post("/admin/logout", data={"csrf_token": csrf}, headers=cookie(token))
        assert out.status_code == 303
        assert out.headers["location"] == "/admin/login"
        assert "Max-Age=0" in out.headers["set-cookie"]
        assert await portal.store.sessions.get(session_id(token)) is None

        after = await client.get("/admin/api/endpoints", headers=cookie(token))
        assert after.status_code == 401
        assert after.json()["error"]["code"] == "login_required"


async def test_the_session_cookie_flags(tmp_path: Path) -> None:
    plain, store = await make_portal(tmp_path / "plain")
    try:
        async with plain.client() as client:
            flags = (await login(client, "alice", ALICE_PW)).headers["set-cookie"].split("; ")
    finally:
        await store.close()
    assert flags[1:] == ["HttpOnly", "SameSite=Strict", "Path=/admin", f"Max-Age={int(TTL)}"]

    tls, store = await make_portal(tmp_path / "tls", secure=True)
    try:
        async with tls.client() as client:
            flags = (await login(client, "alice", ALICE_PW)).headers["set-cookie"].split("; ")
    finally:
        await store.close()
    assert "Secure" in flags and "HttpOnly" in flags and "SameSite=Strict" in flags


async def test_a_wrong_password_an_unknown_and_a_disabled_user_look_the_same(
    portal: Portal,
) -> None:
    async with portal.client() as client:
        answers = [
            await login(client, "alice", "not alice's password"),
            await login(client, "nobody", ALICE_PW),
            await login(client, "carol", "carol's long password"),
        ]
    for answer in answers:
        assert answer.status_code == 401
        assert f"<p class=error role=alert>{WRONG}</p>" in answer.text
        assert "set-cookie" not in answer.headers


async def test_state_changes_need_the_csrf_token(portal: Portal) -> None:
    async with portal.client() as client:
        token, csrf = await logged_in(client, "alice", ALICE_PW)
        attempts = [
            await client.post("/admin/api/keys", json={"name": "x"}, headers=cookie(token)),
            await client.post(
                "/admin/api/keys",
                json={"name": "x"},
                headers={**cookie(token), "X-CSRF-Token": csrf[:-1] + "A"},
            ),
            await client.post(
                "/admin/api/keys", data={"name": "x", "csrf_token": "guess"}, headers=cookie(token)
            ),
            await client.post("/admin/logout", data={"csrf_token": "guess"}, headers=cookie(token)),
        ]
        for attempt in attempts:
            assert attempt.status_code == 403
            assert attempt.json()["error"]["code"] == "csrf_failed"
        assert await portal.store.keys.list() == []
        # The refused logout ended nothing.
        assert (await client.get("/admin/api/endpoints", headers=cookie(token))).status_code == 200


async def test_a_user_without_admin_rights_sees_nothing_of_the_cluster(portal: Portal) -> None:
    async with portal.client() as client:
        token, csrf = await logged_in(client, "bob", BOB_PW)
        session = (await client.get("/admin/api/session", headers=cookie(token))).json()
        assert session["user"] == "bob" and session["admin"] is False

        html = {"Accept": "text/html"}
        answers = [
            await client.get("/admin/api/endpoints", headers=cookie(token)),
            await client.get("/admin/api/endpoints", headers={**cookie(token), **html}),
            await client.get("/admin/", headers={**cookie(token), **html}),
            await client.get("/admin/api/keys", headers=cookie(token)),
            await client.post(
                "/admin/api/keys",
                json={"name": "x"},
                headers={**cookie(token), "X-CSRF-Token": csrf},
            ),
        ]
        for answer in answers:
            assert answer.status_code == 403
            assert "your account has no admin role" in answer.text
            assert "gpu1" not in answer.text and "10.0.0.1" not in answer.text
        assert answers[0].json()["error"]["code"] == "admin_required"
        assert await portal.store.keys.list() == []


async def test_without_a_session_browsers_go_to_the_login_and_api_clients_get_401(
    portal: Portal,
) -> None:
    async with portal.client() as client:
        browser = await client.get("/admin/", headers={"Accept": "text/html,*/*"})
        assert browser.status_code == 303 and browser.headers["location"] == "/admin/login"

        api = await client.get("/admin/api/endpoints")
        assert api.status_code == 401
        assert api.json()["error"]["code"] == "login_required"
        assert "gpu1" not in api.text

        forged = await client.get("/admin/api/endpoints", headers=cookie("made-up-token"))
        assert forged.status_code == 401
        assert "Max-Age=0" in forged.headers["set-cookie"]

        assert (await client.get("/admin")).headers["location"] == "/admin/"


async def test_expired_sessions_are_refused_and_deleted(portal: Portal) -> None:
    async with portal.client() as client:
        token, _ = await logged_in(client, "alice", ALICE_PW)
        portal.clock.advance(TTL - 1)
        assert (await client.get("/admin/api/endpoints", headers=cookie(token))).status_code == 200

        portal.clock.advance(1)
        expired = await client.get("/admin/api/endpoints", headers=cookie(token))
        assert expired.status_code == 401
        assert await portal.store.sessions.get(session_id(token)) is None


async def test_a_disabled_users_session_ends(portal: Portal) -> None:
    async with portal.client() as client:
        token, _ = await logged_in(client, "alice", ALICE_PW)
        await portal.store.users.disable("alice")
        assert (await client.get("/admin/api/endpoints", headers=cookie(token))).status_code == 401


async def test_repeated_failures_slow_the_answers_down(portal: Portal) -> None:
    async with portal.client() as guesser:
        for i in range(9):
            assert (await login(guesser, "alice", f"guess number {i}")).status_code == 401
        assert portal.sleeps.delays == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0]

        # The right password is slowed too (or a guesser could stop waiting early),
        # and then clears the user's count.
        assert (await login(guesser, "alice", ALICE_PW)).status_code == 303
        assert portal.sleeps.delays[-1] == 10.0

    portal.sleeps.delays.clear()
    async with portal.client("198.51.100.1") as elsewhere:
        assert (await login(elsewhere, "alice", "one typo here")).status_code == 401
        assert (await login(elsewhere, "bob", BOB_PW)).status_code == 303
    assert portal.sleeps.delays == []

    # The guesser's address is still slowed, for any name.
    async with portal.client() as guesser:
        assert (await login(guesser, "bob", "another guess")).status_code == 401
    assert portal.sleeps.delays == [10.0]


async def test_admin_listener_only_paths_are_not_reachable(portal: Portal) -> None:
    async with portal.client() as client:
        token, _ = await logged_in(client, "alice", ALICE_PW)
        for path in (
            "/metrics",
            "/healthz",
            "/readyz",
            "/admin/metrics",
            "/admin/healthz",
            # Percent-encoded, so the client sends the dots instead of resolving them.
            "/admin/api/%2E%2E/%2E%2E/metrics",
            "/admin/api/..%2F..%2Fmetrics",
            "/admin/debug/stacks",
        ):
            answer = await client.get(path, headers=cookie(token))
            assert answer.status_code == 404, path
            assert "python_gc" not in answer.text and "llmgw_" not in answer.text


async def test_a_login_posted_from_another_site_is_refused(portal: Portal) -> None:
    async with portal.client() as client:
        forged = await login(client, "alice", ALICE_PW, Origin="https://evil.example")
        assert forged.status_code == 403
        assert forged.json()["error"]["code"] == "cross_origin_login"
        assert "set-cookie" not in forged.headers
        referred = await login(client, "alice", ALICE_PW, Referer="https://evil.example/x")
        assert referred.status_code == 403
        own = await login(client, "alice", ALICE_PW, Origin="http://gw")
        assert own.status_code == 303


async def test_a_hash_with_old_parameters_is_upgraded_at_login(tmp_path: Path) -> None:
    stronger = Passwords(hasher=PasswordHasher(time_cost=2, memory_cost=2048, parallelism=1))
    portal, store = await make_portal(tmp_path, passwords=stronger)
    try:
        async with portal.client() as client:
            token, _ = await logged_in(client, "alice", ALICE_PW)
        alice = await store.users.get_by_name("alice")
        assert alice is not None
        assert alice.password_hash.startswith("$argon2id$v=19$m=2048,t=2,p=1$")
        assert await store.sessions.get(session_id(token)) is not None
    finally:
        await store.close()


class _NoUsage:
    def record(self, rec: UsageRecord) -> None:
        raise AssertionError("no /v1 request is made here")


async def test_the_router_hands_admin_paths_to_the_portal(portal: Portal) -> None:
    registry = CollectorRegistry()
    pool = EndpointPool(policy=EjectionPolicy(3, 1.0, 30.0), clock=time.monotonic)
    metrics = RouterMetrics(registry=registry)

    def router(admin_portal: Callable[..., Awaitable[None]] | None) -> RouterApp:
        return RouterApp(
            proxy=Proxy(
                pool=pool,
                balancer=Balancer(clock=time.monotonic, rng=random.Random(0)),
                upstream=Upstream(connect_timeout=1.0, idle_timeout=1.0),
                metrics=metrics,
                config=RouterConfig(),
                clock=time.monotonic,
            ),
            pool=pool,
            metrics=metrics,
            authenticator=OpenAuthenticator(),
            limiter=Limiter(
                clock=time.monotonic,
                wall_clock=portal.clock.wall,
                budget_source=portal.store.usage,
            ),
            usage=_NoUsage(),
            max_body_bytes=1 << 20,
            clock=time.monotonic,
            wall_clock=portal.clock.wall,
            started_at=0,
            admin_portal=admin_portal,
        )

    with_portal = httpx.ASGITransport(app=router(portal.app))
    async with httpx.AsyncClient(transport=with_portal, base_url="http://gw") as client:
        assert (await client.get("/admin/login")).status_code == 200
        assert (await client.get("/admin")).status_code == 303
        assert (await client.get("/admin/api/endpoints")).status_code == 401
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        assert (await client.get("/administrator")).status_code == 404

    without = httpx.ASGITransport(app=router(None))
    async with httpx.AsyncClient(transport=without, base_url="http://gw") as client:
        for path in ("/admin", "/admin/login", "/admin/api/endpoints"):
            answer = await client.get(path)
            assert answer.status_code == 404
            assert answer.json()["error"]["code"] is not None
