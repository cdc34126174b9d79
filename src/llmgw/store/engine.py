"""Building the async engine, and translating driver failures into store errors.

SQLite connections get `journal_mode=WAL` (readers do not block the writer),
`synchronous=NORMAL` (safe with WAL: a power cut may lose the last commits, never
corrupt the file), `busy_timeout` (wait for the write lock instead of failing) and
`foreign_keys=ON`. PostgreSQL connections may be pinned to a schema through
`search_path`, so several deployments or test runs can share one database.

Not guaranteed: that SQLite transactions are serializable across the read and
write of one repository call. The sqlite3 driver begins a transaction at the first
write, so uniqueness is enforced by indexes, not by reads done beforehand.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from llmgw.store.errors import BadStoreUrl, StoreError, StoreUnavailable
from llmgw.store.urls import describe

SQLITE_BUSY_TIMEOUT_MS = 5000
PG_CONNECT_TIMEOUT_S = 10.0
_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def make_engine(
    url: URL, *, schema: str | None = None, pool_size: int | None = None
) -> AsyncEngine:
    """An engine for `url` (already normalized); no connection is made yet.

    `pool_size`: keep at most this many connections (the default pool otherwise:
    5, and 10 more while busy)."""
    pool: dict[str, Any] = {} if pool_size is None else {"pool_size": pool_size, "max_overflow": 0}
    if url.get_backend_name() == "sqlite":
        if schema is not None:
            raise BadStoreUrl("a schema can only be chosen for PostgreSQL, not for SQLite")
        engine = create_async_engine(url, **pool)
        event.listen(engine.sync_engine, "connect", _configure_sqlite)
        return engine
    connect_args: dict[str, Any] = {"timeout": PG_CONNECT_TIMEOUT_S}
    if schema is not None:
        if not _SCHEMA_NAME.match(schema):
            raise BadStoreUrl(f"schema {schema!r} is not a plain PostgreSQL identifier")
        connect_args["server_settings"] = {"search_path": schema}
    # pre_ping: a pooled connection may be dead after a PostgreSQL restart or failover.
    return create_async_engine(url, connect_args=connect_args, pool_pre_ping=True, **pool)


def _configure_sqlite(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


@asynccontextmanager
async def transaction(engine: AsyncEngine, what: str) -> AsyncIterator[AsyncConnection]:
    """A connection in a transaction, committed on success, with errors translated.

    `what` names the operation for messages ("revoking key key_ab12"). Integrity
    errors are passed through for the caller to turn into `Conflict`.
    """
    try:
        async with engine.begin() as conn:
            yield conn
    except IntegrityError:
        raise
    except (DBAPIError, OSError) as exc:
        raise translate(exc, engine, what) from exc
    except PoolTimeout as exc:
        raise StoreUnavailable(
            f"{what} failed: every connection to the database at {describe(engine.url)} "
            f"stayed busy ({exc}); the store is overloaded"
        ) from exc


def translate(exc: DBAPIError | OSError, engine: AsyncEngine, what: str) -> StoreError:
    """A store error for a failed database call, with a hint at what to do."""
    where = describe(engine.url)
    if isinstance(exc, OSError) or (isinstance(exc, DBAPIError) and exc.connection_invalidated):
        return StoreUnavailable(
            f"{what} failed: the database at {where} did not answer ({exc}); "
            "check that it is running and reachable"
        )
    detail = str(exc.orig) if exc.orig is not None else str(exc)
    if _looks_unmigrated(detail):
        return StoreError(
            f"{what} failed: the database at {where} has no llmgw tables ({detail}); "
            "run `llmgw db upgrade` or start the server, which applies migrations"
        )
    if _looks_unreachable(detail):
        return StoreUnavailable(
            f"{what} failed: the database at {where} did not answer ({detail}); "
            "check that it is running and reachable"
        )
    return StoreError(f"{what} failed on {where}: {detail}")


def _looks_unmigrated(detail: str) -> bool:
    lowered = detail.lower()
    return "no such table" in lowered or ("relation" in lowered and "does not exist" in lowered)


def _looks_unreachable(detail: str) -> bool:
    lowered = detail.lower()
    return any(
        s in lowered
        for s in (
            "unable to open database",
            "database is locked",
            "connection refused",
            "connection was closed",
            "timeout",
        )
    )
