"""Per-key rate limits (RPM, TPM) and token budgets (per UTC day or month).

Algorithm: two token buckets per key, one for requests and one for tokens.
A bucket holds up to the per-minute limit and refills continuously at
limit/60 per second. Buckets were chosen over fixed or sliding windows
because their state is two numbers per limit (no per-request log), a
refusal's wait is exact — (needed - level) / rate — and so is the
`x-ratelimit-reset-*` time until the bucket is full again; a sliding window
would need a log (memory per request) or approximate both.

- RPM: a request needs one whole token.
- TPM: a request is charged its estimated prompt tokens at admission and needs
  that many in the bucket (at least 1, at most the capacity, so a request
  larger than the whole minute is admitted when the bucket is full instead of
  never). `settle` charges the difference to the real usage: an over-estimate
  gives tokens back (never above capacity); an under-estimate drives the level
  down, possibly below zero, and later requests wait for it to refill.
- A request is charged only when every limit lets it through.
- Budget: tokens used in the current UTC period (see `budget`) must be below
  the budget; the request is then charged its estimate, corrected by `settle`.
  So a budget is a soft cap, overshot by at most the requests in flight.

Sharing: without Redis each router process counts on its own, exactly. With
`redis_url`, all processes share one set of buckets and budget counters (see
`redis_counters`); while Redis is unreachable each process falls back to its
own buckets (each allowing the full limit) and resumes sharing when Redis is
back. Budgets keep being tracked in process memory either way, so a fallback
starts from this process's best knowledge.

End users (`KeyLimits.scope` "end-user", one set of counters per key and end user
a request names) are as many as clients make up, so their in-process buckets and
budget entries are capped (`max_end_users`): past the cap the oldest are dropped,
a dropped end user's buckets start full again and its budget is re-read from the
source. In Redis their buckets expire like any key's.

Cost: a key with no limits returns a shared `Admission` with no I/O and no
allocation. In memory, a limited key's admission is arithmetic on a few floats.
Does not guarantee anything across a restart of a process without Redis (its
buckets start full) and does not guarantee that budgets are never exceeded.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime
from typing import NoReturn

from llmgw.limits.bucket import TokenBucket, need
from llmgw.limits.budget import BudgetEntry, BudgetTracker
from llmgw.limits.errors import BudgetExhausted, RateLimited, Reason
from llmgw.limits.headers import RETRY_AFTER, format_duration, rate_headers, retry_after_seconds
from llmgw.limits.metrics import LimitMetrics
from llmgw.limits.model import Admission, BudgetPeriod, BudgetSource, KeyLimits
from llmgw.limits.periods import Period, period_containing
from llmgw.limits.redis_counters import RedisCounters
from llmgw.limits.tasks import TaskSet


class _KeyBuckets:
    __slots__ = ("rpm", "tpm")

    def __init__(self) -> None:
        self.rpm: TokenBucket | None = None
        self.tpm: TokenBucket | None = None


class Limiter:
    """Admits or refuses requests of API keys; one per router process.

    `clock` is monotonic seconds (bucket refills, refresh and retry timers);
    `wall_clock` returns the current time as an aware datetime (budget periods
    are UTC calendar days and months). With `redis_url`, call `start()` before
    the first request and `close()` at shutdown; without it both are cheap
    no-ops (close still ends background budget refreshes).
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        wall_clock: Callable[[], datetime],
        budget_source: BudgetSource,
        redis_url: str | None = None,
        metrics: LimitMetrics | None = None,
        key_prefix: str = "llmgw:rl:",
        budget_refresh_s: float = 30.0,
        redis_timeout_s: float = 0.25,
        redis_retry_s: float = 5.0,
        redis_clock: Callable[[], float] | None = None,
        max_end_users: int = 100_000,
    ) -> None:
        """Build a limiter; nothing connects until `start()`.

        `budget_refresh_s`: how often a key's budget usage is re-read from the
        source, bounding how late other processes' usage is seen without Redis.
        `redis_timeout_s`: connect and read timeout of every Redis call; short,
        because a request waits for it. `redis_retry_s`: how long after a Redis
        failure requests use local state before Redis is probed again.
        `redis_clock`: Unix seconds for the shared buckets; None uses the Redis
        server's clock (the right choice in production; tests inject one).
        `max_end_users`: how many end users' buckets (and, apart, budget entries) this
        process keeps; bounds the memory a client inventing end users can take.
        """
        self._clock = clock
        self._wall_clock = wall_clock
        self._metrics = metrics
        self._tasks = TaskSet()
        self._budgets = BudgetTracker(
            source=budget_source,
            clock=clock,
            refresh_s=budget_refresh_s,
            tasks=self._tasks,
            max_end_users=max_end_users,
        )
        self._shared = (
            RedisCounters(
                url=redis_url,
                prefix=key_prefix,
                clock=clock,
                tasks=self._tasks,
                metrics=metrics,
                timeout_s=redis_timeout_s,
                retry_s=redis_retry_s,
                redis_clock=redis_clock,
            )
            if redis_url is not None
            else None
        )
        self._buckets: dict[str, _KeyBuckets] = {}
        # End users' buckets, apart so that a flood of made-up end users never drops a key's.
        self._user_buckets: dict[str, _KeyBuckets] = {}
        self._max_end_users = max_end_users
        self._periods: dict[BudgetPeriod, Period] = {}
        self._empty = Admission(headers=[], estimated_tokens=0)

    @property
    def redis_up(self) -> bool:
        """True while limits are shared through Redis."""
        return self._shared is not None and self._shared.up

    async def start(self) -> None:
        """Connect to Redis if configured. Never fails for an unreachable Redis:
        that is logged once and requests are limited per process until it answers."""
        if self._shared is not None:
            await self._shared.start()

    async def close(self) -> None:
        """End background work and disconnect from Redis. Admitting afterwards is an error."""
        await self._tasks.close()
        if self._shared is not None:
            await self._shared.close()

    async def probe_redis(self) -> bool:
        """Try Redis now (for health checks and tests); True when shared limits are in use."""
        return self._shared is not None and await self._shared.probe()

    # -- admission ---------------------------------------------------------------------------

    async def admit(self, limits: KeyLimits, estimated_tokens: int) -> Admission:
        """Count one request and its estimated tokens against the key, or refuse it.

        Raises `RateLimited` (over RPM or TPM) or `BudgetExhausted`; nothing is
        charged when it raises. Errors of the budget source on a key's first
        request in a period propagate unchanged.
        """
        if limits.rpm is None and limits.tpm is None and limits.budget_tokens is None:
            return self._empty
        estimated = estimated_tokens if estimated_tokens > 0 else 0
        now = self._clock()
        entry: BudgetEntry | None = None
        period: Period | None = None
        used = 0
        if limits.budget_tokens is not None:
            period = self._period(limits.budget_period or "month")
            entry = self._budgets.lookup(limits.key_id, period, now)
            if entry is None:
                entry = await self._budgets.load(limits.key_id, period)
            used = entry.used

        shared = self._shared
        if shared is not None and shared.ready(now):
            verdict = await shared.admit(limits, estimated, period, used)
            if verdict is not None:
                if verdict.over_budget:
                    self._refuse_budget(
                        limits, verdict.used, period, verdict.rpm_level, verdict.tpm_level
                    )
                if not verdict.admitted:
                    self._refuse_rate(limits, estimated, verdict.rpm_level, verdict.tpm_level)
                if entry is not None:
                    entry.inflight += estimated
                return Admission(
                    headers=rate_headers(
                        limits.rpm, verdict.rpm_level, limits.tpm, verdict.tpm_level
                    ),
                    estimated_tokens=estimated,
                    period_id=period.id if period is not None else "",
                    shared=True,
                )

        return self._admit_local(limits, estimated, now, used, period, entry)

    def _admit_local(
        self,
        limits: KeyLimits,
        estimated: int,
        now: float,
        used: int,
        period: Period | None,
        entry: BudgetEntry | None,
    ) -> Admission:
        """Admit against this process's own buckets (no Redis, or Redis down)."""
        rpm_level = tpm_level = 0.0
        rpm_bucket = tpm_bucket = None
        if limits.rpm is not None or limits.tpm is not None:
            table = self._table(limits)
            buckets = table.get(limits.key_id)
            if buckets is None:
                buckets = table[limits.key_id] = _KeyBuckets()
                if table is self._user_buckets and len(table) > self._max_end_users:
                    del table[next(iter(table))]
            if limits.rpm is not None:
                rpm_bucket = buckets.rpm
                if rpm_bucket is None:
                    rpm_bucket = buckets.rpm = TokenBucket(limits.rpm, now)
                rpm_level = rpm_bucket.refill(now, limits.rpm)
            if limits.tpm is not None:
                tpm_bucket = buckets.tpm
                if tpm_bucket is None:
                    tpm_bucket = buckets.tpm = TokenBucket(limits.tpm, now)
                tpm_level = tpm_bucket.refill(now, limits.tpm)
        if limits.budget_tokens is not None and used >= limits.budget_tokens:
            self._refuse_budget(limits, used, period, rpm_level, tpm_level)
        if (rpm_bucket is not None and rpm_level < 1.0) or (
            tpm_bucket is not None and tpm_level < need(estimated, tpm_bucket.capacity)
        ):
            self._refuse_rate(limits, estimated, rpm_level, tpm_level)
        if rpm_bucket is not None:
            rpm_level = rpm_bucket.level = rpm_level - 1.0
        if tpm_bucket is not None:
            tpm_level = tpm_bucket.level = tpm_level - estimated
        if entry is not None:
            entry.inflight += estimated
        return Admission(
            headers=rate_headers(limits.rpm, rpm_level, limits.tpm, tpm_level),
            estimated_tokens=estimated,
            period_id=period.id if period is not None else "",
        )

    async def settle(self, limits: KeyLimits, admission: Admission, actual_tokens: int) -> None:
        """Replace the admission's estimate by the real usage in TPM and the budget.

        Call it once per admission, with 0 when the request produced nothing,
        or the estimate stays counted (in the budget until the period ends).
        Never raises for limits; a Redis failure drops the shared correction.
        """
        if admission is self._empty:
            return
        if limits.tpm is None and limits.budget_tokens is None:
            return
        actual = actual_tokens if actual_tokens > 0 else 0
        estimated = admission.estimated_tokens
        delta = actual - estimated
        if admission.period_id:
            self._budgets.settle(limits.key_id, admission.period_id, estimated, actual)
        if delta == 0:
            return
        if admission.shared:
            if self._shared is not None:
                await self._shared.settle(limits, delta, admission.period_id)
            return
        if limits.tpm is not None:
            buckets = self._table(limits).get(limits.key_id)
            if buckets is not None and buckets.tpm is not None:
                buckets.tpm.refill(self._clock(), limits.tpm)
                buckets.tpm.adjust(delta)

    async def release(self, limits: KeyLimits, admission: Admission) -> None:
        """Give back everything an admission took: its request (RPM) and its estimate.

        For a request admitted by one set of limits (a key's) and then refused by
        another (its team's): a refused request is charged nothing. Never raises
        for limits; a Redis failure drops the shared give-back.
        """
        if admission is self._empty:
            return
        estimated = admission.estimated_tokens
        if admission.period_id:
            self._budgets.settle(limits.key_id, admission.period_id, estimated, 0)
        if admission.shared:
            if self._shared is not None:
                await self._shared.settle(limits, -estimated, admission.period_id, requests=-1)
            return
        buckets = self._table(limits).get(limits.key_id)
        if buckets is None:
            return
        now = self._clock()
        if limits.rpm is not None and buckets.rpm is not None:
            buckets.rpm.refill(now, limits.rpm)
            buckets.rpm.adjust(-1)
        if limits.tpm is not None and buckets.tpm is not None and estimated:
            buckets.tpm.refill(now, limits.tpm)
            buckets.tpm.adjust(-estimated)

    # -- helpers -----------------------------------------------------------------------------

    def _table(self, limits: KeyLimits) -> dict[str, _KeyBuckets]:
        return self._user_buckets if limits.scope == "end-user" else self._buckets

    def _period(self, kind: BudgetPeriod) -> Period:
        now = self._wall_clock()
        period = self._periods.get(kind)
        if period is None or not period.contains(now):
            period = self._periods[kind] = period_containing(kind, now)
        return period

    def _count(self, reason: Reason) -> None:
        if self._metrics is not None:
            self._metrics.rate_limited[reason].inc()

    def _refuse_rate(
        self, limits: KeyLimits, estimated: int, rpm_level: float, tpm_level: float
    ) -> NoReturn:
        rpm_wait = tpm_wait = 0.0
        if limits.rpm is not None and rpm_level < 1.0:
            rpm_wait = (1.0 - rpm_level) * 60.0 / limits.rpm
        if limits.tpm is not None:
            short = need(estimated, limits.tpm) - tpm_level
            tpm_wait = short * 60.0 / limits.tpm if short > 0 else 0.0
        wait = max(rpm_wait, tpm_wait)
        if rpm_wait >= tpm_wait:
            reason: Reason = "rpm"
            what = (
                f"requests per minute (RPM): limit {limits.rpm}, "
                f"remaining {max(0, math.floor(rpm_level))}"
            )
        else:
            reason = "tpm"
            what = (
                f"tokens per minute (TPM): limit {limits.tpm}, "
                f"remaining {max(0, math.floor(tpm_level))}, requested ~{estimated}"
            )
            if limits.tpm is not None and estimated > limits.tpm:
                what += " (more than the whole minute's limit: it waits for a full bucket)"
        retry_after = retry_after_seconds(wait)
        self._count(reason)
        raise RateLimited(
            f"Rate limit reached for {limits.subject} on {what}. "
            f"Please try again in {format_duration(wait)}.",
            retry_after=retry_after,
            headers=self._refusal_headers(limits, retry_after, rpm_level, tpm_level),
            reason=reason,
        )

    def _refuse_budget(
        self,
        limits: KeyLimits,
        used: int,
        period: Period | None,
        rpm_level: float,
        tpm_level: float,
    ) -> NoReturn:
        assert period is not None  # a budget always has a period (KeyLimits checks it)
        wait = (period.end - self._wall_clock()).total_seconds()
        retry_after = retry_after_seconds(wait)
        self._count("budget")
        raise BudgetExhausted(
            f"Token budget exhausted for {limits.subject}: {used} of "
            f"{limits.budget_tokens} tokens used this {period.kind} (UTC). It resets at "
            f"{period.end:%Y-%m-%dT%H:%M:%SZ}; an administrator can raise the {limits.owner} "
            "budget.",
            retry_after=retry_after,
            headers=self._refusal_headers(limits, retry_after, rpm_level, tpm_level),
            reason="budget",
        )

    @staticmethod
    def _refusal_headers(
        limits: KeyLimits, retry_after: int, rpm_level: float, tpm_level: float
    ) -> list[tuple[bytes, bytes]]:
        return [
            (RETRY_AFTER, b"%d" % retry_after),
            *rate_headers(limits.rpm, rpm_level, limits.tpm, tpm_level),
        ]
