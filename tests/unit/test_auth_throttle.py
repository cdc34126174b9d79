"""The login throttle: no delay for a few mistakes, then doubling waits, bounded memory."""

from __future__ import annotations

from llmgw.auth import LoginThrottle


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def throttle(
    clock: Clock, *, forget_after: float = 900.0, max_entries: int = 10_000
) -> LoginThrottle:
    return LoginThrottle(
        after=3, max_delay=10.0, clock=clock, forget_after=forget_after, max_entries=max_entries
    )


def test_delays_start_after_the_threshold_and_double_up_to_the_maximum() -> None:
    limiter = throttle(Clock())
    delays = [limiter.begin("10.0.0.1", "alice") for _ in range(10)]
    assert delays == [0.0, 0.0, 0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_counts_are_kept_per_address_and_per_user_name() -> None:
    limiter = throttle(Clock())
    for name in ("a", "b", "c"):
        assert limiter.begin("10.0.0.1", name) == 0.0
    # A fourth name from the same address is slowed; the same name elsewhere too.
    assert limiter.begin("10.0.0.1", "d") == 0.5
    for address in ("10.0.0.2", "10.0.0.3", "10.0.0.4"):
        assert limiter.begin(address, "Eve") == 0.0
    assert limiter.begin("10.0.0.5", "eve") == 0.5
    assert limiter.begin("10.0.0.6", "mallory") == 0.0


def test_a_success_clears_the_users_count_but_not_the_addresses() -> None:
    limiter = throttle(Clock())
    for _ in range(4):
        limiter.begin("10.0.0.1", "alice")
    limiter.begin("10.0.0.1", "alice")
    limiter.succeeded("10.0.0.1", "alice")

    assert limiter.begin("10.0.0.9", "alice") == 0.0
    # The address keeps four failures (the successful attempt was taken back).
    assert limiter.begin("10.0.0.1", "bob") == 1.0


def test_failures_are_forgotten_after_a_quiet_while() -> None:
    clock = Clock()
    limiter = throttle(clock, forget_after=60.0)
    for _ in range(5):
        limiter.begin("10.0.0.1", "alice")
    clock.now += 61.0
    assert limiter.begin("10.0.0.1", "alice") == 0.0


def test_memory_is_bounded() -> None:
    limiter = throttle(Clock(), max_entries=100)
    for i in range(1000):
        limiter.begin(f"10.0.{i // 256}.{i % 256}", f"user{i}")
    assert len(limiter) == 100


def test_huge_counts_stay_at_the_maximum() -> None:
    assert throttle(Clock()).delay_for(10**9) == 10.0


def test_spraying_user_names_does_not_flush_the_count_of_the_user_under_attack() -> None:
    # An attacker guesses alice's password, and between guesses tries many other
    # names (from other addresses) to push alice's count out of the bounded table.
    limiter = throttle(Clock(), max_entries=50)
    for _ in range(5):
        limiter.begin("203.0.113.1", "alice")
    for i in range(5000):
        limiter.begin(f"198.51.{i // 256}.{i % 256}", f"spray-{i}")
    assert len(limiter) == 50
    # alice is still slowed, from any address.
    assert limiter.begin("192.0.2.77", "alice") == 2.0
    assert limiter.begin("203.0.113.1", "bob") == 2.0


def test_a_full_table_drops_forgotten_entries_before_counted_ones() -> None:
    clock = Clock()
    limiter = throttle(clock, forget_after=60.0, max_entries=3)
    for _ in range(6):
        limiter.begin("10.0.0.1", "old")
    clock.now += 61.0
    # Each attempt below makes new entries in the full table: the forgotten ones
    # (many failures, but long ago) go, not alice's fresh single failures.
    for address in ("10.0.0.2", "10.0.0.3", "10.0.0.4"):
        assert limiter.begin(address, "alice") == 0.0
    assert len(limiter) == 3
    assert limiter.begin("10.0.0.5", "alice") == 0.5


def test_long_user_names_cost_no_more_memory_than_short_ones() -> None:
    limiter = throttle(Clock(), max_entries=10)
    long_name = "x" * 16_000
    for _ in range(4):
        limiter.begin("10.0.0.1", long_name)
    assert limiter.begin("10.0.0.2", long_name.upper()) == 1.0
    keys = [key for key, _ in limiter._counts.items()]
    assert all(len(k[1]) <= 64 for k in keys)
