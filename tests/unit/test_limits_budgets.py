"""Token budgets per UTC day and month, in virtual time."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry

from llmgw.limits import BudgetExhausted, KeyLimits, Limiter, LimitMetrics, RateLimited


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Wall:
    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at


class Usage:
    """What the store would report: tokens used since a time, by all router processes."""

    def __init__(self, used: int = 0) -> None:
        self.used = used
        self.calls: list[tuple[str, datetime]] = []
        self.fail: Exception | None = None

    async def tokens_used(self, key_id: str, since: datetime) -> int:
        self.calls.append((key_id, since))
        await asyncio.sleep(0)  # a real query yields to the loop
        if self.fail is not None:
            raise self.fail
        return self.used


async def run_background() -> None:
    """Let the limiter's background tasks run (the fake source answers at once)."""
    for _ in range(5):
        await asyncio.sleep(0)


def daily(budget: int) -> KeyLimits:
    return KeyLimits("k1", rpm=None, tpm=None, budget_tokens=budget, budget_period="day")


def monthly(budget: int) -> KeyLimits:
    return KeyLimits("k1", rpm=None, tpm=None, budget_tokens=budget, budget_period="month")


async def test_budget_exhausted_is_insufficient_quota() -> None:
    registry = CollectorRegistry()
    wall = Wall(datetime(2025, 3, 14, 23, 0, tzinfo=UTC))
    limiter = Limiter(
        clock=Clock(),
        wall_clock=wall,
        budget_source=Usage(),
        metrics=LimitMetrics(registry=registry),
    )
    limits = daily(100)
    first = await limiter.admit(limits, 60)
    assert first.headers == []  # a budget is not a rate limit: no x-ratelimit headers
    await limiter.settle(limits, first, 100)  # the real usage used it all up
    with pytest.raises(BudgetExhausted) as info:
        await limiter.admit(limits, 1)
    err = info.value
    assert err.code == "insufficient_quota"
    assert err.reason == "budget"
    assert err.retry_after == 3600  # until midnight UTC
    assert dict(err.headers)[b"retry-after"] == b"3600"
    assert "100 of 100 tokens used this day" in err.message
    assert "2025-03-15T00:00:00Z" in err.message
    assert not isinstance(err, RateLimited)
    assert registry.get_sample_value("llmgw_rate_limited_total", {"reason": "budget"}) == 1.0
    await limiter.close()


async def test_estimates_count_until_settled() -> None:
    limiter = Limiter(
        clock=Clock(), wall_clock=Wall(datetime(2025, 3, 14, tzinfo=UTC)), budget_source=Usage()
    )
    limits = daily(100)
    a = await limiter.admit(limits, 50)
    b = await limiter.admit(limits, 50)  # 50 + 50 in flight: the budget is reached
    with pytest.raises(BudgetExhausted):
        await limiter.admit(limits, 1)
    await limiter.settle(limits, a, 10)
    await limiter.settle(limits, b, 10)  # used 20 in all
    await limiter.admit(limits, 70)  # 90
    await limiter.admit(limits, 1)  # 91: still under
    await limiter.close()


async def test_budget_resets_at_the_utc_day_boundary() -> None:
    usage = Usage()
    wall = Wall(datetime(2025, 3, 14, 23, 59, 59, tzinfo=UTC))
    limiter = Limiter(clock=Clock(), wall_clock=wall, budget_source=usage)
    limits = daily(10)
    admission = await limiter.admit(limits, 10)
    with pytest.raises(BudgetExhausted) as info:
        await limiter.admit(limits, 1)
    assert info.value.retry_after == 1
    wall.at = datetime(2025, 3, 15, 0, 0, 0, tzinfo=UTC)
    await limiter.admit(limits, 10)  # a new day, a new budget
    assert [since for _, since in usage.calls] == [
        datetime(2025, 3, 14, tzinfo=UTC),
        datetime(2025, 3, 15, tzinfo=UTC),
    ]
    # The request admitted yesterday settles against yesterday, not today.
    await limiter.settle(limits, admission, 0)
    with pytest.raises(BudgetExhausted):
        await limiter.admit(limits, 1)
    await limiter.close()


