"""Recording per-request usage and reading it back from hourly and daily roll-ups.

`record_batch` writes the raw rows and adds the same requests to `usage_hourly`
and `usage_daily` in one transaction, so the three never disagree. The batch is
summed in Python first (one upsert row per hour or day, key and model), and each
statement is sent as one executemany: a batch of 500 requests is three
statements, not 1,500. Upserts are sorted by their primary key so concurrent
writers on PostgreSQL take row locks in the same order and cannot deadlock on
each other.

Reports (`query`, `tokens_used`) read only the roll-ups, so they stay fast and
keep working after `prune_raw` has deleted old raw rows. A report that is not by
hour reads the whole UTC days of its range from `usage_daily` and only the hours
at either end from `usage_hourly`: "the last 30 days by model" reads about 30
rows per key and model instead of 720.

A record the database could not hold is refused before anything is sent:
`record_batch` raises `InvalidValue` naming the record (its request id) and the
field (a string longer than its column or holding a NUL or a lone surrogate, a
count outside 0..2^31-1, a latency that is not a finite number). A batch the
database itself refuses for its data (a data or integrity error) raises
`InvalidValue` too, so the caller knows that retrying the same batch is in vain
and can split it to find the record (`llmgw.usage.recorder` does).

A record for a LoRA adapter names its base (`UsageRecord.base`); the batch keeps it
in `usage_bases`, one row per adapter (the latest request's base wins), and a report
by model gives each adapter's row its base (`UsageRow.base`).

Not guaranteed: exactly-once recording. A batch that fails is not retried here,
and a batch retried by the caller after an ambiguous failure (the commit
happened, the answer was lost) is counted twice. Resolution is one hour: a report
cannot split an hour.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Select,
    Table,
    cast,
    delete,
    func,
    select,
    type_coerce,
    union_all,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql.dml import Insert

from llmgw.store.engine import transaction
from llmgw.store.errors import InvalidValue, StoreError
from llmgw.store.models import (
    MAX_END_USER_CHARS,
    MAX_MODEL_CHARS,
    USAGE_DIMENSIONS,
    UsageDimension,
    UsageRecord,
    UsageRow,
    require_aware,
    truncate_to_hour,
)
from llmgw.store.tables import (
    UTCDateTime,
    api_keys,
    usage_bases,
    usage_daily,
    usage_end_users,
    usage_hourly,
    usage_records,
)

# The roll-ups' key_id for requests made without a key (open mode).
NO_KEY = ""
# What the usage tables' columns hold (tables.py), checked before a batch is sent.
_REQUEST_ID_CHARS = 200
_KEY_ID_CHARS = 32
_ENDPOINT_CHARS = 200
_ROUTE_CHARS = 64
# A version name (`versions[].name`), as its column holds it.
_VERSION_CHARS = 64
_MAX_INT = 2**31 - 1  # status and token counts are 32-bit integers on PostgreSQL
_SUMMED = ("requests", "errors", "prompt_tokens", "completion_tokens", "latency_ms_sum")
_DIMENSION_OF = {"team_id": "team", "key_id": "key", "end_user": "end-user", "model": "model"}
_DAY = timedelta(days=1)
_LAST_HOUR = timedelta(hours=23)  # from midnight to the day's last hour


class UsageRepository:
    """Usage records and their hourly roll-ups."""

    def __init__(self, *, engine: AsyncEngine) -> None:
        self._engine = engine
        self._upsert_hourly = _upsert(engine.dialect.name, usage_hourly)
        self._upsert_daily = _upsert(engine.dialect.name, usage_daily)
        self._upsert_end_users = _upsert(engine.dialect.name, usage_end_users)
        self._upsert_bases = _replace(engine.dialect.name, usage_bases)

    async def record_batch(self, records: Sequence[UsageRecord]) -> None:
        """Store the records and add them to the hourly roll-ups, atomically.

        `InvalidValue` when a record cannot be stored (named in the message) or
        the database refuses the batch's data: nothing of the batch is written.
        """
        if not records:
            return
        for record in records:
            _check_record(record)
        raw = [_raw_row(r) for r in records]
        hourly = _roll_up(records, "hour", truncate_to_hour)
        daily = _roll_up(records, "day", truncate_to_day)
        end_users = _roll_up_end_users(records)
        bases = _bases(records)
        what = f"recording {len(records)} usage records"
        try:
            async with transaction(self._engine, what) as conn:
                await conn.execute(usage_records.insert(), raw)
                await conn.execute(self._upsert_hourly, hourly)
                await conn.execute(self._upsert_daily, daily)
                if end_users:
                    await conn.execute(self._upsert_end_users, end_users)
                if bases:
                    await conn.execute(self._upsert_bases, bases)
        except IntegrityError as exc:
            raise InvalidValue(
                f"{what} failed: the database refused a record ({exc.orig})"
            ) from exc
        except StoreError as exc:
            if _refused_data(exc):
                raise InvalidValue(f"{exc}; a record of the batch cannot be stored") from exc
            raise

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
                await conn.exec_driver_sql("ANALYZE usage_daily")
                await conn.exec_driver_sql("ANALYZE usage_records")

    async def tokens_used(self, key_id: str, since: datetime) -> int:
        """Prompt + completion tokens of `key_id` from the hour containing `since` on.

        Whole hours: `since` is truncated to the start of its UTC hour, so a window
        that starts mid-hour also counts that hour's earlier requests. Budget
        periods start on the hour (midnight, first of the month), where this is exact.
        """
        require_aware("since", since)
        rows = await self.query(key_id=key_id, since=since, group_by=())
        return sum(r.prompt_tokens + r.completion_tokens for r in rows)

    async def team_tokens_used(self, team_id: str, since: datetime) -> int:
        """Prompt + completion tokens of the keys that belong to team `team_id` now,
        from the hour containing `since` on (whole hours, as `tokens_used`)."""
        require_aware("since", since)
        rows = await self.query(team_id=team_id, since=since, group_by=())
        return sum(r.prompt_tokens + r.completion_tokens for r in rows)

    async def end_user_tokens_used(self, key_id: str, end_user: str, since: datetime) -> int:
        """Prompt + completion tokens of end user `end_user` of key `key_id` from the hour
        containing `since` on (whole hours, as `tokens_used`)."""
        require_aware("since", since)
        rows = await self.query(key_id=key_id, end_user=end_user, since=since, group_by=())
        return sum(r.prompt_tokens + r.completion_tokens for r in rows)

    async def query(
        self,
        *,
        key_id: str | None = None,
        model: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        group_by: Sequence[UsageDimension] = ("key", "model"),
        team_id: str | None = None,
        end_user: str | None = None,
        top: int | None = None,
    ) -> list[UsageRow]:
        """Usage summed from the roll-ups, one row per group, ordered by the groups.

        `key_id=None` means every key, `key_id=""` the requests made without a
        key. `since` is truncated to its hour (that hour is included); an hour is
        included if it starts before `until`. `group_by` is any of "hour" or "day"
        (midnight UTC; the hours at either end of the range count in their days),
        "team" (the team of each key now), "key" and "model"; an empty one gives a
        single total row (none if nothing matched). Without "hour", whole days are
        read from the daily roll-ups. `team_id` keeps the keys that belong to that
        team now (a key moved to another team takes its past usage with it).
        "end-user" (and `end_user`, which keeps one end user) reads the end users'
        hourly roll-up instead: only requests that named an end user are in it.
        `top` keeps only the groups with the most tokens, most first (a page showing
        the top end users reads that many rows, not one per end user).
        """
        dims = _check_dimensions(group_by)
        require_aware("since", since)
        require_aware("until", until)
        dialect = self._engine.dialect.name
        names = [
            name
            for name in ("team_id", "key_id", "end_user", "model")
            if _DIMENSION_OF[name] in dims
        ]
        start = truncate_to_hour(since) if since is not None else None
        if "end-user" in dims or end_user is not None:
            time_name = "hour" if "hour" in dims else "day" if "day" in dims else None
            picked = [time_name, *names] if time_name is not None else names
            parts = [
                _part(
                    dialect,
                    usage_end_users,
                    "hour",
                    start,
                    until,
                    key_id,
                    model,
                    picked,
                    team_id,
                    end_user,
                )
            ]
            names = picked
        elif "hour" in dims:
            parts = [
                _part(
                    dialect,
                    usage_hourly,
                    "hour",
                    start,
                    until,
                    key_id,
                    model,
                    ["hour", *names],
                    team_id,
                )
            ]
            names = ["hour", *names]
        else:
            if "day" in dims:
                names = ["day", *names]
            parts = [
                _part(dialect, table, column, lo, hi, key_id, model, names, team_id)
                for table, column, lo, hi in _split(start, until)
            ]
        source = parts[0].subquery() if len(parts) == 1 else union_all(*parts).subquery()
        grouped = [source.c[name] for name in names]
        stmt = select(*grouped, *_sums(source.c)).group_by(*grouped)
        if top is None:
            stmt = stmt.order_by(*grouped)
        else:
            if top < 1:
                raise InvalidValue(f"top must be at least 1, not {top}")
            tokens = func.sum(source.c.prompt_tokens) + func.sum(source.c.completion_tokens)
            stmt = stmt.order_by(tokens.desc(), *grouped).limit(top)
        async with transaction(self._engine, "reading usage") as conn:
            rows = [row._mapping for row in await conn.execute(stmt)]
            bases: dict[str, str] = {}
            if "model" in dims and rows:
                read = select(usage_bases.c.model, usage_bases.c.base)
                bases = {r.model: r.base for r in await conn.execute(read)}
        return [_usage_row(row, dims, bases) for row in rows if row["requests"]]

    async def requests(
        self,
        *,
        key_id: str | None = None,
        model: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
    ) -> list[UsageRecord]:
        """Single requests' records in [since, until), newest first, at most `limit`.

        Read from the raw records, so only as far back as they are kept (`prune_raw`).
        `key_id=None` means every key, `key_id=""` the requests made without a key.
        """
        require_aware("since", since)
        require_aware("until", until)
        if limit < 1:
            raise InvalidValue(f"limit must be at least 1, not {limit}")
        table = usage_records
        stmt = select(table).order_by(table.c.ts.desc(), table.c.id.desc()).limit(limit)
        if key_id is not None:
            stmt = stmt.where(
                table.c.key_id.is_(None) if key_id == NO_KEY else table.c.key_id == key_id
            )
        if model is not None:
            stmt = stmt.where(table.c.model == model)
        if since is not None:
            stmt = stmt.where(table.c.ts >= since)
        if until is not None:
            stmt = stmt.where(table.c.ts < until)
        async with transaction(self._engine, "reading usage records") as conn:
            rows = [row._mapping for row in await conn.execute(stmt)]
        return [_record(row) for row in rows]


def _record(row: Any) -> UsageRecord:
    return UsageRecord(
        ts=row["ts"],
        request_id=row["request_id"],
        key_id=row["key_id"] or None,
        model=row["model"],
        endpoint=row["endpoint"],
        status=int(row["status"]),
        prompt_tokens=int(row["prompt_tokens"]),
        completion_tokens=int(row["completion_tokens"]),
        latency_ms=float(row["latency_ms"]),
        ttft_ms=None if row["ttft_ms"] is None else float(row["ttft_ms"]),
        streamed=bool(row["streamed"]),
        queue_ms=float(row["queue_ms"] or 0.0),
        route=row["route"] or "",
        continued=int(row["continued"] or 0),
        version=row["version"] or "",
        end_user=row["end_user"] or "",
    )


def _insert(dialect: str, table: Table) -> sqlite.Insert | postgresql.Insert:
    """The dialect's INSERT, which can be made an upsert (ON CONFLICT DO UPDATE)."""
    if dialect == "sqlite":
        return sqlite.insert(table)
    if dialect == "postgresql":
        return postgresql.insert(table)
    raise StoreError(f"usage roll-ups need SQLite or PostgreSQL, not {dialect}")


