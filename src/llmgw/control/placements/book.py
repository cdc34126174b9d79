"""The placement records of this leadership term, in memory, written through to the store.

One `PlacementBook` per server, built by the composition root. While this
server leads, it holds every placement record:

- `start_term(epoch)` reads them all from the store once (retrying until the
  store answers), before the reconciler runs; until then `wait_loaded` keeps
  agents' Registers waiting, so no report is judged against an empty book.
- `record(placements)` writes a batch (one transaction, fenced with the
  term's epoch) and only then keeps them: the reconciler calls it before it
  sends the starts. `settled(shard_id, refused=...)` follows each start's
  answer; a start the node refused takes its record with it.
- `forget(shard_ids)` / `forget_node(node_id)` drop records at once and remove
  them from the store in the background (`run`, batched, retried); a shard
  that ended, a node that was removed.
- `vet(node_id, where, report)` judges one report (see `vetting`), in memory,
  with no store round trip; `registered(node_id, reported)` drops the records
  of shards a node no longer reports at Register (their engines are gone),
  except those whose start is still in flight.
- `end_term()` forgets everything; the next term reads the store again.

A write refused as stale (another server leads) calls `on_fenced`, so this
server steps down.

Not guaranteed: thread safety (every call from the event loop), or that a
removal reaches the store before this server stops leading; a record left
behind allows only the shard it names, and the next leader drops it when its
node registers without it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from typing import Protocol

from llmgw.control.inventory.model import ShardReport
from llmgw.control.placements.model import Placement, from_stored, to_stored
from llmgw.control.placements.vetting import NodeAddress, Verdict, vet
from llmgw.store import StaleEpoch, StoredPlacement, StoreError

log = logging.getLogger("llmgw.control.placements")

STORE_RETRY_SECONDS = 1.0


class PlacementError(Exception):
    """Placements could not be recorded; the message says why. Nothing was started."""


class PlacementStore(Protocol):
    """The store's `PlacementRepository` satisfies it."""

    async def record(
        self, lease_name: str, epoch: int, records: Sequence[StoredPlacement]
    ) -> list[StoredPlacement]: ...

    async def remove(self, lease_name: str, epoch: int, shard_ids: Sequence[str]) -> None: ...

    async def all(self) -> list[StoredPlacement]: ...


