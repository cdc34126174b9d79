"""The router's per-model queue: requests wait here while their model is saturated.

The proxy awaits `RequestQueue.wait_turn` before it picks a replica. When the
model has room (see `Saturation`) and nobody waits for it, the request goes on
at once, with no lock and no allocation beyond one dict lookup. Otherwise it
waits in the model's queue until a replica has room, and is let out in this
order:

1. by priority class: `interactive` before `default` before `batch`. Ageing:
   a class's next request counts one class higher for every `aging` seconds it
   has waited (router.queue.aging, 10 s by default), so a steady stream of
   interactive work delays batch work, but never holds it forever;
2. within a class, by weighted fair share between keys (start-time fair
   queuing: each request of a key gets a virtual start tag one `1/weight` after
   the key's previous one, and never before the class's virtual time), so a key
   that sends ten times more requests than another of the same weight gets
   the same share while both wait. With `share="tokens"` a request costs its
   estimated tokens (prompt estimate + max_tokens) instead of 1, so shares are
   equal in tokens rather than in requests. With a `ShareLedger` (see
   `llmgw.router.shares`), a class's next request is instead the one whose key
   was given the least work lately (over its weight), as counted by every
   router through Redis; requests of one key leave in arrival order.

The reserve (router.queue.reserve, the most it keeps as a fraction of the
model's places: the sum of its replicas' limits): the model's last free places
go only to requests whose key holds less than its fair share of the places
(split by weight between the keys active on the model: with requests in flight
or waiting, or one within the last `active_for` seconds). A flooding key then
leaves them free, and a light key's request takes one at once instead of
waiting for a request to end; the next place that frees is kept again. A key
alone is never over its share, so with nobody else about every place is used.
While several keys compete, a kept place is idle until such a request comes:
that is the reserve's cost in throughput, so it keeps no more places than its
takers need. Those takers' requests come at some rate per request that ends
(each ending frees a place that is kept again), which makes the kept places an
M/M/1/k queue: it keeps the fewest places with which under `RESERVE_MISS` of
the takers find them all taken (`reserve_miss`), from rates averaged over the
last `RATE_WINDOW` seconds, and none once no taker came for `active_for`
seconds. A taker is counted when it arrives while the model is
down to the reserve's most places and another key is about.

A waiting request leaves with a 429 (`QueueRefused`, with Retry-After and the
queue's length in the message) when its wait budget runs out, and is refused
at once when the model's queue is full. A request whose client goes away is
cancelled by the app and leaves the queue at once (its place is not kept).

A request let out holds a reservation until the proxy sends it (the proxy does
so without yielding to the event loop), so two requests never take the same
free place; every request the proxy served calls `done`, which lets the next
ones out. While anyone waits, the model's queue also looks again every `recheck`
seconds (one timer per model, not per waiter), for room that appears without
a request ending (a new replica, an engine's load report).

With a `FlowShare` (see `llmgw.router.flow_share`: routers sharing a Redis),
the reserve counts every router's requests: a key holds its requests in
flight on all routers, and the keys active on any of them split the places, so
a key cannot take the reserve on each router by spreading its requests over
them. The places are still this router's (the limits of its replicas here).

Not guaranteed: without a ledger, fairness across router processes (each keeps
its own queue and its own virtual times, and a key's virtual time is forgotten
whenever its model's queue empties); with one, other routers' latest work is
seen only after the next sync. A token share is counted from estimates (the
prompt's text and max_tokens), not from what the engine later reports. The
reserve sees other routers' requests as of their last sync and ours (without
a flow share, or while Redis fails, this router's requests only). It splits
this router's places but counts a key's requests on every router: with several
routers each filling the same replicas up to their own limits, a key is over
its share once its requests on all of them together reach its share of one
router's places, so kept places idle more often than behind one router (never
more of them than the reserve). It takes its out-of-turn request by scanning
the model's queue (only while the model is down to its reserve and the next
request's key is over its share).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import math
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from llmgw.metrics.queue import DepthRow, QueueMetrics
from llmgw.router.errors import InvalidRequest, RouterError
from llmgw.router.flow_share import FlowCount, FlowShare, nowhere
from llmgw.router.saturation import Saturation
from llmgw.router.shares import ShareLedger

Priority = Literal["interactive", "default", "batch"]
PRIORITIES: tuple[Priority, ...] = ("interactive", "default", "batch")
_RANK = {name: rank for rank, name in enumerate(PRIORITIES)}

PRIORITY_HEADER = "x-llmgw-priority"
MAX_WAIT_HEADER = "x-llmgw-max-queue-wait"
# The OpenAI SDKs send their client timeout in seconds: a request never needs
# to wait longer than its client will.
SDK_TIMEOUT_HEADER = "x-stainless-timeout"


class QueueRefused(RouterError):
    """The queue turned the request away: full, or its wait budget ran out (429)."""

    status = 429
    type = "rate_limit_error"

    def __init__(self, message: str, *, code: str, retry_after: int) -> None:
        super().__init__(message)
        self.code = code
        self.retry_after = retry_after

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"retry-after", str(self.retry_after).encode())]


@dataclass(frozen=True, slots=True)
class Ticket:
    """How one request queues: its fair-share flow (the key), class, weight and
    how long it may wait, in seconds."""

    key: str
    priority: Priority = "default"
    weight: float = 1.0
    max_wait: float = 30.0


def parse_priority(value: str, *, field_name: str) -> Priority:
    """`value` as a priority class; InvalidRequest naming `field_name` if it is none."""
    name = value.strip().lower()
    for priority in PRIORITIES:
        if name == priority:
            return priority
    raise InvalidRequest(
        f"{field_name} {value!r} is not a priority class; use one of {', '.join(PRIORITIES)}",
        param=field_name,
    )


def lower_priority(own: Priority, asked: Priority) -> Priority:
    """The lower of the two: a request may lower its key's class, never raise it."""
    return own if _RANK[own] >= _RANK[asked] else asked


