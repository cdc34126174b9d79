"""The control-plane lease, the Ready endpoints the leader publishes, demand per server,
and the servers themselves.

The lease is one row (`leases`, name "control"): owner, epoch, expiry. Taking a
free or expired lease raises the epoch; renewing keeps it. Every write the
leader makes to shared placement state (the published endpoints) carries its
epoch and is refused with `StaleEpoch` when the lease has moved on, in the same
transaction that checks it (fencing): a leader that was paused past its expiry
and wakes up cannot overwrite what the new leader published.

Times come from the caller's wall clock. Not guaranteed: correctness under
clock skew between servers larger than a small fraction of the lease TTL; run
NTP. Not guaranteed either: that a reader sees a write committed after its
query began (followers poll).

Every server announces itself (`announce`) every third of the lease TTL, so
all of them can be listed, and so the leader can ignore the demand rows of a
server that died without withdrawing them (`servers` says when each was last
seen); `forget` removes a server and its demand, on a clean stop or when the
leader clears out servers silent for long.

Published endpoints are read back only for replicas with a placement record
(`store.placements`), so a standby serves only what the leader placed.

The leader also writes each node as its inventory shows it (`publish_nodes`,
fenced like the endpoints), so a standby, which has no agent streams, can show
the fleet as the leader sees it (`fleet_nodes`).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from llmgw.store.engine import transaction
from llmgw.store.errors import StaleEpoch
from llmgw.store.tables import (
    control_servers,
    fleet_nodes,
    leases,
    model_demand,
    placements,
    replica_endpoints,
)


@dataclass(frozen=True, slots=True)
class Lease:
    name: str
    owner: str
    epoch: int
    acquired_at: datetime
    expires_at: datetime
    agent_address: str


@dataclass(frozen=True, slots=True)
class PublishedEndpoint:
    """A Ready replica as the leader published it, with the node and port its
    placement record gives it (`endpoints` returns only recorded replicas)."""

    model: str
    replica_id: str
    url: str
    names: tuple[str, ...]
    epoch: int
    node_id: str = ""
    port: int = 0
    # A LoRA adapter's row: the base model whose replica it is (None: the model's own).
    base: str | None = None


@dataclass(frozen=True, slots=True)
class FleetNode:
    """A node as the leader's inventory showed it when it wrote `updated_at`."""

    node_id: str
    view: dict[str, Any]
    epoch: int
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """One replica's engine load as a server's router last read it from its metrics
    (None where the engine reports nothing), and when (wall clock, UTC)."""

    replica: str
    waiting: int | None
    running: int | None
    kv_cache_usage: float | None
    read_at: datetime


@dataclass(frozen=True, slots=True)
class ModelLoad:
    """A server's router's load signals for one model: requests waiting in its own
    queue, the longest wait among them (seconds), and its engine reads per replica."""

    queued: int = 0
    queue_wait: float = 0.0
    replicas: tuple[ReplicaLoad, ...] = ()


@dataclass(frozen=True, slots=True)
class Demand:
    """What one server's router saw of one model."""

    model: str
    server: str
    last_active: datetime
    in_flight: int
    wanted_at: datetime | None
    load: ModelLoad = ModelLoad()


@dataclass(frozen=True, slots=True)
class ControlServer:
    """One `llmgw server` on this store, as it last announced itself."""

    server: str
    hostname: str
    version: str
    api_url: str
    agent_address: str  # "" without an agent listener
    started_at: datetime
    last_seen: datetime


