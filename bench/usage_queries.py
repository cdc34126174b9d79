"""Usage queries over a seeded store: the roll-ups against the hourly ones alone and the raw rows.

One run seeds a fresh store (a temporary SQLite file, or a private schema in
the PostgreSQL at 127.0.0.1:5432, database `test`, user `postgres`) with
`--rows` synthetic requests spread over the last 90 days: ~200 keys whose
traffic follows a Zipf-like curve, each using 1-3 of ~20 models, with
log-normal token counts, 2% errors and 60% streamed answers, in batches of
5,000 in time order, as the router flushes them. The newest
`--record-batch-rows` (100,000) go through `store.usage.record_batch`, onto the
full tables, which gives the write path's throughput; the older ones are
inserted in bulk (the driver's executemany, then one `INSERT INTO usage_hourly
SELECT ... GROUP BY` and one into `usage_daily` from it) only so that a 2M-row
store is built in about a minute.
`--record-batch-rows` equal to `--rows` writes everything through `record_batch`.

Then four typical questions are asked 20 times each, first through
`store.usage.query` (whole days from `usage_daily`, the hours at either end
from `usage_hourly`), then as `SELECT ... FROM usage_hourly WHERE hour >= ...
GROUP BY ...` (what llmgw ran before it kept daily roll-ups), then as the
equivalent `SELECT ... FROM usage_records WHERE ts >= ... GROUP BY ...` (what a
gateway without roll-ups does). The three answers are checked to agree group by
group.
Last, `prune_raw` deletes the raw rows older than 30 days, and the 90-day total
by model is asked again and must not change. On SQLite, question (a) is then
timed once more after a one-off `ANALYZE` (llmgw runs none), with the query
plans before and after, because without statistics SQLite picks a worse index
for it. The result is a markdown section on stdout (progress on stderr);
nothing in the repository is written, and the SQLite file and the PostgreSQL
schema are removed at the end.

Not guaranteed: numbers are comparable only between runs on the same, otherwise
idle machine, with the same PostgreSQL settings. The workload is synthetic;
a store with more keys x models per hour has more roll-up rows and a smaller
advantage (the "raw rows per roll-up row" line says how much there was to fold).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import datetime
import functools
import itertools
import math
import os
import platform
import random
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy import event, text
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from llmgw.store import (
    Store,
    UsageDimension,
    UsageRecord,
    UsageRow,
    open_store,
    store_url,
    truncate_to_hour,
)
from llmgw.store.engine import make_engine
from llmgw.store.urls import normalize_url

PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
BATCH = 5_000
REPEATS = 20
DAYS = 90
RETENTION_DAYS = 30
N_KEYS = 200
MODELS = (
    "llama-3.1-8b-instruct",
    "llama-3.1-70b-instruct",
    "llama-3.3-70b-instruct",
    "qwen2.5-7b-instruct",
    "qwen2.5-32b-instruct",
    "qwen2.5-72b-instruct",
    "qwen2.5-coder-32b",
    "mistral-7b-instruct-v0.3",
    "mistral-small-24b",
    "mixtral-8x7b-instruct",
    "gemma-2-9b-it",
    "gemma-2-27b-it",
    "gemma-3-12b-it",
    "phi-3.5-mini-instruct",
    "phi-4",
    "deepseek-r1-distill-qwen-32b",
    "deepseek-coder-v2-lite",
    "granite-3.1-8b-instruct",
    "bge-m3",
    "nomic-embed-text-v1.5",
)
TABLES = ("usage_records", "usage_hourly", "usage_daily")
EMBEDDERS = frozenset({"bge-m3", "nomic-embed-text-v1.5"})
# One request as the columns of `usage_records` (and the fields of `UsageRecord`).
RAW_COLUMNS = (
    "ts",
    "request_id",
    "key_id",
    "model",
    "endpoint",
    "status",
    "prompt_tokens",
    "completion_tokens",
    "latency_ms",
    "ttft_ms",
    "streamed",
)
Raw = tuple[Any, ...]


# --- the synthetic workload -------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """Who sends what: keys with Zipf-like traffic, each tied to a few models."""

    keys: tuple[str, ...]
    key_cum_weights: tuple[float, ...]
    # key -> (its models, favourite first; cumulative traffic shares)
    key_models: dict[str, tuple[tuple[str, ...], tuple[float, ...]]]

    @classmethod
    def build(cls, rng: random.Random) -> Workload:
        keys = tuple(f"key_{rng.getrandbits(48):012x}" for _ in range(N_KEYS))
        weights = [1.0 / (rank + 1) ** 1.1 for rank in range(N_KEYS)]
        # Popular models are popular with everyone: a key picks 1-3 models, biased
        # towards the head of the list, and sends most traffic to its first one.
        model_weights = [1.0 / (rank + 1) ** 0.8 for rank in range(len(MODELS))]
        key_models = {}
        for key in keys:
            chosen: list[str] = []
            for _ in range(rng.choice((1, 1, 2, 2, 3))):
                model = rng.choices(MODELS, weights=model_weights)[0]
                if model not in chosen:
                    chosen.append(model)
            share = [0.7 if i == 0 else 0.3 / (len(chosen) - 1) for i in range(len(chosen))]
            key_models[key] = (tuple(chosen), tuple(itertools.accumulate(share)))
        return cls(
            keys=keys,
            key_cum_weights=tuple(itertools.accumulate(weights)),
            key_models=key_models,
        )

    @property
    def busiest_key(self) -> str:
        return self.keys[0]

    @property
    def busiest_model(self) -> str:
        return self.key_models[self.busiest_key][0][0]

    def batches(self, rows: int, end: datetime.datetime, rng: random.Random) -> Iterator[list[Raw]]:
        """`rows` requests over the `DAYS` days before `end`, oldest batch first.

        Each batch covers its own slice of time and is sorted, as the router
        flushes finished requests: the tables grow at their end.
        """
        start = end - timedelta(days=DAYS)
        span = (end - start).total_seconds()
        done = 0
        while done < rows:
            n = min(BATCH, rows - done)
            lo, hi = span * done / rows, span * (done + n) / rows
            offsets = sorted(rng.uniform(lo, hi) for _ in range(n))
            keys = rng.choices(self.keys, cum_weights=self.key_cum_weights, k=n)
            yield [
                self._request(start + timedelta(seconds=o), k, rng)
                for o, k in zip(offsets, keys, strict=True)
            ]
            done += n

    def _request(self, ts: datetime.datetime, key: str, rng: random.Random) -> Raw:
        models, cum_share = self.key_models[key]
        model = models[bisect.bisect(cum_share, rng.random() * cum_share[-1])]
        prompt = min(int(math.exp(rng.gauss(6.0, 1.0))) + 1, 32_000)
        status = 200 if rng.random() >= 0.02 else rng.choice((400, 429, 500, 503))
        if model in EMBEDDERS:
            completion, streamed, endpoint = 0, False, "/v1/embeddings"
        else:
            completion = min(int(math.exp(rng.gauss(5.3, 0.9))), 8_000) if status == 200 else 0
            streamed = rng.random() < 0.6
            endpoint = "/v1/chat/completions"
        ttft = 40.0 + prompt * 0.05 + rng.expovariate(1 / 30) if streamed and completion else None
        latency = 30.0 + prompt * 0.05 + completion * 12.0 + rng.expovariate(1 / 50)
        request_id = f"chatcmpl-{rng.getrandbits(96):024x}"
        return (
            ts,
            request_id,
            key,
            model,
            endpoint,
            status,
            prompt,
            completion,
            latency,
            ttft,
            streamed,
        )


def usage_record(row: Raw) -> UsageRecord:
    return UsageRecord(**dict(zip(RAW_COLUMNS, row, strict=True)))


# --- the questions ----------------------------------------------------------------


@dataclass(frozen=True)
class Question:
    """One usage question, asked of the roll-ups and of the raw rows."""

    label: str
    days: int
    group_by: tuple[UsageDimension, ...]
    key_id: str | None = None
    model: str | None = None


def questions(workload: Workload) -> list[Question]:
    return [
        Question("(a) last 24 h, by key x model", 1, ("key", "model")),
        Question(
            "(b) last 30 days, one key, by model", 30, ("model",), key_id=workload.busiest_key
        ),
        Question("(c) last 90 days, total by model", DAYS, ("model",)),
        Question("(d) last 7 days, one model, by hour", 7, ("hour",), model=workload.busiest_model),
    ]


Answer = list[tuple[Any, ...]]


async def ask_rollups(store: Store, q: Question, now: datetime.datetime) -> Answer:
    rows = await store.usage.query(
        key_id=q.key_id, model=q.model, since=now - timedelta(days=q.days), group_by=q.group_by
    )
    return [_rollup_answer(r, q.group_by) for r in rows]


def _rollup_answer(row: UsageRow, dims: Sequence[UsageDimension]) -> tuple[Any, ...]:
    groups: list[str] = []
    if "hour" in dims:
        assert row.hour is not None
        groups.append(row.hour.strftime("%Y-%m-%d %H"))
    if "key" in dims:
        groups.append(row.key_id or "")
    if "model" in dims:
        groups.append(row.model or "")
    return (*groups, row.requests, row.errors, row.prompt_tokens, row.completion_tokens)


def raw_sql(q: Question, dialect: str) -> str:
    """The same question over `usage_records`, as a gateway without roll-ups asks it."""
    hour = (
        "substr(ts, 1, 13)" if dialect == "sqlite" else "date_trunc('hour', ts AT TIME ZONE 'UTC')"
    )
    sums = (
        "COUNT(*), SUM(CASE WHEN status >= 400 THEN 1 ELSE 0 END), SUM(prompt_tokens), "
        "SUM(completion_tokens), SUM(latency_ms)"
    )
    return _grouped_sql(q, "usage_records", "ts", hour, sums)


def hourly_sql(q: Question, dialect: str) -> str:
    """The same question over `usage_hourly` alone, as llmgw asked it before `usage_daily`."""
    hour = "substr(hour, 1, 13)" if dialect == "sqlite" else "(hour AT TIME ZONE 'UTC')"
    sums = (
        "SUM(requests), SUM(errors), SUM(prompt_tokens), SUM(completion_tokens), "
        "SUM(latency_ms_sum)"
    )
    return _grouped_sql(q, "usage_hourly", "hour", hour, sums)


def _grouped_sql(q: Question, table: str, time_column: str, hour: str, sums: str) -> str:
    columns = {"hour": hour, "key": "key_id", "model": "model"}
    dims = ", ".join(columns[d] for d in ("hour", "key", "model") if d in q.group_by)
    where = [f"{time_column} >= :since"]
    if q.key_id is not None:
        where.append("key_id = :key_id")
    if q.model is not None:
        where.append("model = :model")
    return (
        f"SELECT {dims}, {sums} FROM {table} WHERE {' AND '.join(where)} "
        f"GROUP BY {dims} ORDER BY {dims}"
    )


async def ask_hourly(engine: AsyncEngine, q: Question, now: datetime.datetime) -> Answer:
    return await _ask_sql(engine, q, now, hourly_sql(q, engine.dialect.name))


async def ask_raw(engine: AsyncEngine, q: Question, now: datetime.datetime) -> Answer:
    return await _ask_sql(engine, q, now, raw_sql(q, engine.dialect.name))


async def _ask_sql(engine: AsyncEngine, q: Question, now: datetime.datetime, sql: str) -> Answer:
    # The roll-ups count whole hours from the one containing `since`; ask the same.
    since = truncate_to_hour(now - timedelta(days=q.days))
    dialect = engine.dialect.name
    bound: Any = (
        since.replace(tzinfo=None).strftime("%Y-%m-%d %H:%M:%S.%f")
        if dialect == "sqlite"
        else since
    )
    params = {"since": bound, "key_id": q.key_id, "model": q.model}
    ngroups = len(q.group_by)
    async with engine.connect() as conn:
        result = await conn.execute(text(sql), params)
        rows = result.all()
    answer = []
    for row in rows:
        groups = [
            g.strftime("%Y-%m-%d %H") if isinstance(g, datetime.datetime) else g
            for g in row[:ngroups]
        ]
        answer.append((*groups, *(int(v) for v in row[ngroups : ngroups + 4])))
    return answer


@dataclass
class Timing:
    samples_ms: list[float]

    @property
    def p50(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def max(self) -> float:
        return max(self.samples_ms)


async def timed(ask: Callable[[], Awaitable[Answer]]) -> tuple[Timing, Answer]:
    samples, answer = [], []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        answer = await ask()
        samples.append((time.perf_counter() - t0) * 1000)
    return Timing(samples), answer


# --- one store --------------------------------------------------------------------


@dataclass
class StoreResult:
    kind: str
    rows: int = 0
    bulk_rows: int = 0
    bulk_s: float = 0.0
    rollup_build_s: float = 0.0
    batch_rows: int = 0
    batch_s: float = 0.0
    hourly_rows: int = 0
    daily_rows: int = 0
    sizes: dict[str, int] = field(default_factory=dict)
    timings: list[tuple[Question, Timing, Timing, Timing, int]] = field(default_factory=list)
    pruned: int = 0
    prune_s: float = 0.0
    raw_left: int = 0
    sizes_after_prune: dict[str, int] = field(default_factory=dict)
    after_prune: Timing | None = None
    analyzed: Analyzed | None = None


@dataclass
class Analyzed:
    """SQLite question (a) before and after a one-off ANALYZE."""

    plan_before: str
    plan_after: str
    timing: Timing


class StatementLog:
    """The last SELECT on the usage tables sent by any engine: what the store really ran.

    The store keeps its engine private; listening on the Engine class lets the
    benchmark EXPLAIN the exact statement and parameters of `store.usage.query`.
    """

    def __init__(self) -> None:
        self.last: tuple[str, Any] | None = None

    def __call__(self, _conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "usage_" in statement:
            self.last = (statement, params)


async def bench_store(kind: str, args: argparse.Namespace, log: StatementLog) -> StoreResult:
    if kind == "sqlite":
        with tempfile.TemporaryDirectory(prefix="llmgw-usage-bench-") as tmp:
            url = store_url(Path(tmp), None)
            store = await open_store(url)
            raw = baseline_engine(url, None)
            try:
                return await _bench(kind, store, raw, args, log)
            finally:
                await raw.dispose()
                await store.close()
    schema = f"bench_usage_{secrets.token_hex(4)}"
    try:
        admin = await asyncpg.connect(PG_URL, timeout=10)
    except (OSError, asyncpg.PostgresError) as exc:
        raise SystemExit(
            f"cannot reach the PostgreSQL at {PG_URL} ({exc}); start it, or pass --store sqlite"
        ) from exc
    try:
        await admin.execute(f"CREATE SCHEMA {schema}")
        store = await open_store(PG_URL, schema=schema)
        raw = baseline_engine(PG_URL, schema)
        try:
            return await _bench(kind, store, raw, args, log)
        finally:
            await raw.dispose()
            await store.close()
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await admin.close()


def baseline_engine(url: str, schema: str | None) -> AsyncEngine:
    """A second engine built exactly like the store's (pool, pre-ping, pragmas, search_path).

    The raw-table queries and the bulk seeding run on it, so the baseline pays
    the same per-query connection costs as `store.usage.query`.
    """
    return make_engine(normalize_url(url), schema=schema)


async def _bench(
    kind: str, store: Store, raw: AsyncEngine, args: argparse.Namespace, log: StatementLog
) -> StoreResult:
    await store.upgrade()
    rows = args.rows
    res = StoreResult(kind=kind, rows=rows)
    rng = random.Random(args.seed)
    workload = Workload.build(rng)
    now = datetime.datetime.now(UTC)
    await seed(res, store, raw, workload, rng, now, args.record_batch_rows)
    await settle(raw)
    counted = await count_rows(raw)
    assert counted["usage_records"] == rows, counted
    res.hourly_rows = counted["usage_hourly"]
    res.daily_rows = counted["usage_daily"]
    res.sizes = await table_sizes(raw)

    for q in questions(workload):
        fast, rolled = await timed(functools.partial(ask_rollups, store, q, now))
        hours, hourly = await timed(functools.partial(ask_hourly, raw, q, now))
        slow, scanned = await timed(functools.partial(ask_raw, raw, q, now))
        if rolled != hourly:
            raise AssertionError(f"{kind} {q.label}: the roll-ups and the hours alone disagree")
        if rolled != scanned:
            raise AssertionError(f"{kind} {q.label}: the roll-ups and the raw rows disagree")
        res.timings.append((q, fast, hours, slow, len(rolled)))
        progress(
            f"{kind}: {q.label}: roll-ups p50 {fast.p50:.1f} ms, hours alone p50 "
            f"{hours.p50:.1f} ms, raw p50 {slow.p50:.1f} ms"
        )

    total_q = questions(workload)[2]
    before = await ask_rollups(store, total_q, now)
    t0 = time.perf_counter()
    res.pruned = await store.usage.prune_raw(now - timedelta(days=RETENTION_DAYS))
    res.prune_s = time.perf_counter() - t0
    progress(f"{kind}: pruned {res.pruned:,} rows in {res.prune_s:.1f} s")
    await settle(raw)
    res.after_prune, after = await timed(lambda: ask_rollups(store, total_q, now))
    if after != before:
        raise AssertionError(f"{kind}: the 90-day totals changed when raw rows were pruned")
    res.raw_left = (await count_rows(raw))["usage_records"]
    assert res.raw_left + res.pruned == rows, (res.raw_left, res.pruned)
    res.sizes_after_prune = await table_sizes(raw)
    if kind == "sqlite":
        res.analyzed = await analyze_effect(store, raw, questions(workload)[0], now, log)
    return res


async def analyze_effect(
    store: Store, raw: AsyncEngine, q: Question, now: datetime.datetime, log: StatementLog
) -> Analyzed:
    """Question (a) on SQLite with the statistics that llmgw never gathers itself."""
    await ask_rollups(store, q, now)
    before = await explain(raw, log)
    async with raw.begin() as conn:
        await conn.execute(text("ANALYZE"))
    timing, _ = await timed(lambda: ask_rollups(store, q, now))
    after = await explain(raw, log)
    progress(f"sqlite: {q.label} after ANALYZE: roll-ups p50 {timing.p50:.1f} ms")
    return Analyzed(plan_before=before, plan_after=after, timing=timing)


async def explain(engine: AsyncEngine, log: StatementLog) -> str:
    assert log.last is not None, "store.usage.query sent no SELECT on the usage tables"
    statement, params = log.last
    async with engine.connect() as conn:
        rows = await conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, params)
        # Columns: id, parent, notused, detail.
        return "; ".join(str(tuple(row)[-1]) for row in rows)


async def seed(
    res: StoreResult,
    store: Store,
    raw: AsyncEngine,
    workload: Workload,
    rng: random.Random,
    now: datetime.datetime,
    batch_rows: int,
) -> None:
    """Fill the store: the older rows in bulk, the newest `batch_rows` through `record_batch`.

    The bulk part only makes a 2M-row store quick to build; its rows and
    roll-ups are the same as `record_batch` would have written (the answers of
    the two paths are compared later). `record_batch` then appends to the full
    tables, so its rate is measured at the size the benchmark is about.
    """
    bulk_target = res.rows - batch_rows
    t0 = time.perf_counter()
    for batch in workload.batches(res.rows, now, rng):
        if res.bulk_rows < bulk_target:
            await bulk_insert(raw, batch)
            res.bulk_rows += len(batch)
            if res.bulk_rows >= bulk_target:
                res.bulk_s = time.perf_counter() - t0
                t1 = time.perf_counter()
                await build_rollups(raw)
                res.rollup_build_s = time.perf_counter() - t1
                progress(
                    f"{res.kind}: {res.bulk_rows:,} rows in bulk in {res.bulk_s:.1f} s, "
                    f"roll-ups built in {res.rollup_build_s:.1f} s"
                )
            continue
        records = [usage_record(r) for r in batch]
        t1 = time.perf_counter()
        await store.usage.record_batch(records)
        res.batch_s += time.perf_counter() - t1
        res.batch_rows += len(records)
    progress(f"{res.kind}: {res.batch_rows:,} rows through record_batch in {res.batch_s:.1f} s")


async def bulk_insert(engine: AsyncEngine, batch: list[Raw]) -> None:
    # Straight to the driver's executemany: no type processing, so SQLite's
    # timestamps are written here in SQLAlchemy's format (what UTCDateTime stores).
    if engine.dialect.name == "sqlite":
        marks = ", ".join("?" for _ in RAW_COLUMNS)
        params = [(r[0].strftime("%Y-%m-%d %H:%M:%S.%f"), *r[1:]) for r in batch]
    else:
        marks = ", ".join(f"${i + 1}" for i in range(len(RAW_COLUMNS)))
        params = batch
    sql = f"INSERT INTO usage_records ({', '.join(RAW_COLUMNS)}) VALUES ({marks})"
    async with engine.begin() as conn:
        await conn.exec_driver_sql(sql, params)


async def build_rollups(engine: AsyncEngine) -> None:
    hour = (
        "substr(ts, 1, 13) || ':00:00.000000'"
        if engine.dialect.name == "sqlite"
        else "date_trunc('hour', ts AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
    )
    sql = (
        "INSERT INTO usage_hourly (hour, key_id, model, requests, errors, prompt_tokens, "
        "completion_tokens, latency_ms_sum) "
        f"SELECT {hour}, COALESCE(key_id, ''), model, COUNT(*), "
        "SUM(CASE WHEN status >= 400 THEN 1 ELSE 0 END), SUM(prompt_tokens), "
        "SUM(completion_tokens), SUM(latency_ms) FROM usage_records GROUP BY 1, 2, 3"
    )
    day = (
        "substr(hour, 1, 10) || ' 00:00:00.000000'"
        if engine.dialect.name == "sqlite"
        else "date_trunc('day', hour, 'UTC')"
    )
    daily = (
        "INSERT INTO usage_daily (day, key_id, model, requests, errors, prompt_tokens, "
        "completion_tokens, latency_ms_sum) "
        f"SELECT {day}, key_id, model, SUM(requests), SUM(errors), SUM(prompt_tokens), "
        "SUM(completion_tokens), SUM(latency_ms_sum) FROM usage_hourly GROUP BY 1, 2, 3"
    )
    async with engine.begin() as conn:
        await conn.execute(text(sql))
        await conn.execute(text(daily))


async def settle(engine: AsyncEngine) -> None:
    """Fold the WAL into the SQLite file; give PostgreSQL the statistics autovacuum would."""
    async with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            await conn.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
        else:
            await conn.execute(text("ANALYZE usage_records"))
            await conn.execute(text("ANALYZE usage_hourly"))
            await conn.execute(text("ANALYZE usage_daily"))
        await conn.commit()


async def count_rows(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as conn:
        return {
            t: int((await conn.execute(text(f"SELECT COUNT(*) FROM {t}"))).scalar_one())
            for t in TABLES
        }


async def table_sizes(engine: AsyncEngine) -> dict[str, int]:
    """Bytes on disk per table, indexes included, and for SQLite the whole file."""
    async with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            stat = await conn.execute(
                text(
                    "SELECT m.tbl_name, SUM(s.pgsize) FROM dbstat AS s "
                    "JOIN sqlite_master AS m ON m.name = s.name GROUP BY m.tbl_name"
                )
            )
            out = {name: int(n) for name, n in stat if name in TABLES}
            pages = (await conn.execute(text("PRAGMA page_count"))).scalar_one()
            page = (await conn.execute(text("PRAGMA page_size"))).scalar_one()
            out["file"] = int(pages) * int(page)
            return out
        return {
            t: int((await conn.execute(text(f"SELECT pg_total_relation_size('{t}')"))).scalar_one())
            for t in TABLES
        }


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# --- report -----------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def render(args: argparse.Namespace, results: list[StoreResult], wall_s: float, load: float) -> str:
    cmd = " ".join([".venv/bin/python", "bench/usage_queries.py", *sys.argv[1:]])
    out = [
        "## Usage queries over a seeded store",
        "",
        f"`{cmd}` — {datetime.date.today().isoformat()}, {os.cpu_count()} CPUs ({cpu_model()}), "
        f"{memory()} RAM, Python {platform.python_version()}; wall time {wall_s:.0f} s; "
        f"1-min load average just before the run {load:.1f} (other processes' share of the CPUs).",
        "",
        f"{args.rows:,} raw usage rows over the last {DAYS} days: {N_KEYS} keys with Zipf-like "
        f"traffic, each using 1-3 of {len(MODELS)} models, log-normal token counts, 2% errors. "
        f"The oldest rows are inserted in bulk (executemany, then one `INSERT INTO usage_hourly "
        f"SELECT ... GROUP BY` and the same into `usage_daily`) only to keep the run short; "
        f"the newest "
        f"{args.record_batch_rows:,} go through `store.usage.record_batch` in batches of "
        f"{BATCH:,}, appending to the full tables. Each question is asked {REPEATS}x of the "
        "roll-ups (`store.usage.query`: whole days from `usage_daily`, the hours at either end "
        f"from `usage_hourly`), {REPEATS}x of the hourly roll-ups alone (what llmgw ran before "
        f"`usage_daily`), then {REPEATS}x of the raw table (`SELECT ... FROM usage_records WHERE "
        "ts >= ... GROUP BY`, what a gateway without roll-ups runs); the three answers are "
        "asserted equal group by group. (b) is the busiest key, (d) its favourite model.",
    ]
    for r in results:
        out += render_store(r)
    return "\n".join(out)


def render_store(r: StoreResult) -> list[str]:
    name = "SQLite" if r.kind == "sqlite" else "PostgreSQL"
    out = [
        "",
        f"### {name}",
        "",
        "| question | groups | roll-ups p50 / max (ms) | hours alone p50 / max (ms) "
        "| raw p50 / max (ms) | hours alone / roll-ups | raw / roll-ups |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for q, fast, hours, slow, groups in r.timings:
        out.append(
            f"| {q.label} | {groups} | {fast.p50:.1f} / {fast.max:.1f} "
            f"| {hours.p50:.1f} / {hours.max:.1f} | {slow.p50:.1f} / {slow.max:.1f} "
            f"| {ratio(hours.p50 / fast.p50)} | {ratio(slow.p50 / fast.p50)} |"
        )
    assert r.after_prune is not None
    raw_b, hourly_b, daily_b = (r.sizes[t] for t in TABLES)
    file_note = f", file {mib(r.sizes['file'])}" if "file" in r.sizes else ""
    after = r.sizes_after_prune
    if "file" in after:
        left = f"pages in use {mib(after['usage_records'])}; the file stays {mib(after['file'])}"
        left += " until VACUUM"
    else:
        left = f"{mib(after['usage_records'])} on disk: dead rows until autovacuum reuses them"
    if r.bulk_rows:
        onto = f", onto the {r.bulk_rows:,} bulk rows"
        bulk = (
            f"; bulk seeding {r.bulk_rows / r.bulk_s:,.0f} rows/s, roll-ups built in "
            f"{r.rollup_build_s:.1f} s"
        )
    else:
        onto = bulk = ""
    out += [
        "",
        f"- write path: **{r.batch_rows / r.batch_s:,.0f} rows/s** through `record_batch` "
        f"({r.batch_rows:,} rows in {r.batch_s:.1f} s{onto}){bulk}",
        f"- tables: `usage_records` {r.rows:,} rows ({mib(raw_b)}), `usage_hourly` "
        f"{r.hourly_rows:,} rows ({mib(hourly_b)}), `usage_daily` {r.daily_rows:,} rows "
        f"({mib(daily_b)}){file_note}; {r.rows / r.hourly_rows:.1f} raw rows per hourly row, "
        f"{r.hourly_rows / r.daily_rows:.1f} hourly rows per daily row",
        f"- `prune_raw(now - {RETENTION_DAYS} days)`: {r.pruned:,} rows deleted in "
        f"{r.prune_s:.1f} s, {r.raw_left:,} left ({left})",
        f"- (c) again after pruning: p50 {r.after_prune.p50:.1f} ms, max "
        f"{r.after_prune.max:.1f} ms; totals asserted identical to before pruning",
    ]
    if r.analyzed is not None:
        a, first = r.analyzed, r.timings[0][1]
        out.append(
            f"- (a)'s roll-up plan as llmgw leaves SQLite (no statistics): `{a.plan_before}`; "
            f"after a one-off `ANALYZE`: `{a.plan_after}`, p50 {a.timing.p50:.1f} ms, max "
            f"{a.timing.max:.1f} ms (was {first.p50:.1f} / {first.max:.1f})"
        )
    return out


def ratio(x: float) -> str:
    return f"{x:.0f}x" if x >= 10 else f"{x:.1f}x"


def memory() -> str:
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return "? GiB"
    return f"{pages / 2**30:.0f} GiB"


async def run(args: argparse.Namespace) -> list[StoreResult]:
    kinds = ["sqlite", "postgresql"] if args.store == "both" else [args.store]
    log = StatementLog()
    event.listen(Engine, "before_cursor_execute", log)
    try:
        return [await bench_store(kind, args, log) for kind in kinds]
    finally:
        event.remove(Engine, "before_cursor_execute", log)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="raw usage rows to seed")
    parser.add_argument("--store", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument(
        "--record-batch-rows",
        type=int,
        default=100_000,
        help="newest rows written through record_batch (the rest in bulk); >= --rows for all",
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the synthetic workload")
    args = parser.parse_args()
    if args.rows <= 0 or args.record_batch_rows <= 0:
        parser.error("--rows and --record-batch-rows must be positive")
    args.record_batch_rows = min(args.record_batch_rows, args.rows)
    t0, load = time.perf_counter(), os.getloadavg()[0]
    results = asyncio.run(run(args))
    print(render(args, results, time.perf_counter() - t0, load))


if __name__ == "__main__":
    main()