def parse_wait(value: str, *, field_name: str) -> float:
    """Seconds from a header (a number, 0 or more); InvalidRequest naming it if not."""
    try:
        seconds = float(value.strip())
    except ValueError:
        seconds = -1.0
    if not (seconds >= 0 and math.isfinite(seconds)):
        raise InvalidRequest(
            f"{field_name} {value!r} is not a number of seconds; give 0 or more (e.g. 10 or 2.5)",
            param=field_name,
        )
    return seconds


_HEADERS = {
    PRIORITY_HEADER.encode(): PRIORITY_HEADER,
    MAX_WAIT_HEADER.encode(): MAX_WAIT_HEADER,
    SDK_TIMEOUT_HEADER.encode(): SDK_TIMEOUT_HEADER,
}


def ticket_for(
    *,
    key: str,
    priority: Priority,
    weight: float,
    max_wait: float,
    headers: Iterable[tuple[bytes, bytes]],
) -> Ticket:
    """The ticket of one request: the key's settings, lowered by its headers
    (`x-llmgw-priority`, `x-llmgw-max-queue-wait`, the SDK's `x-stainless-timeout`).
    InvalidRequest (400) naming the header when one of ours is not valid; a bad
    SDK timeout is someone else's header and is ignored."""
    for raw_name, raw_value in headers:
        name = _HEADERS.get(raw_name)
        if name is None:
            continue
        value = raw_value.decode("latin-1")
        if name == PRIORITY_HEADER:
            priority = lower_priority(priority, parse_priority(value, field_name=name))
        elif name == MAX_WAIT_HEADER:
            max_wait = min(max_wait, parse_wait(value, field_name=name))
        else:
            with contextlib.suppress(InvalidRequest):
                max_wait = min(max_wait, parse_wait(value, field_name=name))
    return Ticket(key=key, priority=priority, weight=weight, max_wait=max_wait)


@dataclass(eq=False, slots=True)
class _Waiter:
    ticket: Ticket
    rank: int
    enqueued: float
    tag: float
    future: asyncio.Future[None]
    cost: float = 1.0
    gone: bool = False


