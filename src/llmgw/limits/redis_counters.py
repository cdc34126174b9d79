"""Rate-limit buckets and budget counters shared by all router processes through Redis.

One Lua script per request does what the in-process limiter does, atomically in
Redis: refill the key's RPM and TPM buckets, check them and the period's budget
counter, and charge all three only if all pass (one round trip, EVALSHA). A
second script settles the TPM bucket and the budget counter with the real
usage (one more round trip, skipped when the estimate was exact).

Keys: `{prefix}{<key_id>}:r` and `:t` (hashes: level, time; they expire once
the bucket would be full again, so idle keys cost nothing) and
`{prefix}{<key_id>}:b:<period>` (an integer; created from the budget source's
number when missing, as SET NX would, and expiring an hour after the period).
The braces are a hash tag, keeping one key's counters in one cluster slot.

Needs Redis >= 6.2 (SET ... EXAT). Bucket time is the Redis server's clock
(TIME), so router hosts with skewed clocks still agree; tests may inject one.

Failure handling: every call has a short timeout and no retries. The first
failure marks Redis down, logs one warning and sets `llmgw_limits_redis_up` to
0; callers then use their per-process state. Requests never talk to a Redis
marked down: after `retry_s` a request starts one background probe (drop the
pool's connections, PING); when it answers, shared counting resumes and one
line is logged. Does not guarantee exactness across an outage: usage counted
locally meanwhile is not replayed into Redis, and settlements that fail are
dropped (the budget is still corrected in process memory).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from llmgw.limits.metrics import LimitMetrics
from llmgw.limits.model import KeyLimits
from llmgw.limits.periods import Period
from llmgw.limits.tasks import TaskSet

log = logging.getLogger("llmgw.limits")


def fail_fast_client(url: str, timeout: float) -> aioredis.Redis:
    """A Redis client whose commands give up after `timeout` seconds and are never
    retried: whoever uses it falls back (or tries again later) instead of waiting
    on Redis twice."""
    return aioredis.Redis.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
    )


_PRELUDE = """
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function level(key, cap)
  if cap <= 0 then return 0 end
  local v = redis.call('HMGET', key, 'l', 't')
  local l, t = tonumber(v[1]), tonumber(v[2])
  if not l then return cap end
  if now > t then l = l + (now - t) * cap / 60 end
  if l > cap then l = cap end
  return l
end
local function save(key, cap, l)
  redis.call('HSET', key, 'l', string.format('%.17g', l), 't', string.format('%.17g', now))
  redis.call('PEXPIRE', key, string.format('%d', math.ceil((cap - l) * 60000 / cap) + 1000))
end
local function need(cost, cap)
  if cost < 1 then cost = 1 end
  if cost > cap then cost = cap end
  return cost
end
"""

# KEYS: rpm bucket, tpm bucket, budget counter.
# ARGV: now ('' = server TIME), rpm (0 = none), tpm (0 = none), estimate,
#       budget (-1 = none), seed (used tokens if the counter is missing), expire-at (unix s).
# Returns {admitted, over_budget, rpm level, tpm level, budget used}.
ADMIT_LUA = (
    _PRELUDE
    + """
local rpm, tpm = tonumber(ARGV[2]), tonumber(ARGV[3])
local est, budget = tonumber(ARGV[4]), tonumber(ARGV[5])
local used = 0
if budget >= 0 then
  used = tonumber(redis.call('GET', KEYS[3]))
  if not used then
    used = tonumber(ARGV[6])
    redis.call('SET', KEYS[3], ARGV[6], 'EXAT', ARGV[7])
  end
end
local r, t = level(KEYS[1], rpm), level(KEYS[2], tpm)
local ok = 1
local over = 0
if budget >= 0 and used >= budget then
  ok, over = 0, 1
elseif (rpm > 0 and r < need(1, rpm)) or (tpm > 0 and t < need(est, tpm)) then
  ok = 0
else
  if rpm > 0 then r = r - 1; save(KEYS[1], rpm, r) end
  if tpm > 0 then t = t - est; save(KEYS[2], tpm, t) end
  if budget >= 0 then used = redis.call('INCRBY', KEYS[3], est) end
end
return {ok, over, string.format('%.17g', r), string.format('%.17g', t), used}
"""
)

# KEYS: tpm bucket, budget counter, rpm bucket. ARGV: now, tpm (0 = none), delta,
#       has budget (0/1), rpm (0 = none), requests delta (-1 gives a request back).
SETTLE_LUA = (
    _PRELUDE
    + """
local tpm, delta = tonumber(ARGV[2]), tonumber(ARGV[3])
local rpm, requests = tonumber(ARGV[5]), tonumber(ARGV[6])
if rpm > 0 and requests ~= 0 then
  local r = level(KEYS[3], rpm) - requests
  if r > rpm then r = rpm end
  save(KEYS[3], rpm, r)
end
if tpm > 0 and delta ~= 0 then
  local l = level(KEYS[1], tpm) - delta
  if l > tpm then l = tpm end
  save(KEYS[1], tpm, l)
