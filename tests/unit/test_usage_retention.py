"""Pruning raw usage records on a schedule, on the real store (SQLite and PostgreSQL)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import pytest
from store_fixtures import START, FakeClock, clock_fixture, store_fixture, target_fixture  # noqa: F401

from llmgw.store import Store, StoreUnavailable, UsageRecord
from llmgw.usage import RetentionPruner


def rec(ts: datetime, i: int) -> UsageRecord:
    return UsageRecord(
        ts=ts,
        request_id=f"req-{i}",
        key_id="key_aaaaaaaaaaaaaaaa",
        model="llama-8b",
        endpoint="ep-1",
        status=200,
        prompt_tokens=100,
        completion_tokens=10,
        latency_ms=50.0,
        ttft_ms=None,
        streamed=False,
    )


class StopLoop(Exception):
    pass


async def test_prunes_raw_records_past_retention_and_keeps_rollups(
    store: Store, store_clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    ages = [timedelta(days=40), timedelta(days=31), timedelta(days=10), timedelta(hours=1)]
    await store.usage.record_batch([rec(START - age, i) for i, age in enumerate(ages)])
    pruner = RetentionPruner(
        repo=store.usage, retention=timedelta(days=30), interval=3600, wall_clock=store_clock
    )
    with caplog.at_level(logging.INFO, logger="llmgw.usage"):
        assert await pruner.prune_once() == 2
    assert "pruned 2 raw usage records older than 2024-12-02 12:00 UTC" in caplog.text
    assert await pruner.prune_once() == 0
    # Reports read the roll-ups, which pruning leaves alone.
    (total,) = await store.usage.query(group_by=())
    assert total.requests == 4
    store_clock.advance(days=25)
    assert await pruner.prune_once() == 1


async def test_the_loop_prunes_every_interval_and_survives_store_errors(
    store: Store, store_clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmgw.usage")
    calls: list[datetime] = []

    class Flaky:
        async def prune_raw(self, before: datetime) -> int:
            calls.append(before)
            if len(calls) == 1:
                raise StoreUnavailable("pruning old usage records failed: no answer")
            return await store.usage.prune_raw(before)

        async def refresh_statistics(self) -> None:
            await store.usage.refresh_statistics()

    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        store_clock.advance(hours=1)
        if len(sleeps) == 3:
            raise StopLoop

    pruner = RetentionPruner(
        repo=Flaky(),
        retention=timedelta(days=7),
        interval=3600,
        wall_clock=store_clock,
        sleep=sleep,
    )
    with pytest.raises(StopLoop):
        await pruner.run()
    # A failed run is retried soon (at start-up a locked SQLite file is expected), then hourly.
    assert sleeps == [30, 3600, 3600]
    assert calls == [START - timedelta(days=7) + timedelta(hours=h) for h in range(3)]
    assert "pruning raw usage records failed, retrying in 30s" in caplog.text


def test_settings_are_checked(store_clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="retention > 0"):
        RetentionPruner(repo=None, retention=timedelta(0), interval=1, wall_clock=store_clock)  # type: ignore[arg-type]
