"""Usage records, hourly roll-ups, reports, pruning and budget sums, on both databases."""

from __future__ import annotations

import dataclasses
import random
from collections import defaultdict
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine
from store_fixtures import START, StoreTarget, clock_fixture, store_fixture, target_fixture  # noqa: F401

from llmgw.store import InvalidValue, Store, UsageRecord, UsageRepository, UsageRow
from llmgw.store.engine import make_engine
from llmgw.store.urls import normalize_url

H0 = START  # 12:00
H1 = START + timedelta(hours=1)  # 13:00
KEYS = ("key_aaaaaaaaaaaaaaaa", "key_bbbbbbbbbbbbbbbb", None)
MODELS = ("llama-8b", "qwen-7b")


def records(
    n: int, *, seed: int = 1, start: datetime = H0 + timedelta(minutes=30)
) -> list[UsageRecord]:
    """n requests spread over an hour from `start` (so across two clock hours)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        out.append(
            UsageRecord(
                ts=start + timedelta(seconds=rng.uniform(0, 3599)),
                request_id=f"req-{seed}-{i}",
                key_id=rng.choice(KEYS),
                model=rng.choice(MODELS),
                endpoint=f"ep-{i % 3}",
                status=rng.choice((200, 200, 200, 429, 500)),
                prompt_tokens=rng.randint(1, 2000),
                completion_tokens=rng.randint(0, 500),
                latency_ms=rng.uniform(5, 900),
                ttft_ms=rng.uniform(1, 50) if i % 2 else None,
                streamed=bool(i % 2),
            )
        )
    return out


def expected(recs: list[UsageRecord], dims: tuple[str, ...]) -> list[UsageRow]:
    sums: dict[tuple[Any, ...], list[Any]] = defaultdict(lambda: [0, 0, 0, 0, 0.0])
    for r in recs:
        hour = r.ts.replace(minute=0, second=0, microsecond=0)
        group = (
            hour if "hour" in dims else None,
            r.key_id if "key" in dims else None,
            r.model if "model" in dims else None,
            hour.replace(hour=0) if "day" in dims else None,
        )
        acc = sums[group]
        acc[0] += 1
        acc[1] += r.status >= 400
        acc[2] += r.prompt_tokens
        acc[3] += r.completion_tokens
        acc[4] += r.latency_ms
    rows = [UsageRow(*group[:3], *acc, day=group[3]) for group, acc in sums.items()]
    return sorted(rows, key=lambda r: (r.hour or r.day or H0, r.key_id or "", r.model or ""))


def assert_rows(actual: list[UsageRow], wanted: list[UsageRow]) -> None:
    assert [(r.hour, r.day, r.key_id, r.model, r.requests, r.errors) for r in actual] == [
        (r.hour, r.day, r.key_id, r.model, r.requests, r.errors) for r in wanted
    ]
    assert [(r.prompt_tokens, r.completion_tokens) for r in actual] == [
        (r.prompt_tokens, r.completion_tokens) for r in wanted
    ]
    for got, want in zip(actual, wanted, strict=True):
        assert got.latency_ms_sum == pytest.approx(want.latency_ms_sum)


async def test_roll_ups_sum_each_hour_key_and_model(store: Store) -> None:
    recs = records(300)
    await store.usage.record_batch(recs[:120])
    await store.usage.record_batch(recs[120:])  # the second batch adds to existing rows

    rows = await store.usage.query(group_by=("hour", "key", "model"))
    assert_rows(rows, expected(recs, ("hour", "key", "model")))
    assert {r.hour for r in rows} == {H0, H1}
    assert {r.key_id for r in rows} == set(KEYS)
    assert all(r.hour is not None and r.hour.tzinfo == UTC for r in rows)


async def test_reports_group_by_any_dimensions(store: Store) -> None:
    recs = records(200)
    await store.usage.record_batch(recs)
    for dims in [("key", "model"), ("key",), ("model",), ("hour",), ("model", "hour")]:
        assert_rows(await store.usage.query(group_by=dims), expected(recs, dims))  # type: ignore[arg-type]
    [total] = await store.usage.query(group_by=())
    assert total.requests == 200
    assert total.total_tokens == sum(r.prompt_tokens + r.completion_tokens for r in recs)
    assert total.mean_latency_ms == pytest.approx(sum(r.latency_ms for r in recs) / 200)


async def test_reports_filter_by_key_model_and_time(store: Store) -> None:
    recs = records(200)
    await store.usage.record_batch(recs)
    key_a = KEYS[0]

    only_a = await store.usage.query(key_id=key_a, group_by=("key", "model"))
    assert_rows(only_a, expected([r for r in recs if r.key_id == key_a], ("key", "model")))

    open_mode = await store.usage.query(key_id="", group_by=("key",))
    assert_rows(open_mode, expected([r for r in recs if r.key_id is None], ("key",)))

    qwen = await store.usage.query(model="qwen-7b", group_by=("model",))
    assert_rows(qwen, expected([r for r in recs if r.model == "qwen-7b"], ("model",)))

    # since is truncated to its hour; until excludes hours starting at or after it.
    second_hour = await store.usage.query(since=H1 + timedelta(minutes=59), group_by=("hour",))
    assert_rows(second_hour, expected([r for r in recs if r.ts >= H1], ("hour",)))
    first_hour = await store.usage.query(since=H0, until=H1, group_by=("hour",))
    assert_rows(first_hour, expected([r for r in recs if r.ts < H1], ("hour",)))

    assert await store.usage.query(key_id="key_nobody") == []
    assert await store.usage.query(since=H1 + timedelta(hours=1), group_by=()) == []


async def test_bad_report_arguments_are_refused(store: Store) -> None:
    with pytest.raises(InvalidValue, match="group_by"):
        await store.usage.query(group_by=("key", "key"))
    with pytest.raises(InvalidValue, match="group_by"):
        await store.usage.query(group_by=("endpoint",))  # type: ignore[arg-type]
    with pytest.raises(InvalidValue, match="hour or day, not both"):
        await store.usage.query(group_by=("hour", "day"))
    with pytest.raises(InvalidValue, match=r"since=.* has no time zone"):
        await store.usage.query(since=datetime(2025, 1, 1))
    naive = UsageRecord(datetime(2025, 1, 1), "r", None, "m", "e", 200, 1, 1, 1.0, None, False)
    with pytest.raises(InvalidValue, match=r"UsageRecord\.ts"):
        await store.usage.record_batch([naive])
    await store.usage.record_batch([])
    assert await store.usage.query() == []


async def test_single_requests_come_back_newest_first_with_their_queue_wait(
    store: Store,
) -> None:
    recs = [
        dataclasses.replace(r, queue_ms=float(i), route="/v1/chat/completions", continued=i % 3)
        for i, r in enumerate(records(60))
    ]
    await store.usage.record_batch(recs)
    newest = sorted(recs, key=lambda r: r.ts, reverse=True)

    got = await store.usage.requests(limit=10)
    assert got == newest[:10]  # every field, queue_ms, route and continued included
    assert all(r.ts.tzinfo is not None for r in got)
    assert await store.usage.requests(limit=1000) == newest

    key_a = KEYS[0]
    assert await store.usage.requests(key_id=key_a) == [r for r in newest if r.key_id == key_a]
    assert await store.usage.requests(key_id="") == [r for r in newest if r.key_id is None]
    qwen = [r for r in newest if r.model == "qwen-7b"]
    assert await store.usage.requests(model="qwen-7b") == qwen
    # since is exact here (raw records), not rounded to its hour.
    cut = newest[20].ts
    assert await store.usage.requests(since=cut) == newest[:21]
    assert await store.usage.requests(until=cut) == newest[21:]

    await store.usage.prune_raw(H1 + timedelta(days=1))
    assert await store.usage.requests() == []
    with pytest.raises(InvalidValue, match="limit must be at least 1"):
        await store.usage.requests(limit=0)
    with pytest.raises(InvalidValue, match=r"since=.* has no time zone"):
        await store.usage.requests(since=datetime(2025, 1, 1))


async def test_pruning_raw_records_keeps_the_roll_ups(store: Store) -> None:
    recs = records(200)
    await store.usage.record_batch(recs)
    before = await store.usage.query(group_by=("hour", "key", "model"))

    pruned = await store.usage.prune_raw(H1)
    assert pruned == sum(r.ts < H1 for r in recs)
    assert await store.usage.query(group_by=("hour", "key", "model")) == before
    # What is left is the second hour's records: pruning everything counts them.
    assert await store.usage.prune_raw(H1 + timedelta(days=1)) == len(recs) - pruned
    assert await store.usage.prune_raw(H1 + timedelta(days=1)) == 0
    assert await store.usage.query(group_by=("hour", "key", "model")) == before


async def test_tokens_used_counts_whole_hours_of_one_key(store: Store) -> None:
    recs = records(200)
    await store.usage.record_batch(recs)
    key_b = KEYS[1]

    def tokens(since: datetime) -> int:
        return sum(
            r.prompt_tokens + r.completion_tokens
            for r in recs
            if r.key_id == key_b and r.ts >= since.replace(minute=0, second=0, microsecond=0)
        )

    assert await store.usage.tokens_used(key_b, H0) == tokens(H0) > 0
    # Mid-hour: the whole 13:00 hour counts, including its requests before 13:40.
    assert await store.usage.tokens_used(key_b, H1 + timedelta(minutes=40)) == tokens(H1)
    assert tokens(H1) < tokens(H0)
    assert await store.usage.tokens_used(key_b, H1 + timedelta(hours=1)) == 0
    assert await store.usage.tokens_used("key_nobody", H0) == 0


@pytest.fixture
async def counted(
    store: Store, store_target: StoreTarget
) -> AsyncIterator[tuple[UsageRepository, list[bool]]]:
    """A usage repository on its own engine that notes each statement sent (executemany?)."""
    engine: AsyncEngine = make_engine(normalize_url(store_target.url), schema=store_target.schema)
    sent: list[bool] = []

    def note(*args: Any) -> None:
        sent.append(bool(args[-1]))  # the executemany flag

    event.listen(engine.sync_engine, "before_cursor_execute", note)
    try:
        yield UsageRepository(engine=engine), sent
    finally:
        await engine.dispose()


async def test_a_batch_of_500_is_three_bulk_statements(
    counted: tuple[UsageRepository, list[bool]], store: Store
) -> None:
    usage, sent = counted
    recs = records(500, seed=7)
    await usage.record_batch(recs)
    # Raw rows, then the hourly and the daily roll-up upserts, each one executemany.
    assert sent == [True, True, True]
    assert_rows(
        await store.usage.query(group_by=("hour", "key", "model")),
        expected(recs, ("hour", "key", "model")),
    )


async def test_refresh_statistics_runs_on_both_stores(store: Store) -> None:
    # The planner statistics exist afterwards (SQLite: sqlite_stat1; PostgreSQL: pg_stats).
    await store.usage.record_batch(
        [
            UsageRecord(
                ts=START, request_id=f"r{i}", key_id="k", model="m", endpoint="e",
                status=200, prompt_tokens=1, completion_tokens=1, latency_ms=1.0,
                ttft_ms=None, streamed=False,
            )
            for i in range(50)
        ]
    )  # fmt: skip
    await store.usage.refresh_statistics()
    rows = await store.usage.query(group_by=("model",))
    assert rows[0].requests == 50


def in_range(r: UsageRecord, since: datetime | None, until: datetime | None) -> bool:
    """The query's rule: whole hours from the one containing `since`, up to `until`."""
    hour = r.ts.replace(minute=0, second=0, microsecond=0)
    start = since.replace(minute=0, second=0, microsecond=0) if since is not None else None
    return (start is None or hour >= start) and (until is None or hour < until)


