"""The servers' directory and the leader's view of demand, over a real store.

A server killed in the middle of requests leaves its demand rows behind (in
flight, waiting for a start) with nobody to withdraw them. The leader counts
only servers that announced themselves within one lease TTL, so such rows stop
holding replicas up once the server has been silent that long.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable
from datetime import timedelta

import httpx
import pytest
from starlette.applications import Starlette
from store_fixtures import (  # noqa: F401
    START,
    FakeClock,
    StoreTarget,
    clock_fixture,
    store_fixture,
    target_fixture,
)

from llmgw.control.leadership import ServerDirectory, leader_routes, servers_view, sync_demand
from llmgw.control.leadership.lease import LeaderInfo
from llmgw.control.reconciler.demand import DemandBook
from llmgw.store import ControlServer, Demand, Store, StoreUnavailable

TTL = 9.0


def control_server(name: str) -> ControlServer:
    return ControlServer(
        server=name, hostname=name, version="0.1.0", api_url=f"http://{name}:8080",
        agent_address="", started_at=START, last_seen=START,
    )  # fmt: skip


async def wait_until(check: Callable[[], bool], what: str) -> None:
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_the_leader_counts_demand_only_from_servers_seen_within_a_ttl(
    store: Store, store_clock: FakeClock
) -> None:
    # "dead" announced itself 20 s ago and went silent with two requests in flight
    # and a start wanted; "live" announced itself just now with one in flight.
    store_clock.advance(seconds=-20)
    await store.leadership.announce(control_server("dead"))
    store_clock.advance(seconds=20)
    await store.leadership.announce(control_server("live"))
    await store.leadership.report_demand("dead", [Demand("m", "dead", START, 2, START)])
    await store.leadership.report_demand("live", [Demand("m", "live", START, 1, None)])

    book = DemandBook(clock=lambda: 100.0, wall_clock=store_clock)
    woken = asyncio.Event()
    task = asyncio.create_task(
        sync_demand(
            store=store.leadership, demand=book, server_id="leader", leading=lambda: True,
            on_remote=woken.set, interval=0.01, wall_clock=store_clock, ttl=TTL,
        )
    )  # fmt: skip
    try:
        await wait_until(lambda: book.in_flight("m") == 1, "the live server's demand")
        await asyncio.sleep(0.05)  # a few more passes: the dead one's rows stay out
        assert book.in_flight("m") == 1
        assert book.remote_wanted() == []
        assert not woken.is_set()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_the_directory_announces_lists_and_forgets_on_a_clean_stop(
    store: Store, store_clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    # A server silent for over an hour is forgotten by the leader, demand and all.
    store_clock.advance(hours=-2)
    await store.leadership.announce(control_server("old"))
    await store.leadership.report_demand("old", [Demand("m", "old", START, 3, None)])
    store_clock.advance(hours=2)
    await store.leadership.announce(control_server("peer"))
    caplog.set_level(logging.INFO, logger="llmgw.control.leadership")

    directory = ServerDirectory(
        store=store.leadership, server=control_server("me"), leading=lambda: True,
        wall_clock=store_clock, interval=0.01,
    )  # fmt: skip
    assert directory.latest() == []
    task = asyncio.create_task(directory.run())
    try:
        await wait_until(lambda: len(directory.latest()) == 2, "the first pass")
        assert [s.server for s in directory.latest()] == ["me", "peer"]
        assert [s.server for s in await store.leadership.servers()] == ["me", "peer"]
        assert await store.leadership.demand() == []
        assert "forgetting servers silent for over 1:00:00: old" in caplog.messages
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    # Stopped cleanly: gone from the list at once.
    assert [s.server for s in await store.leadership.servers()] == ["peer"]


def test_roles_in_the_list_leader_standby_gone() -> None:
    now = START + timedelta(seconds=30)
    info = LeaderInfo(
        server="b", role="standby", leader="c", epoch=4, since=START,
        expires_at=now + timedelta(seconds=5), agent_address="c:9443", role_since=START,
    )  # fmt: skip
    servers = [
        control_server("a"),  # last seen 30 s ago: longer than a TTL
        dataclasses.replace(control_server("b"), last_seen=now),
        dataclasses.replace(control_server("c"), last_seen=now - timedelta(seconds=8)),
    ]
    listed = servers_view(servers, info, now, TTL)
    assert [(s["server"], s["role"], s["this"]) for s in listed] == [
        ("c", "leader", False),
        ("b", "standby", True),
        ("a", "gone", False),
    ]
    # A leader whose lease ran out (as this server last saw it) is not shown leading.
    lapsed = dataclasses.replace(info, expires_at=now - timedelta(seconds=1))
    assert [s["role"] for s in servers_view(servers, lapsed, now, TTL)] == [
        "standby",
        "standby",
        "gone",
    ]


class UnreachableStore:
    async def servers(self) -> list[ControlServer]:
        raise StoreUnavailable("connection refused (127.0.0.1:5432)")


class Standby:
    def info(self) -> LeaderInfo:
        return LeaderInfo(
            server="b", role="standby", leader=None, epoch=None, since=None,
            expires_at=None, agent_address=None, role_since=START,
        )  # fmt: skip


async def test_the_server_list_says_so_when_the_store_cannot_be_read() -> None:
    routes = leader_routes(
        leadership=Standby(), servers=UnreachableStore(), wall_clock=lambda: START, ttl=TTL
    )
    transport = httpx.ASGITransport(app=Starlette(routes=routes))
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        answer = await client.get("/admin/api/servers")
        assert answer.status_code == 503
        assert answer.json()["error"] == {
            "message": "cannot read the servers from the store: connection refused "
            "(127.0.0.1:5432)",
            "type": "api_error",
            "param": None,
            "code": "store_unavailable",
        }
        # Who leads is this server's own view, and still answers.
        assert (await client.get("/admin/api/leader")).json()["role"] == "standby"
