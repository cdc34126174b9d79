"""How soon a standby takes the lease over, in virtual time.

Two `Leadership` objects share an in-memory lease store that judges expiry the way
the real one does (by the caller's wall clock). Every sleep goes through one
virtual timeline, woken in order of wake time, so runs are exact and take no
real time. A "killed" leader is one whose sleeps never end: it neither renews
nor releases, like a process that got SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from llmgw.control.leadership import Leadership
from llmgw.control.leadership.lease import EXPIRY_MARGIN
from llmgw.store import Lease, StoreError

TTL = 15.0
BASE = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


class Timeline:
    """Virtual seconds; `sleep` parks the caller until `run_until` reaches its time."""

    def __init__(self) -> None:
        self.now = 0.0
        self._parked: list[tuple[float, int, str, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self.dead: set[str] = set()

    def wall(self) -> datetime:
        return BASE + timedelta(seconds=self.now)

    def sleeper(self, who: str) -> object:
        async def sleep(delay: float) -> None:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            heapq.heappush(self._parked, (self.now + delay, next(self._order), who, future))
            await future  # a dead process never wakes

        return sleep

    async def settle(self) -> None:
        for _ in range(20):
            await asyncio.sleep(0)

    async def run_until(self, end: float) -> None:
        await self.settle()
        while self._parked and self._parked[0][0] <= end:
            wake, _, who, future = heapq.heappop(self._parked)
            if who in self.dead:
                continue
            self.now = wake
            if not future.done():
                future.set_result(None)
            await self.settle()
        self.now = end


class MemoryLeases:
    """The lease rules of `store.leadership`, in memory, with a log of who tried when."""

    def __init__(self, timeline: Timeline) -> None:
        self._timeline = timeline
        self.lease: Lease | None = None
        self.tries: list[tuple[float, str]] = []
        self.renewals: list[float] = []  # when a renewal was asked for
        self.down = False
        self.hang = False  # no call answers (a lock held, with no timeout)

    async def _check(self) -> datetime:
        if self.hang:
            await asyncio.Event().wait()
        if self.down:
            raise StoreError("connection refused")
        return self._timeline.wall()

    async def acquire(self, name: str, owner: str, ttl: float, agent_address: str) -> Lease | None:
        self.tries.append((self._timeline.now, owner))
        now = await self._check()
        held = self.lease
        if held is not None and held.owner != owner and held.expires_at > now:
            return None
        epoch = 1 if held is None else held.epoch + (0 if held.owner == owner else 1)
        acquired = held.acquired_at if held is not None and held.owner == owner else now
        self.lease = Lease(
            name, owner, epoch, acquired, now + timedelta(seconds=ttl), agent_address
        )
        return self.lease

    async def renew(self, name: str, owner: str, epoch: int, ttl: float) -> datetime | None:
        self.renewals.append(self._timeline.now)
        now = await self._check()
        held = self.lease
        if held is None or (held.owner, held.epoch) != (owner, epoch) or held.expires_at <= now:
            return None
        expires = now + timedelta(seconds=ttl)
        self.lease = Lease(name, owner, epoch, held.acquired_at, expires, held.agent_address)
        return expires

    async def release(self, name: str, owner: str, epoch: int) -> bool:
        now = await self._check()
        held = self.lease
        if held is None or (held.owner, held.epoch) != (owner, epoch):
            return False
        self.lease = Lease(name, owner, epoch, held.acquired_at, now, held.agent_address)
        return True

    async def current(self, name: str) -> Lease | None:
        await self._check()
        return self.lease


def server(name: str, timeline: Timeline, store: MemoryLeases) -> Leadership:
    return Leadership(
        store=store,
        server_id=name,
        agent_address=f"{name}:9443",
        ttl=TTL,
        clock=lambda: timeline.now,
        wall_clock=timeline.wall,
        sleep=timeline.sleeper(name),  # type: ignore[arg-type]
    )


async def idle(_: int | None = None) -> None:
    await asyncio.Event().wait()


@pytest.mark.parametrize("standby_phase", [0.001, 2.5, 4.99])
async def test_a_standby_takes_over_within_the_ttl_of_the_dead_leaders_last_renewal(
    standby_phase: float,
) -> None:
    timeline = Timeline()
    store = MemoryLeases(timeline)
    first, second = server("a", timeline, store), server("b", timeline, store)
    tasks = [asyncio.ensure_future(first.run(lead=idle, follow=idle))]
    await timeline.run_until(standby_phase)
    tasks.append(asyncio.ensure_future(second.run(lead=idle, follow=idle)))
    try:
        # The leader renews every TTL/3 (at 5, 10, 15 s); it dies just after the third.
        await timeline.run_until(15.1)
        assert first.is_leader() and not second.is_leader()
        assert store.lease is not None
        last_expiry = (store.lease.expires_at - BASE).total_seconds()
        assert last_expiry == 15.0 + TTL
        killed_at = timeline.now
        timeline.dead.add("a")
        # While the leader lived, the standby tried every TTL/3 and no more often.
        tries = [t for t, who in store.tries if who == "b" and t < killed_at]
        assert len(tries) >= 3 and all(
            later - earlier == pytest.approx(TTL / 3)
            for earlier, later in itertools.pairwise(tries)
        )
        await timeline.run_until(killed_at + TTL + 1.0)
        assert second.is_leader(), (store.tries, store.lease)
        assert store.lease is not None and store.lease.owner == "b" and store.lease.epoch == 2
        took_over = (store.lease.acquired_at - BASE).total_seconds()
        # Within the design target (TTL + 1 s after the death), and in fact right at
        # the expiry of the lease the dead leader last renewed.
        assert took_over - killed_at <= TTL + 1.0
        assert last_expiry < took_over <= last_expiry + EXPIRY_MARGIN + 1e-9
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_standby_that_cannot_reach_the_store_keeps_its_pace() -> None:
    timeline = Timeline()
    store = MemoryLeases(timeline)
    first, second = server("a", timeline, store), server("b", timeline, store)
    tasks = [asyncio.ensure_future(first.run(lead=idle, follow=idle))]
    await timeline.run_until(1.0)
    tasks.append(asyncio.ensure_future(second.run(lead=idle, follow=idle)))
    try:
        await timeline.run_until(2.0)
        timeline.dead.add("a")
        store.down = True
        # The lease it last read runs out at 15 s; the store stays away: no tight loop.
        await timeline.run_until(40.0)
        tries = [t for t, who in store.tries if who == "b"]
        assert len(tries) == len({round(t, 6) for t in tries})
        assert all(
            later - earlier >= TTL / 3 - 1e-9 or later >= 15.0 > earlier
            for earlier, later in itertools.pairwise(tries)
        )
        assert len([t for t in tries if t > 15.0]) <= 6
        store.down = False
        await timeline.run_until(40.0 + TTL / 3 + 0.1)
        assert second.is_leader()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Terms:
    """A `lead` that counts the terms it was started for."""

    def __init__(self) -> None:
        self.started: list[int] = []

    async def __call__(self, epoch: int) -> None:
        self.started.append(epoch)
        await asyncio.Event().wait()


@contextlib.asynccontextmanager
async def leading(leadership: Leadership) -> AsyncIterator[tuple[Leadership, Terms]]:
    """`leadership` running (leading when it can) with `Terms` as its leader-only task;
    stopped on leaving."""
    terms = Terms()
    task = asyncio.ensure_future(leadership.run(lead=terms, follow=idle))
    try:
        yield leadership, terms
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_leader_keeps_the_lease_through_a_store_busy_for_most_of_the_ttl() -> None:
    # The store refuses every write from 4 s to 13.5 s (a storm's writes holding
    # SQLite's lock): the renewal due at 5 s fails and is retried until one gets
    # through, before the lease (renewed at 0 s, so valid until 15 s) runs out.
    timeline = Timeline()
    store = MemoryLeases(timeline)
    async with leading(server("a", timeline, store)) as (first, terms):
        await timeline.run_until(4.0)
        assert first.is_leader() and terms.started == [1]
        store.down = True
        step = 0.25
        while timeline.now < 13.5:
            await timeline.run_until(timeline.now + step)
            assert first.is_leader(), timeline.now
        store.down = False
        while timeline.now < 40.0:
            await timeline.run_until(timeline.now + step)
            assert first.is_leader(), timeline.now
        assert terms.started == [1]  # one term: never stepped down and back up
        # It retried quickly while the store refused, not once per TTL/3.
        refused = [t for t in store.renewals if 4.0 < t < 13.5]
        assert len(refused) >= 5
        assert store.lease is not None and store.lease.owner == "a"
        assert (store.lease.expires_at - BASE).total_seconds() > 40.0


@pytest.mark.parametrize("failure", ["down", "hang"])
async def test_a_leader_that_cannot_renew_steps_down_when_its_lease_runs_out(
    failure: str,
) -> None:
    # The store stops answering at 4 s, after the renewal at 0 s... the lease as
    # stored runs out at 15 s, and the leader must not lead a moment past that.
    timeline = Timeline()
    store = MemoryLeases(timeline)
    async with leading(server("a", timeline, store)) as (first, terms):
        await timeline.run_until(4.0)
        assert store.lease is not None
        stored_expiry = (store.lease.expires_at - BASE).total_seconds()
        assert stored_expiry == TTL
        setattr(store, failure, True)
        await timeline.run_until(stored_expiry - 0.01)
        assert first.is_leader()
        await timeline.run_until(stored_expiry)
        assert not first.is_leader()
        await timeline.run_until(stored_expiry + 1.0)
        assert not first.is_leader() and first.info().role == "standby"
        assert terms.started == [1]
        if failure == "hang":
            # The renewal that never answered was abandoned, not waited on forever.
            assert first.epoch is None
