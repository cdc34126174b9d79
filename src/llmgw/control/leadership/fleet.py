"""The fleet as the leader sees it, for standbys: nodes written to the store, read back.

Standbys refuse agent streams, so their own inventory knows no node (or, after a
step-down, only stale ones shown unreachable). The leader therefore writes each
node's admin view to the store (`publish_fleet`, a leader-only task, epoch
fenced), and a standby's admin API reads it back (`FleetView.nodes`), so `llmgw
nodes list` pointed at any server shows the same fleet. A standby also keeps the
last read in memory (`FleetView.follow`, part of its follow loop) for its
dashboard, which renders without waiting on the store (`FleetView.latest`).

`publish_fleet` polls the inventory every `interval` seconds and writes only the
nodes whose view changed (the heartbeat age, which changes on every read, is not
part of the comparison: a standby computes it from `last_heartbeat_at`); its
first write of a term replaces the whole table, so nodes a previous leader knew
and this one does not are gone. Building every node's view is work in proportion
to the fleet (tens of milliseconds per thousand nodes), so the pause between rounds
grows with it: at least `interval`, and at least `PAUSE_PER_COST` times what the
last round took, which keeps the publisher to about a tenth of the event loop at
any fleet size (at 10,000 nodes a standby's view then lags by seconds, not one).

Not guaranteed: a standby's view is up to one pause (plus a store round
trip) behind the leader's; while no leader writes (during a takeover) it shows
the last one's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from llmgw.store import FleetNode, StaleEpoch, StoreError

log = logging.getLogger("llmgw.control.leadership")

NodeViews = Callable[[], Mapping[str, dict[str, Any]]]
"""Every node the leader's inventory knows, by id, as the admin API shows it."""

_AGE = "heartbeat_age_seconds"

PAUSE_PER_COST = 9.0
"""The pause after a publishing round is at least this many times the round's cost."""


class FleetStore(Protocol):
    async def publish_nodes(
        self,
        lease_name: str,
        epoch: int,
        views: Mapping[str, dict[str, Any]],
        *,
        keep_only: bool,
    ) -> None: ...

    async def withdraw_nodes(
        self, lease_name: str, epoch: int, node_ids: Sequence[str]
    ) -> None: ...

    async def fleet_nodes(self) -> list[FleetNode]: ...


def _comparable(view: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in view.items() if k != _AGE}


async def publish_fleet(
    *,
    store: FleetStore,
    views: NodeViews,
    lease_name: str,
    epoch: int,
    on_fenced: Callable[[str], None],
    interval: float,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.perf_counter,
) -> None:
    """Write the leader's nodes to the store while leading at `epoch` (see the module
    docstring); returns when fenced, after telling `on_fenced`."""
    written: dict[str, dict[str, Any]] | None = None  # None: replace everything first
    while True:
        started = clock()
        now = {node_id: _comparable(view) for node_id, view in views().items()}
        try:
            if written is None:
                await store.publish_nodes(lease_name, epoch, now, keep_only=True)
            else:
                changed = {k: v for k, v in now.items() if written.get(k) != v}
                gone = [k for k in written if k not in now]
                if gone:
                    await store.withdraw_nodes(lease_name, epoch, gone)
                if changed:
                    await store.publish_nodes(lease_name, epoch, changed, keep_only=False)
            written = now
        except StaleEpoch as exc:
            on_fenced(str(exc))
            return
        except StoreError as exc:
            log.warning("cannot write the fleet's nodes to the store (retrying): %s", exc)
        await sleep(max(interval, (clock() - started) * PAUSE_PER_COST))


class FleetView:
    """A standby's admin API source: the nodes as the leader last wrote them."""

    def __init__(
        self,
        *,
        store: FleetStore,
        leading: Callable[[], bool],
        leader: Callable[[], str | None],
        wall_clock: Callable[[], datetime],
    ) -> None:
        self._store = store
        self._leading = leading
        self._leader = leader
        self._wall_clock = wall_clock
        self._latest: list[FleetNode] | None = None

    def leading(self) -> bool:
        """True when this server leads: its own inventory is the fleet."""
        return self._leading()

    def leader(self) -> str | None:
        """The server that leads, as this one last saw it (None when unknown)."""
        return self._leader()

    async def nodes(self) -> list[dict[str, Any]]:
        """Every node as the leader wrote it, with its heartbeat age as of now and
        when the leader wrote it; `StoreError` when the store cannot be read."""
        rows = await self._store.fleet_nodes()
        self._latest = rows
        return self._views(rows)

    def latest(self) -> list[dict[str, Any]] | None:
        """The nodes as last read (by `follow` or `nodes`), ages as of now; None
        before the first read."""
        return None if self._latest is None else self._views(self._latest)

    async def follow(
        self, *, interval: float, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    ) -> None:
        """A standby's loop: read the leader's nodes every `interval` seconds (keeping
        the last read while the store cannot be reached)."""
        while True:
            try:
                self._latest = await self._store.fleet_nodes()
            except StoreError as exc:
                log.warning("cannot read the leader's nodes (keeping the last read): %s", exc)
            await sleep(interval)

    def _views(self, rows: Sequence[FleetNode]) -> list[dict[str, Any]]:
        now = self._wall_clock()
        out = []
        for row in rows:
            view = dict(row.view)
            beat = view.get("last_heartbeat_at")
            if isinstance(beat, str):
                age = (now - datetime.fromisoformat(beat)).total_seconds()
                view[_AGE] = round(max(age, 0.0), 3)
            view["leader_view_at"] = row.updated_at.isoformat()
            out.append(view)
        return out
