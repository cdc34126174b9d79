"""Applying the Alembic migrations in `migrations/` from code, without an alembic.ini.

`upgrade_engine` brings a database from empty (or from any earlier revision) to the
newest one; on an up-to-date database it changes nothing. The whole run is one
transaction that first takes a lock (a transaction-scoped advisory lock on
PostgreSQL, the write lock on SQLite), so several servers starting against one
database at once apply each migration once, and a failed migration leaves the
previous revision in place.

Not guaranteed: downgrades (roll back by restoring a backup), or a free event
loop while it runs: Alembic reads and compiles the scripts on the loop's thread,
a few milliseconds, so upgrade at start-up and not while serving.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncEngine

from llmgw.store.engine import transaction

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Any constant works; this one spells "llmg" so it is recognisable in pg_locks.
_PG_LOCK_KEY = 0x6C6C6D67


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config pointing at the packaged migrations (and the connection to use)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest revision shipped with this version of llmgw."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise RuntimeError(f"no migrations found in {MIGRATIONS_DIR}; the package is incomplete")
    return head


async def upgrade_engine(engine: AsyncEngine) -> None:
    """Apply every migration the database has not seen yet; a no-op when up to date."""
    async with transaction(engine, "applying database migrations") as conn:
        await conn.run_sync(_upgrade)


async def current_revision(engine: AsyncEngine) -> str | None:
    """The revision the database is at; None for an empty database."""
    async with transaction(engine, "reading the database revision") as conn:
        return await conn.run_sync(_current_revision)


def _upgrade(connection: Connection) -> None:
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
    elif connection.dialect.name == "sqlite":
        # The sqlite3 driver would run DDL outside any transaction; an explicit
        # BEGIN IMMEDIATE makes the run atomic and makes a second upgrader wait.
        connection.exec_driver_sql("BEGIN IMMEDIATE")
    command.upgrade(alembic_config(connection), "head")


def _current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()
