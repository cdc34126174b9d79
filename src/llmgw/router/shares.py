"""Fair-share accounting between keys, shared by router processes through Redis.

The queue (`RequestQueue` with a ledger) orders the requests waiting in one
priority class by the work each key was given lately, least first, divided by
the key's weight. This module keeps that count. Work decays: it is counted in
windows of `window` seconds (wall clock, so routers on different hosts agree on
the windows), and a key's count is its current window plus the previous one
weighted by the part of it still inside the last `window` seconds.

With a Redis URL (`limits.redis_url`) every router counts into the same hashes
(`{prefix}{model}:{window}`, a field per key, expiring after three windows): a
charge goes into this process's view at once and into Redis at the next sync;
each sync (every `interval` seconds, off the request path) also reads back the
counts of every model this router charged lately. So a key cannot get a bigger
share by spreading its requests over routers. Without Redis, or while it fails,
the counts are this process's own.

Not guaranteed: exactness. Up to `interval` seconds of other routers' work is
not seen yet; charges that fail to reach Redis are not replayed (they stay in
this process's view until their window ends); a Redis outage is logged once and
again when it ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from llmgw.limits.redis_counters import fail_fast_client

log = logging.getLogger("llmgw.router.shares")

# (model, key) -> work counted in a window
_Counts = dict[tuple[str, str], float]


class ShareLedger:
    """Recent work per key and model; shared through Redis when given a URL."""

    def __init__(
        self,
        *,
        wall_clock: Callable[[], float],
        window: float,
        interval: float,
        redis_url: str | None = None,
        prefix: str = "llmgw:share:",
        timeout: float = 0.5,
    ) -> None:
        self._wall = wall_clock
        self._window = window
        self._interval = interval
        self._prefix = prefix
        self._client: aioredis.Redis | None = None
        if redis_url is not None:
            self._client = fail_fast_client(redis_url, timeout)
        # This process's own counts per window index, and what it has not sent yet.
        self._own: dict[int, _Counts] = {}
        self._pending: dict[int, _Counts] = {}
        # Every router's counts as last read from Redis, per window index.
        self._shared: dict[int, _Counts] = {}
        self._models: set[str] = set()
        self._redis_up = True

    @property
    def shared(self) -> bool:
        return self._client is not None

    def _index(self) -> tuple[int, float]:
        """The current window's index and the fraction of it already gone."""
        position = self._wall() / self._window
        index = int(position)
        return index, position - index

    def charge(self, model: str, key: str, cost: float) -> None:
        """`key` was given `cost` of `model`'s capacity just now."""
        index, _ = self._index()
        slot = (model, key)
        own = self._own.setdefault(index, {})
        own[slot] = own.get(slot, 0.0) + cost
        if self._client is not None:
            pending = self._pending.setdefault(index, {})
            pending[slot] = pending.get(slot, 0.0) + cost
            self._models.add(model)
        for old in [i for i in self._own if i < index - 1]:
            del self._own[old]

    def served(self, model: str, key: str) -> float:
        """`key`'s recent work on `model` (all routers' when shared and Redis is up)."""
        index, gone = self._index()
        slot = (model, key)
        if self._client is not None and self._redis_up and self._shared:
            # Redis holds what was sent; what is still pending is only here.
            current = self._shared.get(index, {}).get(slot, 0.0)
            previous = self._shared.get(index - 1, {}).get(slot, 0.0)
            current += self._pending.get(index, {}).get(slot, 0.0)
            previous += self._pending.get(index - 1, {}).get(slot, 0.0)
        else:
            current = self._own.get(index, {}).get(slot, 0.0)
            previous = self._own.get(index - 1, {}).get(slot, 0.0)
        return current + previous * (1.0 - gone)

    def _key(self, model: str, index: int) -> str:
        return f"{self._prefix}{model}:{index}"

    async def sync(self) -> None:
        """Send pending charges and read every router's counts back (one pipeline)."""
        client = self._client
        if client is None:
            return
        index, _ = self._index()
        pending, self._pending = self._pending, {}
        models = sorted(self._models)
        try:
            async with client.pipeline(transaction=False) as pipe:
                for window, counts in pending.items():
                    for (model, key), cost in counts.items():
                        pipe.hincrbyfloat(self._key(model, window), key, cost)
                        pipe.expire(self._key(model, window), int(self._window * 3) + 1)
                for model in models:
                    pipe.hgetall(self._key(model, index))
                    pipe.hgetall(self._key(model, index - 1))
                replies = await pipe.execute()
        except (RedisError, OSError) as exc:
            if self._redis_up:
                log.warning(
                    "fair-share counts are this router's own: Redis failed (%s); "
                    "retrying every %g s",
                    exc,
                    self._interval,
                )
            self._redis_up = False
            return
        if not self._redis_up:
            log.warning("fair-share counts are shared through Redis again")
        self._redis_up = True
        reads = replies[len(replies) - 2 * len(models) :]
        shared: dict[int, _Counts] = {index: {}, index - 1: {}}
        for number, model in enumerate(models):
            for offset, window in ((0, index), (1, index - 1)):
                raw: dict[bytes, bytes] = reads[2 * number + offset]
                for field, value in raw.items():
                    shared[window][(model, field.decode())] = float(value)
        self._shared = shared
        # A model nobody charged here for two windows is no longer read.
        recent = {m for counts in self._own.values() for m, _ in counts}
        self._models &= recent

    async def run(self) -> None:
        """Sync every `interval` seconds, forever (one task per process)."""
        while True:
            await self.sync()
            await asyncio.sleep(self._interval)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
