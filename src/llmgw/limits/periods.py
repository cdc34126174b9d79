"""UTC calendar periods for token budgets: the current day or month.

A budget covers [start, end) of one UTC day or month; at `end` it starts over.
Period ids ("d2025-03-01", "m2025-03") name per-period counters in Redis. Does
not know about time zones other than UTC, by design: every router process
must agree on where a period ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from llmgw.limits.model import BudgetPeriod


@dataclass(frozen=True, slots=True)
class Period:
    kind: BudgetPeriod
    id: str
    start: datetime
    end: datetime

    def contains(self, at: datetime) -> bool:
        return self.start <= at < self.end


def period_containing(kind: BudgetPeriod, at: datetime) -> Period:
    """The UTC day or month containing `at` (an aware datetime; naive means UTC)."""
    at = at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
    if kind == "day":
        start = datetime(at.year, at.month, at.day, tzinfo=UTC)
        return Period(kind, f"d{start:%Y-%m-%d}", start, start + timedelta(days=1))
    start = datetime(at.year, at.month, 1, tzinfo=UTC)
    end = datetime(at.year + at.month // 12, at.month % 12 + 1, 1, tzinfo=UTC)
    return Period(kind, f"m{start:%Y-%m}", start, end)