@dataclass(slots=True)
class _ModelQueue:
    # One heap per class of (start tag, sequence, waiter).
    heaps: tuple[list[tuple[float, int, _Waiter]], ...] = field(
        default_factory=lambda: tuple([] for _ in PRIORITIES)
    )
    counts: list[int] = field(default_factory=lambda: [0] * len(PRIORITIES))
    vtime: list[float] = field(default_factory=lambda: [0.0] * len(PRIORITIES))
    # Finish tag of each key's latest request, per class.
    finish: tuple[dict[str, float], ...] = field(
        default_factory=lambda: tuple({} for _ in PRIORITIES)
    )
    size: int = 0
    reserved: int = 0
    seq: int = 0
    # The task that looks for room every `recheck` seconds while anyone waits.
    rechecker: asyncio.Task[None] | None = None

    def reset_tags(self) -> None:
        for i in range(len(PRIORITIES)):
            self.vtime[i] = 0.0
            self.finish[i].clear()


# The reserve keeps as few places as keep the share of its takers' requests that
# find every kept place taken (and so wait for a request to end) under this.
RESERVE_MISS = 0.05
# Seconds over which the reserve's arrival and completion rates are averaged.
RATE_WINDOW = 10.0


@dataclass(slots=True)
class _Rate:
    """Events per second, averaged with an exponential decay over `RATE_WINDOW`."""

    count: float = 0.0
    at: float = 0.0

    def hit(self, now: float) -> None:
        self.count = self.count * math.exp((self.at - now) / RATE_WINDOW) + 1.0
        self.at = now

    def per_second(self, now: float) -> float:
        return self.count * math.exp((self.at - now) / RATE_WINDOW) / RATE_WINDOW


def reserve_miss(load: float, kept: int) -> float:
    """The share of the reserve's takers that find all `kept` places taken, when
    they come `load` times per request that ends (each ending frees a place that is
    kept again): the blocking probability of an M/M/1/kept queue."""
    if load <= 0:
        return 0.0
    if math.isinf(load):
        return 1.0
    if abs(load - 1.0) < 1e-9:
        return 1.0 / (kept + 1)
    return (1.0 - load) * load**kept / (1.0 - load ** (kept + 1))


@dataclass(slots=True)
class _Flows:
    """What the reserve needs of one model: each key's requests in flight and
    waiting, its weight, and when it last began or ended a request; how often
    requests of keys under their share arrive while the model is down to its
    reserve's most places, and how often requests end."""

    in_flight: dict[str, int] = field(default_factory=dict)
    queued: dict[str, int] = field(default_factory=dict)
    weight: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)
    pruned: float = 0.0
    takers: _Rate = field(default_factory=_Rate)
    endings: _Rate = field(default_factory=_Rate)

    def seen(self, ticket: Ticket, now: float) -> None:
        self.weight[ticket.key] = ticket.weight
        self.last[ticket.key] = now

    def is_active(self, key: str, now: float, active_for: float) -> bool:
        """Whether `key` has requests in flight or waiting, or had one within the
        last `active_for` seconds."""
        return bool(
            self.in_flight.get(key) or self.queued.get(key) or now - self.last[key] < active_for
        )

    def active(self, now: float, active_for: float) -> dict[str, FlowCount]:
        """The counts of the keys active here (see `is_active`)."""
        return {
            key: FlowCount(self.in_flight.get(key, 0), self.queued.get(key, 0), weight)
            for key, weight in self.weight.items()
            if self.is_active(key, now, active_for)
        }


# A callback the proxy gives for streams: sends an SSE keep-alive comment.
KeepAlive = Callable[[int], Awaitable[None]]