def _upsert(dialect: str, table: Table) -> Insert:
    stmt = _insert(dialect, table)
    increments = {name: table.c[name] + stmt.excluded[name] for name in _SUMMED}
    # The primary key's columns, in its order: (time, key_id[, end_user], model).
    index = [column for column in table.primary_key.columns]
    return stmt.on_conflict_do_update(index_elements=index, set_=increments)


def truncate_to_day(ts: datetime) -> datetime:
    """Midnight UTC of the day containing `ts` (which must be timezone-aware)."""
    return truncate_to_hour(ts).replace(hour=0)


def _ceil_day(ts: datetime) -> datetime:
    day = truncate_to_day(ts)
    return day if day == ts else day + _DAY


def _split(
    start: datetime | None, until: datetime | None
) -> list[tuple[Table, str, datetime | None, datetime | None]]:
    """The parts of a range [start, until) to read: (table, time column, from, before).

    `start` is on the hour; an hour is in the range when it starts before `until`.
    A day is whole when its last hour (23:00) is in the range, so the days are
    those from the first midnight at or after `start` up to (not including) the
    first midnight whose 23:00 is not before `until`; the hours before and after
    them come from the hourly roll-ups.
    """
    first = _ceil_day(start) if start is not None else None
    end = _ceil_day(until - _LAST_HOUR) if until is not None else None
    if first is not None and end is not None and first >= end:
        return [(usage_hourly, "hour", start, until)]
    parts: list[tuple[Table, str, datetime | None, datetime | None]] = []
    if start is not None and start != first:
        parts.append((usage_hourly, "hour", start, first))
    parts.append((usage_daily, "day", first, end))
    if until is not None and end is not None and end < until:
        parts.append((usage_hourly, "hour", end, until))
    return parts


