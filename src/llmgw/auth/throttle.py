"""Slowing down password guessing: a delay before answering logins after repeated failures.

Failures are counted per client address and per user name. Once either count
reaches `after`, every further login attempt for that address or name waits
before it is answered: 0.5 s, doubling with each failure, up to `max_delay`.
The wait comes *before* the password is checked and applies whether or not the
password turns out right; otherwise a guesser could give up on any answer slower
than usual and keep guessing at full speed.

An attempt counts as a failure from the moment it starts (a success takes it
back), so a script firing many guesses in parallel is slowed like one firing
them in a row. A success clears the user name's count but not the address's:
logging in to one's own account must not wash away the failures a guesser
collected against others from the same address.

Counts live in this process's memory, bounded to `max_entries` (least recently
used are dropped first) and forgotten `forget_after` seconds after the last
failure. Not guaranteed: anything across several router processes (each counts
alone), or survival across a restart; an attacker with many addresses is slowed
only per user name.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

BASE_DELAY = 0.5
FORGET_AFTER = 900.0
MAX_ENTRIES = 10_000
# 2**40 half-seconds is far past any sensible maximum; capping the exponent
# keeps the arithmetic small for counts in the millions.
_MAX_DOUBLINGS = 40


@dataclass(slots=True)
class _Count:
    failures: int
    last: float


class LoginThrottle:
    """In-memory failure counts by address and by user name, and the delay they imply."""

    def __init__(
        self,
        *,
        after: int,
        max_delay: float,
        clock: Callable[[], float],
        base_delay: float = BASE_DELAY,
        forget_after: float = FORGET_AFTER,
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        if after < 1 or max_delay <= 0 or base_delay <= 0 or max_entries < 2:
            raise ValueError("after >= 1, max_delay > 0, base_delay > 0 and max_entries >= 2")
        self._after = after
        self._max_delay = max_delay
        self._base = base_delay
        self._forget_after = forget_after
        self._max_entries = max_entries
        self._clock = clock
        self._counts: OrderedDict[tuple[str, str], _Count] = OrderedDict()

    def begin(self, address: str, user: str) -> float:
        """Count an attempt as failed until `succeeded` says otherwise; returns how many
        seconds to wait before checking the password (0.0 below the threshold)."""
        now = self._clock()
        delay = 0.0
        for key in (("addr", address), ("user", user.casefold())):
            count = self._current(key, now)
            delay = max(delay, self.delay_for(count.failures))
            count.failures += 1
            count.last = now
        return delay

    def succeeded(self, address: str, user: str) -> None:
        """The attempt begun for `address` and `user` was a success."""
        self._counts.pop(("user", user.casefold()), None)
        count = self._counts.get(("addr", address))
        if count is not None and count.failures > 0:
            count.failures -= 1

    def delay_for(self, failures: int) -> float:
        """The wait before answering an attempt made after `failures` failures."""
        if failures < self._after:
            return 0.0
        doublings = min(failures - self._after, _MAX_DOUBLINGS)
        return float(min(self._base * 2**doublings, self._max_delay))

    def __len__(self) -> int:
        return len(self._counts)

    def _current(self, key: tuple[str, str], now: float) -> _Count:
        count = self._counts.get(key)
        if count is None or now - count.last > self._forget_after:
            count = _Count(0, now)
            self._counts[key] = count
        self._counts.move_to_end(key)
        while len(self._counts) > self._max_entries:
            self._counts.popitem(last=False)
        return count
