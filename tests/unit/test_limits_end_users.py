"""End users' limits in one router process: their own counters, budgets from the source
by (key, end user), refusals that name them, and a bounded number of them kept."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from llmgw.limits import BudgetExhausted, KeyLimits, Limiter, RateLimited, end_user_limits
from llmgw.limits.model import split_end_user


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Source:
    """Tokens used per (key, end user), as the usage store would answer."""

    def __init__(self, used: dict[str, int]) -> None:
        self.used = used
        self.asked: list[str] = []

    async def tokens_used(self, key_id: str, since: datetime) -> int:
        self.asked.append(key_id)
        return self.used.get(key_id, 0)


def wall() -> datetime:
    return datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def user(name: str, *, rpm: int | None = None, budget: int | None = None) -> KeyLimits:
    return end_user_limits(
        key_id="key_1", key_name="app", end_user=name, rpm=rpm, tpm=None, budget_tokens=budget
    )


async def test_each_end_user_has_their_own_counters_and_refusals_name_them() -> None:
    limiter = Limiter(clock=Clock(), wall_clock=wall, budget_source=Source({}))
    for _ in range(2):
        await limiter.admit(user("ann", rpm=2), 5)
    with pytest.raises(RateLimited) as refused:
        await limiter.admit(user("ann", rpm=2), 5)
    assert "Rate limit reached for end user 'ann' of API key 'app'" in refused.value.message
    assert "requests per minute (RPM): limit 2" in refused.value.message
    # Another end user of the key, and the key itself, count apart.
    await limiter.admit(user("bob", rpm=2), 5)
    key = KeyLimits(key_id="key_1", rpm=1, tpm=None, budget_tokens=None, budget_period=None)
    await limiter.admit(key, 5)
    await limiter.close()


async def test_an_end_users_budget_is_per_day_and_read_by_key_and_end_user() -> None:
    limits = user("ann:with:colons", budget=100)
    assert limits.budget_period == "day"
    assert split_end_user(limits.key_id) == ("key_1", "ann:with:colons")
    assert split_end_user("team:t1") is None
    source = Source({limits.key_id: 100})
    limiter = Limiter(clock=Clock(), wall_clock=wall, budget_source=source)
    with pytest.raises(BudgetExhausted) as spent:
        await limiter.admit(limits, 1)
    message = spent.value.message
    assert "Token budget exhausted for end user 'ann:with:colons' of API key 'app'" in message
    assert "100 of 100 tokens used this day (UTC)" in message
    assert "raise the key's end-user budget" in message
    assert source.asked == [limits.key_id]
    await limiter.close()


async def test_made_up_end_users_are_capped_and_never_push_out_a_keys_buckets() -> None:
    clock = Clock()
    limiter = Limiter(clock=clock, wall_clock=wall, budget_source=Source({}), max_end_users=3)
    key = KeyLimits(key_id="key_1", rpm=1, tpm=None, budget_tokens=None, budget_period=None)
    await limiter.admit(key, 1)
    await limiter.admit(user("first", rpm=1), 1)
    for i in range(10):
        await limiter.admit(user(f"made-up-{i}", rpm=1), 1)
    # The key's bucket is still empty: flooding end users did not reset it.
    with pytest.raises(RateLimited):
        await limiter.admit(key, 1)
    # The oldest end user was dropped past the cap: its bucket starts full again.
    await limiter.admit(user("first", rpm=1), 1)
    # A recent one is still counted.
    with pytest.raises(RateLimited):
        await limiter.admit(user("made-up-9", rpm=1), 1)
    await limiter.close()
