"""Fair-share counts shared by router processes through a real Redis (127.0.0.1:6379)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from pathlib import Path

import httpx
import pytest
import redis
from procs import Server, Sim

from llmgw.router.endpoints import EjectionPolicy, EndpointPool, EndpointSpec
from llmgw.router.queue import RequestQueue, Ticket
from llmgw.router.saturation import Saturation
from llmgw.router.shares import ShareLedger

REDIS_URL = "redis://127.0.0.1:6379/0"
MODEL = "m"


class Wall:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_counts_decay_window_by_window() -> None:
    wall = Wall()
    ledger = ShareLedger(wall_clock=wall, window=10.0, interval=1.0)
    ledger.charge(MODEL, "a", 4.0)
    assert ledger.served(MODEL, "a") == 4.0
    assert ledger.served(MODEL, "b") == 0.0
    wall.now += 12.5  # next window, a quarter gone: the previous counts 3/4
    assert ledger.served(MODEL, "a") == pytest.approx(3.0)
    wall.now += 10.0  # two windows on: forgotten
    assert ledger.served(MODEL, "a") == 0.0


async def test_work_given_on_one_router_counts_on_another() -> None:
    wall = Wall()
    prefix = f"llmgw-test-{uuid.uuid4().hex}:"
    one = ShareLedger(
        wall_clock=wall, window=30.0, interval=0.1, redis_url=REDIS_URL, prefix=prefix
    )
    two = ShareLedger(
        wall_clock=wall, window=30.0, interval=0.1, redis_url=REDIS_URL, prefix=prefix
    )
    try:
        for _ in range(10):
            one.charge(MODEL, "flood", 1.0)
        two.charge(MODEL, "light", 1.0)
        await one.sync()
        await two.sync()
        assert two.served(MODEL, "flood") == 10.0
        assert two.served(MODEL, "light") == 1.0
        await one.sync()
        assert one.served(MODEL, "light") == 1.0

        # On router two the flood key waited first, but it had more work elsewhere.
        loop = asyncio.get_running_loop()
        pool = EndpointPool(policy=EjectionPolicy(3, 1.0, 8.0), clock=loop.time)
        pool.set_model_endpoints(MODEL, [EndpointSpec("e0", "http://127.0.0.1:9", (MODEL,))])
        endpoint = pool.by_model[MODEL][0]
        endpoint.in_flight = 1
        saturation = Saturation(pool=pool, clock=loop.time, default_limit=1)
        queue = RequestQueue(
            saturation=saturation,
            clock=loop.time,
            max_size=10,
            aging=0,
            recheck=60,
            retry_after=1,
            ledger=two,
        )
        order: list[str] = []

        async def one_request(key: str) -> None:
            await queue.wait_turn(MODEL, Ticket(key), keepalive=None, interval=60)
            endpoint.in_flight += 1
            order.append(key)

        tasks = [asyncio.ensure_future(one_request(k)) for k in ("flood", "flood", "light")]
        for _ in range(5):
            await asyncio.sleep(0)
        endpoint.in_flight -= 1
        queue.done(MODEL, "flood")
        for _ in range(5):
            await asyncio.sleep(0)
        assert order == ["light"]
        assert two.served(MODEL, "light") == 2.0  # charged when let out
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await one.close()
        await two.close()


async def test_without_redis_the_counts_are_the_routers_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    wall = Wall()
    ledger = ShareLedger(
        wall_clock=wall, window=30.0, interval=0.1, redis_url="redis://127.0.0.1:1/0"
    )
    try:
        ledger.charge(MODEL, "a", 2.0)
        with caplog.at_level(logging.WARNING, logger="llmgw.router.shares"):
            await ledger.sync()
            await ledger.sync()
        warnings = [r.getMessage() for r in caplog.records]
        assert len(warnings) == 1
        assert warnings[0].startswith("fair-share counts are this router's own: Redis failed")
        assert ledger.served(MODEL, "a") == 2.0
    finally:
        await ledger.close()


def test_a_server_with_redis_counts_shares_there(tmp_path: Path) -> None:
    sim = Sim("--itl", "0.05", "--itl-per-running", "0", model="m-shares")
    config = tmp_path / "server.yaml"
    config.write_text(
        f"limits: {{redis_url: '{REDIS_URL}'}}\n"
        "router: {max_in_flight: 1, queue: {recheck: 0.1, share_window: 30}}\n"
    )
    server = Server("--endpoint", f"s={sim.url}=m-shares", "--config", str(config))
    client = redis.Redis.from_url(REDIS_URL)
    try:
        body = {"model": "m-shares", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(3):
            resp = httpx.post(
                server.url + "/v1/chat/completions", json={**body, "max_tokens": 2}, timeout=30
            )
            assert resp.status_code == 200, resp.text

        def counted() -> float:
            index = int(time.time() / 30)
            total = 0.0
            for window in (index, index - 1):
                value = client.hget(f"llmgw:share:m-shares:{window}", "anonymous")
                total += float(value) if value is not None else 0.0
            return total

        deadline = time.monotonic() + 30
        while counted() < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert counted() >= 3
    finally:
        client.close()
        server.proc.stop()
        sim.proc.stop()
    assert "fair-share counts are this router's own" not in server.proc.output()
