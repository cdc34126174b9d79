"""The reserve's counts shared by routers through a real Redis (127.0.0.1:6379, or a
throwaway redis-server where the test stops it).

Each router here is a `RequestQueue` with its own `FlowShare` in front of one
replica of ten places (one kept: `reserve` 0.1); the test moves their syncs
by hand. Every test uses its own key prefix and deletes its keys.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis
from procs import RedisServer, delete_redis_keys, free_port, require_redis

from llmgw.router.endpoints import EjectionPolicy, EndpointPool, EndpointSpec
from llmgw.router.flow_share import FlowCount, FlowShare
from llmgw.router.queue import RequestQueue, Ticket
from llmgw.router.saturation import Saturation

REDIS_URL = "redis://127.0.0.1:6379/0"
MODEL = "m"


@pytest.fixture(scope="module", autouse=True)
def _require_redis() -> None:
    require_redis()


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    prefix = f"llmgw:flows:test-{uuid.uuid4().hex}:"
    yield prefix
    await delete_redis_keys(REDIS_URL, prefix)


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer(free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Router:
    """One router: its queue in front of one replica of ten places (one kept), and
    its flow share when given a prefix; requests hold a place until `finish`."""

    def __init__(
        self,
        name: str,
        *,
        prefix: str | None,
        url: str = REDIS_URL,
        expire_after: float = 60.0,
        recheck: float = 60.0,
    ) -> None:
        self.clock = Clock()
        pool = EndpointPool(policy=EjectionPolicy(3, 1.0, 8.0), clock=self.clock)
        pool.set_model_endpoints(MODEL, [EndpointSpec("e0", "http://127.0.0.1:9000", (MODEL,))])
        self.endpoint = pool.by_model[MODEL][0]
        self.share = (
            FlowShare(
                redis_url=url,
                router_id=f"{name}-{uuid.uuid4().hex[:8]}",
                interval=0.1,
                expire_after=expire_after,
                prefix=prefix,
            )
            if prefix is not None
            else None
        )
        self.queue = RequestQueue(
            saturation=Saturation(pool=pool, clock=self.clock, default_limit=10),
            clock=self.clock,
            max_size=1000,
            aging=0,
            recheck=recheck,
            retry_after=5,
            reserve=0.1,
            active_for=60,
            flow_share=self.share,
        )
        self.running: list[str] = []
        self.waits: dict[str, float] = {}
        self.tasks: list[asyncio.Task[None]] = []

    async def _one(self, name: str, key: str) -> None:
        self.waits[name] = await self.queue.wait_turn(
            MODEL, Ticket(key), keepalive=None, interval=60
        )
        self.endpoint.in_flight += 1
        self.running.append(name)

    async def send(self, key: str, count: int = 1) -> None:
        for _ in range(count):
            name = f"{key}{len(self.tasks)}"
            self.tasks.append(asyncio.ensure_future(self._one(name, key)))
            for _ in range(5):
                await asyncio.sleep(0)

    async def finish(self, name: str) -> None:
        self.running.remove(name)
        self.endpoint.in_flight -= 1
        self.queue.done(MODEL, name.rstrip("0123456789"))
        for _ in range(5):
            await asyncio.sleep(0)

    def holding(self, key: str) -> int:
        return sum(name.rstrip("0123456789") == key for name in self.running)

    async def sync(self) -> None:
        assert self.share is not None
        await self.share.sync()
        for _ in range(5):
            await asyncio.sleep(0)

    def elsewhere(self) -> object:
        return self.queue.describe(MODEL)["elsewhere"]

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.share is not None:
            await self.share.close()


async def _fill_all_but_the_reserve(router: Router) -> None:
    """Seven places to `filler`, two to `flood`: one free place left, the kept one.

    The flood's second request comes when one place is left (the reserve's most),
    under its share while another key is about: the reserve counts it as a taker
    and keeps a place from then on. It takes the last place; one of the filler's
    requests then ends, and its place is kept."""
    await router.send("filler", 8)
    await router.send("flood", 2)
    assert len(router.running) == 10
    await router.finish("filler0")
    assert len(router.running) == 9
    assert router.queue.describe(MODEL)["reserve"] == 1


async def _flood_on_both(one: Router, two: Router) -> None:
    """Three flood requests on router one; router two filled but for its kept place;
    both synced, so router two sees router one's three."""
    await one.send("flood", 3)
    await _fill_all_but_the_reserve(two)
    await one.sync()
    await two.sync()
    assert two.elsewhere() == {"in_flight": 3, "waiting": 0}


