"""Token budgets per key and UTC period, as known to this process.

Tokens used in the period = what the budget source (the usage store, fed by
every router process) reported when last asked, plus what this process settled
since that answer, plus the estimates of its requests still in flight. The
source is asked once when a (key, period) is first seen, awaited on that
request, and then every `refresh_s` in the background so other processes'
usage counts; requests never wait for a refresh.

Does not guarantee a hard cap: a budget check admits a request while the key
is under budget, so each request in flight can overshoot by its own size, and
between refreshes this process does not see other processes' usage (Redis, when
configured, closes that gap). A refresh that fails keeps the last known value.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from llmgw.limits.model import END_USER_PREFIX, BudgetSource
from llmgw.limits.periods import Period
from llmgw.limits.tasks import TaskSet

log = logging.getLogger("llmgw.limits")


class BudgetEntry:
    """One key's budget usage in one period."""

    __slots__ = ("base", "inflight", "key_id", "period", "refresh_at", "refreshing", "settled")

    def __init__(self, key_id: str, period: Period, base: int, refresh_at: float) -> None:
        self.key_id = key_id
        self.period = period
        self.base = base  # the source's answer
        self.settled = 0  # actual tokens this process settled since that answer
        self.inflight = 0  # estimates of admitted, not yet settled requests
        self.refresh_at = refresh_at
        self.refreshing = False

    @property
    def used(self) -> int:
        return self.base + self.settled + self.inflight


class BudgetTracker:
    """Budget entries of all keys, loaded and refreshed from the budget source."""

    def __init__(
        self,
        *,
        source: BudgetSource,
        clock: Callable[[], float],
        refresh_s: float,
        tasks: TaskSet,
        max_end_users: int = 100_000,
    ) -> None:
        """`max_end_users`: how many end users' entries are kept (the oldest loaded is
        dropped past it and re-read from the source when its end user is back)."""
        self._source = source
        self._clock = clock
        self._refresh_s = refresh_s
        self._tasks = tasks
        # One entry per key: the current period's replaces the previous one's.
        self._entries: dict[str, BudgetEntry] = {}
        # End users' entries, apart: clients make end users up, keys are few.
        self._user_entries: dict[str, BudgetEntry] = {}
        self._max_end_users = max_end_users
        self._loading: dict[tuple[str, str], asyncio.Task[BudgetEntry]] = {}

    def lookup(self, key_id: str, period: Period, now: float) -> BudgetEntry | None:
        """The entry if already loaded for this period; starts a refresh when due."""
        entry = self._table(key_id).get(key_id)
        if entry is None or entry.period.id != period.id:
            return None
        if now >= entry.refresh_at and not entry.refreshing:
            entry.refreshing = True
            self._tasks.spawn(self._refresh(entry), name=f"llmgw-budget-refresh-{key_id}")
        return entry

    async def load(self, key_id: str, period: Period) -> BudgetEntry:
        """Ask the source for the key's usage in the period (one query for concurrent callers).

        Errors of the source propagate to every caller waiting on this load;
        the next request tries again.
        """
        task = self._loading.get((key_id, period.id))
        if task is None:
            task = self._tasks.spawn(self._load(key_id, period), name=f"llmgw-budget-load-{key_id}")
            self._loading[(key_id, period.id)] = task
        # Shielded: a client that disconnects must not cancel the load for the others.
        return await asyncio.shield(task)

    async def _load(self, key_id: str, period: Period) -> BudgetEntry:
        try:
            base = await self._source.tokens_used(key_id, period.start)
        finally:
            del self._loading[(key_id, period.id)]
        entry = BudgetEntry(key_id, period, base, self._clock() + self._refresh_s)
        table = self._table(key_id)
        current = table.get(key_id)
        if current is not None and current.period.id == period.id:
            return current
        # A slow load of a period that has already ended must not replace the new one.
        if current is None or current.period.start < period.start:
            table[key_id] = entry
            if table is self._user_entries and len(table) > self._max_end_users:
                del table[next(iter(table))]
        return entry

    async def _refresh(self, entry: BudgetEntry) -> None:
        settled_before = entry.settled
        try:
            base = await self._source.tokens_used(entry.key_id, entry.period.start)
        except Exception as exc:
            # The source is a Protocol and may fail in its own ways; enforcing the
            # last known usage is better than failing requests over a stale number.
            log.warning(
                "budget of key %r not refreshed: the budget source failed (%s); "
                "using the last known usage (%d tokens) and trying again in %gs",
                entry.key_id,
                exc,
                entry.used,
                self._refresh_s,
                exc_info=exc,
            )
            return
        else:
            entry.base = base
            # Settled before the query started is now in the source's answer.
            entry.settled -= settled_before
        finally:
            entry.refreshing = False
            entry.refresh_at = self._clock() + self._refresh_s

    @staticmethod
    def charge(entry: BudgetEntry, estimated: int) -> None:
        entry.inflight += estimated

    def settle(self, key_id: str, period_id: str, estimated: int, actual: int) -> None:
        """Replace an admitted request's estimate by its actual usage."""
        entry = self._table(key_id).get(key_id)
        if entry is not None and entry.period.id == period_id:
            entry.inflight -= estimated
            entry.settled += actual

    def _table(self, key_id: str) -> dict[str, BudgetEntry]:
        return self._user_entries if key_id.startswith(END_USER_PREFIX) else self._entries