class RequestQueue:
    """Per-model queues in front of the balancer."""

    def __init__(
        self,
        *,
        saturation: Saturation,
        clock: Callable[[], float],
        max_size: int,
        aging: float,
        recheck: float,
        retry_after: int,
        metrics: QueueMetrics | None = None,
        share: Literal["requests", "tokens"] = "requests",
        ledger: ShareLedger | None = None,
        reserve: float = 0.0,
        active_for: float = 60.0,
        flow_share: FlowShare | None = None,
    ) -> None:
        """`reserve`: the fraction of a model's places kept for keys under their
        fair share (see `_kept`); a key counts as active on a model while it has
        requests there, and for `active_for` seconds after its last one.
        `flow_share`: where the reserve's counts are shared with other routers."""
        self._reserve = reserve
        self._active_for = active_for
        self._flows: dict[str, _Flows] = {}
        self._flow_share = flow_share
        self._elsewhere = nowhere if flow_share is None else flow_share.elsewhere
        if flow_share is not None:
            flow_share.watch(self.flow_counts)
        self._by_tokens = share == "tokens"
        self._ledger = ledger
        self._saturation = saturation
        self._clock = clock
        self._max_size = max_size
        self._aging = aging
        self._recheck = recheck
        self._retry_after = retry_after
        self._metrics = metrics
        self._models: dict[str, _ModelQueue] = {}
        if metrics is not None:
            metrics.watch(self.depths)

    def depths(self) -> Iterator[DepthRow]:
        for model, state in list(self._models.items()):
            for rank, name in enumerate(PRIORITIES):
                if state.counts[rank]:
                    yield model, name, state.counts[rank]

    def describe(self, model: str) -> dict[str, object]:
        """The model's queue as the admin API and `llmgw status` show it."""
        state = self._models.get(model)
        now = self._clock()
        classes: dict[str, object] = {}
        for rank, name in enumerate(PRIORITIES):
            waiting = [w for _, _, w in state.heaps[rank] if not w.gone] if state else []
            classes[name] = {
                "waiting": len(waiting),
                "oldest_wait_seconds": round(
                    max((now - w.enqueued for w in waiting), default=0), 3
                ),
            }
        places = self._saturation.room_and_places(model)[1] if self._reserve > 0 else math.inf
        described: dict[str, object] = {
            "waiting": state.size if state else 0,
            "classes": classes,
            "reserve": self._kept(model, places),
            "reserve_max": self._most_kept(places),
        }
        if self._flow_share is not None:
            counts = self._elsewhere(model).values()
            described["elsewhere"] = {
                "in_flight": sum(c.in_flight for c in counts),
                "waiting": sum(c.waiting for c in counts),
            }
        return described

    def flow_counts(self) -> dict[str, dict[str, FlowCount]]:
        """Per model, the counts of the keys active on it here (what the reserve
        decides from), for other routers."""
        now = self._clock()
        counts = {m: f.active(now, self._active_for) for m, f in list(self._flows.items())}
        return {model: keys for model, keys in counts.items() if keys}

    def model_state(self, model: str) -> dict[str, object]:
        """One model's queue and saturation, as in `snapshot`, with `state` in words:
        saturated; full but for kept places (what waits is over its share and held
        back from the reserve's places); or has room."""
        queue, saturation = self.describe(model), self._saturation.describe(model)
        if saturation["saturated"]:
            state = "saturated"
        elif queue["waiting"] and queue["reserve"]:
            state = "full but for kept places"
        else:
            state = "has room"
        return {"model": model, "state": state, **queue, **saturation}

    def snapshot(self) -> list[dict[str, object]]:
        """Every model's queue and saturation (`GET /admin/api/queue`)."""
        models = sorted({*self._saturation.models(), *self._models})
        return [self.model_state(m) for m in models]

    async def wait_turn(
        self,
        model: str,
        ticket: Ticket,
        *,
        keepalive: KeepAlive | None,
        interval: float,
        tokens: Callable[[], int] | None = None,
    ) -> float:
        """Return when `model` has room for this request (the seconds it waited);
        the caller must send it at once, then call `done(model)` when it ends.
        `keepalive(waiting)` is awaited every `interval` seconds while it waits;
        `tokens()` (asked only when it queues) is its cost when shares are in tokens.
        Raises QueueRefused when the queue is full or the wait budget runs out."""
        state = self._models.get(model)
        counted = False  # whether the reserve has weighed this request as a taker
        if state is None or state.size == 0:
            reserved = state.reserved if state else 0
            if self._reserve <= 0:
                free = self._saturation.room(model, reserved) > 0
            else:
                room, places = self._saturation.room_and_places(model, reserved)
                if room > self._most_kept(places):
                    free = True
                else:
                    counted = True
                    under = self._count_taker(model, ticket, places)
                    free = room > 0 and (under or room > self._kept(model, places))
            if free:
                if self._ledger is not None:
                    self._ledger.charge(model, ticket.key, self._cost(tokens))
                if self._reserve > 0:
                    self._began(model, ticket)
                return 0.0
        if state is None:
            state = self._models[model] = _ModelQueue()
        rank = _RANK[ticket.priority]
        if state.size >= self._max_size:
            self._refuse_count(model, ticket, "queue_full")
            raise QueueRefused(
                f"model '{model}' is saturated and its queue is full ({state.size} requests "
                f"waiting, router.queue.max_size); retry after {self._retry_after} s",
                code="queue_full",
                retry_after=self._retry_after,
            )
        waiter = self._push(state, ticket, rank, self._cost(tokens))
        if self._reserve > 0:
            if not counted:
                self._count_taker(model, ticket, self._saturation.room_and_places(model)[1])
            self._queued(model, ticket, 1)
        self._drain(model, state)
        if state.rechecker is None and not waiter.future.done():
            state.rechecker = asyncio.get_running_loop().create_task(
                self._recheck_while_waiting(model, state)
            )
        start = waiter.enqueued
        deadline = start + ticket.max_wait
        next_keepalive = start + interval
        try:
            while not waiter.future.done():
                now = self._clock()
                if now >= deadline:
                    self._refuse_count(model, ticket, "wait_expired")
                    raise QueueRefused(
                        f"model '{model}' stayed saturated for the request's whole wait budget "
                        f"of {ticket.max_wait:g} s ({state.size} requests waiting in the "
                        f"queue); retry after {self._retry_after} s",
                        code="queue_wait_expired",
                        retry_after=self._retry_after,
                    )
                wake = deadline if keepalive is None else min(deadline, next_keepalive)
                await asyncio.wait({waiter.future}, timeout=max(0.0, wake - now))
                if waiter.future.done():
                    break
                if keepalive is not None and self._clock() >= next_keepalive:
                    await keepalive(state.size)
                    next_keepalive = self._clock() + interval
        finally:
            self._leave(model, state, waiter)
        waited = self._clock() - start
        if self._metrics is not None:
            self._metrics.wait.labels(model, ticket.priority).observe(waited)
        return waited

    def done(self, model: str, key: str) -> None:
        """A request of `model` by `key` let through by `wait_turn` ended: let the
        next ones out."""
        if self._reserve > 0:
            self._ended(model, key)
        state = self._models.get(model)
        if state is not None and state.size:
            self._drain(model, state)

    async def _recheck_while_waiting(self, model: str, state: _ModelQueue) -> None:
        """Look for room every `recheck` seconds while the model's queue holds
        anyone: one timer per model, not one per waiter."""
        try:
            while state.size and self._models.get(model) is state:
                await asyncio.sleep(self._recheck)
                self._drain(model, state)
        finally:
            if state.rechecker is asyncio.current_task():
                state.rechecker = None

    def _cost(self, tokens: Callable[[], int] | None) -> float:
        if self._by_tokens and tokens is not None:
            return max(1.0, float(tokens()))
        return 1.0

    def _most_kept(self, places: float) -> int:
        """The most of a model's `places` its reserve may keep (never all of them)."""
        if places == math.inf or places < 2:
            return 0
        return min(int(places) - 1, int(self._reserve * places + 0.5))

    def _kept(self, model: str, places: float) -> int:
        """How many of a model's `places` its reserve keeps now: the fewest with
        which under `RESERVE_MISS` of the requests that may take them find them all
        taken (see `reserve_miss`), from how often such requests came lately per
        request that ended; none once none came for `active_for` seconds; at
        most `_most_kept`."""
        most = self._most_kept(places)
        flows = self._flows.get(model)
        if most == 0 or flows is None:
            return 0
        now = self._clock()
        if not flows.takers.count or now - flows.takers.at >= self._active_for:
            return 0
        takers = flows.takers.per_second(now)
        endings = flows.endings.per_second(now)
        load = takers / endings if endings > 0 else math.inf
        for kept in range(1, most):
            if reserve_miss(load, kept) <= RESERVE_MISS:
                return kept
        return most

    def _count_taker(self, model: str, ticket: Ticket, places: float) -> bool:
        """Whether `ticket`'s key is under its share (see `_under_share`); if so,
        and another key was about lately (a key alone needs nothing kept from
        anyone), count the request as one the reserve is kept for."""
        if not self._under_share(model, ticket, places):
            return False
        flows = self._flows.get(model)
        if flows is None:
            flows = self._flows[model] = _Flows()
        key = ticket.key
        if any(other != key for other in flows.weight) or any(
            other != key for other in self._elsewhere(model)
        ):
            flows.takers.hit(self._clock())
        return True

    def _under_share(self, model: str, ticket: Ticket, places: float) -> bool:
        """Whether `ticket`'s key holds less than its fair share of `places`: the
        places split by weight between the keys active on the model, here or on
        other routers (a key with nothing in flight on any router always is)."""
        flows = self._flows.get(model)
        elsewhere = self._elsewhere(model)
        key = ticket.key
        there = elsewhere.get(key)
        held = flows.in_flight.get(key, 0) if flows is not None else 0
        if there is not None:
            held += there.in_flight
        if held == 0:
            return True
        now = self._clock()
        total = 0.0
        if flows is not None:
            for other, weight in list(flows.weight.items()):
                if flows.is_active(other, now, self._active_for):
                    total += weight
                else:
                    self._forget(flows, other)
        for other, count in elsewhere.items():
            if flows is None or other not in flows.weight:
                total += count.weight
        if there is None and (flows is None or key not in flows.weight):
            total += ticket.weight
        return held + 1 <= places * ticket.weight / total

    @staticmethod
    def _forget(flows: _Flows, key: str) -> None:
        for table in (flows.in_flight, flows.queued, flows.weight, flows.last):
            table.pop(key, None)

    def _began(self, model: str, ticket: Ticket) -> None:
        flows = self._flows.get(model)
        if flows is None:
            flows = self._flows[model] = _Flows()
        flows.seen(ticket, self._clock())
        flows.in_flight[ticket.key] = flows.in_flight.get(ticket.key, 0) + 1

    def _ended(self, model: str, key: str) -> None:
        flows = self._flows.get(model)
        if flows is None or key not in flows.in_flight:
            return
        now = flows.last[key] = self._clock()
        flows.endings.hit(now)
        left = flows.in_flight[key] - 1
        if left > 0:
            flows.in_flight[key] = left
        else:
            del flows.in_flight[key]
        if now - flows.pruned > self._active_for:
            # Keys gone quiet are forgotten here too, in case the model never
            # gets down to its reserve (where they are otherwise forgotten).
            flows.pruned = now
            for other in [k for k in flows.last if not flows.is_active(k, now, self._active_for)]:
                self._forget(flows, other)

    def _queued(self, model: str, ticket: Ticket, change: int) -> None:
        flows = self._flows.get(model)
        if flows is None:
            flows = self._flows[model] = _Flows()
        flows.seen(ticket, self._clock())
        count = flows.queued.get(ticket.key, 0) + change
        if count > 0:
            flows.queued[ticket.key] = count
        else:
            flows.queued.pop(ticket.key, None)

    def _refuse_count(self, model: str, ticket: Ticket, reason: str) -> None:
        if self._metrics is not None:
            self._metrics.refused.labels(model, ticket.priority, reason).inc()

    def _push(self, state: _ModelQueue, ticket: Ticket, rank: int, cost: float) -> _Waiter:
        now = self._clock()
        if state.size == 0:
            state.reset_tags()
        finish = state.finish[rank]
        start_tag = max(state.vtime[rank], finish.get(ticket.key, 0.0))
        finish[ticket.key] = start_tag + cost / ticket.weight
        waiter = _Waiter(
            ticket=ticket,
            rank=rank,
            enqueued=now,
            tag=start_tag,
            future=asyncio.get_running_loop().create_future(),
            cost=cost,
        )
        state.seq += 1
        heapq.heappush(state.heaps[rank], (start_tag, state.seq, waiter))
        state.size += 1
        state.counts[rank] += 1
        return waiter

    def _leave(self, model: str, state: _ModelQueue, waiter: _Waiter) -> None:
        """The waiter's coroutine resumes: let go of its reservation, or of its place."""
        if waiter.future.done() and not waiter.future.cancelled():
            # Let out: the caller sends it now, into the in-flight count.
            state.reserved -= 1
            if not _returning():
                # Cancelled after being let out (the client left): hand the place on.
                if self._reserve > 0:
                    self._ended(model, waiter.ticket.key)
                self._drain(model, state)
        else:
            waiter.future.cancel()
            waiter.gone = True
            state.size -= 1
            state.counts[waiter.rank] -= 1
            if self._reserve > 0:
                self._queued(model, waiter.ticket, -1)
            if _returning() is False and self._metrics is not None:
                self._metrics.left.labels(model, waiter.ticket.priority).inc()
        if state.size == 0 and state.rechecker is not None:
            state.rechecker.cancel()  # nobody waits: nothing to look for
            state.rechecker = None
        if state.size == 0 and state.reserved == 0:
            self._models.pop(model, None)

    def _least_served(self, model: str, heap: list[tuple[float, int, _Waiter]]) -> _Waiter | None:
        """The waiter whose key was given the least work lately (over its weight);
        the earliest among its key's."""
        ledger = self._ledger
        assert ledger is not None
        best: _Waiter | None = None
        best_key = (math.inf, math.inf)
        usage: dict[str, float] = {}
        for _, seq, waiter in heap:
            if waiter.gone:
                continue
            key = waiter.ticket.key
            if key not in usage:
                usage[key] = ledger.served(model, key) / waiter.ticket.weight
            order = (usage[key], float(seq))
            if order < best_key:
                best, best_key = waiter, order
        return best

    def _next(self, model: str, state: _ModelQueue, now: float) -> _Waiter | None:
        best: _Waiter | None = None
        best_key = (math.inf, math.inf)
        for rank, heap in enumerate(state.heaps):
            while heap and heap[0][2].gone:
                heapq.heappop(heap)
            if not heap:
                continue
            head = heap[0][2] if self._ledger is None else self._least_served(model, heap)
            if head is None:
                continue
            promoted = int((now - head.enqueued) // self._aging) if self._aging > 0 else 0
            key = (float(rank - promoted), float(rank))
            if key < best_key:
                best, best_key = head, key
        return best

    def _next_under_share(self, model: str, state: _ModelQueue, places: float) -> _Waiter | None:
        """The first waiter, by class and then fair-share order, whose key is under
        its fair share (the reserve's taker). Scans the queue: it runs only while
        the model is down to its reserve and its next waiter's key is over its share."""
        under: dict[str, bool] = {}
        for heap in state.heaps:
            best: tuple[float, int, _Waiter] | None = None
            for entry in heap:
                waiter = entry[2]
                if waiter.gone or (best is not None and entry[:2] >= best[:2]):
                    continue
                key = waiter.ticket.key
                if key not in under:
                    under[key] = self._under_share(model, waiter.ticket, places)
                if under[key]:
                    best = entry
            if best is not None:
                return best[2]
        return None

    def _drain(self, model: str, state: _ModelQueue) -> None:
        """Let waiters out, in order, while the model has room (and, down to its
        reserve, only those whose key is under its fair share)."""
        now = self._clock()
        while state.size:
            if self._reserve <= 0:
                room, places = self._saturation.room(model, state.reserved), math.inf
            else:
                room, places = self._saturation.room_and_places(model, state.reserved)
            if room <= 0:
                return
            waiter = self._next(model, state, now)
            if waiter is None:
                return
            in_order = True
            if (
                room <= self._most_kept(places)
                and room <= self._kept(model, places)
                and not self._under_share(model, waiter.ticket, places)
            ):
                waiter = self._next_under_share(model, state, places)
                if waiter is None:
                    return
                in_order = False
            heap = state.heaps[waiter.rank]
            if heap[0][2] is waiter:
                heapq.heappop(heap)
            # (Otherwise it is left in the heap, gone, until it reaches the top.)
            if in_order:
                # A reserve's taker out of order does not move the class's virtual time.
                state.vtime[waiter.rank] = waiter.tag
            if self._ledger is not None:
                self._ledger.charge(model, waiter.ticket.key, waiter.cost)
            waiter.gone = True
            state.size -= 1
            state.counts[waiter.rank] -= 1
            state.reserved += 1
            if self._reserve > 0:
                self._queued(model, waiter.ticket, -1)
                self._began(model, waiter.ticket)
            waiter.future.set_result(None)


def _returning() -> bool:
    """True unless the current task is being cancelled."""
    task = asyncio.current_task()
    return task is None or task.cancelling() == 0
