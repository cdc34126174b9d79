"""The timing model: FIFO admission up to `max_running`, prefill time, inter-token time.

A request waits in a FIFO queue while `running >= max_running`; once admitted its
first token costs `prefill_per_token` per prompt token the prefix cache did not hold
(plus any injected slow start), and every later token costs
`itl + itl_per_running * running`, so a fuller batch decodes slower, as on a GPU.
Prefill also stalls the batch, as it does on a GPU: a decoding sequence's next token
is late by `prefill_interference` times the prefill seconds that other requests
began on this engine since its previous token (a cache miss slows everyone's
decoding, a cache hit does not). A request's own prefill is not counted against it.

Sleeping goes through an injected `Sleep`, so tests drive the scheduler in virtual
time. A zero timing model with no `max_running` never sleeps and never queues
(`--zero-delay`).

Not guaranteed: the batch is not re-evaluated during a sleep (a token's gap is fixed by
the batch size when the previous token was produced), there is no preemption, and a
queued request's position is only FIFO among requests that reached `admit`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]


class Occupancy(Protocol):
    """Per-model gauges the scheduler keeps next to its own totals."""

    running: int
    waiting: int


@dataclass(frozen=True, slots=True)
class TimingModel:
    prefill_per_token: float
    itl: float
    itl_per_running: float
    prefill_interference: float = 0.0

    @property
    def instant(self) -> bool:
        return self.prefill_per_token == 0 and self.itl == 0 and self.itl_per_running == 0

    def prefill_seconds(self, uncached_tokens: int) -> float:
        return self.prefill_per_token * uncached_tokens

    def inter_token_seconds(self, running: int) -> float:
        return self.itl + self.itl_per_running * running


class DecodeCursor:
    """One decoding sequence's place in the engine's prefill history."""

    __slots__ = ("prefill_seen",)

    def __init__(self, prefill_seen: float) -> None:
        self.prefill_seen = prefill_seen


class Scheduler:
    """Admission slots and the sleeps that make up a request's time on the engine."""

    def __init__(
        self,
        *,
        timing: TimingModel,
        max_running: int | None,
        sleep: Sleep,
        prefill_slots: int = 0,
    ) -> None:
        if max_running is not None and max_running < 1:
            raise ValueError(f"max_running must be at least 1, got {max_running}")
        if prefill_slots < 0:
            raise ValueError(f"prefill_slots must be 0 (no limit) or more, got {prefill_slots}")
        self.prefill_slots = prefill_slots
        self._prefilling = 0
        self._prefill_queue: deque[asyncio.Future[None]] = deque()
        self.timing = timing
        self.max_running = max_running
        self._sleep = sleep
        self._waiters: deque[tuple[asyncio.Future[None], Occupancy]] = deque()
        self.running = 0
        self.waiting = 0
        # Prefill seconds begun on this engine so far (what stalls decoding).
        self._prefill_begun = 0.0

    @property
    def instant(self) -> bool:
        """True when no request ever sleeps or queues here (zero-delay mode)."""
        return self.max_running is None and self.timing.instant

    def _has_room(self) -> bool:
        return self.max_running is None or self.running < self.max_running

    async def admit(self, occupancy: Occupancy) -> None:
        """Return once the request holds a running slot; the caller must `release` it."""
        if not self._waiters and self._has_room():
            self.running += 1
            occupancy.running += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (waiter, occupancy)
        self._waiters.append(entry)
        self.waiting += 1
        occupancy.waiting += 1
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                # The slot was granted just before the cancellation reached us: give it on.
                self.release(occupancy)
            elif entry in self._waiters:
                self._waiters.remove(entry)
                self.waiting -= 1
                occupancy.waiting -= 1
            raise

    def release(self, occupancy: Occupancy) -> None:
        self.running -= 1
        occupancy.running -= 1
        while self._waiters and self._has_room():
            waiter, waiting_occupancy = self._waiters.popleft()
            self.waiting -= 1
            waiting_occupancy.waiting -= 1
            if waiter.done():  # cancelled while queued; its task cleans up nothing more
                continue
            self.running += 1
            waiting_occupancy.running += 1
            waiter.set_result(None)

    async def prefill(self, uncached_tokens: int, *, extra_seconds: float = 0.0) -> None:
        compute = self.timing.prefill_seconds(uncached_tokens)
        if self.prefill_slots and compute > 0:
            await self.pause(extra_seconds)
            await self._prefill_turn()
            try:
                self._prefill_begun += compute
                await self._sleep(compute)
            finally:
                self._prefill_done()
            return
        self._prefill_begun += compute
        delay = compute + extra_seconds
        if delay > 0:
            await self._sleep(delay)

    async def _prefill_turn(self) -> None:
        """Wait for a prefill slot (FIFO); the caller must `_prefill_done` after."""
        if not self._prefill_queue and self._prefilling < self.prefill_slots:
            self._prefilling += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._prefill_queue.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._prefill_done()  # granted just before the cancellation: pass it on
            elif waiter in self._prefill_queue:
                self._prefill_queue.remove(waiter)
            raise

    def _prefill_done(self) -> None:
        self._prefilling -= 1
        while self._prefill_queue and self._prefilling < self.prefill_slots:
            waiter = self._prefill_queue.popleft()
            if waiter.done():
                continue
            self._prefilling += 1
            waiter.set_result(None)

    def decoding(self) -> DecodeCursor:
        """Start decoding a sequence: prefills begun before now do not delay it."""
        return DecodeCursor(self._prefill_begun)

    async def inter_token(self, cursor: DecodeCursor | None = None) -> None:
        delay = self.timing.inter_token_seconds(self.running)
        if cursor is not None:
            stalled = self._prefill_begun - cursor.prefill_seen
            cursor.prefill_seen = self._prefill_begun
            delay += self.timing.prefill_interference * stalled
        if delay > 0:
            await self._sleep(delay)

    async def pause(self, seconds: float) -> None:
        if seconds > 0:
            await self._sleep(seconds)
