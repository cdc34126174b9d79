"""Full-jitter exponential backoff: bounds, growth, cap and reset (no real sleeping)."""

from __future__ import annotations

import random

import pytest

from llmgw.agent.backoff import Backoff


class Ceiling(random.Random):
    """Always draws the top of the interval, to see the bounds themselves."""

    def uniform(self, a: float, b: float) -> float:
        return b


def test_ceiling_doubles_from_base_up_to_the_cap() -> None:
    backoff = Backoff(rng=Ceiling(), base=0.5, cap=30.0)
    delays = [backoff.next_delay() for _ in range(10)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0, 30.0]
    assert backoff.failures == 10


def test_full_jitter_draws_from_zero_to_the_ceiling() -> None:
    backoff = Backoff(rng=random.Random(7))
    ceilings, delays = [], []
    for _ in range(12):
        ceilings.append(backoff.ceiling())
        delays.append(backoff.next_delay())
    assert all(0 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    # Jittered, not the ceiling itself: two nodes that failed together spread out.
    assert delays != ceilings
    other = Backoff(rng=random.Random(8))
    assert [other.next_delay() for _ in range(12)] != delays


def test_reset_starts_again_from_the_base() -> None:
    backoff = Backoff(rng=Ceiling())
    for _ in range(5):
        backoff.next_delay()
    backoff.reset()
    assert backoff.failures == 0
    assert backoff.next_delay() == 0.5


def test_many_failures_never_overflow() -> None:
    backoff = Backoff(rng=Ceiling(), cap=30.0)
    for _ in range(5000):
        assert backoff.next_delay() <= 30.0


@pytest.mark.parametrize(("base", "cap"), [(0.0, 1.0), (2.0, 1.0), (-1.0, 5.0)])
def test_bad_settings(base: float, cap: float) -> None:
    with pytest.raises(ValueError, match="0 < base <= cap"):
        Backoff(rng=random.Random(), base=base, cap=cap)
