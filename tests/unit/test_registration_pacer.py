"""The registration pacer in virtual time, and how an agent reads a busy server's answer."""

from __future__ import annotations

import random

import pytest

from llmgw.agent.refusal import retry_after
from llmgw.control.agentsvc import RegistrationPacer
from llmgw.control.agentsvc.pacing import ANSWER_TARGET_S, JITTER, MAX_RETRY_AFTER_S


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def pacer(clock: Clock, rate: float = 10.0, burst: int = 5) -> RegistrationPacer:
    return RegistrationPacer(rate=rate, burst=burst, clock=clock, rng=random.Random(3))


def test_a_burst_is_taken_at_once_and_the_rest_told_distinct_spread_slots() -> None:
    clock = Clock()
    paced = pacer(clock)
    assert [paced.take() for _ in range(5)] == [None] * 5
    waits = [paced.take() for _ in range(20)]
    assert all(w is not None for w in waits)
    delays = [w for w in waits if w is not None]
    # The n-th deferred agent's slot is n / rate away, stretched by at most 1 + JITTER.
    for n, wait in enumerate(delays, start=1):
        assert n / 10.0 <= wait <= n / 10.0 * (1 + JITTER)
    # Not all together: the backlog is spread over about two seconds.
    assert max(delays) - min(delays) >= 1.5


def test_the_bucket_refills_at_the_rate() -> None:
    clock = Clock()
    paced = pacer(clock, rate=2.0, burst=1)
    assert paced.take() is None
    paced.answered(0.01)
    assert paced.take() is not None
    clock.now += 0.5  # one token at 2 a second
    assert paced.take() is None
    assert paced.take() is not None


def test_a_huge_backlog_is_never_told_to_wait_longer_than_the_cap() -> None:
    clock = Clock()
    paced = pacer(clock, rate=1.0, burst=1)
    waits = [paced.take() for _ in range(500)]
    assert max(w for w in waits if w is not None) <= MAX_RETRY_AFTER_S


def test_slow_answers_halve_the_registrations_in_progress_and_slow_the_slots() -> None:
    clock = Clock()
    paced = pacer(clock, rate=100.0, burst=10)
    assert [paced.take() for _ in range(10)] == [None] * 10
    clock.now += 1.0  # the bucket is full again, but ten are still unanswered
    assert paced.take() is not None
    # Answers slower than the target: the limit halves once for the spell, not
    # once per slow answer that was already in flight.
    slow = ANSWER_TARGET_S * 1.5
    for _ in range(4):
        paced.answered(slow)
    assert paced.limit == 5
    assert paced.in_progress == 6
    deferred = [paced.take() for _ in range(3)]
    assert all(w is not None for w in deferred)
    # Slots now follow the answers' pace (5 in progress per 3 s), not the rate of
    # 100 a second: consecutive agents are told about 0.6 s apart, not 0.01 s.
    waits = [w for w in deferred if w is not None]
    assert max(waits) >= 2 * 0.6
    # Once the slow ones are answered, registrations are taken again.
    for _ in range(6):
        paced.answered(slow)
    assert paced.in_progress == 0
    assert paced.take() is None


def test_fast_answers_raise_the_limit_again() -> None:
    clock = Clock()
    paced = pacer(clock, rate=100.0, burst=8)
    assert paced.take() is None
    paced.answered(ANSWER_TARGET_S * 2)
    assert paced.limit == 4
    for _ in range(10):
        clock.now += 1.0
        assert paced.take() is None
        paced.answered(0.05)
    assert paced.limit == 14
    # Never above the rate's worth of the target answer time (or the burst).
    for _ in range(1000):
        clock.now += 1.0
        assert paced.take() is None
        paced.answered(0.05)
    assert paced.limit == 100.0 * ANSWER_TARGET_S


def test_a_second_slow_spell_halves_the_limit_again() -> None:
    clock = Clock()
    paced = pacer(clock, rate=100.0, burst=16)
    for _ in range(2):
        assert paced.take() is None
    slow = ANSWER_TARGET_S * 1.5
    paced.answered(slow)
    paced.answered(slow)
    assert paced.limit == 8
    clock.now += slow
    assert paced.take() is None
    paced.answered(slow)
    assert paced.limit == 4


def test_a_pacer_needs_a_positive_rate_and_a_burst() -> None:
    with pytest.raises(ValueError, match="rate > 0"):
        pacer(Clock(), rate=0)
    with pytest.raises(ValueError, match="burst >= 1"):
        pacer(Clock(), burst=0)


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ((("llmgw-refused", "busy"), ("llmgw-retry-after-ms", "2500")), 2.5),
        ((("llmgw-refused", b"busy"), ("llmgw-retry-after-ms", b"40")), 0.04),
        # A standby's refusal carries no delay; the agent's own retry applies.
        ((("llmgw-refused", "standby"), ("llmgw-retry-after-ms", "2500")), None),
        ((("llmgw-refused", "busy"), ("llmgw-retry-after-ms", "soon")), None),
        ((("llmgw-refused", "busy"),), None),
        # A day's delay from a confused server is capped.
        ((("llmgw-refused", "busy"), ("llmgw-retry-after-ms", "86400000")), 300.0),
        (None, None),
    ],
)
def test_an_agent_reads_the_delay_only_from_a_busy_answer(
    metadata: tuple[tuple[str, object], ...] | None, expected: float | None
) -> None:
    assert retry_after(metadata) == expected
