"""RPM and TPM limits in process memory, in virtual time."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry

from llmgw.limits import (
    Admission,
    KeyLimits,
    Limiter,
    LimitExceeded,
    LimitMetrics,
    RateLimited,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class NoUsage:
    def __init__(self) -> None:
        self.calls = 0

    async def tokens_used(self, key_id: str, since: datetime) -> int:
        self.calls += 1
        return 0


def wall() -> datetime:
    return datetime(2025, 3, 14, 12, 0, tzinfo=UTC)


def make(clock: Clock, registry: CollectorRegistry | None = None) -> Limiter:
    metrics = LimitMetrics(registry=registry) if registry is not None else None
    return Limiter(clock=clock, wall_clock=wall, budget_source=NoUsage(), metrics=metrics)


def rpm(n: int) -> KeyLimits:
    return KeyLimits("k1", rpm=n, tpm=None, budget_tokens=None, budget_period=None)


def tpm(n: int) -> KeyLimits:
    return KeyLimits("k1", rpm=None, tpm=n, budget_tokens=None, budget_period=None)


def hdr(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in headers}


async def test_rpm_exhaustion_is_refused_with_retry_after_and_headers() -> None:
    clock = Clock()
    registry = CollectorRegistry()
    limiter = make(clock, registry)
    limits = rpm(3)
    seen = [hdr((await limiter.admit(limits, 10)).headers) for _ in range(3)]
    assert [h["x-ratelimit-remaining-requests"] for h in seen] == ["2", "1", "0"]
    assert seen[0]["x-ratelimit-limit-requests"] == "3"
    assert seen[0]["x-ratelimit-reset-requests"] == "20s"  # one request refills in 60/3 s
    assert seen[2]["x-ratelimit-reset-requests"] == "1m0s"
    assert "x-ratelimit-limit-tokens" not in seen[0]

    clock.now += 5.0
    with pytest.raises(RateLimited) as info:
        await limiter.admit(limits, 10)
    err = info.value
    assert isinstance(err, LimitExceeded)
    assert err.code == "rate_limit_exceeded"
    assert err.reason == "rpm"
    assert err.retry_after == 15  # 20 s per request, 5 s already refilled
    headers = hdr(err.headers)
    assert headers["retry-after"] == "15"
    assert headers["x-ratelimit-limit-requests"] == "3"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"] == "55s"
    assert all(k == k.lower() for k in headers)
    assert "try again in 15s" in err.message
    assert registry.get_sample_value("llmgw_rate_limited_total", {"reason": "rpm"}) == 1.0
    assert registry.get_sample_value("llmgw_rate_limited_total", {"reason": "tpm"}) == 0.0
    await limiter.close()


async def test_rpm_refills_as_time_passes() -> None:
    clock = Clock()
    limiter = make(clock)
    limits = rpm(60)  # one per second
    for _ in range(60):
        await limiter.admit(limits, 0)
    with pytest.raises(RateLimited) as info:
        await limiter.admit(limits, 0)
    assert info.value.retry_after == 1
    clock.now += 0.5
    with pytest.raises(RateLimited):
        await limiter.admit(limits, 0)
    clock.now += 0.5
    admission = await limiter.admit(limits, 0)
    assert hdr(admission.headers)["x-ratelimit-remaining-requests"] == "0"
    clock.now += 3600
    admission = await limiter.admit(limits, 0)  # refilled to capacity, not beyond
    assert hdr(admission.headers)["x-ratelimit-remaining-requests"] == "59"


async def test_refused_request_charges_nothing() -> None:
    clock = Clock()
    limiter = make(clock)
    limits = KeyLimits("k1", rpm=10, tpm=100, budget_tokens=None, budget_period=None)
    await limiter.admit(limits, 90)
    with pytest.raises(RateLimited) as info:
        await limiter.admit(limits, 50)  # TPM refuses: 10 left
    assert info.value.reason == "tpm"
    headers = hdr(info.value.headers)
    assert headers["x-ratelimit-remaining-requests"] == "9"  # the refused one was not counted
    assert headers["x-ratelimit-remaining-tokens"] == "10"
    ok = await limiter.admit(limits, 10)
    assert hdr(ok.headers)["x-ratelimit-remaining-requests"] == "8"


async def test_tpm_refuses_until_the_estimate_fits() -> None:
    clock = Clock()
    registry = CollectorRegistry()
    limiter = make(clock, registry)
    limits = tpm(600)  # 10 tokens per second
    first = await limiter.admit(limits, 500)
    h = hdr(first.headers)
    assert h["x-ratelimit-limit-tokens"] == "600"
    assert h["x-ratelimit-remaining-tokens"] == "100"
    assert h["x-ratelimit-reset-tokens"] == "50s"
    assert "x-ratelimit-limit-requests" not in h
    with pytest.raises(RateLimited) as info:
        await limiter.admit(limits, 150)
    assert info.value.reason == "tpm"
    assert info.value.retry_after == 5  # 50 tokens short at 10/s
    assert "TPM" in info.value.message
    assert registry.get_sample_value("llmgw_rate_limited_total", {"reason": "tpm"}) == 1.0
    clock.now += 5.0
    await limiter.admit(limits, 150)


async def test_settle_gives_back_an_over_estimate() -> None:
    clock = Clock()
    limiter = make(clock)
    limits = tpm(1000)
    admission = await limiter.admit(limits, 800)
    assert admission.estimated_tokens == 800
    with pytest.raises(RateLimited):
        await limiter.admit(limits, 300)
    await limiter.settle(limits, admission, 200)  # used 600 fewer than estimated
    after = await limiter.admit(limits, 300)
    assert hdr(after.headers)["x-ratelimit-remaining-tokens"] == "500"
    # Giving back never fills the bucket beyond its capacity.
    await limiter.settle(limits, after, 0)
    await limiter.settle(limits, admission, 0)
    top = await limiter.admit(limits, 1)
    assert hdr(top.headers)["x-ratelimit-remaining-tokens"] == "999"


async def test_settle_under_estimate_drives_the_bucket_negative() -> None:
    clock = Clock()
    limiter = make(clock)
    limits = tpm(600)  # 10 tokens per second
    admission = await limiter.admit(limits, 100)
    await limiter.settle(limits, admission, 1200)  # 1100 more than estimated: level -600
    with pytest.raises(RateLimited) as info:
        await limiter.admit(limits, 0)  # even an empty request needs one token
    assert info.value.retry_after == 61  # from -600 to +1 at 10/s = 60.1 s
    assert hdr(info.value.headers)["x-ratelimit-remaining-tokens"] == "0"
    assert hdr(info.value.headers)["x-ratelimit-reset-tokens"] == "2m0s"
    clock.now += 61.0
    await limiter.admit(limits, 0)


async def test_a_request_larger_than_the_minute_waits_for_a_full_bucket() -> None:
    clock = Clock()
    limiter = make(clock)
    limits = tpm(600)
    await limiter.admit(limits, 5000)  # full bucket: admitted, level -4400
    with pytest.raises(RateLimited) as info:
        await limiter.admit(limits, 5000)
    assert info.value.retry_after == 500  # back to a full 600 at 10/s
    assert "more than the whole minute" in info.value.message


async def test_unlimited_keys_pass_untouched_without_headers() -> None:
    clock = Clock()
    source = NoUsage()
    limiter = Limiter(clock=clock, wall_clock=wall, budget_source=source)
    limits = KeyLimits("free", rpm=None, tpm=None, budget_tokens=None, budget_period=None)
    first = await limiter.admit(limits, 10**9)
    second = await limiter.admit(limits, 5)
    assert isinstance(first, Admission)
    assert first is second  # shared, nothing allocated per request
    assert first.headers == []
    await limiter.settle(limits, first, 10**9)
    assert source.calls == 0
    assert limiter._buckets == {}  # no state kept for unlimited keys


async def test_keys_are_limited_independently() -> None:
    clock = Clock()
    limiter = make(clock)
    a = KeyLimits("a", rpm=1, tpm=None, budget_tokens=None, budget_period=None)
    b = KeyLimits("b", rpm=1, tpm=None, budget_tokens=None, budget_period=None)
    await limiter.admit(a, 1)
    await limiter.admit(b, 1)
    with pytest.raises(RateLimited):
        await limiter.admit(a, 1)


async def test_a_lowered_limit_applies_to_the_existing_bucket() -> None:
    clock = Clock()
    limiter = make(clock)
    await limiter.admit(rpm(100), 0)
    admission = await limiter.admit(rpm(10), 0)
    assert hdr(admission.headers)["x-ratelimit-remaining-requests"] == "9"


async def test_release_gives_back_the_request_and_its_tokens() -> None:
    # A key admitted and then refused by its team is charged nothing.
    clock = Clock()
    limiter = make(clock)
    limits = KeyLimits("k1", rpm=2, tpm=100, budget_tokens=None, budget_period=None)
    first = await limiter.admit(limits, 60)
    assert hdr(first.headers)["x-ratelimit-remaining-requests"] == "1"
    await limiter.release(limits, first)
    again = await limiter.admit(limits, 60)
    assert hdr(again.headers)["x-ratelimit-remaining-requests"] == "1"
    assert hdr(again.headers)["x-ratelimit-remaining-tokens"] == "40"
    await limiter.admit(limits, 10)
    with pytest.raises(RateLimited):
        await limiter.admit(limits, 10)


async def test_a_team_refusal_names_the_team() -> None:
    limiter = make(Clock())
    team = KeyLimits(
        "team:team_1", rpm=1, tpm=None, budget_tokens=None, budget_period=None,
        scope="team", label="ml",
    )  # fmt: skip
    await limiter.admit(team, 5)
    with pytest.raises(RateLimited) as info:
        await limiter.admit(team, 5)
    assert info.value.message.startswith(
        "Rate limit reached for team 'ml' on requests per minute (RPM): limit 1"
    )
