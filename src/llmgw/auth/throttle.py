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

Counts live in this process's memory, bounded to `max_entries`, and are
forgotten `forget_after` seconds after the last failure. When the table is full,
the entry that goes is one already forgotten, or else the one with the fewest
failures (the least recently touched of those): an attacker who sprays user
names or addresses to flush the table makes entries of one or two failures
each, and those go first, so the count of a user under attack (which grows
with every guess) stays. Evicting it would take `max_entries` other entries
with at least as many failures each. User names are kept as 16-byte digests,
so a table of long names costs no more memory than one of short names.

Not guaranteed: anything across several router processes (each counts
alone), or survival across a restart; an attacker with many addresses is
slowed only per user name.
"""

from __future__ import annotations

import hashlib
import heapq
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

BASE_DELAY = 0.5
FORGET_AFTER = 900.0
MAX_ENTRIES = 10_000
# 2**40 half-seconds is far past any sensible maximum; capping the exponent
# keeps the arithmetic small for counts in the millions.
_MAX_DOUBLINGS = 40

_Key = tuple[str, bytes]


@dataclass(slots=True)
class _Count:
    failures: int
    last: float
    version: int = 0  # matches the newest heap entry for this key


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
        # Least recently touched first.
        self._counts: OrderedDict[_Key, _Count] = OrderedDict()
        # (failures, version, key), fewest failures first; entries whose version is
        # no longer the count's are stale and skipped (a lazy priority queue).
        self._heap: list[tuple[int, int, _Key]] = []
        self._version = 0

    def begin(self, address: str, user: str) -> float:
        """Count an attempt as failed until `succeeded` says otherwise; returns how many
        seconds to wait before checking the password (0.0 below the threshold)."""
        now = self._clock()
        delay = 0.0
        for key in (_address_key(address), _user_key(user)):
            count = self._current(key, now)
            delay = max(delay, self.delay_for(count.failures))
            count.failures += 1
            count.last = now
            self._queue(key, count)
        self._evict(now)
        return delay

    def succeeded(self, address: str, user: str) -> None:
        """The attempt begun for `address` and `user` was a success."""
        self._counts.pop(_user_key(user), None)
        key = _address_key(address)
        count = self._counts.get(key)
        if count is not None and count.failures > 0:
            count.failures -= 1
            self._queue(key, count)

    def delay_for(self, failures: int) -> float:
        """The wait before answering an attempt made after `failures` failures."""
        if failures < self._after:
            return 0.0
        doublings = min(failures - self._after, _MAX_DOUBLINGS)
        return float(min(self._base * 2**doublings, self._max_delay))

    def __len__(self) -> int:
        return len(self._counts)

    def _current(self, key: _Key, now: float) -> _Count:
        count = self._counts.get(key)
        if count is None or now - count.last > self._forget_after:
            count = _Count(0, now)
            self._counts[key] = count
        self._counts.move_to_end(key)
        return count

    def _queue(self, key: _Key, count: _Count) -> None:
        self._version += 1
        count.version = self._version
        heapq.heappush(self._heap, (count.failures, count.version, key))
        if len(self._heap) > 4 * len(self._counts) + 16:
            self._heap = [(c.failures, c.version, k) for k, c in self._counts.items()]
            heapq.heapify(self._heap)

    def _evict(self, now: float) -> None:
        while len(self._counts) > self._max_entries:
            oldest_key, oldest = next(iter(self._counts.items()))
            if now - oldest.last > self._forget_after:
                del self._counts[oldest_key]
                continue
            _, version, key = heapq.heappop(self._heap)
            count = self._counts.get(key)
            if count is not None and count.version == version:
                del self._counts[key]


def _address_key(address: str) -> _Key:
    return ("addr", address.encode()[:64])


def _user_key(user: str) -> _Key:
    digest = hashlib.blake2b(user.casefold().encode(), digest_size=16).digest()
    return ("user", digest)
