"""The store as one object: an engine, its repositories, migrations and shutdown.

`open_store` is called once, by the composition root (`cli/server.py`), which
passes `store.keys`, `store.usage` and `store.catalog` on to their users and
awaits `store.close()` at shutdown. Nothing here is global: two stores (e.g. in
tests) never share state.

Not guaranteed: that the schema is current after `open_store`; call
`await store.upgrade()` (the server does at start-up) or `llmgw db upgrade`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from llmgw.store.catalog import CatalogRepository
from llmgw.store.engine import make_engine, translate
from llmgw.store.errors import BadStoreUrl
from llmgw.store.keys import KeyRepository
from llmgw.store.leadership import LeadershipRepository
from llmgw.store.migrate import current_revision, upgrade_engine
from llmgw.store.models import utc_now
from llmgw.store.nodeids import NodeIdentityRepository
from llmgw.store.oidc_logins import OidcLoginRepository
from llmgw.store.pki import PkiRepository
from llmgw.store.placements import PlacementRepository
from llmgw.store.rollouts import RolloutRepository
from llmgw.store.teams import TeamRepository
from llmgw.store.urls import describe, normalize_url
from llmgw.store.usage import UsageRepository
from llmgw.store.users import SessionRepository, UserRepository

LEASE_POOL_SIZE = 2
"""Connections kept for the lease alone (`Store.lease`): a renewal, and a release or a
read that may overlap it."""


class Store:
    """An open database with its repositories; build it with `open_store`."""

    def __init__(
        self,
        *,
        engine: AsyncEngine,
        clock: Callable[[], datetime],
        lease_engine: AsyncEngine | None = None,
    ) -> None:
        self._engine = engine
        self._lease_engine = lease_engine
        self.keys = KeyRepository(engine=engine, clock=clock)
        self.usage = UsageRepository(engine=engine)
        self.catalog = CatalogRepository(engine=engine, clock=clock)
        self.leadership = LeadershipRepository(engine=engine, clock=clock)
        # The lease on connections of its own: a renewal must not wait for a pooled
        # connection behind a registration storm's writes (it still takes its turn
        # at SQLite's write lock, briefly).
        self.lease = LeadershipRepository(engine=lease_engine or engine, clock=clock)
        self.users = UserRepository(engine=engine, clock=clock)
        self.teams = TeamRepository(engine=engine, clock=clock)
        self.sessions = SessionRepository(engine=engine)
        self.oidc_logins = OidcLoginRepository(engine=engine)
        self.pki = PkiRepository(engine=engine, clock=clock)
        self.nodeids = NodeIdentityRepository(engine=engine)
        self.placements = PlacementRepository(engine=engine, clock=clock)
        self.rollouts = RolloutRepository(engine=engine, clock=clock)
        self.canary_halts = RolloutRepository(engine=engine, clock=clock, canary=True)

    @property
    def url(self) -> str:
        """Where the store is, password hidden; for logs and the dashboard."""
        return describe(self._engine.url)

    @property
    def dialect(self) -> str:
        """The database kind: "sqlite" or "postgresql"."""
        return self._engine.dialect.name

    async def upgrade(self) -> None:
        """Apply pending migrations; a no-op on an up-to-date database."""
        await upgrade_engine(self._engine)

    async def revision(self) -> str | None:
        """The migration revision the database is at (None when empty)."""
        return await current_revision(self._engine)

    async def close(self) -> None:
        """Close every pooled connection; the store cannot be used afterwards."""
        await self._engine.dispose()
        if self._lease_engine is not None:
            await self._lease_engine.dispose()


async def open_store(
    url: str,
    *,
    clock: Callable[[], datetime] = utc_now,
    schema: str | None = None,
) -> Store:
    """Connect to the store at `url` (as given by `store_url`, or a raw --store value).

    Connects once to fail early with a clear message (`StoreUnavailable`) rather
    than on the first request. For SQLite the parent directory is created.
    `schema` (PostgreSQL only, must exist) keeps the tables in that schema.
    """
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database:
        directory = Path(parsed.database).parent
        try:
            await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
        except OSError as exc:
            raise BadStoreUrl(
                f"cannot create {directory} for the SQLite database ({exc}); "
                "pass a writable --data-dir, or --store postgresql://USER@HOST/DB"
            ) from exc
    engine = make_engine(parsed, schema=schema)
    lease_engine = make_engine(parsed, schema=schema, pool_size=LEASE_POOL_SIZE)
    try:
        await _probe(engine)
    except BaseException:
        await engine.dispose()
        await lease_engine.dispose()
        raise
    return Store(engine=engine, clock=clock, lease_engine=lease_engine)


async def upgrade(url: str, *, schema: str | None = None) -> None:
    """Bring the database at `url` to the newest schema (for `llmgw db upgrade`)."""
    store = await open_store(url, schema=schema)
    try:
        await store.upgrade()
    finally:
        await store.close()


async def _probe(engine: AsyncEngine) -> None:
    try:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    except (DBAPIError, OSError) as exc:
        raise translate(exc, engine, "opening the store") from exc
