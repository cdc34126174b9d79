"""Rate limits shared by several limiters (router processes) through the real Redis.

Needs Redis on 127.0.0.1:6379 and fails, never skips, without it. Each test
uses its own key prefix and deletes only its own keys. Bucket time is injected
(`redis_clock`), so refills are tested without sleeping.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime

import pytest
import redis.asyncio as aioredis
from procs import RedisServer, delete_redis_keys, free_port, require_redis
from prometheus_client import CollectorRegistry

from llmgw.limits import (
    BudgetExhausted,
    KeyLimits,
    Limiter,
    LimitMetrics,
    RateLimited,
)

REDIS_URL = "redis://127.0.0.1:6379/0"


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Usage:
    def __init__(self, used: int = 0) -> None:
        self.used = used

    async def tokens_used(self, key_id: str, since: datetime) -> int:
        return self.used


@pytest.fixture(scope="module", autouse=True)
def _require_redis() -> None:
    require_redis()


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    prefix = f"llmgw:rl:test-{uuid.uuid4().hex}:"
    yield prefix
    await delete_redis_keys(REDIS_URL, prefix)


class Process:
    """One router process's view: its own monotonic clock, limiter and metrics."""

    def __init__(
        self,
        *,
        url: str,
        prefix: str,
        redis_clock: Clock | None,
        wall: datetime,
        used: int = 0,
    ) -> None:
        self.clock = Clock(1000.0)
        self.registry = CollectorRegistry()
        self.limiter = Limiter(
            clock=self.clock,
            wall_clock=lambda: wall,
            budget_source=Usage(used),
            redis_url=url,
            metrics=LimitMetrics(registry=self.registry),
            key_prefix=prefix,
            redis_clock=redis_clock,
        )

    def metric(self, name: str) -> float | None:
        return self.registry.get_sample_value(name)


@pytest.fixture
def wall() -> datetime:
    # Budget counters expire after their period, so the period must be the real one.
    return datetime.now(UTC)


async def test_two_processes_enforce_one_combined_rpm(prefix: str, wall: datetime) -> None:
    shared_time = Clock(1_700_000_000.0)
    a = Process(url=REDIS_URL, prefix=prefix, redis_clock=shared_time, wall=wall)
    b = Process(url=REDIS_URL, prefix=prefix, redis_clock=shared_time, wall=wall)
    await a.limiter.start()
    await b.limiter.start()
    try:
        assert a.limiter.redis_up and b.limiter.redis_up
        assert a.metric("llmgw_limits_redis_up") == 1.0
        limits = KeyLimits("team-x", rpm=4, tpm=None, budget_tokens=None, budget_period=None)
        remaining = []
        for proc in (a, b, a, b):
            admission = await proc.limiter.admit(limits, 10)
            assert admission.shared
            remaining.append(dict(admission.headers)[b"x-ratelimit-remaining-requests"])
        assert remaining == [b"3", b"2", b"1", b"0"]
        for proc in (a, b):
            with pytest.raises(RateLimited) as info:
                await proc.limiter.admit(limits, 10)
            assert info.value.retry_after == 15  # 60 s / 4 requests
            assert dict(info.value.headers)[b"x-ratelimit-reset-requests"] == b"1m0s"
        shared_time.now += 15.0
        await b.limiter.admit(limits, 10)
        with pytest.raises(RateLimited):
            await a.limiter.admit(limits, 10)
    finally:
        await a.limiter.close()
        await b.limiter.close()


async def test_release_gives_a_shared_request_and_its_tokens_back(
    prefix: str, wall: datetime
) -> None:
    shared_time = Clock(1_700_000_000.0)
    a = Process(url=REDIS_URL, prefix=prefix, redis_clock=shared_time, wall=wall)
    b = Process(url=REDIS_URL, prefix=prefix, redis_clock=shared_time, wall=wall)
    await a.limiter.start()
    await b.limiter.start()
    try:
        limits = KeyLimits("key-r", rpm=2, tpm=100, budget_tokens=None, budget_period=None)
        taken = await a.limiter.admit(limits, 60)
        assert taken.shared
        await a.limiter.release(limits, taken)
        back = await b.limiter.admit(limits, 60)
        assert dict(back.headers)[b"x-ratelimit-remaining-requests"] == b"1"
        assert dict(back.headers)[b"x-ratelimit-remaining-tokens"] == b"40"
        await a.limiter.admit(limits, 10)
        with pytest.raises(RateLimited):
            await b.limiter.admit(limits, 10)
    finally:
        await a.limiter.close()
        await b.limiter.close()


async def test_tpm_is_shared_and_settled_across_processes(prefix: str, wall: datetime) -> None:
    shared_time = Clock(1_700_000_000.0)
    a = Process(url=REDIS_URL, prefix=prefix, redis_clock=shared_time, wall=wall)
    b = Process(url=REDIS_URL, prefix=prefix, redis_clock=shared_time, wall=wall)
    await a.limiter.start()
    await b.limiter.start()
    try:
        limits = KeyLimits("team-y", rpm=None, tpm=1000, budget_tokens=None, budget_period=None)
        big = await a.limiter.admit(limits, 800)
        with pytest.raises(RateLimited) as info:
            await b.limiter.admit(limits, 300)
        assert info.value.reason == "tpm"
        assert info.value.retry_after == 6  # 100 short at 1000/60 per s
        await a.limiter.settle(limits, big, 200)  # over-estimated by 600: given back
        small = await b.limiter.admit(limits, 300)
        assert dict(small.headers)[b"x-ratelimit-remaining-tokens"] == b"500"
        await b.limiter.settle(limits, small, 1300)  # under-estimated by 1000: level -500
        with pytest.raises(RateLimited) as info:
            await a.limiter.admit(limits, 0)
        assert info.value.retry_after == 31  # from -500 to 1 at 1000/60 per s
    finally:
        await a.limiter.close()
        await b.limiter.close()


