"""Leadership: one server holds the store's lease and places work; the others stand by.

`Leadership.run(lead=..., follow=...)` alternates between two roles. As a standby
it runs `follow()` and tries to take the lease every third of its TTL, and also
just after the moment the lease it last read runs out: a leader that dies right
after renewing leaves a lease valid for a whole TTL, and trying only every TTL/3
would take it over up to TTL + TTL/3 later; waking at the expiry makes it TTL
plus the store's round trip. (Expiry is judged by each server's own wall clock,
in the store and here alike.) Once it
holds the lease it runs `lead(epoch)` (the leader-only tasks, as one task) and
renews every third of the TTL; a renewal that fails (the store is busy or
unreachable) is retried every TTL/15 while the lease is still valid, and one that
has not answered by then is abandoned. When a renewal is refused, or none
succeeded before the lease would have run out, it cancels `lead` and goes back
to standing by. The renewals go through a connection pool of their own
(`Store.lease`), so they never wait for a connection behind bulk writes. The
process never exits for losing the lease.

`is_leader()` is also false once the lease's local validity (monotonic time of
the last successful renewal's start + TTL) has passed, so a leader that was
paused (SIGSTOP, a long GC, a VM migration) and wakes up stops placing at once,
before its next renewal is even attempted; its store writes are refused by
epoch fencing in any case.

Not guaranteed: exclusivity under clock skew between servers that approaches the
TTL, or a store that loses committed writes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol

from llmgw.store import Lease, StoreError

log = logging.getLogger("llmgw.control.leadership")

LEASE_NAME = "control"
# How long after the seen lease's expiry a standby tries: the store takes it only
# once its own reading of the clock is past the expiry.
EXPIRY_MARGIN = 0.01
# A failed renewal is retried every TTL/RETRIES_PER_TTL seconds until the lease runs
# out: a store that is busy for a few seconds (a registration storm's writes on
# SQLite) must not cost the lease, which the next renewal at TTL/3 often would.
RETRIES_PER_TTL = 15
Role = Literal["leader", "standby"]


class LeaseStore(Protocol):
    async def acquire(
        self, name: str, owner: str, ttl: float, agent_address: str
    ) -> Lease | None: ...

    async def renew(self, name: str, owner: str, epoch: int, ttl: float) -> datetime | None: ...

    async def release(self, name: str, owner: str, epoch: int) -> bool: ...

    async def current(self, name: str) -> Lease | None: ...


@dataclass(frozen=True, slots=True)
class LeaderInfo:
    """Who leads, as this server last saw it."""

    server: str
    role: Role
    leader: str | None
    epoch: int | None
    since: datetime | None
    expires_at: datetime | None
    agent_address: str | None
    role_since: datetime


class Leadership:
    """Holds or waits for the lease; see the module docstring."""

    def __init__(
        self,
        *,
        store: LeaseStore,
        server_id: str,
        agent_address: str,
        ttl: float,
        clock: Callable[[], float],
        wall_clock: Callable[[], datetime],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._store = store
        self._server = server_id
        self._agent_address = agent_address
        self._ttl = ttl
        self._clock = clock
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._lease: Lease | None = None  # ours, while leading
        self._seen: Lease | None = None  # the last lease read, anyone's
        self._valid_until = float("-inf")
        self._role_since = wall_clock()
        self._lost = asyncio.Event()
        self._elected = asyncio.Event()
        self._store_answered = False  # whether the last try to acquire reached the store

    @property
    def server_id(self) -> str:
        return self._server

    @property
    def epoch(self) -> int | None:
        return self._lease.epoch if self._lease is not None else None

    def is_leader(self) -> bool:
        return self._lease is not None and self._clock() < self._valid_until

    async def wait_elected(self) -> None:
        """Return once this server leads (for tests and start-up ordering)."""
        await self._elected.wait()

    def lost(self, reason: str) -> None:
        """A leader-only task found the lease gone (a fenced write): step down now."""
        if self._lease is not None:
            log.warning("stepping down: %s", reason)
            self._valid_until = float("-inf")
            self._lost.set()

    def admission(self) -> str | None:
        """None when agents may connect here; else why not and where to go instead."""
        if self.is_leader():
            return None
        seen = self._seen
        if seen is None or seen.owner == self._server:
            return (
                f"this server ({self._server}) is a standby and no leader is known yet; "
                "try the next server"
            )
        return (
            f"this server ({self._server}) is a standby; the leader is {seen.owner}, "
            f"its agent listener is {seen.agent_address}"
        )

    def info(self) -> LeaderInfo:
        seen = self._lease if self._lease is not None else self._seen
        live = seen is not None and (
            self._lease is not None or seen.expires_at > self._wall_clock()
        )
        return LeaderInfo(
            server=self._server,
            role="leader" if self.is_leader() else "standby",
            leader=seen.owner if live and seen is not None else None,
            epoch=seen.epoch if seen is not None else None,
            since=seen.acquired_at if live and seen is not None else None,
            expires_at=seen.expires_at if seen is not None else None,
            agent_address=seen.agent_address if live and seen is not None else None,
            role_since=self._role_since,
        )

    async def run(
        self,
        *,
        lead: Callable[[int], Awaitable[None]],
        follow: Callable[[], Awaitable[None]],
    ) -> None:
        """Stand by or lead until cancelled; releases a held lease on the way out."""
        while True:
            lease = await self._stand_by(follow)
            await self._lead(lease, lead)

    async def _try_acquire(self) -> Lease | None:
        started = self._clock()
        try:
            lease = await self._store.acquire(
                LEASE_NAME, self._server, self._ttl, self._agent_address
            )
            if lease is None:
                self._seen = await self._store.current(LEASE_NAME)
        except StoreError as exc:
            log.warning("cannot reach the store for the lease: %s", exc)
            self._store_answered = False
            return None
        self._store_answered = True
        if lease is not None:
            self._valid_until = started + self._ttl
        return lease

    async def _stand_by(self, follow: Callable[[], Awaitable[None]]) -> Lease:
        follower: asyncio.Task[None] | None = None
        try:
            while True:
                lease = await self._try_acquire()
                if lease is not None:
                    return lease
                if follower is None:
                    log.info(
                        "standing by: %s",
                        self.admission() or "waiting for the lease",
                    )
                    follower = asyncio.ensure_future(follow())
                elif follower.done():
                    follower.result()  # a follower that failed ends the process
                await self._sleep(self._next_try())
        finally:
            if follower is not None:
                follower.cancel()
                await asyncio.gather(follower, return_exceptions=True)

    def _next_try(self) -> float:
        """Seconds until a standby tries again: TTL/3, or just after the lease it
        read runs out when that is sooner. A healthy leader renews every TTL/3, so
        its lease always runs longer than that and the standby keeps its pace."""
        delay = self._ttl / 3
        seen = self._seen
        if self._store_answered and seen is not None and seen.owner != self._server:
            left = (seen.expires_at - self._wall_clock()).total_seconds()
            delay = min(delay, max(left, 0.0) + EXPIRY_MARGIN)
        return delay

    async def _lead(self, lease: Lease, lead: Callable[[int], Awaitable[None]]) -> None:
        self._lease = self._seen = lease
        self._lost.clear()
        self._role_since = self._wall_clock()
        self._elected.set()
        log.warning(
            "this server (%s) now leads the control plane (epoch %d)", self._server, lease.epoch
        )
        work = asyncio.ensure_future(lead(lease.epoch))
        keeper = asyncio.ensure_future(self._keep(lease))
        lost = asyncio.ensure_future(self._lost.wait())
        try:
            done, _ = await asyncio.wait({work, keeper, lost}, return_when=asyncio.FIRST_COMPLETED)
            if work in done:
                work.result()  # the leader's work failed: the process ends with it
        finally:
            for task in (work, keeper, lost):
                task.cancel()
            await asyncio.gather(work, keeper, lost, return_exceptions=True)
            # On shutdown this hands the lease over at once; after a loss the
            # stale epoch makes it a no-op.
            await self._release()
            self._elected.clear()
            self._role_since = self._wall_clock()
            log.warning("this server (%s) is a standby again", self._server)

    async def _keep(self, lease: Lease) -> None:
        """Renew every TTL/3, retrying a failed renewal every TTL/15 until the lease's
        local validity runs out; return when the lease is lost."""
        delay = self._ttl / 3
        while True:
            await self._sleep(delay)
            started = self._clock()
            if started >= self._valid_until:
                log.warning(
                    "lost the lease: it ran out (TTL %g s) before this process renewed it "
                    "(it did not run, or the store did not answer); another server may "
                    "lead now",
                    self._ttl,
                )
                return
            try:
                expires = await self._renew(lease, self._valid_until - started)
            except StoreError as exc:
                left = self._valid_until - self._clock()
                if left <= 0:
                    log.warning("lost the lease: the store did not renew it before it ran out")
                    return
                delay = min(self._ttl / RETRIES_PER_TTL, left)
                log.warning(
                    "cannot renew the lease (%.1f s of it left; retrying in %g s): %s",
                    left,
                    delay,
                    exc,
                )
                continue
            if expires is None:
                log.warning("lost the lease: another server took it over (epoch moved on)")
                return
            took = self._clock() - started
            if took > self._ttl / RETRIES_PER_TTL:
                log.warning("renewing the lease took %.1f s (TTL %g s)", took, self._ttl)
            self._valid_until = started + self._ttl
            self._lease = self._seen = Lease(
                lease.name,
                lease.owner,
                lease.epoch,
                lease.acquired_at,
                expires,
                lease.agent_address,
            )
            delay = self._ttl / 3

    async def _renew(self, lease: Lease, left: float) -> datetime | None:
        """One renewal, given up (as a `StoreError`) when it has not answered within
        `left` seconds: past that the lease may have run out, and waiting on would
        keep the leader-only tasks running on a lease that nobody renewed."""
        attempt = asyncio.ensure_future(
            self._store.renew(LEASE_NAME, self._server, lease.epoch, self._ttl)
        )
        deadline = asyncio.ensure_future(self._sleep(left))
        try:
            await asyncio.wait({attempt, deadline}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            deadline.cancel()
            if not attempt.done():
                attempt.cancel()
            await asyncio.gather(attempt, deadline, return_exceptions=True)
        if attempt.cancelled():
            raise StoreError(f"the store did not answer the renewal within {left:.1f} s")
        return attempt.result()

    async def _release(self) -> None:
        lease = self._lease
        if lease is None:
            return
        self._lease = None
        try:
            async with asyncio.timeout(5):
                await asyncio.shield(self._store.release(LEASE_NAME, self._server, lease.epoch))
            log.info("released the lease (epoch %d) for a standby to take", lease.epoch)
        except (StoreError, TimeoutError) as exc:
            log.warning("could not release the lease; it runs out by itself: %s", exc)