class LeadershipRepository:
    """Lease, published endpoints and demand; every method is one short transaction."""

    def __init__(self, *, engine: AsyncEngine, clock: Callable[[], datetime]) -> None:
        self._engine = engine
        self._clock = clock
        self._postgres = engine.dialect.name == "postgresql"

    # ---- the lease ----

    async def acquire(self, name: str, owner: str, ttl: float, agent_address: str) -> Lease | None:
        """Take the lease when it is free, expired or already `owner`'s; None when held
        by another. A change of owner raises the epoch; keeping it does not."""
        now = self._clock()
        expires = now + timedelta(seconds=ttl)
        async with transaction(self._engine, f"taking the {name!r} lease") as conn:
            row = await self._locked(conn, name)
            if row is None:
                try:
                    await conn.execute(
                        leases.insert().values(
                            name=name, owner=owner, epoch=1, acquired_at=now,
                            expires_at=expires, agent_address=agent_address,
                        )
                    )  # fmt: skip
                except IntegrityError:
                    return None  # another server inserted it first
                return Lease(name, owner, 1, now, expires, agent_address)
            if row["owner"] != owner and row["expires_at"] > now:
                return None
            epoch = int(row["epoch"]) + (0 if row["owner"] == owner else 1)
            acquired = row["acquired_at"] if row["owner"] == owner else now
            result = await conn.execute(
                update(leases)
                .where(leases.c.name == name, leases.c.epoch == row["epoch"])
                .values(
                    owner=owner, epoch=epoch, acquired_at=acquired, expires_at=expires,
                    agent_address=agent_address,
                )
            )  # fmt: skip
            if result.rowcount != 1:
                return None
            return Lease(name, owner, epoch, acquired, expires, agent_address)

    async def renew(self, name: str, owner: str, epoch: int, ttl: float) -> datetime | None:
        """Extend `owner`'s lease at `epoch`; the new expiry, or None when it is lost."""
        now = self._clock()
        expires = now + timedelta(seconds=ttl)
        async with transaction(self._engine, f"renewing the {name!r} lease") as conn:
            result = await conn.execute(
                update(leases)
                .where(
                    leases.c.name == name,
                    leases.c.owner == owner,
                    leases.c.epoch == epoch,
                    leases.c.expires_at > now,
                )
                .values(expires_at=expires)
            )
            return expires if result.rowcount == 1 else None

    async def release(self, name: str, owner: str, epoch: int) -> bool:
        """Give the lease up now (a clean shutdown), so a standby need not wait for it."""
        now = self._clock()
        async with transaction(self._engine, f"releasing the {name!r} lease") as conn:
            result = await conn.execute(
                update(leases)
                .where(leases.c.name == name, leases.c.owner == owner, leases.c.epoch == epoch)
                .values(expires_at=now)
            )
            return bool(result.rowcount == 1)

    async def current(self, name: str) -> Lease | None:
        """The lease as stored (possibly expired), or None when nobody ever held it."""
        async with transaction(self._engine, f"reading the {name!r} lease") as conn:
            row = (await conn.execute(select(leases).where(leases.c.name == name))).first()
        return None if row is None else _lease(row._mapping)

    async def _locked(self, conn: AsyncConnection, name: str) -> Any:
        return await locked_lease(conn, name, postgres=self._postgres)

    async def _check_epoch(self, conn: AsyncConnection, name: str, epoch: int) -> None:
        await check_epoch(conn, name, epoch, postgres=self._postgres)

    # ---- published endpoints ----

    async def publish(
        self,
        lease_name: str,
        epoch: int,
        model: str,
        names: Sequence[str],
        endpoints: Sequence[tuple[str, str]],
        base: str | None = None,
    ) -> None:
        """Replace `model`'s Ready endpoints ((replica id, url) pairs); `StaleEpoch` when
        fenced. `base`: for a LoRA adapter, the model whose replicas these are."""
        now = self._clock()
        async with transaction(self._engine, f"publishing endpoints of {model!r}") as conn:
            await self._check_epoch(conn, lease_name, epoch)
            await conn.execute(delete(replica_endpoints).where(replica_endpoints.c.model == model))
            if endpoints:
                await conn.execute(
                    replica_endpoints.insert(),
                    [
                        {
                            "model": model, "replica_id": replica_id, "url": url,
                            "names": list(names), "base": base, "epoch": epoch,
                            "updated_at": now,
                        }
                        for replica_id, url in endpoints
                    ],
                )  # fmt: skip

    async def withdraw(self, lease_name: str, epoch: int, models: Sequence[str]) -> None:
        """Remove models that are not served any more; `StaleEpoch` when fenced."""
        async with transaction(self._engine, "withdrawing endpoints") as conn:
            await self._check_epoch(conn, lease_name, epoch)
            await conn.execute(
                delete(replica_endpoints).where(replica_endpoints.c.model.in_(list(models)))
            )

    async def endpoints(self) -> builtins.list[PublishedEndpoint]:
        """Every published endpoint whose replica has a placement record (rank 0 of
        that model, or of an adapter's base), by model then replica id; a row without
        one is left out."""
        stmt = (
            select(replica_endpoints, placements.c.node_id, placements.c.port)
            .join(
                placements,
                (placements.c.shard_id == replica_endpoints.c.replica_id)
                & (
                    placements.c.model
                    == func.coalesce(replica_endpoints.c.base, replica_endpoints.c.model)
                )
                & (placements.c.node_rank == 0),
            )
            .order_by(replica_endpoints.c.model, replica_endpoints.c.replica_id)
        )
        async with transaction(self._engine, "reading published endpoints") as conn:
            rows = (await conn.execute(stmt)).all()
        return [
            PublishedEndpoint(
                model=r.model,
                replica_id=r.replica_id,
                url=r.url,
                names=tuple(cast(list[str], r.names)),
                epoch=int(r.epoch),
                node_id=r.node_id,
                port=int(r.port),
                base=r.base,
            )
            for r in rows
        ]

    # ---- the fleet as the leader sees it ----

    async def publish_nodes(
        self,
        lease_name: str,
        epoch: int,
        views: Mapping[str, dict[str, Any]],
        *,
        keep_only: bool,
    ) -> None:
        """Write `views` (node id -> view); with `keep_only`, also remove every other
        node. `StaleEpoch` when fenced."""
        now = self._clock()
        async with transaction(self._engine, "publishing the fleet's nodes") as conn:
            await self._check_epoch(conn, lease_name, epoch)
            if keep_only:
                await conn.execute(
                    delete(fleet_nodes).where(fleet_nodes.c.node_id.not_in(list(views)))
                )
            if not views:
                return
            insert = (postgresql.insert if self._postgres else sqlite.insert)(fleet_nodes)
            upsert = insert.on_conflict_do_update(
                index_elements=[fleet_nodes.c.node_id],
                set_={
                    "view": insert.excluded.view,
                    "epoch": insert.excluded.epoch,
                    "updated_at": insert.excluded.updated_at,
                },
            )
            await conn.execute(
                upsert,
                [
                    {"node_id": node_id, "view": view, "epoch": epoch, "updated_at": now}
                    for node_id, view in sorted(views.items())
                ],
            )

    async def withdraw_nodes(self, lease_name: str, epoch: int, node_ids: Sequence[str]) -> None:
        """Remove nodes the leader no longer knows; `StaleEpoch` when fenced."""
        async with transaction(self._engine, "withdrawing fleet nodes") as conn:
            await self._check_epoch(conn, lease_name, epoch)
            await conn.execute(delete(fleet_nodes).where(fleet_nodes.c.node_id.in_(node_ids)))

    async def fleet_nodes(self) -> builtins.list[FleetNode]:
        """Every node the leader wrote, by id."""
        async with transaction(self._engine, "reading the fleet's nodes") as conn:
            rows = (await conn.execute(select(fleet_nodes).order_by(fleet_nodes.c.node_id))).all()
        return [
            FleetNode(
                node_id=r.node_id,
                view=cast(dict[str, Any], r.view),
                epoch=int(r.epoch),
                updated_at=r.updated_at,
            )
            for r in rows
        ]

    # ---- demand ----

    async def report_demand(self, server: str, rows: Sequence[Demand]) -> None:
        """Replace `server`'s demand rows with `rows`."""
        async with transaction(self._engine, f"reporting demand of {server!r}") as conn:
            await conn.execute(delete(model_demand).where(model_demand.c.server == server))
            if rows:
                await conn.execute(
                    model_demand.insert(),
                    [
                        {
                            "model": d.model, "server": server, "last_active": d.last_active,
                            "in_flight": d.in_flight, "wanted_at": d.wanted_at,
                            "queued": d.load.queued, "queue_wait": d.load.queue_wait,
                            "replicas": [_replica_json(r) for r in d.load.replicas] or None,
                        }
                        for d in rows
                    ],
                )  # fmt: skip

    # ---- the servers ----

    async def announce(self, server: ControlServer) -> None:
        """Insert or refresh `server`'s row; `last_seen` is the store's clock now."""
        row = {
            "server": server.server, "hostname": server.hostname, "version": server.version,
            "api_url": server.api_url, "agent_address": server.agent_address,
            "started_at": server.started_at, "last_seen": self._clock(),
        }  # fmt: skip
        insert = (postgresql.insert if self._postgres else sqlite.insert)(control_servers)
        upsert = insert.values(**row).on_conflict_do_update(
            index_elements=[control_servers.c.server],
            set_={name: insert.excluded[name] for name in row if name != "server"},
        )
        async with transaction(self._engine, f"announcing server {server.server!r}") as conn:
            await conn.execute(upsert)

    async def servers(self) -> builtins.list[ControlServer]:
        """Every server that announced itself and was not forgotten, by id."""
        async with transaction(self._engine, "reading the servers") as conn:
            rows = (
                await conn.execute(select(control_servers).order_by(control_servers.c.server))
            ).all()
        return [
            ControlServer(
                server=r.server, hostname=r.hostname, version=r.version, api_url=r.api_url,
                agent_address=r.agent_address, started_at=r.started_at, last_seen=r.last_seen,
            )
            for r in rows
        ]  # fmt: skip

    async def forget(self, servers: Sequence[str]) -> None:
        """Remove these servers and their demand rows."""
        if not servers:
            return
        async with transaction(self._engine, f"forgetting servers {list(servers)!r}") as conn:
            await conn.execute(delete(model_demand).where(model_demand.c.server.in_(servers)))
            await conn.execute(delete(control_servers).where(control_servers.c.server.in_(servers)))

    async def demand(self) -> builtins.list[Demand]:
        """Every server's demand rows."""
        async with transaction(self._engine, "reading demand") as conn:
            rows = (await conn.execute(select(model_demand))).all()
        return [
            Demand(
                r.model,
                r.server,
                r.last_active,
                int(r.in_flight),
                r.wanted_at,
                ModelLoad(
                    int(r.queued),
                    float(r.queue_wait),
                    tuple(_replica_load(item) for item in r.replicas or ()),
                ),
            )
            for r in rows
        ]


