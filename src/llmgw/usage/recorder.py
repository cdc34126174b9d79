"""Recording per-request usage without ever making a request wait for the store.

The router calls `record()` once per finished request: it appends to a bounded
in-memory queue and returns, never blocking and never raising. `run()` (a
guarded background task) takes up to `batch_size` records at a time, waiting at
most `flush_interval` seconds for a batch to fill once it has one record, and
writes each batch with one `record_batch` call. A failed write is retried with
exponential backoff; after `retry_attempts` failures the batch is dropped,
counted and logged, and the next batch starts afresh.

Shutdown: once the HTTP servers have drained, `await close()` writes everything
still queued (without waiting for batches to fill) and returns; `run()` then
returns too. Records arriving after `close()` has returned are dropped and
counted as `closed`.

Not guaranteed: that every request is recorded. When the store is slower than
the traffic for long enough to fill the queue, or down longer than the retries
last, records are dropped (and counted in `llmgw_usage_dropped_total`). Nor
exactly-once: a write whose commit succeeded but whose answer was lost is
retried and counted twice. Usage is for reports and budgets, not billing to the
token.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry

from llmgw.store import InvalidValue, StoreError, UsageRecord
from llmgw.usage.metrics import DropReason, UsageMetrics

log = logging.getLogger("llmgw.usage")


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
    ) -> None:
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
        self.metrics = UsageMetrics(registry=registry, queued=lambda: len(self._pending))

    @property
    def queued(self) -> int:
        """Records waiting to be written."""
        return len(self._pending)

    def record(self, rec: UsageRecord) -> None:
        """Queue one record for writing; never blocks, never raises."""
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

    async def _write(self, batch: list[UsageRecord]) -> None:
        delay = self._retry_backoff
        for attempt in range(1, self._retry_attempts + 1):
            try:
                await self._repo.record_batch(batch)
            except InvalidValue as exc:
                # The same batch would fail the same way again.
                self.metrics.write_errors.inc()
                self._give_up(batch, f"the store refused it: {exc}")
                return
            except StoreError as exc:
                self.metrics.write_errors.inc()
                if attempt == self._retry_attempts:
                    self._give_up(batch, f"{attempt} attempts failed, the last with: {exc}")
                    return
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
                if len(self._pending) < self._queue_size // 2:
                    self._full_logged = False  # log the next overflow again, not every refill
                return

    def _give_up(self, batch: list[UsageRecord], why: str) -> None:
        lost = len(batch)
        if self._closing:
            # Shutting down with the store failing: do not retry batch after batch.
            lost += len(self._pending)
            self._pending.clear()
        self._drop("write_failed", lost)
        log.error("dropped %d usage records: %s", lost, why)

    def _drop(self, reason: DropReason, count: int) -> None:
        self.metrics.dropped[reason].inc(count)
