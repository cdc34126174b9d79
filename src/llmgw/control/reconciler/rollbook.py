"""Where each model's rollout stands, as the leading controller sees it: under way, or stopped.

The planning is `rollout` (pure, inside `plan`); this book keeps what the plan
cannot derive from the catalog and the inventory: which rollouts a failing new
replica stopped (a `Halt`, written to the store through a `RolloutLedger` so the
next leader keeps it stopped), and which models were rolling at the last plan
(for the `rollout` events: begun, done, stopped).

Not guaranteed: that a halt survives a store that cannot be written (the leader
that saw the failure keeps it; a new leader would try the spec once more and
stop again), or that a standby knows anything here (only the leader plans).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Mapping
from datetime import datetime
from typing import Any, Protocol

from llmgw.control.catalog.model import CatalogModel
from llmgw.control.inventory import ShardSpec
from llmgw.control.reconciler.rollout import runs_current, spec_key
from llmgw.control.reconciler.state import Halt, Rollout
from llmgw.store import StoredHalt, StoreError

log = logging.getLogger("llmgw.control.reconciler")


class RolloutLedger(Protocol):
    """Where stopped rollouts are kept across leaders; the store's `RolloutRepository`."""

    async def list(self) -> list[StoredHalt]: ...

    async def halt(self, model: str, spec_key: str, reason: str, /) -> StoredHalt: ...

    async def clear(self, model: str, /) -> bool: ...


class RolloutBook:
    """Stopped rollouts and the models rolling now; `event(kind, model, message)` records
    what people should see, `spawn(coro, name)` runs a store write in the background."""

    def __init__(
        self,
        *,
        ledger: RolloutLedger | None,
        event: Callable[[str, str], None],
        spawn: Callable[[Coroutine[Any, Any, None], str], None],
        wall_clock: Callable[[], datetime],
    ) -> None:
        self._ledger = ledger
        self._event = event
        self._spawn = spawn
        self._wall_clock = wall_clock
        self._halts: dict[str, Halt] = {}
        self._rolling: dict[str, str] = {}

    async def read(self) -> None:
        """The stopped rollouts the previous leaders kept; none when the store cannot say
        (a rollout may then try its failing spec once more, and stop again)."""
        if self._ledger is None:
            return
        try:
            stored = await self._ledger.list()
        except StoreError as exc:
            log.warning("cannot read the stopped rollouts (%s); none is kept stopped", exc)
            return
        self._halts = {h.model: Halt(h.model, h.spec_key, h.reason, h.halted_at) for h in stored}

    def planned(self, rolling: Mapping[str, str]) -> None:
        """The last plan's rolling models: an event when one begins, and when one ends."""
        for name, detail in rolling.items():
            if name not in self._rolling:
                message = f"rolling out a new spec: {detail}"
                log.info("model %s: %s", name, message)
                self._event(name, message)
        for name in [n for n in self._rolling if n not in rolling]:
            if name not in self._halts:
                log.info("model %s: rollout done", name)
                self._event(name, "rollout done: every replica runs the new spec")
        self._rolling = dict(rolling)

    def failed(
        self, model: CatalogModel | None, shard_id: str, spec: ShardSpec | None, why: str
    ) -> None:
        """A replica failed: when it runs the new spec of a rolling model, stop the rollout."""
        if model is None or model.name not in self._rolling or not runs_current(model, spec):
            return
        key = spec_key(model)
        held = self._halts.get(model.name)
        if held is not None and held.spec_key == key:
            return
        reason = (
            f"replica {shard_id} of the new spec failed ({why}); the old replicas keep "
            f"serving. Undo with `llmgw models rollout undo {model.name}`, or fix the spec "
            "with `llmgw models add --replace`"
        )
        self._halts[model.name] = Halt(model.name, key, reason, self._wall_clock())
        log.warning("model %s: rollout stopped: %s", model.name, reason)
        self._event(model.name, f"rollout stopped: {reason}")
        if self._ledger is not None:
            self._spawn(self._keep(model.name, key, reason), f"record halt {model.name}")

    def halted(self, model: CatalogModel) -> bool:
        """Whether the model's rollout is stopped; a halt of another spec is dropped."""
        halt = self._halts.get(model.name)
        if halt is None:
            return False
        if halt.spec_key == spec_key(model):
            return True
        del self._halts[model.name]
        self._event(model.name, "the spec changed: the stopped rollout is over")
        if self._ledger is not None:
            self._spawn(self._drop(model.name), f"clear halt {model.name}")
        return False

    def state(self, model: CatalogModel) -> Rollout | None:
        """Where the model's rollout stands; None when every replica runs its spec."""
        halt = self._halts.get(model.name)
        if halt is not None and halt.spec_key == spec_key(model):
            return Rollout("halted", self._rolling.get(model.name, ""), halt.reason)
        if model.name in self._rolling:
            return Rollout("rolling", self._rolling[model.name])
        return None

    async def _keep(self, model: str, key: str, reason: str) -> None:
        assert self._ledger is not None
        try:
            await self._ledger.halt(model, key, reason)
        except StoreError as exc:
            log.warning(
                "model %s: the stopped rollout could not be recorded (%s); this leader keeps "
                "it stopped, a new one would try the new spec again",
                model,
                exc,
            )

    async def _drop(self, model: str) -> None:
        assert self._ledger is not None
        try:
            await self._ledger.clear(model)
        except StoreError as exc:
            log.warning("model %s: a stale stopped rollout stays recorded (%s)", model, exc)