def _replace(dialect: str, table: Table) -> Insert:
    """An insert that replaces the row of the same primary key (usage_bases: the latest
    base of an adapter wins)."""
    stmt = _insert(dialect, table)
    index = list(table.primary_key.columns)
    changed = {c.name: stmt.excluded[c.name] for c in table.columns if c not in index}
    return stmt.on_conflict_do_update(index_elements=index, set_=changed)


def _bases(records: Sequence[UsageRecord]) -> list[dict[str, Any]]:
    """The base of each adapter in the batch, as its latest record names it; sorted by
    adapter so that concurrent writers lock the rows in one order."""
    latest: dict[str, UsageRecord] = {}
    for r in records:
        if r.base and (r.model not in latest or r.ts >= latest[r.model].ts):
            latest[r.model] = r
    return [
        {"model": model, "base": r.base, "updated_at": r.ts} for model, r in sorted(latest.items())
    ]


def _part(
    dialect: str,
    table: Table,
    column: str,
    lo: datetime | None,
    hi: datetime | None,
    key_id: str | None,
    model: str | None,
    names: Sequence[str],
    team_id: str | None = None,
    end_user: str | None = None,
) -> Select[Any]:
    """The rows of one table in [lo, hi), with the grouped columns ("hour", "day" named so)."""
    picked = [_grouped(dialect, table, column, name) for name in names]
    stmt = select(*picked, *(table.c[name] for name in _SUMMED))
    if "team_id" in names:
        # A row's team is its key's team now.
        stmt = stmt.select_from(table.outerjoin(api_keys, api_keys.c.id == table.c.key_id))
    if key_id is not None:
        stmt = stmt.where(table.c.key_id == key_id)
    if model is not None:
        stmt = stmt.where(table.c.model == model)
    if end_user is not None:
        stmt = stmt.where(table.c.end_user == end_user)
    if team_id is not None:
        stmt = stmt.where(
            table.c.key_id.in_(select(api_keys.c.id).where(api_keys.c.team_id == team_id))
        )
    if lo is not None:
        stmt = stmt.where(table.c[column] >= lo)
    if hi is not None:
        stmt = stmt.where(table.c[column] < hi)
    return stmt