async def locked_lease(conn: AsyncConnection, name: str, *, postgres: bool) -> Any:
    """The lease row (locked until the transaction ends, on PostgreSQL), or None."""
    stmt = select(leases).where(leases.c.name == name)
    if postgres:
        stmt = stmt.with_for_update()
    row = (await conn.execute(stmt)).first()
    return None if row is None else row._mapping


async def check_epoch(conn: AsyncConnection, name: str, epoch: int, *, postgres: bool) -> None:
    """Fencing: `StaleEpoch` unless the `name` lease is still at `epoch`, checked in
    the transaction of the write it guards."""
    row = await locked_lease(conn, name, postgres=postgres)
    if row is None or int(row["epoch"]) != epoch:
        held = "nobody" if row is None else f"{row['owner']} at epoch {row['epoch']}"
        raise StaleEpoch(
            f"write refused: it carries epoch {epoch} of the {name!r} lease, which is "
            f"now held by {held}"
        )


def _replica_json(load: ReplicaLoad) -> dict[str, Any]:
    return {
        "replica": load.replica,
        "waiting": load.waiting,
        "running": load.running,
        "kv_cache_usage": load.kv_cache_usage,
        "read_at": load.read_at.isoformat(),
    }


def _replica_load(item: Mapping[str, Any]) -> ReplicaLoad:
    return ReplicaLoad(
        replica=str(item["replica"]),
        waiting=item.get("waiting"),
        running=item.get("running"),
        kv_cache_usage=item.get("kv_cache_usage"),
        read_at=datetime.fromisoformat(item["read_at"]),
    )


def _lease(row: Any) -> Lease:
    return Lease(
        name=row["name"],
        owner=row["owner"],
        epoch=int(row["epoch"]),
        acquired_at=row["acquired_at"],
        expires_at=row["expires_at"],
        agent_address=row["agent_address"],
    )
