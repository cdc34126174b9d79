"""Recording per-request usage and reading it back from hourly roll-ups.

`record_batch` writes the raw rows and adds the same requests to `usage_hourly`
in one transaction, so the two never disagree. The batch is summed in Python
first (one upsert row per hour, key and model), and both statements are sent as
one executemany each: a batch of 500 requests is two statements, not 1,000.
Upserts are sorted by their primary key so concurrent writers on PostgreSQL take
row locks in the same order and cannot deadlock on each other.

Reports (`query`, `tokens_used`) read only the roll-ups, so they stay fast and
keep working after `prune_raw` has deleted old raw rows.

Not guaranteed: exactly-once recording. A batch that fails is not retried here,
and a batch retried by the caller after an ambiguous failure (the commit
happened, the answer was lost) is counted twice. Resolution is one hour: a report
cannot split an hour.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, ColumnElement, cast, delete, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql.dml import Insert

from llmgw.store.engine import transaction
from llmgw.store.errors import InvalidValue, StoreError
from llmgw.store.models import (
    USAGE_DIMENSIONS,
    UsageDimension,
    UsageRecord,
    UsageRow,
    require_aware,
    truncate_to_hour,
)
from llmgw.store.tables import usage_hourly, usage_records

# The roll-ups' key_id for requests made without a key (open mode).
NO_KEY = ""
_SUMMED = ("requests", "errors", "prompt_tokens", "completion_tokens", "latency_ms_sum")


class UsageRepository:
    """Usage records and their hourly roll-ups."""

    def __init__(self, *, engine: AsyncEngine) -> None:
        self._engine = engine
        self._upsert = _hourly_upsert(engine.dialect.name)

    async def record_batch(self, records: Sequence[UsageRecord]) -> None:
        """Store the records and add them to the hourly roll-ups, atomically."""
        if not records:
            return
        for record in records:
            require_aware("UsageRecord.ts", record.ts)
        raw = [_raw_row(r) for r in records]
        hourly = _roll_up(records)
        async with transaction(self._engine, f"recording {len(records)} usage records") as conn:
            await conn.execute(usage_records.insert(), raw)
            await conn.execute(self._upsert, hourly)

    async def prune_raw(self, before: datetime) -> int:
        """Delete raw records older than `before`; roll-ups are kept. Returns the count.

        One DELETE: prune often (e.g. hourly) so each run stays small.
        """
        require_aware("before", before)
        stmt = delete(usage_records).where(usage_records.c.ts < before)
        async with transaction(self._engine, "pruning old usage records") as conn:
            result = await conn.execute(stmt)
        return int(result.rowcount)

    async def refresh_statistics(self) -> None:
        """Let the query planner see how big the usage tables are now.

        Without statistics SQLite answers "last 24 h by key and model" by walking
        the whole (key_id, hour) index of the roll-ups instead of the recent hours
        (measured 4x slower at 2M requests). SQLite: `PRAGMA optimize`, which
        analyzes only what changed enough; PostgreSQL: `ANALYZE` of both tables
        (autovacuum does it too, later).
        """
        async with transaction(self._engine, "refreshing usage statistics") as conn:
            if conn.dialect.name == "sqlite":
                await conn.exec_driver_sql("PRAGMA optimize=0x10002")
            else:
                await conn.exec_driver_sql("ANALYZE usage_hourly")
                await conn.exec_driver_sql("ANALYZE usage_records")

    async def tokens_used(self, key_id: str, since: datetime) -> int:
        """Prompt + completion tokens of `key_id` from the hour containing `since` on.

        Whole hours: `since` is truncated to the start of its UTC hour, so a window
        that starts mid-hour also counts that hour's earlier requests. Budget
        periods start on the hour (midnight, first of the month), where this is exact.
        """
        require_aware("since", since)
        total = func.coalesce(
            func.sum(usage_hourly.c.prompt_tokens + usage_hourly.c.completion_tokens), 0
        )
        stmt = select(cast(total, BigInteger)).where(
            usage_hourly.c.key_id == key_id, usage_hourly.c.hour >= truncate_to_hour(since)
        )
        async with transaction(self._engine, f"summing the tokens of key {key_id}") as conn:
            return int((await conn.execute(stmt)).scalar_one())

    async def query(
        self,
        *,
        key_id: str | None = None,
        model: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        group_by: Sequence[UsageDimension] = ("key", "model"),
    ) -> list[UsageRow]:
        """Usage summed from the roll-ups, one row per group, ordered by the groups.

        `key_id=None` means every key, `key_id=""` the requests made without a
        key. `since` is truncated to its hour (that hour is included); an hour is
        included if it starts before `until`. `group_by` is any of "hour", "key",
        "model"; an empty one gives a single total row (none if nothing matched).
        """
        dims = _check_dimensions(group_by)
        require_aware("since", since)
        require_aware("until", until)
        columns = {
            "hour": usage_hourly.c.hour,
            "key": usage_hourly.c.key_id,
            "model": usage_hourly.c.model,
        }
        grouped = [columns[d] for d in USAGE_DIMENSIONS if d in dims]
        stmt = select(*grouped, *_sums()).group_by(*grouped).order_by(*grouped)
        if key_id is not None:
            stmt = stmt.where(usage_hourly.c.key_id == key_id)
        if model is not None:
            stmt = stmt.where(usage_hourly.c.model == model)
        if since is not None:
            stmt = stmt.where(usage_hourly.c.hour >= truncate_to_hour(since))
        if until is not None:
            stmt = stmt.where(usage_hourly.c.hour < until)
        async with transaction(self._engine, "reading usage") as conn:
            rows = [row._mapping for row in await conn.execute(stmt)]
        return [_usage_row(row, dims) for row in rows if row["requests"]]


def _hourly_upsert(dialect: str) -> Insert:
    stmt: sqlite.Insert | postgresql.Insert
    if dialect == "sqlite":
        stmt = sqlite.insert(usage_hourly)
    elif dialect == "postgresql":
        stmt = postgresql.insert(usage_hourly)
    else:
        raise StoreError(f"usage roll-ups need SQLite or PostgreSQL, not {dialect}")
    increments = {name: usage_hourly.c[name] + stmt.excluded[name] for name in _SUMMED}
    return stmt.on_conflict_do_update(
        index_elements=[usage_hourly.c.hour, usage_hourly.c.key_id, usage_hourly.c.model],
        set_=increments,
    )


def _raw_row(r: UsageRecord) -> dict[str, Any]:
    return {
        "ts": r.ts,
        "request_id": r.request_id,
        "key_id": r.key_id,
        "model": r.model,
        "endpoint": r.endpoint,
        "status": r.status,
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": r.completion_tokens,
        "latency_ms": r.latency_ms,
        "ttft_ms": r.ttft_ms,
        "streamed": r.streamed,
    }


def _roll_up(records: Sequence[UsageRecord]) -> list[dict[str, Any]]:
    sums: dict[tuple[datetime, str, str], list[float]] = {}
    for r in records:
        group = (truncate_to_hour(r.ts), r.key_id or NO_KEY, r.model)
        acc = sums.get(group)
        if acc is None:
            acc = sums[group] = [0, 0, 0, 0, 0.0]
        acc[0] += 1
        acc[1] += 1 if r.status >= 400 else 0
        acc[2] += r.prompt_tokens
        acc[3] += r.completion_tokens
        acc[4] += r.latency_ms
    return [
        {
            "hour": hour,
            "key_id": key,
            "model": model,
            "requests": int(acc[0]),
            "errors": int(acc[1]),
            "prompt_tokens": int(acc[2]),
            "completion_tokens": int(acc[3]),
            "latency_ms_sum": acc[4],
        }
        for (hour, key, model), acc in sorted(sums.items(), key=lambda item: item[0])
    ]


def _sums() -> list[ColumnElement[Any]]:
    out: list[ColumnElement[Any]] = []
    for name in _SUMMED:
        total = func.coalesce(func.sum(usage_hourly.c[name]), 0)
        # PostgreSQL sums bigints as numeric (Decimal); bring them back to integers.
        typed = total if name == "latency_ms_sum" else cast(total, BigInteger)
        out.append(typed.label(name))
    return out


def _check_dimensions(group_by: Sequence[UsageDimension]) -> frozenset[UsageDimension]:
    dims = frozenset(group_by)
    unknown = dims - set(USAGE_DIMENSIONS)
    if unknown or len(dims) != len(group_by):
        raise InvalidValue(
            f"group_by takes distinct values among {', '.join(USAGE_DIMENSIONS)}, "
            f"got {tuple(group_by)!r}"
        )
    return dims


def _usage_row(row: Any, dims: frozenset[UsageDimension]) -> UsageRow:
    key = row["key_id"] if "key" in dims else None
    return UsageRow(
        hour=row["hour"] if "hour" in dims else None,
        key_id=key or None,
        model=row["model"] if "model" in dims else None,
        requests=int(row["requests"]),
        errors=int(row["errors"]),
        prompt_tokens=int(row["prompt_tokens"]),
        completion_tokens=int(row["completion_tokens"]),
        latency_ms_sum=float(row["latency_ms_sum"]),
    )
