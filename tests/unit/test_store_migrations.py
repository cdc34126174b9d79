"""Migrations from empty, idempotent re-runs and the schema they leave, on both databases."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine
from store_fixtures import START, StoreTarget, clock_fixture, store_fixture, target_fixture  # noqa: F401

from llmgw.store import NewApiKey, Store, StoreError, UsageRecord, upgrade
from llmgw.store.engine import make_engine
from llmgw.store.migrate import alembic_config, head_revision
from llmgw.store.tables import (
    issued_certificates,
    join_tokens,
    metadata,
    node_identities,
    usage_hourly,
)
from llmgw.store.urls import normalize_url

TABLES = {
    "alembic_version",
    "api_keys",
    "usage_records",
    "usage_hourly",
    "usage_daily",
    "catalog_models",
    "leases",
    "replica_endpoints",
    "model_demand",
    "control_servers",
    "users",
    "admin_sessions",
    "cluster_cas",
    "join_tokens",
    "issued_certificates",
    "node_identities",
    "node_revocations",
    "fleet_nodes",
    "placements",
    "rollout_halts",
    "teams",
    "team_members",
    "usage_end_users",
    "oidc_logins",
    "canary_halts",
    "usage_bases",
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
        assert await store.revision() == head_revision() == "0032"
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


async def test_the_daily_roll_ups_are_filled_from_the_hourly_ones_on_upgrade(
    store_target: StoreTarget,
) -> None:
    # A store at 0004 has usage only by the hour; 0005 adds the days, summed from them.
    hours = [START - timedelta(hours=h) for h in (0, 5, 12, 13, 30, 50)]
    rows = [
        {
            "hour": hour, "key_id": key, "model": "m", "requests": 2, "errors": 1,
            "prompt_tokens": 10 * n, "completion_tokens": n, "latency_ms_sum": 1.5,
        }
        for n, hour in enumerate(hours, 1)
        for key in ("k1", "")
    ]  # fmt: skip
    store = await store_target.open()  # creates the database, migrates nothing
    async with raw_engine(store_target) as engine, engine.begin() as conn:

        def to_0004(sync: Connection) -> None:
            command.upgrade(alembic_config(sync), "0004")

        await conn.run_sync(to_0004)
        await conn.execute(usage_hourly.insert(), rows)
    try:
        await store.upgrade()
        # No range: the whole days only, so exactly what the migration wrote.
        by_key = await store.usage.query(group_by=("key",))
        assert [(r.key_id, r.requests, r.prompt_tokens, r.completion_tokens) for r in by_key] == [
            (None, 12, 210, 21),
            ("k1", 12, 210, 21),
        ]
        # START is noon on Jan 1: the hours before 00:00 fall on Dec 31 and Dec 30.
        day = datetime(START.year, START.month, START.day, tzinfo=UTC)
        first_day = await store.usage.query(since=day, until=day + timedelta(days=1), group_by=())
        assert [(r.requests, r.prompt_tokens) for r in first_day] == [(12, 2 * (10 + 20 + 30))]
    finally:
        await store.close()


async def test_nodes_that_joined_before_keep_their_token_s_labels_on_upgrade(
    store_target: StoreTarget,
) -> None:
    # A store at 0013 knows which token each node's certificate was issued for;
    # 0014 binds that token's labels to the node (the latest join wins).
    tokens = [
        {
            "id": tid, "secret_hash": "0" * 64, "root_pem": "-", "labels": labels,
            "max_uses": None, "uses": 1, "created_at": START, "expires_at": START,
            "last_used_at": None, "revoked_at": None,
        }
        for tid, labels in (("t-old", {"zone": "old"}), ("t-new", {"zone": "a"}))
    ]  # fmt: skip
    certs = [
        {
            "serial": serial, "kind": "node", "subject": subject, "ca_id": "ca",
            "spki_sha256": "1" * 64, "token_id": token, "issued_at": START + timedelta(hours=h),
            "not_after": START + timedelta(days=30),
        }
        for serial, subject, token, h in (
            ("01", "gpu-1", "t-old", 0), ("02", "gpu-1", "t-new", 1), ("03", "gpu-1", None, 2),
            ("04", "own-1", None, 0),
        )
    ]  # fmt: skip
    nodes = [
        {"node_id": n, "key_hash": "1" * 64, "bound_at": START, "last_seen_at": START}
        for n in ("gpu-1", "own-1")
    ]
    store = await store_target.open()
    async with raw_engine(store_target) as engine, engine.begin() as conn:

        def to_0013(sync: Connection) -> None:
            command.upgrade(alembic_config(sync), "0013")

        await conn.run_sync(to_0013)
        # Only the columns 0013 has: the tables module describes the newest schema.
        await conn.execute(join_tokens.insert(), tokens)
        await conn.execute(issued_certificates.insert(), certs)
        await conn.execute(node_identities.insert(), nodes)
    try:
        await store.upgrade()
        bound = await store.nodeids.claim("gpu-1", "1" * 64, now=START)
        assert bound.binding is not None and bound.binding.labels == {"zone": "a"}
        own = await store.nodeids.claim("own-1", "1" * 64, now=START)
        assert own.binding is not None and own.binding.labels is None
        [token] = [t for t in await store.pki.tokens() if t.id == "t-new"]
        assert token.fabric == {}
    finally:
        await store.close()


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


async def test_admins_from_before_roles_become_admins_and_the_rest_get_no_role(
    store_target: StoreTarget,
) -> None:
    # A store at 0015 knows only the admin flags; 0018 turns them into roles.
    keys = [
        {"id": kid, "name": kid, "prefix": kid, "secret_hash": digit * 64, "is_admin": admin,
         "created_at": START, "updated_at": START, "priority": "default", "weight": 1.0}
        for kid, digit, admin in (("key_ops", "1", True), ("key_app", "2", False))
    ]  # fmt: skip
    people = [
        {"id": uid, "name": uid, "password_hash": "$argon2id$x", "admin": admin,
         "created_at": START}
        for uid, admin in (("usr_ann", True), ("usr_bob", False))
    ]  # fmt: skip
    store = await store_target.open()
    async with raw_engine(store_target) as engine, engine.begin() as conn:

        def to_0015(sync: Connection) -> None:
            command.upgrade(alembic_config(sync), "0015")

        await conn.run_sync(to_0015)
        for row in keys:
            await conn.execute(
                text(
                    "INSERT INTO api_keys (id, name, prefix, secret_hash, is_admin, created_at, "
                    "updated_at, priority, weight) VALUES (:id, :name, :prefix, :secret_hash, "
                    ":is_admin, :created_at, :updated_at, :priority, :weight)"
                ),
                row,
            )
        for row in people:
            await conn.execute(
                text(
                    "INSERT INTO users (id, name, password_hash, admin, created_at) "
                    "VALUES (:id, :name, :password_hash, :admin, :created_at)"
                ),
                row,
            )
    try:
        await store.upgrade()
        roles = {k.id: (k.admin_role, k.is_admin) for k in await store.keys.list()}
        assert roles == {"key_ops": ("admin", True), "key_app": (None, False)}
        users = {u.name: (u.admin_role, u.is_admin) for u in await store.users.list()}
        assert users == {"usr_ann": ("admin", True), "usr_bob": (None, False)}
    finally:
        await store.close()


async def test_keys_from_before_teams_belong_to_no_team(store_target: StoreTarget) -> None:
    # A store at 0018 has no teams; 0021 adds them, and every existing key has none.
    key = {"id": "key_old", "name": "old", "prefix": "old", "secret_hash": "3" * 64,
           "is_admin": False, "created_at": START, "updated_at": START,
           "priority": "default", "weight": 1.0}  # fmt: skip
    store = await store_target.open()
    async with raw_engine(store_target) as engine, engine.begin() as conn:

        def to_0018(sync: Connection) -> None:
            command.upgrade(alembic_config(sync), "0018")

        await conn.run_sync(to_0018)
        await conn.execute(
            text(
                "INSERT INTO api_keys (id, name, prefix, secret_hash, is_admin, created_at, "
                "updated_at, priority, weight) VALUES (:id, :name, :prefix, :secret_hash, "
                ":is_admin, :created_at, :updated_at, :priority, :weight)"
            ),
            key,
        )
    try:
        await store.upgrade()
        [old] = await store.keys.list()
        assert (old.id, old.team_id, old.team) == ("key_old", None, None)
        assert await store.teams.list() == []
    finally:
        await store.close()
