"""Checking the API key of each request, from an in-memory cache kept fresh by polling.

A cache hit costs a SHA-256, a dict lookup and a constant-time compare: no I/O.
A miss reads the key by its hash from the store, once for all concurrent
requests with the same key (single flight), and caches the answer: found keys
(revoked ones too, so they are refused without I/O) in a bounded LRU, unknown
hashes in a short negative cache so a flood of bad keys does not reach the
database on every request.

Freshness: `run()` polls `changed_since` every `refresh_interval` seconds and
updates cached keys that were updated, revoked or rotated, and forgets negative
entries for keys that were just created, so changes made by any process take effect
here within about one interval. The poll cursor trails the newest `updated_at`
seen by `CURSOR_OVERLAP`, as the store asks, so a change committed late or
stamped by a slightly slow clock is still read. As a backstop, a cached key is
re-read from the store after `max_age` seconds.

Not guaranteed: revocation while the store is unreachable. Cached keys keep
working (with the state last read) until the store answers again; keys not in
the cache get `AuthUnavailable`. Nor that a key created elsewhere works at once:
a hash looked up just before the key existed is refused until the negative entry
expires or the next poll, whichever comes first.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Protocol

from llmgw.auth.errors import AuthUnavailable, ExpiredKey, InvalidKey, MissingKey
from llmgw.auth.principal import ANONYMOUS, Principal, principal_for
from llmgw.auth.tokens import hash_secret
from llmgw.store import ApiKey, StoreError

log = logging.getLogger("llmgw.auth")

CURSOR_OVERLAP = timedelta(seconds=10)


class KeyLookup(Protocol):
    """What the authenticator reads from the store (`KeyRepository` is one)."""

    async def get_by_hash(self, secret_hash: str) -> ApiKey | None: ...

    async def changed_since(self, ts: datetime) -> list[ApiKey]: ...


class Authenticator(Protocol):
    """Turns the key a request carries into a `Principal`, or raises an `AuthError`."""

    async def authenticate(self, token: str | None) -> Principal: ...


class OpenAuthenticator:
    """Auth mode `open`: every request is `ANONYMOUS` (all models, no limits, not admin)."""

    async def authenticate(self, token: str | None) -> Principal:
        return ANONYMOUS


@dataclass(slots=True)
class _Entry:
    key: ApiKey
    # None when the stored limits cannot be turned into KeyLimits: such a key is refused.
    principal: Principal | None
    fetched_at: float


class KeyAuthenticator:
    """API key authentication against the store, with a polled in-memory cache.

    `clock` is monotonic seconds (cache ages), `wall_clock` aware UTC datetimes
    (key expiry, poll cursor). Call `authenticate` per request and run `run()`
    as a guarded background task for as long as requests are served.
    """

    def __init__(
        self,
        *,
        keys: KeyLookup,
        clock: Callable[[], float],
        wall_clock: Callable[[], datetime],
        refresh_interval: float = 2.0,
        cache_size: int = 10000,
        negative_ttl: float = 2.0,
        max_age: float = 60.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if refresh_interval <= 0 or negative_ttl < 0 or max_age <= 0 or cache_size < 1:
            raise ValueError(
                "KeyAuthenticator needs refresh_interval > 0, negative_ttl >= 0, "
                f"max_age > 0 and cache_size >= 1; got {refresh_interval}, {negative_ttl}, "
                f"{max_age}, {cache_size}"
            )
        self._keys = keys
        self._clock = clock
        self._wall_clock = wall_clock
        self._refresh_interval = refresh_interval
        self._cache_size = cache_size
        self._negative_ttl = negative_ttl
        self._max_age = max_age
        self._sleep = sleep
        self._cache: OrderedDict[str, _Entry] = OrderedDict()
        self._hash_of: dict[str, str] = {}  # key id -> hash it is cached under
        self._negative: OrderedDict[str, float] = OrderedDict()  # hash -> expiry (clock)
        self._inflight: dict[str, asyncio.Task[_Entry | None]] = {}
        self._cursor = wall_clock() - CURSOR_OVERLAP
        self._refresh_failing = False

    @property
    def cached_keys(self) -> int:
        """How many keys are in the positive cache (for tests and debugging)."""
        return len(self._cache)

    async def authenticate(self, token: str | None) -> Principal:
        """The principal of `token`; `MissingKey`, `InvalidKey`, `ExpiredKey` or
        `AuthUnavailable` otherwise."""
        if not token:
            raise MissingKey()
        digest = hash_secret(token)
        now = self._clock()
        entry = self._cache.get(digest)
        if entry is not None and now - entry.fetched_at < self._max_age:
            self._cache.move_to_end(digest)
        else:
            expiry = self._negative.get(digest)
            if expiry is not None and now < expiry:
                raise InvalidKey()
            entry = await self._lookup(digest)
            if entry is None:
                raise InvalidKey()
        return self._admit(entry, digest)

    def _admit(self, entry: _Entry, digest: str) -> Principal:
        key = entry.key
        # The dict lookup already matched; compare in constant time anyway so no
        # future change to the lookup path can turn into a timing oracle.
        if not hmac.compare_digest(key.secret_hash, digest):
            raise InvalidKey()
        if key.revoked_at is not None or entry.principal is None:
            raise InvalidKey()
        if key.expires_at is not None and self._wall_clock() >= key.expires_at:
            raise ExpiredKey(
                f"API key expired at {key.expires_at:%Y-%m-%d %H:%M:%S} UTC; "
                "ask an administrator for a new key"
            )
        return entry.principal

    async def _lookup(self, digest: str) -> _Entry | None:
        task = self._inflight.get(digest)
        if task is None:
            task = asyncio.ensure_future(self._fetch(digest))
            self._inflight[digest] = task
            task.add_done_callback(partial(self._lookup_done, digest))
        # Shielded: a client that disconnects must not cancel the lookup that
        # other requests with the same key are waiting for.
        return await asyncio.shield(task)

    def _lookup_done(self, digest: str, task: asyncio.Task[_Entry | None]) -> None:
        if self._inflight.get(digest) is task:
            del self._inflight[digest]
        if not task.cancelled():
            # Retrieved here so an error nobody waited for is not reported twice.
            task.exception()

    async def _fetch(self, digest: str) -> _Entry | None:
        try:
            key = await self._keys.get_by_hash(digest)
        except StoreError as exc:
            log.warning("cannot check an API key that is not cached: %s", exc)
            raise AuthUnavailable() from exc
        if key is None:
            self._remember_unknown(digest)
            return None
        return self._put(key, refreshed=False)

    def _remember_unknown(self, digest: str) -> None:
        if self._negative_ttl <= 0:
            return
        self._negative[digest] = self._clock() + self._negative_ttl
        self._negative.move_to_end(digest)
        while len(self._negative) > self._cache_size:
            self._negative.popitem(last=False)

    def _put(self, key: ApiKey, *, refreshed: bool) -> _Entry | None:
        """Cache `key` under its current hash, dropping what was cached for its old one.

        A poll (`refreshed`) only updates keys already cached: caching every key
        that changes would let a bulk import push the busy keys out.
        """
        old_hash = self._hash_of.get(key.id)
        if old_hash is not None and old_hash != key.secret_hash:
            other = self._cache[old_hash]
            if other.key.updated_at > key.updated_at:
                return None  # a stale read of a secret that has been rotated since
            del self._cache[old_hash]  # rotated: the old secret is dead
            del self._hash_of[key.id]
        self._negative.pop(key.secret_hash, None)
        current = self._cache.get(key.secret_hash)
        if current is not None and current.key.updated_at > key.updated_at:
            # A poll stored a newer version while this read was in flight.
            return current
        if current is None and refreshed:
            return None
        entry = _Entry(key=key, principal=self._principal(key), fetched_at=self._clock())
        self._cache[key.secret_hash] = entry
        self._hash_of[key.id] = key.secret_hash
        if current is None:
            while len(self._cache) > self._cache_size:
                _, evicted = self._cache.popitem(last=False)
                if self._hash_of.get(evicted.key.id) == evicted.key.secret_hash:
                    del self._hash_of[evicted.key.id]
        return entry

    @staticmethod
    def _principal(key: ApiKey) -> Principal | None:
        try:
            return principal_for(key)
        except ValueError as exc:
            log.error("API key %s (%r) is refused: %s", key.id, key.name, exc)
            return None

    async def refresh(self) -> int:
        """Poll the store once for changed keys and apply them; returns how many changed.

        Raises the store's `StoreError` if it does not answer; `run()` logs and retries.
        """
        changed = await self._keys.changed_since(self._cursor)
        for key in changed:
            self._put(key, refreshed=True)
        if changed:
            newest = max(key.updated_at for key in changed)
            self._cursor = max(self._cursor, newest - CURSOR_OVERLAP)
        return len(changed)

    async def run(self) -> None:
        """Poll for key changes every `refresh_interval` seconds, forever.

        A store that does not answer is logged (once per outage) and retried at
        the next interval; any other error ends the loop for the guard to report.
        """
        while True:
            await self._sleep(self._refresh_interval)
            try:
                await self.refresh()
            except StoreError as exc:
                if not self._refresh_failing:
                    log.warning(
                        "cannot refresh API keys (revocations are not seen until it works "
                        "again): %s",
                        exc,
                    )
                self._refresh_failing = True
                continue
            if self._refresh_failing:
                log.info("refreshing API keys works again")
                self._refresh_failing = False
