"""Routing only to engines this server can reach: a gate in front of the local router.

A replica is Ready when its agent's probe (on the node itself) answers; that
says nothing about whether *this* server can open a connection to the URL the
agent advertised (an agent on another host advertising 127.0.0.1, a firewall,
a second network). `ReachabilityGate` wraps the publisher of this server's
router: every endpoint the controller (or, on a standby, the leader through the
store) publishes is first checked from here, in the background, with a TCP
connect to the engine's address; only reachable ones reach the router. An
endpoint that fails the check is shown as unreachable, with its URL and the
error (`reach`), and is checked again every `recheck_interval` seconds until it
answers; then it is published. Each server runs its own gate: a standby's
router gets only what the standby itself can reach.

`wait_routable(model)` is for a request that found no endpoint in the router:
it returns once one of the model's Ready replicas is published here, and raises
`ReplicaUnreachable` (naming each URL and error for operators, and only the
replica ids in the `public` message API clients get) when every one was checked
and none can be reached, instead of letting the request fail against an address
that cannot work.

Not guaranteed: that an endpoint stays reachable after its check passed (the
router's health probes and ejection handle engines that stop answering); that
something listening at a checked address is the engine (a TCP connect is the
whole check, cheap and independent of the engine's load).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal
from urllib.parse import urlsplit

from llmgw.control.reconciler.state import EndpointPublisher, ReadyEndpoint
from llmgw.lifecycle import wait_for_event

log = logging.getLogger("llmgw.control.reachability")

ReachState = Literal["checking", "reachable", "unreachable"]


class ProbeFailed(Exception):
    """The engine's address did not take a connection; the message says how it failed."""


