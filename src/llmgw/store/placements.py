"""Placement records: what the leader placed where, the only source of truth for adoption.

The leader writes a record for every shard it is about to start (`record`,
one transaction for all the starts of a reconcile, so a multi-node replica's
shards are recorded together) before it sends the start, and removes records
when their shards are gone (`remove`, also batched). Both carry the leader's
epoch and are refused with `StaleEpoch` in the same transaction when the lease
has moved on (fencing, as for the published endpoints): a leader that was
paused past its expiry cannot record a placement the new leader does not know.
A new leader reads every record once (`all`) when its term starts.

A record names the shard, its replica (rank 0's shard id), the node, the model,
the profile, the port and the rank, and keeps the start's whole spec as JSON
(the store neither reads nor checks it; `llmgw.control.placements` does).

Not guaranteed: that a record's shard runs. A record is written before the
start is sent; a start that never reached its node leaves a record until that
node next registers without the shard (the control plane then removes it), or
until the node is removed.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine

from llmgw.store.engine import transaction
from llmgw.store.errors import InvalidValue
from llmgw.store.leadership import check_epoch
from llmgw.store.tables import placements

MAX_ID = 128  # shard, replica, model and profile names, as the columns hold them
# Rows per DELETE ... IN (...): well below SQLite's and asyncpg's parameter limits.
_CHUNK = 500


@dataclass(frozen=True, slots=True)
class StoredPlacement:
    """One shard as the leader placed it; `spec` is the start command's spec as JSON."""

    shard_id: str
    replica_id: str
    node_id: str
    model: str
    profile: str
    port: int
    node_rank: int
    nodes: int
    spec: dict[str, Any]
    epoch: int = 0
    placed_at: datetime | None = None


class PlacementRepository:
    """Placement records; every method is one short transaction."""

    def __init__(self, *, engine: AsyncEngine, clock: Callable[[], datetime]) -> None:
        self._engine = engine
        self._clock = clock
        self._postgres = engine.dialect.name == "postgresql"

    async def record(
        self, lease_name: str, epoch: int, records: Sequence[StoredPlacement]
    ) -> builtins.list[StoredPlacement]:
        """Write `records` (replacing any of the same shard id) at `epoch`; returns them
        as stored. `StaleEpoch` when fenced, `InvalidValue` for a field too long."""
        if not records:
            return []
        for placed in records:
            _check(placed)
        now = self._clock()
        rows = [
            {
                "shard_id": p.shard_id, "replica_id": p.replica_id, "node_id": p.node_id,
                "model": p.model, "profile": p.profile, "port": p.port,
                "node_rank": p.node_rank, "nodes": p.nodes, "spec": p.spec,
                "epoch": epoch, "placed_at": now,
            }
            for p in records
        ]  # fmt: skip
        insert = (postgresql.insert if self._postgres else sqlite.insert)(placements)
        # A start sent again after a failed write keeps its shard id: the row is replaced.
        upsert = insert.on_conflict_do_update(
            index_elements=[placements.c.shard_id],
            set_={name: insert.excluded[name] for name in rows[0] if name != "shard_id"},
        )
        async with transaction(self._engine, f"recording {len(rows)} placement(s)") as conn:
            await check_epoch(conn, lease_name, epoch, postgres=self._postgres)
            await conn.execute(upsert, rows)
        return [_stored(row) for row in rows]

    async def remove(self, lease_name: str, epoch: int, shard_ids: Sequence[str]) -> None:
        """Remove the records of `shard_ids` (unknown ids are ignored); `StaleEpoch` when fenced."""
        ids = sorted(set(shard_ids))
        if not ids:
            return
        async with transaction(self._engine, f"removing {len(ids)} placement(s)") as conn:
            await check_epoch(conn, lease_name, epoch, postgres=self._postgres)
            for start in range(0, len(ids), _CHUNK):
                chunk = ids[start : start + _CHUNK]
                await conn.execute(delete(placements).where(placements.c.shard_id.in_(chunk)))

    async def all(self) -> builtins.list[StoredPlacement]:
        """Every record, by node then shard id (a new leader reads them once)."""
        stmt = select(placements).order_by(placements.c.node_id, placements.c.shard_id)
        async with transaction(self._engine, "reading placement records") as conn:
            return [_stored(dict(row._mapping)) for row in await conn.execute(stmt)]


def _check(placed: StoredPlacement) -> None:
    for field in ("shard_id", "replica_id", "model", "profile"):
        value = getattr(placed, field)
        if not value or len(value) > MAX_ID:
            raise InvalidValue(
                f"a placement's {field} is 1 to {MAX_ID} characters, got {value[:80]!r}"
            )
    if not placed.node_id or len(placed.node_id) > 253:
        raise InvalidValue(f"a placement's node_id is 1 to 253 characters: {placed.node_id!r}")


def _stored(row: dict[str, Any]) -> StoredPlacement:
    return StoredPlacement(
        shard_id=row["shard_id"],
        replica_id=row["replica_id"],
        node_id=row["node_id"],
        model=row["model"],
        profile=row["profile"],
        port=int(row["port"]),
        node_rank=int(row["node_rank"]),
        nodes=int(row["nodes"]),
        spec=cast(dict[str, Any], row["spec"]),
        epoch=int(row["epoch"]),
        placed_at=row["placed_at"],
    )
