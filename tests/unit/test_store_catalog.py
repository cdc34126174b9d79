"""Catalog models in the store: add, replace, read, delete, and migration 0002, on both databases."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from alembic import command
from sqlalchemy import Connection, inspect
from sqlalchemy.ext.asyncio import AsyncEngine
from store_fixtures import (  # noqa: F401
    START,
    FakeClock,
    StoreTarget,
    clock_fixture,
    store_fixture,
    target_fixture,
)

from llmgw.store import (
    AlreadyExists,
    Conflict,
    InvalidValue,
    NotFound,
    Store,
    StoredModel,
)
from llmgw.store.engine import make_engine
from llmgw.store.migrate import alembic_config, head_revision
from llmgw.store.urls import normalize_url

SPEC = {
    "name": "llama",
    "weights": "/m/llama",
    "profiles": [{"engine": "vllm", "gpus": 1, "labels": {"zone": "eu-1"}}],
    "keep_alive": -1,
    "activation": True,
}


@asynccontextmanager
async def raw_engine(target: StoreTarget) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(normalize_url(target.url), schema=target.schema)
    try:
        yield engine
    finally:
        await engine.dispose()


async def test_a_created_model_reads_back(store: Store) -> None:
    stored = await store.catalog.put("llama", SPEC, create=True)
    assert stored == StoredModel(name="llama", spec=SPEC, created_at=START, updated_at=START)
    assert await store.catalog.get("llama") == stored
    assert await store.catalog.get("nobody") is None
    assert await store.catalog.list() == [stored]


async def test_list_is_by_name(store: Store) -> None:
    for name in ("qwen", "gemma", "llama"):
        await store.catalog.put(name, {**SPEC, "name": name}, create=True)
    assert [m.name for m in await store.catalog.list()] == ["gemma", "llama", "qwen"]


async def test_creating_a_stored_name_fails_and_writes_nothing(store: Store) -> None:
    await store.catalog.put("llama", SPEC, create=True)
    with pytest.raises(AlreadyExists, match=r"'llama' is already in the store") as info:
        await store.catalog.put("llama", {**SPEC, "weights": "/other"}, create=True)
    assert isinstance(info.value, Conflict)
    stored = await store.catalog.get("llama")
    assert stored is not None and stored.spec == SPEC


async def test_concurrent_creates_of_one_name_store_one(store: Store) -> None:
    results = await asyncio.gather(
        *(store.catalog.put("race", {**SPEC, "weights": f"/m/{i}"}, create=True) for i in range(4)),
        return_exceptions=True,
    )
    assert sum(isinstance(r, StoredModel) for r in results) == 1
    assert all(isinstance(r, AlreadyExists) for r in results if not isinstance(r, StoredModel))
    assert len(await store.catalog.list()) == 1


async def test_replacing_keeps_created_at_and_moves_updated_at(
    store: Store, store_clock: FakeClock
) -> None:
    await store.catalog.put("llama", SPEC, create=True)
    later = store_clock.advance(minutes=5)
    changed = {**SPEC, "max_replicas": 3}
    replaced = await store.catalog.put("llama", changed, create=False)
    assert replaced == StoredModel("llama", changed, START, later)
    assert await store.catalog.get("llama") == replaced


async def test_replacing_a_missing_name_fails_and_writes_nothing(store: Store) -> None:
    with pytest.raises(NotFound, match=r"'ghost' is not in the store"):
        await store.catalog.put("ghost", SPEC, create=False)
    assert await store.catalog.list() == []


async def test_delete(store: Store) -> None:
    await store.catalog.put("llama", SPEC, create=True)
    assert await store.catalog.delete("llama") is True
    assert await store.catalog.delete("llama") is False
    assert await store.catalog.get("llama") is None


async def test_specs_are_copies(store: Store) -> None:
    await store.catalog.put("llama", SPEC, create=True)
    first = await store.catalog.get("llama")
    assert first is not None
    first.spec["weights"] = "/tampered"
    again = await store.catalog.get("llama")
    assert again is not None and again.spec["weights"] == "/m/llama"


async def test_names_and_specs_the_store_refuses(store: Store) -> None:
    with pytest.raises(InvalidValue, match="1 to 128 characters"):
        await store.catalog.put("x" * 129, SPEC, create=True)
    with pytest.raises(InvalidValue, match="1 to 128 characters"):
        await store.catalog.put("", SPEC, create=True)
    with pytest.raises(InvalidValue, match="must be a JSON object"):
        await store.catalog.put("llama", ["not", "a", "dict"], create=True)  # type: ignore[arg-type]


async def test_migration_0002_creates_the_table_and_rerunning_is_a_no_op(
    store_target: StoreTarget,
) -> None:
    store = await store_target.open()
    try:
        await store.upgrade()
        assert await store.revision() == head_revision()
        await store.catalog.put("llama", SPEC, create=True)
        await store.upgrade()
        await store.upgrade()
        assert await store.revision() == head_revision()
        assert [m.name for m in await store.catalog.list()] == ["llama"]
    finally:
        await store.close()

    def columns(conn: Connection) -> dict[str, bool]:
        return {c["name"]: c["nullable"] for c in inspect(conn).get_columns("catalog_models")}

    def primary_key(conn: Connection) -> list[str]:
        return list(inspect(conn).get_pk_constraint("catalog_models")["constrained_columns"])

    async with raw_engine(store_target) as engine, engine.connect() as conn:
        assert await conn.run_sync(columns) == {
            "name": False,
            "spec": False,
            "created_at": False,
            "updated_at": False,
            "previous_spec": True,
        }
        assert await conn.run_sync(primary_key) == ["name"]


async def test_migration_0002_upgrades_a_database_at_0001(store_target: StoreTarget) -> None:
    store = await store_target.open()  # creates the SQLite file's directory
    try:
        async with raw_engine(store_target) as engine, engine.begin() as conn:

            def to_0001(sync_conn: Connection) -> None:
                command.upgrade(alembic_config(sync_conn), "0001")

            await conn.run_sync(to_0001)
        assert await store.revision() == "0001"
        await store.upgrade()
        assert await store.revision() == head_revision()
        assert await store.catalog.list() == []
    finally:
        await store.close()