class ReplicaUnreachable(Exception):
    """A model's Ready replicas exist, but this server can reach none of them.

    `message` names each replica's URL and error, for operators and the log;
    `public`, for API clients, names the replicas by id only."""

    def __init__(self, message: str, *, retry_after: float, public: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.public = message if public is None else public
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class Reach:
    """What this server last found when it dialled one replica's endpoint."""

    replica_id: str
    url: str
    state: ReachState
    error: str = ""
    checked_at: datetime | None = None

    def view(self) -> dict[str, object]:
        return {
            "replica": self.replica_id,
            "state": self.state,
            "url": self.url,
            "error": self.error or None,
            "checked_at": None if self.checked_at is None else self.checked_at.isoformat(),
        }


Probe = Callable[[str], Awaitable[None]]
"""Dial an endpoint URL; return when it takes a connection, raise `ProbeFailed` otherwise."""


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        port = parts.port
    except ValueError as exc:
        raise ProbeFailed(f"{url!r} has no valid port") from exc
    if not host:
        raise ProbeFailed(f"{url!r} names no host")
    return host, port if port is not None else (443 if parts.scheme == "https" else 80)


async def tcp_probe(url: str, *, seconds: float) -> None:
    """A TCP connect to the URL's host and port, closed at once."""
    host, port = host_port(url)
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        async with asyncio.timeout(seconds):
            _, writer = await asyncio.open_connection(host, port)
    except TimeoutError:
        raise ProbeFailed(f"no answer from {shown} within {seconds:g} s") from None
    except OSError as exc:
        raise ProbeFailed(f"cannot connect to {shown}: {exc.strerror or exc}") from None
    writer.close()
    # The connection was taken, which is all this check asks.
    with contextlib.suppress(OSError):
        await writer.wait_closed()


class ReachabilityGate:
    """An `EndpointPublisher` that forwards to `local` only the endpoints it can reach."""

    def __init__(
        self,
        *,
        local: EndpointPublisher,
        probe: Probe,
        clock: Callable[[], float],
        wall_clock: Callable[[], datetime],
        recheck_interval: float,
    ) -> None:
        self._local = local
        self._probe = probe
        self._clock = clock
        self._wall_clock = wall_clock
        self._recheck = recheck_interval
        # Per model (its own name): its names and the Ready endpoints published to us.
        self._wanted: dict[str, tuple[tuple[str, ...], tuple[ReadyEndpoint, ...]]] = {}
        self._primary: dict[str, str] = {}  # any name of a model -> the model's own name
        self._shown: dict[str, tuple[tuple[str, ...], tuple[ReadyEndpoint, ...]]] = {}
        self._reach: dict[str, Reach] = {}  # replica id -> its last check
        self._due: dict[str, float] = {}  # replica id -> when to check it (clock)
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()  # replaced on every change: a broadcast

    # ---- EndpointPublisher ----

    def publish(self, names: Sequence[str], endpoints: Sequence[ReadyEndpoint]) -> None:
        primary = names[0]
        self._wanted[primary] = (tuple(names), tuple(endpoints))
        for name in names:
            self._primary[name] = primary
        for endpoint in endpoints:
            known = self._reach.get(endpoint.id)
            if known is None or known.url != endpoint.url:
                self._reach[endpoint.id] = Reach(endpoint.id, endpoint.url, "checking")
                self._due[endpoint.id] = -math.inf
                self._wake.set()
        self._forget_unused()
        self._forward(primary, force=True)

    def withdraw(self, names: Sequence[str]) -> None:
        self._local.withdraw(names)
        for name in names:
            if self._primary.get(name) == name:
                self._wanted.pop(name, None)
                self._shown.pop(name, None)
            self._primary.pop(name, None)
        self._forget_unused()
        self._notify()

    # ---- what it found ----

    def reach(self, replica_id: str) -> Reach | None:
        """The last check of a replica published here; None when none is published."""
        return self._reach.get(replica_id)

    def reaches(self, name: str) -> list[Reach]:
        """The last check of each Ready replica of model `name` (any of its names)."""
        primary = self._primary.get(name)
        entry = None if primary is None else self._wanted.get(primary)
        if entry is None:
            return []
        return [self._reach[e.id] for e in entry[1] if e.id in self._reach]

    async def wait_routable(self, name: str) -> None:
        """Return once `name` has an endpoint in the router (or nothing to check);
        raise `ReplicaUnreachable` when every Ready replica was found unreachable."""
        while True:
            changed = self._changed
            primary = self._primary.get(name)
            entry = None if primary is None else self._wanted.get(primary)
            if entry is None or not entry[1]:
                return
            reaches = self.reaches(name)
            if any(r.state == "reachable" for r in reaches):
                return
            if reaches and all(r.state == "unreachable" for r in reaches):
                raise ReplicaUnreachable(
                    self._refusal(entry[0][0], reaches),
                    retry_after=self._recheck,
                    public=self._public_refusal(entry[0][0], reaches),
                )
            await changed.wait()

    def _refusal(self, model: str, reaches: Sequence[Reach]) -> str:
        count = len(reaches)
        found = "; ".join(f"replica {r.replica_id} at {r.url}: {r.error}" for r in reaches)
        return (
            f"model '{model}' has {count} ready replica{'s' if count != 1 else ''} but this "
            f"server cannot reach {'any of them' if count != 1 else 'it'} ({found}); the "
            "node's agent must advertise an address this server can dial (`llmgw agent "
            "--advertise-host`, or no flag to use the address it connects from)"
        )

    @staticmethod
    def _public_refusal(model: str, reaches: Sequence[Reach]) -> str:
        count = len(reaches)
        ids = ", ".join(r.replica_id for r in reaches)
        return (
            f"model '{model}' has {count} ready replica{'s' if count != 1 else ''} ({ids}) "
            f"but this server cannot reach {'any of them' if count != 1 else 'it'}; the "
            "node's agent must advertise an address this server can dial (`llmgw agent "
            f"--advertise-host`); an operator sees the addresses with `llmgw models show "
            f"{model}` or on the dashboard"
        )

    # ---- the checker ----

    async def run(self) -> None:
        """Check endpoints as they are published, and unreachable ones again, forever.

        Each check runs on its own, so an address that never answers (up to the
        probe's timeout) does not hold up the check of a new endpoint.
        """
        async with asyncio.TaskGroup() as group:
            while True:
                self._wake.clear()
                now = self._clock()
                for replica, at in tuple(self._due.items()):
                    if at <= now:
                        # Not due again until this check is done (or the endpoint changes).
                        self._due[replica] = math.inf
                        group.create_task(self._check(replica), name=f"reach {replica}")
                wait = min(self._due.values(), default=math.inf) - now
                await wait_for_event(self._wake, max(0.0, min(wait, self._recheck)))

    async def _check(self, replica_id: str) -> None:
        before = self._reach.get(replica_id)
        if before is None:
            return
        error = ""
        try:
            await self._probe(before.url)
        except ProbeFailed as exc:
            error = str(exc)
        current = self._reach.get(replica_id)
        if current is None or current.url != before.url:
            return  # withdrawn or moved while being checked
        state: ReachState = "unreachable" if error else "reachable"
        self._reach[replica_id] = Reach(replica_id, before.url, state, error, self._wall_clock())
        if error:
            self._due[replica_id] = self._clock() + self._recheck
            self._wake.set()
        else:
            self._due.pop(replica_id, None)
        self._log(before, state, error)
        for primary, (_, endpoints) in tuple(self._wanted.items()):
            if any(e.id == replica_id for e in endpoints):
                self._forward(primary, force=False)
        self._notify()

    def _log(self, before: Reach, state: ReachState, error: str) -> None:
        if state == "unreachable" and before.state != "unreachable":
            log.warning(
                "replica %s is ready on its node but this server cannot reach it at %s: %s; "
                "not routing to it here (checking again every %g s)",
                before.replica_id,
                before.url,
                error,
                self._recheck,
            )
        elif state == "reachable" and before.state == "unreachable":
            log.info(
                "replica %s is reachable at %s now; routing to it", before.replica_id, before.url
            )

    # ---- internals ----

    def _forward(self, primary: str, *, force: bool) -> None:
        names, endpoints = self._wanted[primary]
        entry = (names, tuple(e for e in endpoints if self._reach[e.id].state == "reachable"))
        if force or self._shown.get(primary) != entry:
            self._local.publish(*entry)
            self._shown[primary] = entry
        self._notify()

    def _forget_unused(self) -> None:
        used = {e.id for _, endpoints in self._wanted.values() for e in endpoints}
        for replica in [r for r in self._reach if r not in used]:
            del self._reach[replica]
            self._due.pop(replica, None)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
