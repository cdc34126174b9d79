"""Sharing the leader's view through the store: Ready endpoints and demand.

- `StorePublisher` wraps the local publisher: every change goes to this
  server's router at once and, while this server leads, to the store in the
  background, each write carrying the leader's epoch. A write refused as stale
  (fenced) makes this server step down.
- `follow_endpoints` is a standby's loop: it reads what the leader published
  and hands it to the controller (which publishes it to the local router), so
  clients may use any server. Only replicas with a placement record are read
  back (the store joins them), and only at the port their record gives them.
- `sync_demand` runs on every server: it reports this server's demand and, on
  the leader, reads everyone else's, counting only servers announced within one
  lease TTL (a server killed mid-request leaves rows nobody withdraws). The
  rows carry the router's load signals; engine reads are re-sent when they
  change, and at least every `LOAD_REFRESH` seconds so the leader knows them fresh.
- `ServerDirectory` runs on every server: it refreshes this server's row every
  third of the lease TTL, so every server can list them all; the leader forgets
  servers silent for an hour, and a clean stop forgets this one at once.

Not guaranteed: followers see the leader's changes within one poll interval,
not at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Protocol

from llmgw.control.reconciler.demand import DemandBook
from llmgw.control.reconciler.state import EndpointPublisher, ReadyEndpoint
from llmgw.lifecycle import wait_for_event
from llmgw.store import ControlServer, Demand, PublishedEndpoint, StaleEpoch, StoreError

log = logging.getLogger("llmgw.control.leadership")

STORE_RETRY_SECONDS = 1.0
# A server silent this long is removed from the list (and its demand rows with it).
FORGET_AFTER = timedelta(hours=1)
# Unchanged engine reads are written again this often: the leader ignores reads
# older than demand.LOAD_MAX_AGE, which must stay well above this.
LOAD_REFRESH = 5.0
# How long a clean stop waits for the store to forget this server.
FORGET_TIMEOUT_SECONDS = 2.0


class EndpointStore(Protocol):
    async def publish(
        self,
        lease_name: str,
        epoch: int,
        model: str,
        names: Sequence[str],
        endpoints: Sequence[tuple[str, str]],
        base: str | None = None,
    ) -> None: ...

    async def withdraw(self, lease_name: str, epoch: int, models: Sequence[str]) -> None: ...

    async def endpoints(self) -> list[PublishedEndpoint]: ...


class DemandStore(Protocol):
    async def report_demand(self, server: str, rows: Sequence[Demand]) -> None: ...

    async def demand(self) -> list[Demand]: ...

    async def servers(self) -> list[ControlServer]: ...


class ServerStore(Protocol):
    async def announce(self, server: ControlServer) -> None: ...

    async def servers(self) -> list[ControlServer]: ...

    async def forget(self, servers: Sequence[str]) -> None: ...


def is_live(server: ControlServer, now: datetime, ttl: float) -> bool:
    """Announced within one lease TTL (three announcements)."""
    return (now - server.last_seen).total_seconds() <= ttl


class StorePublisher:
    """The controller's `EndpointPublisher` in a multi-server set-up."""

    def __init__(
        self,
        *,
        local: EndpointPublisher,
        store: EndpointStore,
        lease_name: str,
        on_fenced: Callable[[str], None],
    ) -> None:
        self._local = local
        self._store = store
        self._lease_name = lease_name
        self._on_fenced = on_fenced
        self._epoch: int | None = None
        self._dirty: dict[str, tuple[tuple[str, ...], tuple[ReadyEndpoint, ...]] | None] = {}
        self._wake = asyncio.Event()

    def publish(self, names: Sequence[str], endpoints: Sequence[ReadyEndpoint]) -> None:
        self._local.publish(names, endpoints)
        if self._epoch is not None:
            self._dirty[names[0]] = (tuple(names), tuple(endpoints))
            self._wake.set()

    def withdraw(self, names: Sequence[str]) -> None:
        self._local.withdraw(names)
        if self._epoch is not None:
            # Only a model's own name is a row key; a withdrawn alias is covered by
            # the model's next publish.
            self._dirty.setdefault(names[0], None)
            self._wake.set()

    async def run(self, epoch: int) -> None:
        """Write changes to the store while leading at `epoch` (a leader-only task)."""
        self._epoch = epoch
        self._dirty.clear()
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                batch, self._dirty = self._dirty, {}
                try:
                    await self._write(epoch, batch)
                except StaleEpoch as exc:
                    self._on_fenced(str(exc))
                    return
                except StoreError as exc:
                    log.warning("cannot publish endpoints to the store (retrying): %s", exc)
                    for model, entry in batch.items():
                        self._dirty.setdefault(model, entry)
                    await asyncio.sleep(STORE_RETRY_SECONDS)
                    self._wake.set()
        finally:
            self._epoch = None

    async def _write(
        self,
        epoch: int,
        batch: Mapping[str, tuple[tuple[str, ...], tuple[ReadyEndpoint, ...]] | None],
    ) -> None:
        gone = [model for model, entry in batch.items() if entry is None]
        if gone:
            await self._store.withdraw(self._lease_name, epoch, gone)
        for model, entry in batch.items():
            if entry is not None:
                names, endpoints = entry
                # An adapter's replicas are its base's: standbys join them to its records.
                based = [e.base_names[0] for e in endpoints if e.base_names]
                await self._store.publish(
                    self._lease_name,
                    epoch,
                    model,
                    names,
                    [(e.id, e.url) for e in endpoints],
                    base=based[0] if based else None,
                )


