"""Stopped rollouts and canaries: which models' rollouts (or canaries) a failing replica
stopped, and why.

A rollout itself needs no record: the catalog holds the new spec and the agents
report what each replica runs, so any leader sees which replicas are outdated and
carries on. What it cannot see is that a new replica failed and the rollout was
stopped for it; that is kept here, so a leader taking over keeps it stopped
instead of starting the failing spec again. A canary whose replica failed is kept
the same way, in a table of its own (a model may have both stopped at once).

Not guaranteed: that a halt names a spec still in the catalog; the reconciler
drops a halt whose spec key no longer matches the model.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Table, delete, select
from sqlalchemy.ext.asyncio import AsyncEngine

from llmgw.store.engine import transaction
from llmgw.store.tables import canary_halts, rollout_halts


@dataclass(frozen=True, slots=True)
class StoredHalt:
    """A stopped rollout: the model, the key of the spec that failed, why, and when."""

    model: str
    spec_key: str
    reason: str
    halted_at: datetime


class RolloutRepository:
    """Stopped rollouts in the store (or, with `canary=True`, stopped canaries); every
    method is one short transaction."""

    def __init__(
        self, *, engine: AsyncEngine, clock: Callable[[], datetime], canary: bool = False
    ) -> None:
        self._engine = engine
        self._clock = clock
        self._table: Table = canary_halts if canary else rollout_halts
        self._what = "canary" if canary else "rollout"

    async def list(self) -> builtins.list[StoredHalt]:
        """Every stopped rollout, by model."""
        stmt = select(self._table).order_by(self._table.c.model)
        async with transaction(self._engine, f"listing stopped {self._what}s") as conn:
            return [
                StoredHalt(r.model, r.spec_key, r.reason, r.halted_at)
                for r in await conn.execute(stmt)
            ]

    async def halt(self, model: str, spec_key: str, reason: str) -> StoredHalt:
        """Record that `model`'s rollout (canary) of `spec_key` stopped, replacing an older
        record."""
        now = self._clock()
        table = self._table
        async with transaction(
            self._engine, f"recording the stopped {self._what} of {model!r}"
        ) as conn:
            await conn.execute(delete(table).where(table.c.model == model))
            await conn.execute(
                table.insert().values(model=model, spec_key=spec_key, reason=reason, halted_at=now)
            )
        return StoredHalt(model, spec_key, reason, now)

    async def clear(self, model: str) -> bool:
        """Forget `model`'s stopped rollout (canary); False when there was none."""
        table = self._table
        async with transaction(
            self._engine, f"clearing the stopped {self._what} of {model!r}"
        ) as conn:
            result = await conn.execute(delete(table).where(table.c.model == model))
        return result.rowcount > 0