async def test_ranges_across_days_sum_to_the_requests_in_them(store: Store) -> None:
    # Five days of requests. Ranges start and end mid-hour, on the hour, at midnight
    # and open-ended, so each of them reads whole days from the daily roll-ups and
    # the hours at either end from the hourly ones; the sums must not tell, by day
    # neither (the hours at either end are summed into their days).
    rng = random.Random(11)
    begin = START - timedelta(days=3, hours=7)
    recs = [
        dataclasses.replace(r, ts=begin + timedelta(seconds=rng.uniform(0, 5 * 86400)))
        for r in records(800, seed=11)
    ]
    for i in range(0, len(recs), 200):
        await store.usage.record_batch(recs[i : i + 200])
    midnight = datetime(START.year, START.month, START.day, tzinfo=UTC)
    moments = [
        None,
        midnight - timedelta(days=2),
        midnight - timedelta(days=1, minutes=30),
        midnight + timedelta(hours=1, minutes=15),
        midnight + timedelta(days=1, hours=23),
        midnight + timedelta(days=1, hours=23, minutes=1),
        midnight + timedelta(days=2),
        START,
    ]
    for since in moments:
        for until in moments:
            if since is not None and until is not None and since >= until:
                continue
            for dims in ((), ("key",), ("model",), ("key", "model"), ("day",), ("day", "key")):
                wanted = [r for r in recs if in_range(r, since, until)]
                got = await store.usage.query(since=since, until=until, group_by=dims)
                assert_rows(got, expected(wanted, dims) if wanted else [])


