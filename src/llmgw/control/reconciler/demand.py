"""Who wants which model: requests in flight, last activity, activations waiting.

The router of every server reports its requests here (`started`/`finished`);
activations mark a model as wanted until it is served. With several servers,
each reports its own rows to the store and the leader merges the others' rows
(`set_remote`), so a model in use through a standby is not scaled to zero.

Each row also carries the router's load signals for the model (`ModelLoad`:
its queue, its engine reads per replica), read from `local_load` when the row
is made; the leader merges them into `LoadSignals` for the load targets.

Times are kept on the monotonic clock; rows for the store are in wall-clock UTC.
Not guaranteed: demand from other servers is as old as their last report (about
a second; engine reads are re-sent at least every `LOAD_REFRESH` seconds).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from llmgw.control.catalog.model import CatalogModel
from llmgw.control.reconciler.autoscale import LoadSignals, merge_signals
from llmgw.store import Demand, ModelLoad

# Engine reads older than this are ignored by the leader: several missed scrapes,
# or a server that stopped reporting (its rows stay until it is forgotten).
LOAD_MAX_AGE = 15.0
# The last activity of a row that only carries load signals (no request went
# through that server): long ago, so it keeps nothing alive.
NEVER = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(slots=True)
class _Local:
    in_flight: int = 0
    last_active: float = -math.inf
    # Once activated, a pinned model (keep_alive -1) stays up.
    ever: bool = False
    wanted_since: float | None = None


@dataclass(frozen=True, slots=True)
class _Remote:
    in_flight: int
    last_active: float
    wanted: bool


class DemandBook:
    """Demand per model (by its canonical name), local and from other servers."""

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        wall_clock: Callable[[], datetime],
        local_load: Callable[[], Mapping[str, ModelLoad]] = dict,
    ) -> None:
        self._clock = clock
        self._wall_clock = wall_clock
        self._local_load = local_load
        self._local: dict[str, _Local] = {}
        self._remote: dict[str, _Remote] = {}
        self._remote_load: dict[str, list[ModelLoad]] = {}
        self._load: Mapping[str, ModelLoad] = {}
        # Set when an activation starts waiting: other servers should hear at once.
        self.changed = asyncio.Event()

    def started(self, model: str) -> None:
        entry = self._local.setdefault(model, _Local())
        entry.in_flight += 1
        entry.ever = True

    def finished(self, model: str) -> None:
        entry = self._local.setdefault(model, _Local())
        entry.in_flight = max(0, entry.in_flight - 1)
        entry.last_active = self._clock()

    def want(self, model: str) -> None:
        """An activation is waiting for `model`."""
        entry = self._local.setdefault(model, _Local())
        entry.ever = True
        entry.last_active = self._clock()
        if entry.wanted_since is None:
            entry.wanted_since = entry.last_active
        self.changed.set()

    def served(self, model: str) -> None:
        """The model has a ready replica: nothing waits for it any more."""
        entry = self._local.get(model)
        if entry is not None and entry.wanted_since is not None:
            entry.wanted_since = None

    def adopt(self, model: str) -> None:
        """A running replica was found (after a restart): count it as just used."""
        entry = self._local.setdefault(model, _Local())
        if entry.last_active == -math.inf:
            entry.last_active = self._clock()
            entry.ever = True

    def wants(self, model: CatalogModel, now: float, *, activating: bool) -> bool:
        """Whether `model` should have a replica now (beyond its min_replicas)."""
        local = self._local.get(model.name)
        remote = self._remote.get(model.name)
        if activating:
            return True
        for in_flight, last_active, ever, wanted in (
            (local.in_flight, local.last_active, local.ever, local.wanted_since is not None)
            if local is not None
            else (0, -math.inf, False, False),
            (remote.in_flight, remote.last_active, True, remote.wanted)
            if remote is not None
            else (0, -math.inf, False, False),
        ):
            if in_flight > 0 or wanted or (model.pinned and ever):
                return True
            if now - last_active < model.keep_alive:
                return True
        return False

    def in_flight(self, model: str) -> int:
        local = self._local.get(model)
        remote = self._remote.get(model)
        return (local.in_flight if local else 0) + (remote.in_flight if remote else 0)

    def idle_for(self, model: str, now: float) -> float | None:
        last = max(
            self._local[model].last_active if model in self._local else -math.inf,
            self._remote[model].last_active if model in self._remote else -math.inf,
        )
        return None if last == -math.inf else max(0.0, now - last)

    # ---- load signals ----

    def read_local_load(self) -> Mapping[str, ModelLoad]:
        """Read this server's router's load signals now (kept for `signals`)."""
        self._load = self._local_load()
        return self._load

    def signals(self, model: str, ready: Collection[str]) -> LoadSignals:
        """`model`'s load over every server: this one's as last read, the others' as
        last reported; `ready` are the ids of its Ready replicas."""
        local = self._load.get(model)
        return merge_signals(
            in_flight=self.in_flight(model),
            ready=ready,
            loads=[*self._remote_load.get(model, ()), *([local] if local is not None else [])],
            now=self._wall_clock(),
            max_age=LOAD_MAX_AGE,
        )

    # ---- across servers ----

    def local_rows(self, server: str) -> list[Demand]:
        """This server's demand, with its router's load signals, for the store."""
        now, wall = self._clock(), self._wall_clock()
        loads = self.read_local_load()
        rows = []
        for model in sorted({*self._local, *loads}):
            entry = self._local.get(model, _Local())
            load = loads.get(model, ModelLoad())
            if entry.last_active == -math.inf and not entry.in_flight and load == ModelLoad():
                continue
            if entry.last_active != -math.inf:
                last = _wall(wall, now, entry.last_active)
            else:
                last = wall if entry.in_flight else NEVER
            wanted = None if entry.wanted_since is None else _wall(wall, now, entry.wanted_since)
            rows.append(Demand(model, server, last, entry.in_flight, wanted, load))
        return rows

    def set_remote(self, rows: Sequence[Demand]) -> None:
        """The other servers' rows (the leader calls this with everything but its own)."""
        now, wall = self._clock(), self._wall_clock()
        merged: dict[str, _Remote] = {}
        loads: dict[str, list[ModelLoad]] = {}
        for row in rows:
            if row.load != ModelLoad():
                loads.setdefault(row.model, []).append(row.load)
            if row.last_active == NEVER and not row.in_flight and row.wanted_at is None:
                # A row for load signals only: no requests through that server.
                continue
            last = now - (wall - row.last_active).total_seconds()
            seen = merged.get(row.model)
            merged[row.model] = _Remote(
                in_flight=row.in_flight + (seen.in_flight if seen else 0),
                last_active=max(last, seen.last_active if seen else -math.inf),
                wanted=row.wanted_at is not None or (seen is not None and seen.wanted),
            )
        self._remote = merged
        self._remote_load = loads

    def remote_wanted(self) -> list[str]:
        return sorted(m for m, r in self._remote.items() if r.wanted)


def _wall(wall_now: datetime, now: float, then: float) -> datetime:
    return wall_now - timedelta(seconds=max(0.0, now - then))
