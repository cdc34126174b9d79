"""How many registrations the agent service takes a second, and when the rest come back.

When every node reconnects at once (a leader failover, a network blip), taking
all their Registers at once starves the event loop: streams time out on the
agents' side, the API port stalls, and the agents retry into the same storm.
`RegistrationPacer` takes registrations at a steady `rate` a second (a token
bucket holding at most `burst`) and answers every other one with a delay: the
agent is told to come back then (RESOURCE_EXHAUSTED with the trailing metadata
`llmgw-refused: busy` and `llmgw-retry-after-ms`), keeps its place in no
queue, and costs the server nothing until it does.

The delays are handed out as slots: each deferred agent is given the next
free one (`1 / rate` after the previous), stretched by a random factor, so the
agents told to wait come back spread over the backlog at about the pace the
server takes them, not all together.

Not guaranteed: that an agent comes back when told (an older agent uses its
own backoff), nor that it is taken when it does: others may have taken the
slot, and it is told to wait again.
"""

from __future__ import annotations

import random
from collections.abc import Callable

# The longest an agent is told to wait, however long the backlog: it then asks
# again, and the backlog is measured afresh.
MAX_RETRY_AFTER_S = 60.0
# Each delay is stretched by a factor drawn from [1, 1 + JITTER).
JITTER = 0.5


class RegistrationPacer:
    """Takes up to `rate` registrations a second (`burst` at once); see the module docstring."""

    def __init__(
        self,
        *,
        rate: float,
        burst: int,
        clock: Callable[[], float],
        rng: random.Random,
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(
                f"registration pacing needs rate > 0 and burst >= 1, got {rate:g}, {burst}"
            )
        self._rate = rate
        self._burst = float(burst)
        self._clock = clock
        self._rng = rng
        self._tokens = float(burst)
        self._at = clock()
        # The last slot handed to a deferred agent (on the clock).
        self._promised = -float("inf")

    @property
    def rate(self) -> float:
        return self._rate

    def take(self) -> float | None:
        """None when a registration may proceed now; else the seconds to come back after."""
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return None
        # When the bucket holds a token again, then one slot after the last promised.
        refill = now + (1.0 - self._tokens) / self._rate
        slot = max(self._promised + 1.0 / self._rate, refill)
        self._promised = min(slot, now + MAX_RETRY_AFTER_S)
        wait = (self._promised - now) * self._rng.uniform(1.0, 1.0 + JITTER)
        return min(wait, MAX_RETRY_AFTER_S)