async def test_budget_is_one_counter_seeded_from_the_source(prefix: str, wall: datetime) -> None:
    a = Process(url=REDIS_URL, prefix=prefix, redis_clock=None, wall=wall, used=90)
    b = Process(url=REDIS_URL, prefix=prefix, redis_clock=None, wall=wall, used=0)
    await a.limiter.start()
    await b.limiter.start()
    try:
        limits = KeyLimits("team-z", rpm=None, tpm=None, budget_tokens=100, budget_period="day")
        first = await a.limiter.admit(limits, 5)  # seeds the counter with 90 from the store
        await b.limiter.admit(limits, 5)  # B's stale "0" does not replace it: 100
        with pytest.raises(BudgetExhausted) as info:
            await a.limiter.admit(limits, 1)
        assert info.value.code == "insufficient_quota"
        assert "100 of 100" in info.value.message
        await a.limiter.settle(limits, first, 0)  # the first request produced nothing
        await b.limiter.admit(limits, 1)
        client = aioredis.Redis.from_url(REDIS_URL)
        try:
            keys = [key async for key in client.scan_iter(match=prefix + "*:b:*")]
            assert len(keys) == 1
            value = await client.get(keys[0])
            assert value is not None and int(value) == 96
            ttl = await client.ttl(keys[0])
            assert 3600 < ttl <= 86400 + 3600  # expires an hour after the UTC day ends
        finally:
            await client.aclose()
    finally:
        await a.limiter.close()
        await b.limiter.close()


async def test_unreachable_redis_falls_back_to_local_limits(
    prefix: str, wall: datetime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="llmgw.limits")
    proc = Process(url="redis://127.0.0.1:1", prefix=prefix, redis_clock=None, wall=wall)
    await proc.limiter.start()  # does not raise
    try:
        assert not proc.limiter.redis_up
        assert proc.metric("llmgw_limits_redis_up") == 0.0
        limits = KeyLimits("team-w", rpm=3, tpm=None, budget_tokens=None, budget_period=None)
        for _ in range(3):
            admission = await proc.limiter.admit(limits, 1)
            assert not admission.shared
        with pytest.raises(RateLimited):
            await proc.limiter.admit(limits, 1)
        errors_before = proc.metric("llmgw_limits_redis_errors_total")
        assert errors_before is not None and errors_before >= 1
        # Requests within the back-off never touch Redis.
        proc.clock.now += 1.0
        with pytest.raises(RateLimited):
            await proc.limiter.admit(limits, 1)
        assert proc.metric("llmgw_limits_redis_errors_total") == errors_before
        # After it, one request starts a background probe, which fails again quietly.
        proc.clock.now += 20.0
        await proc.limiter.admit(limits, 1)
        for _ in range(100):
            if proc.metric("llmgw_limits_redis_errors_total") != errors_before:
                break
            await asyncio.sleep(0.01)
        assert proc.metric("llmgw_limits_redis_errors_total") == errors_before + 1
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert "127.0.0.1:1 is unreachable" in warnings[0].getMessage()
        assert "each router process now enforces" in warnings[0].getMessage()
    finally:
        await proc.limiter.close()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer(free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_shared_counting_resumes_when_redis_comes_back(
    redis_server: RedisServer, wall: datetime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmgw.limits")
    url = f"redis://127.0.0.1:{redis_server.port}/0"
    proc = Process(url=url, prefix="llmgw:rl:", redis_clock=None, wall=wall)
    await proc.limiter.start()
    try:
        limits = KeyLimits("team-v", rpm=100, tpm=None, budget_tokens=None, budget_period=None)
        assert (await proc.limiter.admit(limits, 1)).shared

        await asyncio.to_thread(redis_server.stop)
        admission = await proc.limiter.admit(limits, 1)  # this call fails over
        assert not admission.shared
        assert proc.metric("llmgw_limits_redis_up") == 0.0
        assert not (await proc.limiter.admit(limits, 1)).shared

        await asyncio.to_thread(redis_server.start)
        proc.clock.now += 6.0  # past the 5 s back-off
        assert not (await proc.limiter.admit(limits, 1)).shared  # starts the probe
        for _ in range(200):
            if proc.limiter.redis_up:
                break
            await asyncio.sleep(0.01)
        assert proc.limiter.redis_up
        assert proc.metric("llmgw_limits_redis_up") == 1.0
        admission = await proc.limiter.admit(limits, 1)
        assert admission.shared
        # The restarted Redis is empty: this is its first count.
        assert dict(admission.headers)[b"x-ratelimit-remaining-requests"] == b"99"

        messages = [r.getMessage() for r in caplog.records if r.name == "llmgw.limits"]
        assert sum("is unreachable" in m for m in messages) == 1
        assert sum("reachable again" in m for m in messages) == 1
    finally:
        await proc.limiter.close()
