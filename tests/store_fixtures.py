"""Fixtures that run each store test on SQLite and on the real PostgreSQL.

Fixtures are registered under short names (`store`, `store_target`, `store_clock`)
but defined as `*_fixture` functions, so a test module imports all three without
its test arguments shadowing the imports:

    from store_fixtures import clock_fixture, store_fixture, target_fixture  # noqa: F401

SQLite lives in the test's tmp_path; each PostgreSQL test gets its own schema
(`t_<random hex>`, selected through `search_path`) that is dropped afterwards.
PostgreSQL must be running (postgresql://postgres@127.0.0.1:5432/test, trust
auth, or LLMGW_TEST_PG_URL); if it is not, the PostgreSQL half of every store test
fails with a message saying so; it is never skipped.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from llmgw.store import Store, open_store, store_url, utc_now

PG_URL = os.environ.get("LLMGW_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
PG_DOWN = "PostgreSQL is not running on 127.0.0.1:5432; it is needed for the store tests"
START = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


class FakeClock:
    """A settable clock for the store: starts at START and moves only when told."""

    def __init__(self, now: datetime = START) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> datetime:
        self.now += timedelta(**delta)
        return self.now


@dataclass(frozen=True)
class StoreTarget:
    """Where a test's database lives; `open` connects without migrating."""

    kind: str
    url: str
    schema: str | None

    async def open(self, *, clock: Callable[[], datetime] = utc_now) -> Store:
        return await open_store(self.url, clock=clock, schema=self.schema)


async def connect_postgres() -> asyncpg.Connection:
    """An admin connection to the test PostgreSQL; fails the test (never skips) without one."""
    try:
        return await asyncpg.connect(PG_URL, timeout=5)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        reason = f"{type(exc).__name__}: {exc}"
    pytest.fail(f"{PG_DOWN} ({PG_URL}: {reason})", pytrace=False)


@pytest.fixture(name="store_target", params=["sqlite", "postgresql"])
async def target_fixture(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[StoreTarget]:
    if request.param == "sqlite":
        yield StoreTarget("sqlite", store_url(tmp_path / "data", None), None)
        return
    admin = await connect_postgres()
    schema = "t_" + secrets.token_hex(6)
    try:
        await admin.execute(f"CREATE SCHEMA {schema}")
        yield StoreTarget("postgresql", PG_URL, schema)
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await admin.close()


@pytest.fixture(name="store_clock")
def clock_fixture() -> FakeClock:
    return FakeClock()


@pytest.fixture(name="store")
async def store_fixture(store_target: StoreTarget, store_clock: FakeClock) -> AsyncIterator[Store]:
    """A migrated store on a fresh database, closed after the test."""
    opened = await store_target.open(clock=store_clock)
    try:
        await opened.upgrade()
        yield opened
    finally:
        await opened.close()
