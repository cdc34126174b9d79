"""The reserve's per-key counts, shared by router processes through Redis.

The queue's reserve (`RequestQueue` with `reserve` above 0) keeps a model's
last free places for keys holding less than their fair share of it, and
decides that from each key's requests in flight and waiting. Alone, a router
counts only its own, so a key that spreads its requests over several routers
looks under its share on each. With a Redis URL (`limits.redis_url`) every
router publishes its counts and reads the others', every `interval` seconds,
off the request path:

- `{prefix}counts:{router}`: a hash, a field per model this router has keys
  active on (JSON: key -> [in flight, waiting, weight]), expiring
  `expire_after` seconds after the router last wrote it, so the counts of a
  router that stopped or died vanish by themselves (a router that stops
  cleanly deletes them at once);
- `{prefix}routers`: the set of router ids that published lately (ids whose
  hash is gone are dropped by the next reader).

Each sync writes this router's counts and reads every other router's for the
models it wrote (two pipelined round trips). The queue reads the result as a
dict (`elsewhere(model)`): key -> the other routers' counts summed.

Not guaranteed: exactness. Other routers' counts are as they were at their
last sync and at ours (up to about two `interval`s old); a dead router's
counts are still counted until they expire. Without Redis, or while it fails,
`elsewhere` is empty and the reserve counts this router's requests only; an
outage is logged once and again when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from redis.exceptions import RedisError

from llmgw.limits.redis_counters import fail_fast_client

log = logging.getLogger("llmgw.router.flow_share")


@dataclass(frozen=True, slots=True)
class FlowCount:
    """One key's requests on one model: in flight, waiting in the queue, and its weight."""

    in_flight: int
    waiting: int
    weight: float


# model -> key -> counts
FlowCounts = Mapping[str, Mapping[str, FlowCount]]

_NOWHERE: Mapping[str, FlowCount] = MappingProxyType({})


def nowhere(model: str) -> Mapping[str, FlowCount]:
    """Other routers' counts when nothing is shared: none."""
    return _NOWHERE


class FlowShare:
    """This router's reserve counts out to Redis, the other routers' back in."""

    def __init__(
        self,
        *,
        redis_url: str,
        router_id: str,
        interval: float,
        expire_after: float,
        prefix: str = "llmgw:flows:",
        timeout: float = 0.5,
    ) -> None:
        self._id = router_id
        self._interval = interval
        self._ttl_ms = max(1, int(expire_after * 1000))
        self._prefix = prefix
        self._client = fail_fast_client(redis_url, timeout)
        self._counts: Callable[[], FlowCounts] = lambda: {}
        # Other routers' counts as last read: model -> key -> summed counts.
        self._elsewhere: dict[str, dict[str, FlowCount]] = {}
        # Models this router's hash holds, and router ids found gone at the last read.
        self._published: set[str] = set()
        self._stale: list[str] = []
        self._redis_up = True

    def watch(self, counts: Callable[[], FlowCounts]) -> None:
        """Publish what `counts()` returns (the queue's own counts) at every sync."""
        self._counts = counts

    def elsewhere(self, model: str) -> Mapping[str, FlowCount]:
        """Every other router's counts of `model`'s keys as last read (empty while
        Redis fails)."""
        return self._elsewhere.get(model, _NOWHERE)

    def _hash(self, router_id: str) -> str:
        return f"{self._prefix}counts:{router_id}"

    async def sync(self) -> None:
        """Write this router's counts and read the other routers' (off the request path)."""
        own = {model: keys for model, keys in self._counts().items() if keys}
        gone = sorted(self._published - own.keys())
        if not own and not gone and not self._stale:
            self._elsewhere = {}
            return
        # A pipeline that fails may still have written: such models are deleted
        # once they are gone, like those written for sure.
        self._published |= own.keys()
        try:
            elsewhere = await self._exchange(own, gone)
        except (RedisError, OSError) as exc:
            if self._redis_up:
                log.warning(
                    "the reserve counts this router's requests only: Redis failed (%s); "
                    "retrying every %g s",
                    exc,
                    self._interval,
                )
            self._redis_up = False
            self._elsewhere = {}
            return
        if not self._redis_up:
            log.warning("the reserve counts every router's requests through Redis again")
        self._redis_up = True
        self._published = set(own)
        self._elsewhere = elsewhere

    async def _exchange(
        self, own: Mapping[str, Mapping[str, FlowCount]], gone: list[str]
    ) -> dict[str, dict[str, FlowCount]]:
        mine = self._hash(self._id)
        routers = f"{self._prefix}routers"
        models = sorted(own)
        async with self._client.pipeline(transaction=False) as pipe:
            if self._stale:
                pipe.srem(routers, *self._stale)
            if gone:
                pipe.hdel(mine, *gone)
            if models:
                pipe.hset(mine, mapping={m: _encode(own[m]) for m in models})
                pipe.pexpire(mine, self._ttl_ms)
                pipe.sadd(routers, self._id)
                pipe.pexpire(routers, self._ttl_ms)
                pipe.smembers(routers)
            replies = await pipe.execute()
        self._stale = []
        if not models:
            return {}
        others = sorted(m.decode() for m in replies[-1] if m.decode() != self._id)
        if not others:
            return {}
        async with self._client.pipeline(transaction=False) as pipe:
            for other in others:
                pipe.hmget(self._hash(other), models)
                pipe.exists(self._hash(other))
            replies = await pipe.execute()
        elsewhere: dict[str, dict[str, FlowCount]] = {}
        for number, other in enumerate(others):
            blobs: list[bytes | None] = replies[2 * number]
            if not replies[2 * number + 1]:
                self._stale.append(other)
                continue
            for model, blob in zip(models, blobs, strict=True):
                if blob is None:
                    continue
                counts = elsewhere.setdefault(model, {})
                for key, count in _decode(blob).items():
                    seen = counts.get(key)
                    counts[key] = count if seen is None else _sum(seen, count)
        return elsewhere

    async def run(self) -> None:
        """Sync every `interval` seconds, forever (one task per process)."""
        while True:
            await self.sync()
            await asyncio.sleep(self._interval)

    async def close(self) -> None:
        """Delete this router's counts (its requests have ended) and close the client."""
        if self._published and self._redis_up:
            with contextlib.suppress(RedisError, OSError):
                await self._client.delete(self._hash(self._id))
        await self._client.aclose()


def _sum(one: FlowCount, other: FlowCount) -> FlowCount:
    return FlowCount(
        one.in_flight + other.in_flight,
        one.waiting + other.waiting,
        max(one.weight, other.weight),
    )


def _encode(counts: Mapping[str, FlowCount]) -> str:
    return json.dumps(
        {key: [c.in_flight, c.waiting, c.weight] for key, c in counts.items()},
        separators=(",", ":"),
    )


def _decode(blob: bytes) -> dict[str, FlowCount]:
    """A router's counts of one model; none when they do not parse (written by
    something else than this version of llmgw: they cannot be counted)."""
    try:
        raw = json.loads(blob)
        return {
            str(key): FlowCount(int(value[0]), int(value[1]), float(value[2]))
            for key, value in raw.items()
        }
    except (ValueError, TypeError, LookupError, AttributeError):
        return {}
