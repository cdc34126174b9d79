"""Where each model's rollout stands, as the leading controller sees it: under way, or stopped.

The planning is `rollout` (pure, inside `plan`); this book keeps what the plan
cannot derive from the catalog and the inventory: which rollouts a failing new
replica stopped (a `Halt`, written to the store through a `RolloutLedger` so the
next leader keeps it stopped), which canaries a failing replica of theirs stopped
(a `Halt` of the canary's spec, kept the same way: the canary is no longer started,
its remaining replicas drain as after an abort, the model's own spec serves), and
which models were rolling at the last plan (for the `rollout` events: begun, done,
stopped).

Not guaranteed: that a halt survives a store that cannot be written (the leader
that saw the failure keeps it; a new leader would try the spec once more and
stop again), or that a standby knows anything here (only the leader plans).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Mapping
from datetime import datetime
from typing import Any, Protocol

from llmgw.control.catalog.model import CatalogModel, canary_model
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
        canary_ledger: RolloutLedger | None = None,
        event: Callable[[str, str], None],
        spawn: Callable[[Coroutine[Any, Any, None], str], None],
        wall_clock: Callable[[], datetime],
    ) -> None:
        self._ledger = ledger
        self._canary_ledger = canary_ledger
        self._event = event
        self._spawn = spawn
        self._wall_clock = wall_clock
        self._halts: dict[str, Halt] = {}
        self._canary_halts: dict[str, Halt] = {}
        self._rolling: dict[str, str] = {}

    async def read(self) -> None:
        """The stopped rollouts and canaries the previous leaders kept; none when the store
        cannot say (a rollout or canary may then try its failing spec once more, and stop
        again)."""
        self._halts = await _read(self._ledger, "rollouts")
        self._canary_halts = await _read(self._canary_ledger, "canaries")

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
        """A replica failed: when it runs the new spec of a rolling model, stop the rollout;
        when it runs the model's canary, stop the canary."""
        if model is None:
            return
        canary = canary_model(model)
        if canary is not None and spec is not None and runs_current(canary, spec):
            self._canary_failed(model, canary, shard_id, why)
            return
        if model.name not in self._rolling or not runs_current(model, spec):
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
            self._spawn(
                _keep(self._ledger, model.name, key, reason, "rollout"), f"record halt {model.name}"
            )

    def _canary_failed(
        self, model: CatalogModel, canary: CatalogModel, shard_id: str, why: str
    ) -> None:
        key = spec_key(canary)
        held = self._canary_halts.get(model.name)
        if held is not None and held.spec_key == key:
            return
        name = model.canary.name if model.canary is not None else "canary"
        reason = (
            f"replica {shard_id} of canary {name!r} failed ({why}); the canary is stopped and "
            f"the model's own spec serves. Drop it with `llmgw models rollout abort "
            f"{model.name}`, or fix its spec with `llmgw models add --replace`"
        )
        self._canary_halts[model.name] = Halt(model.name, key, reason, self._wall_clock())
        log.warning("model %s: canary stopped: %s", model.name, reason)
        self._event(model.name, f"canary stopped: {reason}")
        if self._canary_ledger is not None:
            self._spawn(
                _keep(self._canary_ledger, model.name, key, reason, "canary"),
                f"record canary halt {model.name}",
            )

    def canary_halted(self, model: CatalogModel) -> str | None:
        """Why the model's canary is stopped, or None; the stop of a canary that changed
        or is gone (promoted, aborted, edited) is dropped."""
        halt = self._canary_halts.get(model.name)
        if halt is None:
            return None
        canary = canary_model(model)
        if canary is not None and halt.spec_key == spec_key(canary):
            return halt.reason
        del self._canary_halts[model.name]
        self._event(model.name, "the canary changed or is gone: its stop is over")
        if self._canary_ledger is not None:
            self._spawn(
                _drop(self._canary_ledger, model.name, "canary"),
                f"clear canary halt {model.name}",
            )
        return None

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
            self._spawn(_drop(self._ledger, model.name, "rollout"), f"clear halt {model.name}")
        return False

    def state(self, model: CatalogModel) -> Rollout | None:
        """Where the model's rollout stands; None when every replica runs its spec."""
        halt = self._halts.get(model.name)
        if halt is not None and halt.spec_key == spec_key(model):
            return Rollout("halted", self._rolling.get(model.name, ""), halt.reason)
        if model.name in self._rolling:
            return Rollout("rolling", self._rolling[model.name])
        return None


async def _read(ledger: RolloutLedger | None, what: str) -> dict[str, Halt]:
    if ledger is None:
        return {}
    try:
        stored = await ledger.list()
    except StoreError as exc:
        log.warning("cannot read the stopped %s (%s); none is kept stopped", what, exc)
        return {}
    return {h.model: Halt(h.model, h.spec_key, h.reason, h.halted_at) for h in stored}


async def _keep(ledger: RolloutLedger, model: str, key: str, reason: str, what: str) -> None:
    try:
        await ledger.halt(model, key, reason)
    except StoreError as exc:
        log.warning(
            "model %s: the stopped %s could not be recorded (%s); this leader keeps it "
            "stopped, a new one would try its spec again",
            model,
            what,
            exc,
        )


async def _drop(ledger: RolloutLedger, model: str, what: str) -> None:
    try:
        await ledger.clear(model)
    except StoreError as exc:
        log.warning("model %s: a stale stopped %s stays recorded (%s)", model, what, exc)