class PlacementBook:
    """The term's placement records; see the module docstring."""

    def __init__(
        self,
        *,
        store: PlacementStore,
        lease_name: str,
        on_fenced: Callable[[str], None],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._store = store
        self._lease_name = lease_name
        self._on_fenced = on_fenced
        self._sleep = sleep
        self._epoch: int | None = None
        self._loaded = asyncio.Event()
        self._by_shard: dict[str, Placement] = {}
        self._by_node: dict[str, set[str]] = {}
        self._in_flight: set[str] = set()
        self._removals: set[str] = set()
        self._wake = asyncio.Event()

    # ---- the term ----

    async def start_term(self, epoch: int) -> None:
        """Read every record (retrying while the store cannot answer), then judge reports."""
        self.end_term()
        while True:
            try:
                stored = await self._store.all()
                break
            except StoreError as exc:
                log.warning("cannot read the placement records (retrying): %s", exc)
                await self._sleep(STORE_RETRY_SECONDS)
        self._epoch = epoch
        for record in stored:
            self._keep(from_stored(record))
        self._loaded.set()
        log.info("read %d placement record(s) for epoch %d", len(stored), epoch)

    def end_term(self) -> None:
        """Forget the term's records; reports wait for the next `start_term`."""
        self._epoch = None
        self._loaded.clear()
        self._by_shard.clear()
        self._by_node.clear()
        self._in_flight.clear()
        self._removals.clear()

    @property
    def loaded(self) -> bool:
        """Whether this term's records are read (reports can be judged)."""
        return self._loaded.is_set()

    async def wait_loaded(self) -> None:
        """Return once this term's records are read (callers bound the wait)."""
        await self._loaded.wait()

    async def run(self) -> None:
        """Remove forgotten records from the store in batches (a leader-only task)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            epoch = self._epoch
            batch, self._removals = sorted(self._removals), set()
            if epoch is None or not batch:
                continue
            try:
                await self._store.remove(self._lease_name, epoch, batch)
            except StaleEpoch as exc:
                self._on_fenced(str(exc))
                return
            except StoreError as exc:
                log.warning("cannot remove %d placement record(s) (retrying): %s", len(batch), exc)
                self._removals.update(batch)
                await self._sleep(STORE_RETRY_SECONDS)
                self._wake.set()

    # ---- the reconciler's side ----

    async def record(self, placements: Sequence[Placement]) -> None:
        """Write `placements` to the store, then keep them; `PlacementError` if not."""
        epoch = self._epoch
        if epoch is None:
            raise PlacementError(
                "this server does not lead the control plane (its placement records are not loaded)"
            )
        try:
            await self._store.record(self._lease_name, epoch, [to_stored(p) for p in placements])
        except StaleEpoch as exc:
            self._on_fenced(str(exc))
            raise PlacementError(f"another server leads now: {exc}") from exc
        except StoreError as exc:
            raise PlacementError(f"the store refused the placement record: {exc}") from exc
        if self._epoch != epoch:
            raise PlacementError("this server stopped leading while it recorded the placement")
        for placement in placements:
            self._keep(placement)
            self._in_flight.add(placement.shard_id)

    def settled(self, shard_id: str, *, refused: bool) -> None:
        """The start of `shard_id` was answered; `refused`: the node said no (its record goes)."""
        self._in_flight.discard(shard_id)
        if refused:
            self.forget([shard_id])

    def forget(self, shard_ids: Iterable[str]) -> None:
        """Drop these records now, and from the store soon."""
        for shard_id in shard_ids:
            placement = self._by_shard.pop(shard_id, None)
            if placement is None:
                continue
            on_node = self._by_node.get(placement.node_id)
            if on_node is not None:
                on_node.discard(shard_id)
                if not on_node:
                    del self._by_node[placement.node_id]
            self._in_flight.discard(shard_id)
            self._removals.add(shard_id)
        if self._removals:
            self._wake.set()

    def forget_node(self, node_id: str) -> None:
        """Drop every record of a node (it was removed)."""
        self.forget(sorted(self._by_node.get(node_id, ())))

    def get(self, shard_id: str) -> Placement | None:
        return self._by_shard.get(shard_id)

    def on_node(self, node_id: str) -> list[Placement]:
        """The records of one node, by shard id."""
        return [self._by_shard[s] for s in sorted(self._by_node.get(node_id, ()))]

    # ---- the agent service's side ----

    def vet(self, node_id: str, where: NodeAddress, report: ShardReport) -> Verdict:
        """The verdict on one report of `node_id` (in memory; see `vetting.vet`)."""
        return vet(node_id, report, self._by_shard.get(report.shard_id), where)

    def registered(self, node_id: str, reported: Collection[str]) -> None:
        """`node_id` registered reporting `reported` (shard ids): a record of it not among
        them, and not a start in flight, names an engine that is gone."""
        gone = [
            shard_id
            for shard_id in self._by_node.get(node_id, ())
            if shard_id not in reported and shard_id not in self._in_flight
        ]
        if gone:
            log.info(
                "node %s registered without shard(s) %s: their placement records are dropped",
                node_id,
                ", ".join(sorted(gone)),
            )
            self.forget(gone)

    # ---- helpers ----

    def _keep(self, placement: Placement) -> None:
        previous = self._by_shard.get(placement.shard_id)
        if previous is not None and previous.node_id != placement.node_id:
            self._by_node.get(previous.node_id, set()).discard(placement.shard_id)
        self._by_shard[placement.shard_id] = placement
        self._by_node.setdefault(placement.node_id, set()).add(placement.shard_id)
