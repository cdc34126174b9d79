"""Deleting raw usage records older than the retention period, on a schedule.

Only raw per-request rows are pruned; the hourly roll-ups that reports and
budgets read are kept. Each run is one DELETE, so running often keeps it small.
Several servers sharing a store may all prune; the deletes overlap harmlessly.

Not guaranteed: that a row is deleted the moment it passes the retention
period; it goes at the next run (within `interval` seconds).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Protocol

from llmgw.store import StoreError

log = logging.getLogger("llmgw.usage")

# After a failed run, this many retries come sooner than `interval`.
EARLY_RETRIES = 3
EARLY_RETRY_SECONDS = 30.0


class RawUsagePruner(Protocol):
    """What the pruner needs of the store (`UsageRepository` is one)."""

    async def prune_raw(self, before: datetime) -> int: ...

    async def refresh_statistics(self) -> None: ...


class RetentionPruner:
    """Every `interval` seconds, delete raw usage records older than `retention`."""

    def __init__(
        self,
        *,
        repo: RawUsagePruner,
        retention: timedelta,
        interval: float,
        wall_clock: Callable[[], datetime],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if retention <= timedelta(0) or interval <= 0:
            raise ValueError(
                f"RetentionPruner needs retention > 0 and interval > 0; got {retention}, {interval}"
            )
        self._repo = repo
        self._retention = retention
        self._interval = interval
        self._wall_clock = wall_clock
        self._sleep = sleep

    async def prune_once(self) -> int:
        """Delete what is older than the retention now; returns how many rows went."""
        cutoff = self._wall_clock() - self._retention
        deleted = await self._repo.prune_raw(cutoff)
        # The tables changed by a day's requests and the deletion: keep plans good.
        await self._repo.refresh_statistics()
        if deleted:
            log.info(
                "pruned %d raw usage records older than %s", deleted, f"{cutoff:%Y-%m-%d %H:%M} UTC"
            )
        return deleted

    async def run(self) -> None:
        """Prune now and then every `interval` seconds, forever.

        A store error is logged and the next run tries again; anything else ends
        the loop for the guard to report.
        """
        failures = 0
        while True:
            delay = self._interval
            try:
                await self.prune_once()
                failures = 0
            except StoreError as exc:
                failures += 1
                # The first run comes at start-up, when the server writes most (the
                # CA, migrations, the lease): a locked SQLite file then is expected
                # and worth a quick retry, not an hour's wait and a warning.
                if failures <= EARLY_RETRIES:
                    delay = min(self._interval, EARLY_RETRY_SECONDS)
                level = logging.INFO if failures == 1 else logging.WARNING
                log.log(
                    level, "pruning raw usage records failed, retrying in %.0fs: %s", delay, exc
                )
            await self._sleep(delay)