end
if ARGV[4] == '1' and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('INCRBY', KEYS[2], delta)
end
return 1
"""
)

# Budget counters outlive their period a little, for late settlements and debugging.
_BUDGET_GRACE_S = 3600


@dataclass(frozen=True, slots=True)
class SharedVerdict:
    admitted: bool
    over_budget: bool
    rpm_level: float
    tpm_level: float
    used: int


class RedisCounters:
    """The shared state in one Redis, and whether it is usable right now."""

    def __init__(
        self,
        *,
        url: str,
        prefix: str,
        clock: Callable[[], float],
        tasks: TaskSet,
        metrics: LimitMetrics | None,
        timeout_s: float,
        retry_s: float,
        redis_clock: Callable[[], float] | None,
    ) -> None:
        self._url = url
        self._prefix = prefix
        self._clock = clock
        self._tasks = tasks
        self._metrics = metrics
        self._timeout_s = timeout_s
        self._retry_s = retry_s
        self._redis_clock = redis_clock
        self._client: aioredis.Redis | None = None
        self._admit_script: Callable[..., Awaitable[Any]] | None = None
        self._settle_script: Callable[..., Awaitable[Any]] | None = None
        self._where = url
        self._up = False
        self._outage_logged = False
        self._retry_at = 0.0
        self._probing = False
        self._names: dict[str, tuple[str, str, str]] = {}

    @property
    def up(self) -> bool:
        return self._up

    async def start(self) -> bool:
        """Create the client and probe Redis; False (and one warning) when unreachable."""
        if self._client is not None:
            return await self.probe()
        client = fail_fast_client(self._url, self._timeout_s)
        self._client = client
        kwargs = client.connection_pool.connection_kwargs
        if "host" in kwargs:  # not the URL: it may hold a password
            self._where = f"{kwargs['host']}:{kwargs.get('port', 6379)}"
        self._admit_script = client.register_script(ADMIT_LUA)
        self._settle_script = client.register_script(SETTLE_LUA)
        return await self.probe()

    async def close(self) -> None:
        client, self._client = self._client, None
        self._up = False
        if client is not None:
            await client.aclose()

    def ready(self, now: float) -> bool:
        """Whether to use Redis for this request; starts a background probe when due."""
        if self._up:
            return True
        if self._client is not None and not self._probing and now >= self._retry_at:
            self._probing = True
            self._tasks.spawn(self._probe_in_background(), name="llmgw-limits-redis-probe")
        return False

    async def probe(self) -> bool:
        """Try Redis now: reconnect and PING. Marks it up or down accordingly."""
        client = self._client
        if client is None:
            return False
        try:
            # Connections that died with the server would fail the first commands.
            await client.connection_pool.disconnect()
            await client.ping()
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return False
        self._up = True
        if self._metrics is not None:
            self._metrics.redis_up.set(1)
        if self._outage_logged:
            self._outage_logged = False
            log.info(
                "Redis at %s is reachable again: rate limits and budgets are shared "
                "between router processes again",
                self._where,
            )
        return True

    async def _probe_in_background(self) -> None:
        try:
            await self.probe()
        finally:
            self._probing = False

    def _failed(self, exc: BaseException) -> None:
        self._up = False
        self._retry_at = self._clock() + self._retry_s
        if self._metrics is not None:
            self._metrics.redis_errors.inc()
            self._metrics.redis_up.set(0)
        if not self._outage_logged:
            self._outage_logged = True
            log.warning(
                "Redis at %s is unreachable (%s: %s): each router process now enforces "
                "rate limits and budgets on its own, so a key may get its limit once per "
                "process; retrying every %gs. Check that Redis is running and reachable.",
                self._where,
                type(exc).__name__,
                exc,
                self._retry_s,
            )

    def _key_names(self, key_id: str) -> tuple[str, str, str]:
        names = self._names.get(key_id)
        if names is None:
            base = f"{self._prefix}{{{key_id}}}:"
            names = self._names[key_id] = (base + "r", base + "t", base + "b:")
        return names

    def _now_arg(self) -> str:
        return "" if self._redis_clock is None else f"{self._redis_clock():.6f}"

    async def admit(
        self, limits: KeyLimits, estimated: int, period: Period | None, seed: int
    ) -> SharedVerdict | None:
        """Check and charge the key in Redis; None when Redis failed (use local state)."""
        script = self._admit_script
        if script is None:
            return None
        rpm_key, tpm_key, budget_prefix = self._key_names(limits.key_id)
        budget_key = budget_prefix + (period.id if period is not None else "")
        budget = limits.budget_tokens
        expire_at = int(period.end.timestamp()) + _BUDGET_GRACE_S if period is not None else 0
        try:
            reply = await script(
                keys=[rpm_key, tpm_key, budget_key],
                args=[
                    self._now_arg(),
                    limits.rpm or 0,
                    limits.tpm or 0,
                    estimated,
                    budget if budget is not None else -1,
                    seed,
                    expire_at,
                ],
            )
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return None
        return SharedVerdict(
            admitted=reply[0] == 1,
            over_budget=reply[1] == 1,
            rpm_level=float(reply[2]),
            tpm_level=float(reply[3]),
            used=int(reply[4]),
        )

    async def settle(
        self, limits: KeyLimits, delta: int, period_id: str, *, requests: int = 0
    ) -> bool:
        """Correct the TPM bucket and budget counter by `delta` tokens and the RPM
        bucket by `requests` (-1 gives one back); False when Redis failed."""
        script = self._settle_script
        if script is None or not self._up:
            return False
        rpm_key, tpm_key, budget_prefix = self._key_names(limits.key_id)
        try:
            await script(
                keys=[tpm_key, budget_prefix + period_id, rpm_key],
                args=[
                    self._now_arg(),
                    limits.tpm or 0,
                    delta,
                    1 if period_id else 0,
                    limits.rpm or 0,
                    requests,
                ],
            )
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return False
        return True