async def published(store: EndpointStore) -> dict[str, set[str]]:
    """Replica ids per model as the last leader published them (an adapter's rows count
    for its base, whose replicas they are)."""
    expected: dict[str, set[str]] = {}
    for row in await store.endpoints():
        expected.setdefault(row.base or row.model, set()).add(row.replica_id)
    return expected


async def follow_endpoints(
    *,
    store: EndpointStore,
    apply: Callable[[Mapping[str, Sequence[ReadyEndpoint]]], None],
    interval: float,
) -> None:
    """A standby's loop: apply the leader's published endpoints every `interval` s."""
    last: dict[str, list[ReadyEndpoint]] | None = None
    refused: set[tuple[str, str]] = set()
    while True:
        try:
            rows = await store.endpoints()
        except StoreError as exc:
            log.warning("cannot read the published endpoints (keeping the last): %s", exc)
        else:
            ready: dict[str, list[ReadyEndpoint]] = {}
            wrong: set[tuple[str, str]] = set()
            for row in rows:
                if _port(row.url) != row.port:
                    wrong.add((row.replica_id, row.url))
                    continue
                ready.setdefault(row.model, []).append(ReadyEndpoint(row.replica_id, row.url))
            for replica_id, url in sorted(wrong - refused):
                log.warning(
                    "not serving replica %s at %s: the leader published it at another port "
                    "than its placement record gives it",
                    replica_id,
                    url,
                )
            refused = wrong
            if ready != last:
                apply(ready)
                last = ready
        await asyncio.sleep(interval)


def _port(url: str) -> int | None:
    try:
        return urllib.parse.urlsplit(url).port
    except ValueError:
        return None


async def sync_demand(
    *,
    store: DemandStore,
    demand: DemandBook,
    server_id: str,
    leading: Callable[[], bool],
    on_remote: Callable[[], None],
    interval: float,
    wall_clock: Callable[[], datetime],
    ttl: float,
    on_load: Callable[[], None] = lambda: None,
) -> None:
    """Report this server's demand when it changes (at most every `interval` s, at
    once for a new activation), and while leading read the rows of the other
    servers that are live (announced within `ttl` seconds), then call `on_load`
    (the load signals may ask for more replicas)."""
    reported: list[Demand] | None = None
    reported_at = wall_clock()
    remote_wanted: list[str] = []
    while True:
        rows = demand.local_rows(server_id)
        try:
            stale = (wall_clock() - reported_at).total_seconds() >= LOAD_REFRESH and any(
                row.load.replicas for row in rows
            )
            if reported is None or _content(rows) != _content(reported) or stale:
                await store.report_demand(server_id, rows)
                reported, reported_at = rows, wall_clock()
            if leading():
                now = wall_clock()
                live = {s.server for s in await store.servers() if is_live(s, now, ttl)}
                others = [
                    d for d in await store.demand() if d.server != server_id and d.server in live
                ]
                demand.set_remote(others)
                if demand.remote_wanted() != remote_wanted:
                    remote_wanted = demand.remote_wanted()
                    on_remote()
                on_load()
        except StoreError as exc:
            log.warning("cannot share demand through the store (retrying): %s", exc)
        demand.changed.clear()
        await wait_for_event(demand.changed, interval)


def _content(rows: Sequence[Demand]) -> list[object]:
    """The rows without the times of the engine reads, and with queue waits in whole
    seconds: what is worth a write to the store."""
    return [
        (
            row.model, row.last_active, row.in_flight, row.wanted_at, row.load.queued,
            round(row.load.queue_wait),
            tuple(
                (r.replica, r.waiting, r.running,
                 None if r.kv_cache_usage is None else round(r.kv_cache_usage, 2))
                for r in row.load.replicas
            ),
        )
        for row in rows
    ]  # fmt: skip


class ServerDirectory:
    """Announces this server every `interval` s and keeps the list it last read.

    `run` refreshes this server's row, reads every server's (for `latest`, which
    the dashboard shows without a store round trip) and, while leading, forgets
    the servers silent for `FORGET_AFTER`. Cancelled (a clean stop), it forgets
    this server at once.
    """

    def __init__(
        self,
        *,
        store: ServerStore,
        server: ControlServer,
        leading: Callable[[], bool],
        wall_clock: Callable[[], datetime],
        interval: float,
    ) -> None:
        self._store = store
        self._server = server
        self._leading = leading
        self._wall_clock = wall_clock
        self._interval = interval
        self._latest: list[ControlServer] = []

    def latest(self) -> list[ControlServer]:
        """The servers as last read (at most `interval` s ago); empty before the first read."""
        return list(self._latest)

    async def run(self) -> None:
        try:
            while True:
                try:
                    await self._pass()
                except StoreError as exc:
                    log.warning("cannot announce this server in the store (retrying): %s", exc)
                await asyncio.sleep(self._interval)
        finally:
            # A clean stop: leave the list at once rather than show as gone for an hour.
            with contextlib.suppress(StoreError, TimeoutError):
                async with asyncio.timeout(FORGET_TIMEOUT_SECONDS):
                    await asyncio.shield(self._store.forget([self._server.server]))

    async def _pass(self) -> None:
        await self._store.announce(self._server)
        servers = await self._store.servers()
        if self._leading():
            now = self._wall_clock()
            silent = [s.server for s in servers if now - s.last_seen > FORGET_AFTER]
            if silent:
                log.info(
                    "forgetting servers silent for over %s: %s", FORGET_AFTER, ", ".join(silent)
                )
                await self._store.forget(silent)
                servers = [s for s in servers if s.server not in silent]
        self._latest = servers
