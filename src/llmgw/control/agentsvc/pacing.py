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

The rate alone does not bound how long a taken registration waits for its
answer: a server short of CPU (its heartbeats, TLS handshakes, a loaded host)
answers 300 a second later and later, past the agent's connect timeout (5 s);
the agent then gives up and dials again while the server still works through
the Registers it abandoned, and nobody registers. So the pacer also bounds the
registrations in progress (taken, not yet answered) by a limit that follows
their answer times, as TCP's congestion window follows round trips: an answer
slower than `ANSWER_TARGET_S` halves the limit (at most once per such answer
time), one answered in under half of it raises it by one (up to the rate's
worth of `ANSWER_TARGET_S`; it starts at `burst`). The
agents deferred meanwhile are handed slots at the pace the server is actually
answering (limit / mean answer time) when that is below `rate`.

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
# A registration answered slower than this halves the limit of those in
# progress: well under the agent's default connect timeout (5 s), so a
# registration taken is answered before its agent gives up on it.
ANSWER_TARGET_S = 2.0
# The weight of the newest answer time in their moving mean.
ANSWER_MEAN_WEIGHT = 0.1


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
        # Registrations taken and not yet answered, and how many may be.
        self._in_progress = 0
        self._ceiling = max(float(burst), rate * ANSWER_TARGET_S)
        self._limit = float(burst)
        self._answer_mean: float | None = None
        # When the limit was last halved: one slow spell halves it once.
        self._cut_at = -float("inf")

    @property
    def rate(self) -> float:
        return self._rate

    @property
    def limit(self) -> float:
        """How many registrations may be in progress at once now."""
        return self._limit

    @property
    def in_progress(self) -> int:
        return self._in_progress

    def take(self) -> float | None:
        """None when a registration may proceed now (call `answered` when it ends);
        else the seconds to come back after."""
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens >= 1.0 and self._in_progress < self._limit:
            self._tokens -= 1.0
            self._in_progress += 1
            return None
        pace = self._pace()
        # When the bucket holds a token again, then one slot after the last promised.
        refill = now + max(0.0, 1.0 - self._tokens) / self._rate
        slot = max(self._promised + 1.0 / pace, refill)
        self._promised = min(slot, now + MAX_RETRY_AFTER_S)
        wait = (self._promised - now) * self._rng.uniform(1.0, 1.0 + JITTER)
        return min(wait, MAX_RETRY_AFTER_S)

    def answered(self, seconds: float) -> None:
        """A registration taken by `take` ended (answered or refused) after `seconds`."""
        self._in_progress = max(0, self._in_progress - 1)
        mean = self._answer_mean
        self._answer_mean = (
            seconds if mean is None else mean + ANSWER_MEAN_WEIGHT * (seconds - mean)
        )
        now = self._clock()
        if seconds > ANSWER_TARGET_S:
            # Once per slow spell: the answers in flight when it began are slow too.
            if now - self._cut_at >= seconds:
                self._limit = max(1.0, self._limit / 2.0)
                self._cut_at = now
        elif seconds < ANSWER_TARGET_S / 2.0:
            self._limit = min(self._ceiling, self._limit + 1.0)

    def _pace(self) -> float:
        """Registrations a second to hand slots at: the rate, or the pace of answers
        when the limit of those in progress is what holds them back."""
        mean = self._answer_mean
        if mean is None or mean <= 0.0:
            return self._rate
        return max(min(self._rate, self._limit / mean), 1.0 / MAX_RETRY_AFTER_S)
