"""The usage recorder: batching, a bounded queue, retries and flushing at close.

Writes go to the real store (SQLite and PostgreSQL) through a wrapper that counts
batches and can fail on demand. Waits use an injected sleep the test controls,
so nothing here sleeps for real.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Protocol

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import text
from store_fixtures import (  # noqa: F401
    START,
    FakeClock,
    StoreTarget,
    clock_fixture,
    store_fixture,
    target_fixture,
)

from llmgw.limits import BudgetExhausted, KeyLimits, Limiter
from llmgw.store import InvalidValue, Store, StoreUnavailable, UsageRecord
from llmgw.store.engine import make_engine
from llmgw.store.urls import normalize_url
from llmgw.usage import RecordedUsage, UsageRecorder


class Repo:
    """The real usage repository, recording batch sizes, failing the first `fail` writes."""

    def __init__(self, store: Store, *, fail: int = 0) -> None:
        self.inner = store.usage
        self.batches: list[int] = []
        self.fail = fail
        self.attempts = 0
        self.changed = asyncio.Event()

    async def record_batch(self, records: Sequence[UsageRecord]) -> None:
        self.attempts += 1
        try:
            if self.fail > 0:
                self.fail -= 1
                raise StoreUnavailable("recording usage failed: the database did not answer")
            await self.inner.record_batch(records)
            self.batches.append(len(records))
        finally:
            self.changed.set()

    async def wait_until(self, done: Callable[[], bool]) -> None:
        async with asyncio.timeout(5):
            while not done():
                self.changed.clear()
                await self.changed.wait()


class Gate:
    """An injected sleep that waits until the test opens the gate."""

    def __init__(self, *, open_: bool = False) -> None:
        self.requested: list[float] = []
        self.event = asyncio.Event()
        if open_:
            self.event.set()

    async def __call__(self, seconds: float) -> None:
        self.requested.append(seconds)
        await self.event.wait()


def rec(
    i: int,
    *,
    key: str | None = "key_aaaaaaaaaaaaaaaa",
    request_id: str | None = None,
    model: str = "llama-8b",
    prompt_tokens: int = 10,
) -> UsageRecord:
    return UsageRecord(
        ts=START + timedelta(seconds=i),
        request_id=request_id or f"req-{i}",
        key_id=key,
        model=model,
        endpoint="ep-1",
        status=200,
        prompt_tokens=prompt_tokens,
        completion_tokens=5,
        latency_ms=12.5,
        ttft_ms=None,
        streamed=False,
    )


async def stored_requests(store: Store) -> int:
    rows = await store.usage.query(group_by=())
    return rows[0].requests if rows else 0


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return value if value is not None else 0.0


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_records_are_written_in_batches(store: Store) -> None:
    repo, registry = Repo(store), CollectorRegistry()
    recorder = UsageRecorder(repo=repo, registry=registry, batch_size=500, sleep=Gate(open_=True))
    for i in range(1234):
        recorder.record(rec(i))
    assert sample(registry, "llmgw_usage_queued") == 1234
    task = asyncio.create_task(recorder.run())
    await recorder.close()
    await task
    assert repo.batches == [500, 500, 234]  # ceil(1234 / 500) writes
    assert await stored_requests(store) == 1234
    assert sample(registry, "llmgw_usage_written_total") == 1234
    assert sample(registry, "llmgw_usage_queued") == 0
    assert sample(registry, "llmgw_usage_dropped_total", reason="queue_full") == 0


async def test_a_partial_batch_waits_at_most_the_flush_interval(store: Store) -> None:
    repo, gate = Repo(store), Gate()
    recorder = UsageRecorder(
        repo=repo, registry=CollectorRegistry(), batch_size=10, flush_interval=0.5, sleep=gate
    )
    task = asyncio.create_task(recorder.run())
    try:
        for i in range(3):
            recorder.record(rec(i))
        await settle()
        assert gate.requested == [0.5]  # waiting for more, up to flush_interval
        recorder.record(rec(3))
        await settle()
        assert repo.batches == []
        gate.event.set()  # the flush interval passes
        await repo.wait_until(lambda: bool(repo.batches))
        assert repo.batches == [4]
    finally:
        await recorder.close()
        await task


async def test_a_full_batch_is_written_without_waiting(store: Store) -> None:
    repo, gate = Repo(store), Gate()  # the flush interval never passes
    recorder = UsageRecorder(
        repo=repo, registry=CollectorRegistry(), batch_size=4, flush_interval=60, sleep=gate
    )
    task = asyncio.create_task(recorder.run())
    try:
        recorder.record(rec(0))
        await settle()
        for i in range(1, 4):
            recorder.record(rec(i))
        await repo.wait_until(lambda: bool(repo.batches))
        assert repo.batches == [4]
    finally:
        await recorder.close()
        await task


async def test_a_full_queue_drops_and_counts_without_blocking(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    repo, registry = Repo(store), CollectorRegistry()
    recorder = UsageRecorder(repo=repo, registry=registry, queue_size=10, batch_size=4)
    for i in range(15):
        recorder.record(rec(i))  # synchronous: returns at once, never raises
    assert recorder.queued == 10
    assert sample(registry, "llmgw_usage_dropped_total", reason="queue_full") == 5
    assert caplog.text.count("usage queue is full") == 1
    await recorder.close()  # no run() task: close writes what is queued itself
    assert repo.batches == [4, 4, 2]
    assert await stored_requests(store) == 10


async def test_close_flushes_everything_queued_then_run_returns(store: Store) -> None:
    repo, registry = Repo(store), CollectorRegistry()
    recorder = UsageRecorder(
        repo=repo, registry=registry, batch_size=5, flush_interval=60, sleep=Gate()
    )
    task = asyncio.create_task(recorder.run())
    for i in range(7):
        recorder.record(rec(i))
    await settle()
    await recorder.close()
    assert task.done()
    await task
    assert sum(repo.batches) == 7
    assert await stored_requests(store) == 7
    recorder.record(rec(99))  # after close: dropped, counted
    assert sample(registry, "llmgw_usage_dropped_total", reason="closed") == 1


async def test_a_failed_write_is_retried_with_backoff(store: Store) -> None:
    repo, registry, gate = Repo(store, fail=2), CollectorRegistry(), Gate(open_=True)
    recorder = UsageRecorder(repo=repo, registry=registry, batch_size=10, sleep=gate)
    for i in range(6):
        recorder.record(rec(i))
    task = asyncio.create_task(recorder.run())
    await recorder.close()
    await task
    assert repo.attempts == 3
    assert gate.requested == [0.5, 1.0]
    assert repo.batches == [6]
    assert await stored_requests(store) == 6
    assert sample(registry, "llmgw_usage_write_errors_total") == 2
    assert sample(registry, "llmgw_usage_written_total") == 6


async def test_a_batch_is_dropped_after_the_last_retry_and_the_next_one_is_written(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    repo, registry = Repo(store, fail=3), CollectorRegistry()
    recorder = UsageRecorder(
        repo=repo,
        registry=registry,
        batch_size=4,
        retry_attempts=3,
        sleep=Gate(open_=True),
    )
    task = asyncio.create_task(recorder.run())
    for i in range(4):
        recorder.record(rec(i))
    await repo.wait_until(lambda: repo.attempts >= 3)
    for i in range(4, 6):
        recorder.record(rec(i))
    await recorder.close()
    await task
    assert sample(registry, "llmgw_usage_dropped_total", reason="write_failed") == 4
    assert sample(registry, "llmgw_usage_write_errors_total") == 3
    assert repo.batches == [2]
    assert await stored_requests(store) == 2
    assert "dropped 4 usage records: 3 attempts failed" in caplog.text


async def test_close_with_the_store_down_gives_up_after_one_batch(store: Store) -> None:
    repo, registry = Repo(store, fail=1000), CollectorRegistry()
    recorder = UsageRecorder(
        repo=repo, registry=registry, batch_size=5, retry_attempts=2, sleep=Gate(open_=True)
    )
    for i in range(23):
        recorder.record(rec(i))
    await recorder.close()
    assert repo.attempts == 2  # not 2 per batch
    assert sample(registry, "llmgw_usage_dropped_total", reason="write_failed") == 23
    assert recorder.queued == 0


async def test_invalid_records_are_dropped_at_the_door(store: Store) -> None:
    class Refusing:
        attempts = 0

        async def record_batch(self, records: Sequence[UsageRecord]) -> None:
            self.attempts += 1
            raise InvalidValue("UsageRecord.ts has no time zone")

    registry = CollectorRegistry()
    bad = UsageRecord(
        ts=START.replace(tzinfo=None),
        request_id="naive",
        key_id=None,
        model="m",
        endpoint="e",
        status=200,
        prompt_tokens=1,
        completion_tokens=1,
        latency_ms=1.0,
        ttft_ms=None,
        streamed=False,
    )
    refusing = Refusing()
    recorder = UsageRecorder(repo=refusing, registry=registry, sleep=Gate(open_=True))
    recorder.record(bad)
    assert recorder.queued == 0
    assert sample(registry, "llmgw_usage_dropped_total", reason="invalid") == 1
    # A record the store refuses outright is not retried: it is dropped as refused.
    recorder.record(rec(1))
    await recorder.close()
    assert refusing.attempts == 1
    assert sample(registry, "llmgw_usage_dropped_total", reason="refused") == 1
    assert sample(registry, "llmgw_usage_dropped_total", reason="write_failed") == 0


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="batch_size >= 1"):
        UsageRecorder(repo=None, registry=CollectorRegistry(), batch_size=0)  # type: ignore[arg-type]


# The database refuses the record whose request id is 'poison', as a database
# refuses a value for its own reasons: SQLite aborts the insert (an integrity
# error); PostgreSQL raises an error of no data class (P0001), so the recorder
# only learns it is the data after its retries.
_POISON_SQL = {
    "sqlite": [
        "CREATE TRIGGER refuse_poison BEFORE INSERT ON usage_records "
        "WHEN NEW.request_id = 'poison' BEGIN SELECT RAISE(ABORT, 'poison refused'); END"
    ],
    "postgresql": [
        "CREATE FUNCTION refuse_poison() RETURNS trigger AS $$ BEGIN "
        "IF NEW.request_id = 'poison' THEN RAISE EXCEPTION 'poison refused'; END IF; "
        "RETURN NEW; END $$ LANGUAGE plpgsql",
        "CREATE TRIGGER refuse_poison BEFORE INSERT ON usage_records "
        "FOR EACH ROW EXECUTE FUNCTION refuse_poison()",
    ],
}


async def refuse_poison(target: StoreTarget) -> None:
    engine = make_engine(normalize_url(target.url), schema=target.schema)
    try:
        async with engine.begin() as conn:
            for statement in _POISON_SQL[target.kind]:
                await conn.execute(text(statement))
    finally:
        await engine.dispose()


async def test_a_record_the_database_refuses_costs_only_itself(
    store: Store, store_target: StoreTarget, caplog: pytest.LogCaptureFixture
) -> None:
    await refuse_poison(store_target)
    repo, registry = Repo(store), CollectorRegistry()
    recorder = UsageRecorder(
        repo=repo, registry=registry, batch_size=100, retry_attempts=3, sleep=Gate(open_=True)
    )
    for i in range(100):
        recorder.record(rec(i, request_id="poison" if i == 37 else None, key=f"key_{i % 3}"))
    await recorder.close()
    assert await stored_requests(store) == 99
    landed = {r.request_id for r in await store.usage.requests(limit=1000)}
    assert landed == {f"req-{i}" for i in range(100) if i != 37}
    assert sample(registry, "llmgw_usage_dropped_total", reason="refused") == 1
    assert sample(registry, "llmgw_usage_dropped_total", reason="write_failed") == 0
    assert sample(registry, "llmgw_usage_written_total") == 99
    (line,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert "request poison of key key_1" in line.getMessage()
    assert "poison refused" in line.getMessage()
    # Bisection, not one write per record: at most two writes per halving.
    assert repo.attempts <= 3 + 2 * 7


async def test_a_record_the_store_cannot_hold_is_dropped_alone(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    # Each of these made PostgreSQL refuse the whole batch before the store checked
    # them; SQLite took the megabytes.
    bad = [
        rec(1, request_id="nul", model="llama\x00-8b"),
        rec(2, request_id="long", model="m" * 2_000_000),
        rec(3, request_id="huge", prompt_tokens=3_000_000_000),
    ]
    repo, registry = Repo(store), CollectorRegistry()
    recorder = UsageRecorder(repo=repo, registry=registry, batch_size=50, sleep=Gate(open_=True))
    for i in range(40):
        recorder.record(bad[i // 10] if i in (5, 15, 25) else rec(100 + i))
    await recorder.close()
    assert await stored_requests(store) == 37
    assert sample(registry, "llmgw_usage_dropped_total", reason="refused") == 3
    logged = " ".join(r.getMessage() for r in caplog.records if r.levelname == "ERROR")
    assert "its model holds a NUL character" in logged
    assert "its model is 2000000 characters long, over its column's 256" in logged
    assert "its prompt_tokens 3000000000 is outside 0..2147483647" in logged
    rows = await store.usage.query(group_by=("model",))
    assert [r.model for r in rows] == ["llama-8b"]


async def test_a_store_that_stops_answering_while_a_batch_is_split_loses_the_rest_once(
    store: Store, store_target: StoreTarget
) -> None:
    class DownAfterRefusal:
        def __init__(self) -> None:
            self.attempts = 0

        async def record_batch(self, records: Sequence[UsageRecord]) -> None:
            self.attempts += 1
            if self.attempts == 1:
                raise InvalidValue("a record cannot be stored")
            raise StoreUnavailable("recording usage failed: the database did not answer")

    repo, registry = DownAfterRefusal(), CollectorRegistry()
    recorder = UsageRecorder(
        repo=repo, registry=registry, batch_size=8, retry_attempts=2, sleep=Gate(open_=True)
    )
    for i in range(8):
        recorder.record(rec(i))
    await recorder.close()
    # The first half is retried, then it and the second half are given up: no more.
    assert repo.attempts == 1 + 2
    assert sample(registry, "llmgw_usage_dropped_total", reason="write_failed") == 8


async def test_budgets_count_the_tokens_of_records_not_in_the_store(
    store: Store, store_target: StoreTarget
) -> None:
    await refuse_poison(store_target)
    repo, registry = Repo(store), CollectorRegistry()
    gate = Gate(open_=True)
    recorder = UsageRecorder(repo=repo, registry=registry, batch_size=10, sleep=gate)
    budget = RecordedUsage(stored=store.usage, unwritten=recorder)
    key = "key_budget"
    since = START - timedelta(minutes=5)
    for i in range(4):
        recorder.record(rec(i, key=key))
    # Queued, not written: counted all the same (15 tokens each).
    assert await store.usage.tokens_used(key, since) == 0
    assert await budget.tokens_used(key, since) == 60
    recorder.record(rec(4, key=key, request_id="poison", prompt_tokens=1000))
    await recorder.close()
    assert await store.usage.tokens_used(key, since) == 60
    # The refused record's 1005 tokens were served: the budget keeps them.
    assert await budget.tokens_used(key, since) == 60 + 1005
    assert recorder.unwritten_tokens(key, since) == 1005
    # Counted by hour, as the store counts: an hour after the records, none of them.
    assert await budget.tokens_used(key, START + timedelta(hours=1)) == 0
    assert await budget.tokens_used("key_other", since) == 0


class UsageRepositoryLike(Protocol):
    async def tokens_used(self, key_id: str, since: datetime) -> int: ...


class Answered:
    """A budget source that says each time it answered (the limiter refreshes in the
    background: the test waits for the answer instead of sleeping)."""

    def __init__(self, inner: UsageRepositoryLike) -> None:
        self.inner = inner
        self.answers = 0
        self.answered = asyncio.Event()

    async def tokens_used(self, key_id: str, since: datetime) -> int:
        used = await self.inner.tokens_used(key_id, since)
        self.answers += 1
        self.answered.set()
        return used


async def test_a_budget_keeps_counting_a_request_whose_record_was_refused(
    store: Store, store_target: StoreTarget
) -> None:
    await refuse_poison(store_target)
    now = [0.0]
    recorder = UsageRecorder(
        repo=store.usage, registry=CollectorRegistry(), batch_size=1, sleep=Gate(open_=True)
    )
    # With the store alone as the source (as before), the re-read forgets the 1500.
    budget = Answered(RecordedUsage(stored=store.usage, unwritten=recorder))
    limiter = Limiter(
        clock=lambda: now[0], wall_clock=lambda: START, budget_source=budget, budget_refresh_s=10
    )
    limits = KeyLimits(key_id="key_b", rpm=None, tpm=None, budget_tokens=1000, budget_period="day")
    try:
        admission = await limiter.admit(limits, 10)
        # Served 1500 tokens, and the store refused the request's record.
        recorder.record(rec(0, key="key_b", request_id="poison", prompt_tokens=1495))
        await limiter.settle(limits, admission, 1500)
        await recorder.close()
        assert await store.usage.tokens_used("key_b", START) == 0
        # The budget is re-read from its source; until it answers, this process's count holds.
        now[0] = 11.0
        budget.answered.clear()
        with pytest.raises(BudgetExhausted):
            await limiter.admit(limits, 10)
        await asyncio.wait_for(budget.answered.wait(), 5)
        await settle()
        with pytest.raises(BudgetExhausted):
            await limiter.admit(limits, 10)
    finally:
        await limiter.close()


async def test_an_adapters_records_are_given_its_base_from_the_catalog(store: Store) -> None:
    repo, registry = Repo(store), CollectorRegistry()
    bases = {"sql-lora": "llama-8b"}
    recorder = UsageRecorder(
        repo=repo, registry=registry, sleep=Gate(open_=True), base_of=bases.get
    )
    recorder.record(rec(1, model="sql-lora"))
    recorder.record(rec(2, model="llama-8b"))
    task = asyncio.create_task(recorder.run())
    await recorder.close()
    await task
    rows = await store.usage.query(group_by=("model",))
    assert {r.model: r.base for r in rows} == {"sql-lora": "llama-8b", "llama-8b": None}
