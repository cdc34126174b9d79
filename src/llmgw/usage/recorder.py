"""Recording per-request usage without ever making a request wait for the store.

The router calls `record()` once per finished request: it appends to a bounded
in-memory queue and returns, never blocking and never raising. `run()` (a
guarded background task) takes up to `batch_size` records at a time, waiting at
most `flush_interval` seconds for a batch to fill once it has one record, and
writes each batch with one `record_batch` call. A failed write is retried with
exponential backoff; after `retry_attempts` failures with the store unreachable
the batch is dropped, counted and logged, and the next batch starts afresh.

One bad record never costs its neighbours theirs. A batch the store refuses for
its data (`InvalidValue`: a record it cannot hold, or the database refusing
one), or that keeps failing with the store reachable, is split in halves, each
written on its own and split again while it fails, until the one record that
cannot be written is alone: it is dropped, logged at error with its request id,
key, model and route, and counted (`llmgw_usage_dropped_total{reason="refused"}`).
A bad record in a batch of 500 costs about 18 more writes.

Budgets (`unwritten_tokens`): the tokens of every record not in the store (queued,
being written, or dropped for any reason) are kept per key and UTC hour, so the
budget source (`llmgw.usage.budget`) adds them to what the store reports and a
key's budget counts what it was served even when its records could not be written.
Dropped records' tokens are kept for `_KEEP_LOST` (longer than a month, the
longest budget period).

A record for a catalog LoRA adapter is given its base model (`base_of`, the catalog
as it is when the request is recorded) unless the router named one.

Shutdown: once the HTTP servers have drained, `await close()` writes everything
still queued (without waiting for batches to fill) and returns; `run()` then
returns too. Records arriving after `close()` has returned are dropped and
counted as `closed`.

Not guaranteed: that every request is recorded. When the store is slower than
the traffic for long enough to fill the queue, or down longer than the retries
last, records are dropped (and counted in `llmgw_usage_dropped_total`). Nor
exactly-once: a write whose commit succeeded but whose answer was lost is
retried and counted twice. Usage is for reports and budgets, not billing to the
token. Nor, for budgets, across a restart: tokens of records that were never
written are forgotten with the process, and a batch committed while a budget is
being re-read may count twice in that budget until its next refresh.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Protocol

from prometheus_client import CollectorRegistry

from llmgw.store import InvalidValue, StoreError, StoreUnavailable, UsageRecord
from llmgw.usage.metrics import DropReason, UsageMetrics

log = logging.getLogger("llmgw.usage")

_HOUR = 3600
# How long the tokens of records that were never written keep counting in budgets
# (in hours): past the longest budget period (a month), plus a day.
_KEEP_LOST = 32 * 24


class UsageSink(Protocol):
    """Where batches go (`UsageRepository` is one)."""

    async def record_batch(self, records: Sequence[UsageRecord]) -> None: ...


class UsageRecorder:
    """A bounded queue of usage records and the loop that writes them in batches."""

    def __init__(
        self,
        *,
        repo: UsageSink,
        registry: CollectorRegistry,
        queue_size: int = 10000,
        batch_size: int = 500,
        flush_interval: float = 0.5,
        retry_attempts: int = 5,
        retry_backoff: float = 0.5,
        retry_backoff_max: float = 10.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        base_of: Callable[[str], str | None] = lambda model: None,
    ) -> None:
        """`base_of(model)`: the base model of a catalog LoRA adapter (None for any
        other name)."""
        if queue_size < 1 or batch_size < 1 or flush_interval < 0 or retry_attempts < 1:
            raise ValueError(
                "UsageRecorder needs queue_size >= 1, batch_size >= 1, flush_interval >= 0 "
                f"and retry_attempts >= 1; got {queue_size}, {batch_size}, {flush_interval}, "
                f"{retry_attempts}"
            )
        self._repo = repo
        self._queue_size = queue_size
        self._batch_size = batch_size
        self._flush_interval = flush_interval
        self._retry_attempts = retry_attempts
        self._retry_backoff = retry_backoff
        self._retry_backoff_max = retry_backoff_max
        self._sleep = sleep
        self._base_of = base_of
        self._pending: deque[UsageRecord] = deque()
        # Set by record() once `_want` records are pending: the writer waits on it.
        self._wake = asyncio.Event()
        self._want = 1
        self._closing = False
        self._closed = False
        self._running = False
        self._stopped = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._full_logged = False
        # key id -> UTC hour (hours since the epoch) -> tokens of records not in the store.
        self._unwritten: dict[str, dict[int, int]] = {}
        self.metrics = UsageMetrics(registry=registry, queued=lambda: len(self._pending))

    @property
    def queued(self) -> int:
        """Records waiting to be written."""
        return len(self._pending)

    def unwritten_tokens(self, key_id: str, since: datetime) -> int:
        """Tokens of `key_id`'s records not in the store (queued, being written, or
        dropped), from the UTC hour containing `since` on, as the store counts them."""
        hours = self._unwritten.get(key_id)
        if not hours:
            return 0
        first = int(since.timestamp()) // _HOUR
        return sum(tokens for hour, tokens in hours.items() if hour >= first)

    def record(self, rec: UsageRecord) -> None:
        """Queue one record for writing; never blocks, never raises."""
        if rec.key_id is not None and rec.ts.tzinfo is not None:
            self._count_unwritten(rec, 1)
        if self._closed:
            self._drop("closed", 1)
            return
        if rec.ts.tzinfo is None:
            self._drop("invalid", 1)
            log.warning("usage record %s dropped: its timestamp has no time zone", rec.request_id)
            return
        if len(self._pending) >= self._queue_size:
            self._drop("queue_full", 1)
            if not self._full_logged:
                self._full_logged = True
                log.warning(
                    "usage queue is full (%d records): dropping usage records until the "
                    "store catches up; llmgw_usage_dropped_total counts them",
                    self._queue_size,
                )
            return
        if not rec.base:
            base = self._base_of(rec.model)
            if base:
                rec = dataclasses.replace(rec, base=base)
        self._pending.append(rec)
        if len(self._pending) >= self._want:
            self._wake.set()

    async def run(self) -> None:
        """Write queued records in batches until `close()` has flushed them all."""
        if self._running:
            raise RuntimeError("UsageRecorder.run() is already running")
        self._running = True
        self._stopped.clear()
        try:
            while await self._wait_for_batch():
                await self._write_next()
        finally:
            self._running = False
            self._stopped.set()

    async def close(self) -> None:
        """Write everything queued, then return; call it after the router has stopped.

        Does not wait for batches to fill. If the store is down, the first batch
        that exhausts its retries drops the rest of the queue with it, so
        shutdown is not held up batch after batch.
        """
        self._closing = True
        self._wake.set()
        # Writing here too (not only in run()) makes close() work whether run()
        # is running, finished, cancelled or never started; the lock keeps one
        # writer at a time and the batches in order.
        while self._pending:
            await self._write_next()
        if self._running:
            await self._stopped.wait()
        self._closed = True

    async def _wait_for_batch(self) -> bool:
        """Wait until a batch is due; False once closing with nothing left."""
        while not self._pending:
            if self._closing:
                return False
            self._want = 1
            self._wake.clear()
            await self._wake.wait()
        if len(self._pending) < self._batch_size and not self._closing:
            self._want = self._batch_size
            self._wake.clear()
            await self._wake_or_sleep(self._flush_interval)
        return True

    async def _write_next(self) -> None:
        async with self._write_lock:
            count = min(self._batch_size, len(self._pending))
            if count:
                await self._write([self._pending.popleft() for _ in range(count)])

    async def _wake_or_sleep(self, seconds: float) -> None:
        waiter = asyncio.ensure_future(self._wake.wait())
        sleeper = asyncio.ensure_future(self._sleep(seconds))
        try:
            await asyncio.wait((waiter, sleeper), return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            sleeper.cancel()
            await asyncio.gather(waiter, sleeper, return_exceptions=True)

    async def _write(self, batch: list[UsageRecord], *, suspect: bool = False) -> bool:
        """Write `batch`, splitting it around records the store refuses. False when
        it was dropped because the store stayed unreachable.

        `suspect`: a part of a batch that failed already; any failure but the store
        being unreachable splits it at once instead of retrying it.
        """
        delay = self._retry_backoff
        for attempt in range(1, self._retry_attempts + 1):
            try:
                await self._repo.record_batch(batch)
            except InvalidValue as exc:
                # The same batch would fail the same way again.
                self.metrics.write_errors.inc()
                return await self._split(batch, exc)
            except StoreError as exc:
                self.metrics.write_errors.inc()
                reachable = not isinstance(exc, StoreUnavailable)
                if reachable and (suspect or attempt == self._retry_attempts):
                    # The store answers and still fails this batch: look for a bad record.
                    return await self._split(batch, exc)
                if attempt == self._retry_attempts:
                    self._give_up(batch, f"{attempt} attempts failed, the last with: {exc}")
                    return False
                log.warning(
                    "writing %d usage records failed (attempt %d of %d), retrying in %.1fs: %s",
                    len(batch),
                    attempt,
                    self._retry_attempts,
                    delay,
                    exc,
                )
                await self._sleep(delay)
                delay = min(delay * 2, self._retry_backoff_max)
            else:
                self.metrics.written.inc(len(batch))
                for rec in batch:
                    if rec.key_id is not None:
                        self._count_unwritten(rec, -1)
                if len(self._pending) < self._queue_size // 2:
                    self._full_logged = False  # log the next overflow again, not every refill
                return True
        return True  # not reached: the last attempt returns or splits

    async def _split(self, batch: list[UsageRecord], error: StoreError) -> bool:
        """Write the halves of a batch the store refused, down to the one record it
        cannot take, which is dropped; its neighbours are written."""
        if len(batch) == 1:
            self._refuse(batch[0], error)
            return True
        middle = len(batch) // 2
        if not await self._write(batch[:middle], suspect=True):
            # The store became unreachable meanwhile: the rest is lost with the first half.
            self._give_up(batch[middle:], "the store stopped answering while a batch was split")
            return False
        return await self._write(batch[middle:], suspect=True)

    def _refuse(self, rec: UsageRecord, error: StoreError) -> None:
        self._drop("refused", 1)
        self._forget_old_lost()
        log.error(
            "usage record dropped, the store cannot write it: request %s of key %s "
            "(model %r, route %s, status %d, %d prompt + %d completion tokens, still "
            "counted in the key's budget): %s",
            rec.request_id,
            rec.key_id or "none",
            rec.model[:300],
            rec.route or "-",
            rec.status,
            rec.prompt_tokens,
            rec.completion_tokens,
            error,
        )

    def _give_up(self, batch: list[UsageRecord], why: str) -> None:
        lost = len(batch)
        if self._closing:
            # Shutting down with the store failing: do not retry batch after batch.
            lost += len(self._pending)
            self._pending.clear()
        self._drop("write_failed", lost)
        self._forget_old_lost()
        log.error("dropped %d usage records: %s", lost, why)

    def _count_unwritten(self, rec: UsageRecord, sign: int) -> None:
        """Add (sign 1) or take away (-1) a keyed record's tokens in `_unwritten`."""
        tokens = rec.prompt_tokens + rec.completion_tokens
        if tokens <= 0:
            return
        assert rec.key_id is not None
        hour = int(rec.ts.timestamp()) // _HOUR
        hours = self._unwritten.get(rec.key_id)
        if hours is None:
            if sign < 0:
                return
            hours = self._unwritten[rec.key_id] = {}
        left = hours.get(hour, 0) + sign * tokens
        if left > 0:
            hours[hour] = left
        else:
            hours.pop(hour, None)
            if not hours:
                del self._unwritten[rec.key_id]

    def _forget_old_lost(self) -> None:
        """Stop counting dropped records older than any budget period."""
        if not self._unwritten:
            return
        oldest = max(max(hours) for hours in self._unwritten.values()) - _KEEP_LOST
        for key_id, hours in tuple(self._unwritten.items()):
            for hour in [h for h in hours if h < oldest]:
                del hours[hour]
            if not hours:
                del self._unwritten[key_id]

    def _drop(self, reason: DropReason, count: int) -> None:
        self.metrics.dropped[reason].inc(count)
