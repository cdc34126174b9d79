"""Full-jitter exponential backoff for reconnecting to the control plane.

Each delay is uniform(0, min(cap, base * 2**n)) where n counts consecutive failed
passes, so a fleet that lost its control plane at the same moment spreads its
reconnects instead of arriving in lockstep. The random source is injected.

Does not sleep by itself and does not decide when to back off: the connection
loop asks for a delay only after every address has just failed.
"""

from __future__ import annotations

import random

DEFAULT_BASE_SECONDS = 0.5
DEFAULT_CAP_SECONDS = 30.0


class Backoff:
    """Delays that grow with each consecutive failure and restart after a success."""

    def __init__(
        self,
        *,
        rng: random.Random,
        base: float = DEFAULT_BASE_SECONDS,
        cap: float = DEFAULT_CAP_SECONDS,
    ) -> None:
        if base <= 0 or cap < base:
            raise ValueError(f"backoff needs 0 < base <= cap (got base={base}, cap={cap})")
        self._rng = rng
        self._base = base
        self._cap = cap
        self._failures = 0

    @property
    def failures(self) -> int:
        """Consecutive failures since the last reset."""
        return self._failures

    def ceiling(self) -> float:
        """The upper bound of the next delay."""
        # The exponent stops growing once the cap is reached, so it never overflows.
        return min(self._cap, self._base * 2.0 ** min(self._failures, 64))

    def next_delay(self) -> float:
        """Draw the delay after one more failure, and count it."""
        delay = self._rng.uniform(0.0, self.ceiling())
        self._failures += 1
        return delay

    def reset(self) -> None:
        """Start again from the base delay (after a successful registration)."""
        self._failures = 0
