"""The sim's timing model in virtual time: FIFO queueing, prefill, ITL that grows with the batch.

`VirtualTime` replaces `asyncio.sleep`: sleepers wait on futures ordered by deadline,
and `run` advances the clock to the next deadline only once every task is blocked, so
these tests take no real time and assert exact simulated timestamps.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Coroutine
from typing import Any

import pytest

from llmgw.sim.cache import PrefixCache
from llmgw.sim.engine import Engine
from llmgw.sim.scheduler import Scheduler, TimingModel
from llmgw.sim.stats import ModelCounters


class VirtualTime:
    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + delay, next(self._order), waiter))
        await waiter

    async def _settle(self) -> None:
        for _ in range(50):
            await asyncio.sleep(0)

    async def run(self, *coros: Coroutine[Any, Any, Any]) -> None:
        tasks = [asyncio.ensure_future(coro) for coro in coros]
        while True:
            await self._settle()
            if all(task.done() for task in tasks):
                break
            assert self._sleepers, "every task is blocked and nobody sleeps: deadlock"
            deadline, _, waiter = heapq.heappop(self._sleepers)
            self.now = max(self.now, deadline)
            if not waiter.done():
                waiter.set_result(None)
        for task in tasks:
            task.result()


def _engine(vt: VirtualTime, *, max_running: int | None, cache_blocks: int = 0) -> Engine:
    timing = TimingModel(prefill_per_token=0.001, itl=0.1, itl_per_running=0.01)
    scheduler = Scheduler(timing=timing, max_running=max_running, sleep=vt.sleep)
    return Engine(
        scheduler=scheduler, cache=PrefixCache(block_size=4, capacity_blocks=cache_blocks)
    )


async def _request(
    engine: Engine,
    vt: VirtualTime,
    times: list[float],
    *,
    counters: ModelCounters | None = None,
    prompt: list[str] | None = None,
    tokens: int = 3,
) -> None:
    async def emit(index: int, token: str) -> None:
        times.append(round(vt.now, 9))

    await engine.generate(
        model="m",
        counters=counters or ModelCounters(),
        prompt=prompt if prompt is not None else [f"p{index}" for index in range(10)],
        tokens=[" x"] * tokens,
        stall_after=None,
        slow_start=0.0,
        emit=emit,
    )


async def test_requests_beyond_max_running_queue_fifo_and_start_when_a_slot_frees() -> None:
    vt = VirtualTime()
    engine = _engine(vt, max_running=2)
    a: list[float] = []
    b: list[float] = []
    c: list[float] = []
    counters = ModelCounters()

    async def observe() -> None:
        await asyncio.sleep(0)
        assert (engine.scheduler.running, engine.scheduler.waiting) == (2, 1)
        assert (counters.running, counters.waiting) == (2, 1)

    await vt.run(
        _request(engine, vt, a, counters=counters),
        _request(engine, vt, b, counters=counters),
        _request(engine, vt, c, counters=counters),
        observe(),
    )
    # 10 prompt tokens x 1 ms prefill; then 0.1 + 0.01 x 2 running per token.
    assert a == pytest.approx([0.01, 0.13, 0.25])
    assert b == pytest.approx([0.01, 0.13, 0.25])
    # c starts when a finishes at 0.25, then decodes alone (running = 1).
    assert c == pytest.approx([0.26, 0.37, 0.48])
    assert (engine.scheduler.running, engine.scheduler.waiting) == (0, 0)
    assert (counters.running, counters.waiting) == (0, 0)
    assert counters.generation_tokens == 9
    assert counters.prompt_tokens == 30


async def test_inter_token_latency_grows_with_the_number_running() -> None:
    vt = VirtualTime()
    engine = _engine(vt, max_running=None)
    alone: list[float] = []
    await vt.run(_request(engine, vt, alone))
    # 10 ms prefill, then 0.1 + 0.01 x 1 running per token.
    assert alone == pytest.approx([0.01, 0.12, 0.23])

    vt = VirtualTime()
    engine = _engine(vt, max_running=None)
    batch: list[list[float]] = [[] for _ in range(4)]
    await vt.run(*(_request(engine, vt, times) for times in batch))
    for times in batch:  # all four are running after the prefill: 0.1 + 0.01 x 4
        assert times == pytest.approx([0.01, 0.15, 0.29])


async def test_prefix_cache_hits_shorten_the_prefill() -> None:
    vt = VirtualTime()
    engine = _engine(vt, max_running=None, cache_blocks=100)
    prompt = [f"p{index}" for index in range(10)]  # two full blocks of 4, 2 tokens left
    first: list[float] = []
    await vt.run(_request(engine, vt, first, prompt=prompt, tokens=1))
    start = vt.now
    second: list[float] = []
    counters = ModelCounters()
    await vt.run(_request(engine, vt, second, prompt=prompt, tokens=1, counters=counters))
    assert first == pytest.approx([0.01])
    assert second[0] - start == pytest.approx(0.002)  # only the 2 uncached tokens
    assert (counters.prefix_cache_queries, counters.prefix_cache_hits) == (10, 8)


async def test_cancelled_requests_free_their_slot_or_queue_place() -> None:
    vt = VirtualTime()
    engine = _engine(vt, max_running=1)
    scheduler = engine.scheduler
    running = asyncio.ensure_future(_request(engine, vt, [], tokens=100))
    queued = asyncio.ensure_future(_request(engine, vt, [], tokens=1))
    for _ in range(10):
        await asyncio.sleep(0)
    assert (scheduler.running, scheduler.waiting) == (1, 1)
    queued.cancel()
    await asyncio.gather(queued, return_exceptions=True)
    assert (scheduler.running, scheduler.waiting) == (1, 0)
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    assert (scheduler.running, scheduler.waiting) == (0, 0)
    # The slot is usable again.
    done: list[float] = []
    await vt.run(_request(engine, vt, done, tokens=1))
    assert len(done) == 1


async def test_a_granted_slot_is_handed_on_when_its_waiter_was_cancelled_meanwhile() -> None:
    vt = VirtualTime()
    engine = _engine(vt, max_running=1)
    scheduler = engine.scheduler
    holder = ModelCounters()
    await scheduler.admit(holder)
    first = asyncio.ensure_future(scheduler.admit(ModelCounters()))
    second_counters = ModelCounters()
    second = asyncio.ensure_future(scheduler.admit(second_counters))
    await asyncio.sleep(0)
    scheduler.release(holder)  # grants `first`...
    first.cancel()  # ...which is cancelled before it runs, so it must pass the slot on
    await asyncio.gather(first, return_exceptions=True)
    await second
    assert (scheduler.running, scheduler.waiting) == (1, 0)
    assert second_counters.running == 1


async def test_stalled_generation_stops_after_n_tokens_until_cancelled() -> None:
    vt = VirtualTime()
    engine = _engine(vt, max_running=None)
    emitted: list[int] = []

    async def emit(index: int, token: str) -> None:
        emitted.append(index)

    task = asyncio.ensure_future(
        engine.generate(
            model="m",
            counters=ModelCounters(),
            prompt=[],
            tokens=[" x"] * 10,
            stall_after=3,
            slow_start=0.0,
            emit=emit,
        )
    )

    async def stop_later() -> None:
        await vt.sleep(100.0)
        task.cancel()

    await vt.run(stop_later())
    await asyncio.gather(task, return_exceptions=True)
    assert emitted == [0, 1, 2]
    assert task.cancelled()
    assert engine.scheduler.running == 0


def test_zero_timing_without_limit_is_instant() -> None:
    instant = Scheduler(
        timing=TimingModel(prefill_per_token=0.0, itl=0.0, itl_per_running=0.0),
        max_running=None,
        sleep=asyncio.sleep,
    )
    assert instant.instant
    with pytest.raises(ValueError, match="max_running"):
        Scheduler(timing=instant.timing, max_running=0, sleep=asyncio.sleep)


async def test_another_requests_prefill_stalls_decoding_unless_its_prefix_is_cached() -> None:
    def engine(vt: VirtualTime) -> Engine:
        timing = TimingModel(
            prefill_per_token=0.001, itl=0.1, itl_per_running=0.0, prefill_interference=1.0
        )
        scheduler = Scheduler(timing=timing, max_running=None, sleep=vt.sleep)
        return Engine(scheduler=scheduler, cache=PrefixCache(block_size=4, capacity_blocks=100))

    long_prompt = [f"q{index}" for index in range(100)]  # 0.1 s of prefill when uncached

    async def later(engine: Engine, vt: VirtualTime, times: list[float]) -> None:
        await vt.sleep(0.05)  # arrives while the first request decodes
        await _request(engine, vt, times, prompt=long_prompt, tokens=1)

    vt = VirtualTime()
    cold = engine(vt)
    decoding: list[float] = []
    await vt.run(_request(cold, vt, decoding, tokens=3), later(cold, vt, []))
    # 10 ms own prefill; the second request's 0.1 s prefill (begun at 0.05) delays the
    # gap that follows it; its own prefill never delays the request itself.
    assert decoding == pytest.approx([0.01, 0.11, 0.31])

    vt = VirtualTime()
    warm = engine(vt)
    await vt.run(_request(warm, vt, [], prompt=long_prompt, tokens=1))  # caches the prefix
    start = vt.now
    decoding = []
    await vt.run(_request(warm, vt, decoding, tokens=3), later(warm, vt, []))
    # A cache hit costs the others nothing beyond the 0 uncached tokens (the last
    # partial block is none: 100 tokens are 25 full blocks).
    assert [t - start for t in decoding] == pytest.approx([0.01, 0.11, 0.21])


async def test_prefill_slots_serialize_prefills_fifo_and_leave_cache_hits_alone() -> None:
    def engine(vt: VirtualTime, slots: int) -> Engine:
        timing = TimingModel(prefill_per_token=0.001, itl=0.1, itl_per_running=0.0)
        scheduler = Scheduler(timing=timing, max_running=None, sleep=vt.sleep, prefill_slots=slots)
        return Engine(scheduler=scheduler, cache=PrefixCache(block_size=4, capacity_blocks=100))

    def prompt(tag: str) -> list[str]:
        return [f"{tag}{index}" for index in range(100)]  # 0.1 s of prefill when uncached

    for slots, expected in ((0, [0.1, 0.1, 0.1]), (1, [0.1, 0.2, 0.3]), (2, [0.1, 0.1, 0.2])):
        vt = VirtualTime()
        sim = engine(vt, slots)
        firsts: list[list[float]] = [[], [], []]
        await vt.run(
            *(_request(sim, vt, firsts[i], prompt=prompt(t), tokens=1) for i, t in enumerate("abc"))
        )
        # Three misses at once: with one slot, each waits for the ones before it.
        assert [times[0] for times in firsts] == pytest.approx(expected), slots

    vt = VirtualTime()
    sim = engine(vt, 1)
    await vt.run(_request(sim, vt, [], prompt=prompt("a"), tokens=1))
    start = vt.now
    hit: list[float] = []
    miss: list[float] = []
    await vt.run(
        _request(sim, vt, miss, prompt=prompt("b"), tokens=1),
        _request(sim, vt, hit, prompt=prompt("a"), tokens=1),
    )
    # A cached prompt has nothing to compute, so it does not queue behind a miss.
    assert (hit[0] - start, miss[0] - start) == pytest.approx((0.0, 0.1))
    with pytest.raises(ValueError, match="prefill_slots"):
        Scheduler(timing=sim.scheduler.timing, max_running=None, sleep=vt.sleep, prefill_slots=-1)