async def test_budget_resets_at_the_first_of_the_month() -> None:
    usage = Usage()
    wall = Wall(datetime(2024, 12, 31, 22, 0, tzinfo=UTC))
    limiter = Limiter(clock=Clock(), wall_clock=wall, budget_source=usage)
    limits = monthly(1000)
    await limiter.admit(limits, 1000)
    with pytest.raises(BudgetExhausted) as info:
        await limiter.admit(limits, 1)
    assert info.value.retry_after == 7200
    assert "this month" in info.value.message
    wall.at = datetime(2024, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    with pytest.raises(BudgetExhausted):
        await limiter.admit(limits, 1)
    wall.at = datetime(2025, 1, 1, tzinfo=UTC)
    await limiter.admit(limits, 999)
    assert usage.calls[-1][1] == datetime(2025, 1, 1, tzinfo=UTC)
    assert usage.calls[0][1] == datetime(2024, 12, 1, tzinfo=UTC)
    await limiter.close()


async def test_budget_includes_usage_of_other_processes() -> None:
    usage = Usage(used=950)  # other router processes already used 950 this month
    clock = Clock()
    wall = Wall(datetime(2025, 3, 14, tzinfo=UTC))
    limiter = Limiter(clock=clock, wall_clock=wall, budget_source=usage, budget_refresh_s=30)
    limits = monthly(1000)
    await limiter.admit(limits, 40)  # 990
    await limiter.admit(limits, 5)  # 995
    await limiter.admit(limits, 5)  # 1000
    with pytest.raises(BudgetExhausted) as info:
        await limiter.admit(limits, 1)
    assert "1000 of 1000" in info.value.message
    assert len(usage.calls) == 1  # loaded once, not per request
    await limiter.close()


async def test_budget_refresh_sees_new_usage_without_double_counting() -> None:
    usage = Usage(used=100)
    clock = Clock()
    wall = Wall(datetime(2025, 3, 14, tzinfo=UTC))
    limiter = Limiter(clock=clock, wall_clock=wall, budget_source=usage, budget_refresh_s=30)
    limits = daily(1000)
    a = await limiter.admit(limits, 200)
    await limiter.settle(limits, a, 300)  # this process: 100 + 300 = 400
    # The store now holds this process's 300 plus 500 from another process.
    usage.used = 900
    clock.now += 31
    await limiter.admit(limits, 50)  # refresh starts in the background; 450 counted meanwhile
    await run_background()
    assert len(usage.calls) == 2
    # 900 (store) + 50 in flight = 950; without the refresh 450, with double counting 1250.
    await limiter.admit(limits, 49)  # 999: still under, so admitted
    await limiter.admit(limits, 1)  # 1000
    with pytest.raises(BudgetExhausted) as info:
        await limiter.admit(limits, 1)
    assert "1000 of 1000" in info.value.message
    await limiter.close()


async def test_a_failed_refresh_keeps_the_last_usage(caplog: pytest.LogCaptureFixture) -> None:
    usage = Usage(used=10)
    clock = Clock()
    limiter = Limiter(
        clock=clock,
        wall_clock=Wall(datetime(2025, 3, 14, tzinfo=UTC)),
        budget_source=usage,
        budget_refresh_s=30,
    )
    limits = daily(100)
    await limiter.admit(limits, 10)
    usage.fail = ConnectionError("store down")
    clock.now += 31
    await limiter.admit(limits, 10)
    await run_background()
    assert "not refreshed" in caplog.text
    await limiter.admit(limits, 70)  # 10 + 10 + 10 + 70 = 100
    with pytest.raises(BudgetExhausted):
        await limiter.admit(limits, 1)
    await limiter.close()


async def test_first_load_errors_propagate_and_are_retried() -> None:
    usage = Usage()
    usage.fail = ConnectionError("store down")
    limiter = Limiter(
        clock=Clock(), wall_clock=Wall(datetime(2025, 3, 14, tzinfo=UTC)), budget_source=usage
    )
    with pytest.raises(ConnectionError):
        await limiter.admit(daily(100), 1)
    usage.fail = None
    await limiter.admit(daily(100), 1)
    await limiter.close()


async def test_concurrent_first_requests_share_one_load() -> None:
    usage = Usage()
    limiter = Limiter(
        clock=Clock(), wall_clock=Wall(datetime(2025, 3, 14, tzinfo=UTC)), budget_source=usage
    )
    await asyncio.gather(*(limiter.admit(daily(100), 1) for _ in range(10)))
    assert len(usage.calls) == 1
    await limiter.admit(daily(100), 90)  # 100: all ten were counted on one entry
    with pytest.raises(BudgetExhausted):
        await limiter.admit(daily(100), 1)
    await limiter.close()


async def test_budget_with_rate_limits_reports_both_headers() -> None:
    wall = Wall(datetime(2025, 3, 14, 12, 0, tzinfo=UTC))
    limiter = Limiter(clock=Clock(), wall_clock=wall, budget_source=Usage(used=500))
    limits = KeyLimits("k1", rpm=60, tpm=6000, budget_tokens=500, budget_period="day")
    with pytest.raises(BudgetExhausted) as info:
        await limiter.admit(limits, 1)
    headers = dict(info.value.headers)
    assert headers[b"retry-after"] == str(12 * 3600).encode()
    assert headers[b"x-ratelimit-remaining-requests"] == b"60"  # nothing was charged
    assert headers[b"x-ratelimit-remaining-tokens"] == b"6000"
    await limiter.close()


async def test_close_leaves_no_task_behind() -> None:
    usage = Usage()
    clock = Clock()
    limiter = Limiter(
        clock=clock,
        wall_clock=Wall(datetime(2025, 3, 14, tzinfo=UTC)),
        budget_source=usage,
        budget_refresh_s=1,
    )
    await limiter.admit(daily(100), 1)
    clock.now += timedelta(seconds=5).total_seconds()
    await limiter.admit(daily(100), 1)  # starts a refresh
    assert len(limiter._tasks) == 1
    await limiter.close()
    assert len(limiter._tasks) == 0