def _check_record(r: UsageRecord) -> None:
    """`InvalidValue` naming the record and field when the database could not hold it."""
    require_aware("UsageRecord.ts", r.ts)
    for name, value, limit in (
        ("request_id", r.request_id, _REQUEST_ID_CHARS),
        ("key_id", r.key_id or "", _KEY_ID_CHARS),
        ("model", r.model, MAX_MODEL_CHARS),
        ("base", r.base, MAX_MODEL_CHARS),
        ("endpoint", r.endpoint, _ENDPOINT_CHARS),
        ("route", r.route, _ROUTE_CHARS),
        ("version", r.version, _VERSION_CHARS),
        ("end_user", r.end_user, MAX_END_USER_CHARS),
    ):
        problem = _string_problem(value, limit)
        if problem is not None:
            raise InvalidValue(
                f"usage record of request {_shown(r.request_id)} cannot be stored: its {name} "
                f"{problem}"
            )
    for name, count in (
        ("status", r.status),
        ("prompt_tokens", r.prompt_tokens),
        ("completion_tokens", r.completion_tokens),
        ("continued", r.continued),
    ):
        if not 0 <= count <= _MAX_INT:
            raise InvalidValue(
                f"usage record of request {_shown(r.request_id)} cannot be stored: its {name} "
                f"{count} is outside 0..{_MAX_INT}"
            )
    for name, ms in (
        ("latency_ms", r.latency_ms),
        ("ttft_ms", r.ttft_ms),
        ("queue_ms", r.queue_ms),
    ):
        if ms is not None and not math.isfinite(ms):
            raise InvalidValue(
                f"usage record of request {_shown(r.request_id)} cannot be stored: its {name} "
                f"is {ms}, not a finite number"
            )