async def test_requests_on_other_routers_put_a_key_over_its_share(prefix: str) -> None:
    one = Router("one", prefix=prefix)
    two = Router("two", prefix=prefix)
    alone = Router("alone", prefix=None)
    try:
        # On router one: the flood holds a place, and the light key was active
        # lately (its request has ended).
        await one.send("light")
        await one.finish("light0")
        await one.send("flood")
        for router in (two, alone):
            await _fill_all_but_the_reserve(router)
        await one.sync()
        await two.sync()
        assert two.elsewhere() == {"in_flight": 1, "waiting": 0}
        assert two.share is not None
        assert dict(two.share.elsewhere(MODEL)) == {
            "flood": FlowCount(in_flight=1, waiting=0, weight=1.0),
            "light": FlowCount(in_flight=0, waiting=0, weight=1.0),
        }

        # Alone, the flood holds 2 of its share of 5 (two keys here): it takes the
        # kept place, and the light key's request finds none.
        await alone.send("flood")
        assert alone.holding("flood") == 3 and len(alone.running) == 10
        await alone.send("light")
        assert alone.holding("light") == 0

        # Sharing, it holds 3 (one on router one) of its share of 10/3 (the light
        # key is active on router one): it waits, and the light key finds the place.
        await two.send("flood")
        assert two.holding("flood") == 2 and len(two.running) == 9
        await two.send("light")
        assert two.holding("light") == 1 and len(two.running) == 10
        assert two.waits["light" + str(len(two.tasks) - 1)] == 0.0

        # Router one sees router two's requests, the waiting one too.
        await two.sync()
        await one.sync()
        assert one.elsewhere() == {"in_flight": 10, "waiting": 1}
    finally:
        for router in (one, two, alone):
            await router.close()


async def test_counts_of_a_router_that_stopped_syncing_expire(prefix: str) -> None:
    one = Router("one", prefix=prefix, expire_after=0.3)
    two = Router("two", prefix=prefix, recheck=0.05)
    try:
        await _flood_on_both(one, two)
        await two.send("flood")
        assert two.holding("flood") == 2  # over its share of 5 with 5 in flight

        # Router one stops syncing (as a router that died): once its counts expire,
        # the flood's waiting request is under its share again and, looking again
        # (every `recheck`), takes the place.
        deadline = time.monotonic() + 30
        while two.elsewhere() != {"in_flight": 0, "waiting": 0}:
            assert time.monotonic() < deadline, "router one's counts never expired"
            await asyncio.sleep(0.05)
            await two.sync()
        while two.holding("flood") < 3:
            assert time.monotonic() < deadline, "the flood's request never took the place"
            await asyncio.sleep(0.05)
        assert len(two.running) == 10

        # The dead router's id is dropped from the set of routers by the next read.
        client = aioredis.Redis.from_url(REDIS_URL)
        try:
            await two.sync()
            members = await client.smembers(prefix + "routers")
            assert two.share is not None
            assert [m.decode() for m in members] == [two.share._id]
        finally:
            await client.aclose()
    finally:
        await one.close()
        await two.close()


async def test_a_router_that_stops_cleanly_takes_its_counts_with_it(prefix: str) -> None:
    one = Router("one", prefix=prefix)
    two = Router("two", prefix=prefix)
    try:
        await one.send("flood", 3)
        await two.send("light")
        await one.sync()
        await two.sync()
        assert two.elsewhere() == {"in_flight": 3, "waiting": 0}
        await one.close()
        await two.sync()
        assert two.elsewhere() == {"in_flight": 0, "waiting": 0}
    finally:
        await two.close()


async def test_while_redis_is_down_the_reserve_counts_this_routers_requests(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="llmgw.router.flow_share")
    url = f"redis://127.0.0.1:{redis_server.port}/0"
    one = Router("one", prefix="llmgw:flows:", url=url)
    two = Router("two", prefix="llmgw:flows:", url=url)
    try:
        await _flood_on_both(one, two)

        await asyncio.to_thread(redis_server.stop)
        await two.sync()
        await two.sync()
        assert two.elsewhere() == {"in_flight": 0, "waiting": 0}
        failed = "the reserve counts this router's requests only: Redis failed"
        assert [r.getMessage().startswith(failed) for r in caplog.records] == [True]
        assert caplog.records[0].getMessage().endswith("retrying every 0.1 s")
        # Its own counts only: the flood holds 2 of its share of 5, and takes the place.
        await two.send("flood")
        assert two.holding("flood") == 3 and len(two.running) == 10
        await two.finish("flood10")

        await asyncio.to_thread(redis_server.start)
        # (Router one's first sync may fail on its connection from before the restart.)
        deadline = time.monotonic() + 30
        while two.elsewhere() != {"in_flight": 3, "waiting": 0}:
            assert time.monotonic() < deadline, "the counts were never shared again"
            await one.sync()
            await two.sync()
        await two.send("flood")
        assert two.holding("flood") == 2

        messages = [r.getMessage() for r in caplog.records]
        again = "the reserve counts every router's requests through Redis again"
        # Each router logs an outage once and its end once.
        assert messages.count(again) == sum(m.startswith(failed) for m in messages) <= 2
        assert messages[-1] == again
    finally:
        await one.close()
        await two.close()
