"""Stopped rollouts: which models' rollouts a failing new replica stopped, and why.

A rollout itself needs no record: the catalog holds the new spec and the agents
report what each replica runs, so any leader sees which replicas are outdated and
carries on. What it cannot see is that a new replica failed and the rollout was
stopped for it; that is kept here, so a leader taking over keeps it stopped
instead of starting the failing spec again.

Not guaranteed: that a halt names a spec still in the catalog; the reconciler
drops a halt whose spec key no longer matches the model.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncEngine

from llmgw.store.engine import transaction
from llmgw.store.tables import rollout_halts


@dataclass(frozen=True, slots=True)
class StoredHalt:
    """A stopped rollout: the model, the key of the spec that failed, why, and when."""

    model: str
    spec_key: str
    reason: str
    halted_at: datetime


class RolloutRepository:
    """Stopped rollouts in the store; every method is one short transaction."""

    def __init__(self, *, engine: AsyncEngine, clock: Callable[[], datetime]) -> None:
        self._engine = engine
        self._clock = clock

    async def list(self) -> builtins.list[StoredHalt]:
        """Every stopped rollout, by model."""
        stmt = select(rollout_halts).order_by(rollout_halts.c.model)
        async with transaction(self._engine, "listing stopped rollouts") as conn:
            return [
                StoredHalt(r.model, r.spec_key, r.reason, r.halted_at)
                for r in await conn.execute(stmt)
            ]

    async def halt(self, model: str, spec_key: str, reason: str) -> StoredHalt:
        """Record that `model`'s rollout to `spec_key` stopped, replacing an older record."""
        now = self._clock()
        async with transaction(self._engine, f"recording the stopped rollout of {model!r}") as conn:
            await conn.execute(delete(rollout_halts).where(rollout_halts.c.model == model))
            await conn.execute(
                rollout_halts.insert().values(
                    model=model, spec_key=spec_key, reason=reason, halted_at=now
                )
            )
        return StoredHalt(model, spec_key, reason, now)

    async def clear(self, model: str) -> bool:
        """Forget `model`'s stopped rollout; False when there was none."""
        async with transaction(self._engine, f"clearing the stopped rollout of {model!r}") as conn:
            result = await conn.execute(delete(rollout_halts).where(rollout_halts.c.model == model))
        return result.rowcount > 0