def _string_problem(value: str, limit: int) -> str | None:
    if len(value) > limit:
        return f"is {len(value)} characters long, over its column's {limit}"
    if "\x00" in value:
        return "holds a NUL character, which PostgreSQL text cannot"
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            return "is not valid Unicode (a lone surrogate)"
    return None


def _shown(request_id: str) -> str:
    return repr(request_id[:_REQUEST_ID_CHARS])


def _refused_data(exc: StoreError) -> bool:
    """Whether the database refused the data itself (SQLSTATE class 22: data
    exception; 23: integrity constraint), which no retry of the same batch fixes."""
    cause = exc.__cause__
    orig = getattr(cause, "orig", None) if isinstance(cause, DBAPIError) else None
    state = getattr(orig, "sqlstate", None)
    return isinstance(state, str) and state[:2] in ("22", "23")


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
        "queue_ms": r.queue_ms,
        "route": r.route or None,
        "continued": r.continued or None,
        "version": r.version or None,
        "end_user": r.end_user or None,
    }


def _grouped(dialect: str, table: Table, column: str, name: str) -> ColumnElement[Any]:
    if name == "team_id":
        return api_keys.c.team_id.label("team_id")
    if name == "hour":
        return table.c[column].label("hour")
    if name != "day":
        return table.c[name]
    if column == "day":
        return table.c.day
    # An hour's day. SQLite keeps UTC times as naive text ("2026-01-31 09:00:00.000000").
    hour = table.c.hour
    day: ColumnElement[Any] = (
        func.substr(hour, 1, 10).concat(" 00:00:00.000000")
        if dialect == "sqlite"
        else func.date_trunc("day", hour, "UTC")
    )
    return type_coerce(day, UTCDateTime).label("day")


def _roll_up(
    records: Sequence[UsageRecord], time_column: str, truncate: Callable[[datetime], datetime]
) -> list[dict[str, Any]]:
    sums: dict[tuple[datetime, str, str], list[float]] = {}
    for r in records:
        group = (truncate(r.ts), r.key_id or NO_KEY, r.model)
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
            time_column: moment,
            "key_id": key,
            "model": model,
            "requests": int(acc[0]),
            "errors": int(acc[1]),
            "prompt_tokens": int(acc[2]),
            "completion_tokens": int(acc[3]),
            "latency_ms_sum": acc[4],
        }
        for (moment, key, model), acc in sorted(sums.items(), key=lambda item: item[0])
    ]


def _roll_up_end_users(records: Sequence[UsageRecord]) -> list[dict[str, Any]]:
    """The records that name an end user, summed per hour, key, end user and model."""
    sums: dict[tuple[datetime, str, str, str], list[float]] = {}
    for r in records:
        if not r.end_user:
            continue
        group = (truncate_to_hour(r.ts), r.key_id or NO_KEY, r.end_user, r.model)
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
            "end_user": end_user,
            "model": model,
            "requests": int(acc[0]),
            "errors": int(acc[1]),
            "prompt_tokens": int(acc[2]),
            "completion_tokens": int(acc[3]),
            "latency_ms_sum": acc[4],
        }
        for (hour, key, end_user, model), acc in sorted(sums.items(), key=lambda item: item[0])
    ]


def _sums(columns: Any) -> list[ColumnElement[Any]]:
    out: list[ColumnElement[Any]] = []
    for name in _SUMMED:
        total = func.coalesce(func.sum(columns[name]), 0)
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
    if {"hour", "day"} <= dims:
        raise InvalidValue("group_by takes hour or day, not both")
    return dims


def _usage_row(row: Any, dims: frozenset[UsageDimension], bases: dict[str, str]) -> UsageRow:
    key = row["key_id"] if "key" in dims else None
    model = row["model"] if "model" in dims else None
    return UsageRow(
        hour=row["hour"] if "hour" in dims else None,
        key_id=key or None,
        model=row["model"] if "model" in dims else None,
        requests=int(row["requests"]),
        errors=int(row["errors"]),
        prompt_tokens=int(row["prompt_tokens"]),
        completion_tokens=int(row["completion_tokens"]),
        latency_ms_sum=float(row["latency_ms_sum"]),
        day=row["day"] if "day" in dims else None,
        team_id=row["team_id"] if "team" in dims else None,
        end_user=row["end_user"] if "end-user" in dims else None,
        base=bases.get(model) if model is not None else None,
    )