async def test_a_report_over_whole_days_reads_the_daily_roll_ups(store_target: StoreTarget) -> None:
    store = await store_target.open()
    await store.upgrade()
    engine = make_engine(normalize_url(store_target.url), schema=store_target.schema)
    read: list[str] = []

    @event.listens_for(engine.sync_engine, "before_cursor_execute")
    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        read.append(" ".join(t for t in ("usage_hourly", "usage_daily") if t in statement))

    usage = UsageRepository(engine=engine)
    try:
        await usage.record_batch(records(50))
        await usage.query(since=START - timedelta(days=30), until=START, group_by=("model",))
        await usage.query(since=START - timedelta(hours=6), until=START, group_by=("model",))
        await usage.query(since=START - timedelta(days=30), until=START, group_by=("hour",))
        # 30 days: the hours of the first and the last day, the days between; six hours
        # and anything by hour: the hours alone.
        assert read[-3:] == ["usage_hourly usage_daily", "usage_hourly", "usage_hourly"]
    finally:
        await engine.dispose()
        await store.close()


async def test_end_users_are_rolled_up_per_hour_key_end_user_and_model(store: Store) -> None:
    base = records(40, seed=7)
    named = [
        dataclasses.replace(r, end_user=("ann", "bob", "", "=evil\\x00")[i % 4])
        for i, r in enumerate(base)
    ]
    await store.usage.record_batch(named[:25])
    await store.usage.record_batch(named[25:])
    rows = await store.usage.query(group_by=("key", "end-user"))
    sums: dict[tuple[str | None, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for r in named:
        if r.end_user:
            acc = sums[(r.key_id, r.end_user)]
            acc[0] += 1
            acc[1] += 1 if r.status >= 400 else 0
            acc[2] += r.prompt_tokens + r.completion_tokens
    assert {(r.key_id, r.end_user): [r.requests, r.errors, r.total_tokens] for r in rows} == sums
    # One end user, by hour; and a budget's sum for one key's end user.
    ann = await store.usage.query(end_user="ann", group_by=("hour",))
    assert sum(r.requests for r in ann) == sum(1 for r in named if r.end_user == "ann")
    key = KEYS[0]
    assert key is not None
    used = await store.usage.end_user_tokens_used(key, "bob", H0)
    assert used == sum(
        r.prompt_tokens + r.completion_tokens
        for r in named
        if r.key_id == key and r.end_user == "bob"
    )
    # The raw records keep it too; requests naming none are in no end-user row.
    latest = await store.usage.requests(limit=100)
    assert {r.end_user for r in latest} == {"ann", "bob", "", "=evil\\x00"}
    assert all(r.end_user for r in rows)


async def test_an_end_user_the_column_cannot_hold_is_refused(store: Store) -> None:
    (record,) = records(1)
    for bad in ("x" * 257, "a\x00b"):
        with pytest.raises(InvalidValue, match="its end_user"):
            await store.usage.record_batch([dataclasses.replace(record, end_user=bad)])


async def test_top_keeps_the_groups_with_the_most_tokens(store: Store) -> None:
    recs = [dataclasses.replace(r, end_user=f"u{i % 7}") for i, r in enumerate(records(70))]
    await store.usage.record_batch(recs)
    every = await store.usage.query(group_by=("end-user",))
    top = await store.usage.query(group_by=("end-user",), top=3)
    most = sorted(every, key=lambda r: r.total_tokens, reverse=True)[:3]
    assert [(r.end_user, r.total_tokens) for r in top] == [
        (r.end_user, r.total_tokens) for r in most
    ]
    with pytest.raises(InvalidValue, match="top must be at least 1"):
        await store.usage.query(group_by=("end-user",), top=0)


async def test_a_report_by_model_says_each_adapters_base_the_latest_request_named(
    store: Store,
) -> None:
    plain = records(1)[0]
    sql = dataclasses.replace(plain, request_id="sql-1", model="sql-lora", base="llama-8b")
    moved = dataclasses.replace(
        sql, request_id="sql-2", ts=sql.ts + timedelta(seconds=1), base="qwen-7b"
    )
    await store.usage.record_batch([plain, sql])
    rows = await store.usage.query(group_by=("model",))
    assert {r.model: r.base for r in rows} == {plain.model: None, "sql-lora": "llama-8b"}
    # The adapter now serves over another base: its rows say the latest.
    await store.usage.record_batch([moved])
    rows = await store.usage.query(group_by=("model",))
    assert {r.model: (r.base, r.requests) for r in rows} == {
        plain.model: (None, 1),
        "sql-lora": ("qwen-7b", 2),
    }
    # Not grouped by model: no base to say.
    assert [r.base for r in await store.usage.query(group_by=("key",))] == [None] * len(
        await store.usage.query(group_by=("key",))
    )
    with pytest.raises(InvalidValue, match="its base"):
        await store.usage.record_batch([dataclasses.replace(sql, base="b" * 300)])
