"""Migrations from empty, idempotent re-runs and the schema they leave, on both databases."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine
from store_fixtures import START, StoreTarget, clock_fixture, store_fixture, target_fixture  # noqa: F401

from llmgw.store import NewApiKey, Store, StoreError, UsageRecord, upgrade
from llmgw.store.engine import make_engine
from llmgw.store.migrate import head_revision
from llmgw.store.tables import metadata
from llmgw.store.urls import normalize_url

TABLES = {
    "alembic_version",
    "api_keys",
    "usage_records",
    "usage_hourly",
    "catalog_models",
    "leases",
    "replica_endpoints",
    "model_demand",
    "users",
    "admin_sessions",
}


@asynccontextmanager
async def raw_engine(target: StoreTarget) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(normalize_url(target.url), schema=target.schema)
    try:
        yield engine
    finally:
        await engine.dispose()


def table_names(conn: Connection) -> set[str]:
    return set(inspect(conn).get_table_names())


async def test_migrations_create_the_schema_from_empty(store_target: StoreTarget) -> None:
    store = await store_target.open()
    try:
        assert await store.revision() is None
        await store.upgrade()
        assert await store.revision() == head_revision() == "0004"
        assert await store.keys.list(include_revoked=True) == []
        assert await store.usage.query() == []
    finally:
        await store.close()
    async with raw_engine(store_target) as engine, engine.connect() as conn:
        assert await conn.run_sync(table_names) == TABLES


async def test_rerunning_the_upgrade_changes_nothing(store: Store) -> None:
    key = await store.keys.create(
        NewApiKey(name="team-a", prefix="sk-aaaa", secret_hash=hashlib.sha256(b"a").hexdigest())
    )
    record = UsageRecord(START, "r1", key.id, "m", "e1", 200, 3, 4, 10.0, None, False)
    await store.usage.record_batch([record])

    await store.upgrade()
    await store.upgrade()

    assert await store.revision() == head_revision()
    assert await store.keys.list() == [key]
    assert await store.usage.tokens_used(key.id, START) == 7


async def test_module_level_upgrade_is_idempotent(store_target: StoreTarget) -> None:
    await upgrade(store_target.url, schema=store_target.schema)
    await upgrade(store_target.url, schema=store_target.schema)
    store = await store_target.open()
    try:
        assert await store.revision() == head_revision()
    finally:
        await store.close()


async def test_migrated_schema_matches_the_tables_module(
    store: Store, store_target: StoreTarget
) -> None:
    def diff(conn: Connection) -> list[object]:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(context, metadata))

    async with raw_engine(store_target) as engine, engine.connect() as conn:
        assert await conn.run_sync(diff) == []


async def test_concurrent_upgrades_apply_the_migrations_once(store_target: StoreTarget) -> None:
    first, second = await store_target.open(), await store_target.open()
    try:
        await asyncio.gather(first.upgrade(), second.upgrade())
        assert await first.revision() == await second.revision() == head_revision()
    finally:
        await first.close()
        await second.close()


async def test_an_unmigrated_store_says_how_to_fix_it(store_target: StoreTarget) -> None:
    store = await store_target.open()
    try:
        with pytest.raises(StoreError, match=r"no llmgw tables.*llmgw db upgrade"):
            await store.keys.list()
    finally:
        await store.close()


async def test_connections_are_configured(store: Store, store_target: StoreTarget) -> None:
    async with raw_engine(store_target) as engine, engine.connect() as conn:
        if store_target.kind == "sqlite":
            assert (await conn.execute(text("PRAGMA journal_mode"))).scalar_one() == "wal"
            assert (await conn.execute(text("PRAGMA foreign_keys"))).scalar_one() == 1
            assert (await conn.execute(text("PRAGMA busy_timeout"))).scalar_one() == 5000
        else:
            current = (await conn.execute(text("SELECT current_schema()"))).scalar_one()
            assert current == store_target.schema
    assert store.dialect == store_target.kind
