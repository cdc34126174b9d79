"""The last hour of the router's request rate, error rate and time to first token.

`MetricsHistory.run()` reads the router's cumulative counters (`RouterTotals`,
from `RouterMetrics.totals()`) every `interval` seconds and keeps, in a ring
buffer covering `window` seconds, what happened in each interval:

- requests per second: answered requests in the interval / its length;
- error rate: the share of those answered with a 5xx status (llmgw's own
  failures and the engines': no capacity, upstream errors, timeouts). 4xx are
  the client's doing (bad request, unknown model, no key, rate limited) and
  499 is a client that went away; neither counts as an error here;
- TTFT: the mean time to first token of the streams that began relaying in
  the interval (histogram sum and count deltas); None when there were none.

The dashboard draws these as small charts. Time is the injected monotonic
`clock`; the loop waits with the injected `sleep`, so tests run it in virtual
time.

Not guaranteed: history across restarts or across router processes (each
process keeps its own last hour), or percentiles: the mean is exact, a
percentile from histogram buckets would only be an estimate.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RouterTotals:
    """The router's cumulative counts at one moment (since the process started)."""

    requests: float
    errors: float
    ttft_sum: float
    ttft_count: float


@dataclass(frozen=True, slots=True)
class HistoryPoint:
    """One interval, ending at `at` (on the history's monotonic clock)."""

    at: float
    seconds: float
    requests: float
    requests_per_second: float
    # None when nothing was answered (no rate to speak of) or nothing streamed.
    error_rate: float | None
    ttft_seconds: float | None


class MetricsHistory:
    """A ring buffer of per-interval rates; see the module docstring."""

    def __init__(
        self,
        *,
        sample: Callable[[], RouterTotals],
        clock: Callable[[], float],
        interval: float = 10.0,
        window: float = 3600.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if interval <= 0 or window < interval:
            raise ValueError(f"needs 0 < interval <= window, got {interval:g} / {window:g}")
        self._sample = sample
        self._clock = clock
        self.interval = interval
        self.window = window
        self._sleep = sleep
        self._points: deque[HistoryPoint] = deque(maxlen=math.ceil(window / interval))
        self._last: tuple[float, RouterTotals] | None = None

    def now(self) -> float:
        """The history's clock, for drawing the charts' time axis."""
        return self._clock()

    def points(self) -> list[HistoryPoint]:
        """The intervals within the window, oldest first."""
        horizon = self._clock() - self.window
        return [p for p in self._points if p.at >= horizon]

    def tick(self) -> HistoryPoint | None:
        """Take one sample; the interval it closes (None for the very first sample)."""
        now, totals = self._clock(), self._sample()
        last, self._last = self._last, (now, totals)
        if last is None or now <= last[0]:
            return None
        then, before = last
        seconds = now - then
        requests = _delta(totals.requests, before.requests)
        errors = _delta(totals.errors, before.errors)
        streams = _delta(totals.ttft_count, before.ttft_count)
        ttft = _delta(totals.ttft_sum, before.ttft_sum)
        point = HistoryPoint(
            at=now,
            seconds=seconds,
            requests=requests,
            requests_per_second=requests / seconds,
            error_rate=min(1.0, errors / requests) if requests > 0 else None,
            ttft_seconds=ttft / streams if streams > 0 else None,
        )
        self._points.append(point)
        return point

    async def run(self) -> None:
        """Sample every `interval` seconds until cancelled."""
        while True:
            self.tick()
            await self._sleep(self.interval)


def _delta(now: float, before: float) -> float:
    # Counters only go down when they were reset (a new registry); count from zero then.
    return now - before if now >= before else now
