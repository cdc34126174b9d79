"""llmgw.diagnostics on real tasks, threads and allocations of the test process itself."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
import tracemalloc
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from llmgw.diagnostics import (
    AllocationTracer,
    Profiler,
    ProfilerBusy,
    TracingError,
    install_stack_dump,
    memory_report,
    render,
    render_memory,
    report,
    task_stacks,
    thread_stacks,
)


async def _parked_inner(gate: asyncio.Event) -> None:
    await gate.wait()


async def _parked_outer(gate: asyncio.Event) -> None:
    await _parked_inner(gate)


async def _ticks(gate: asyncio.Event) -> AsyncIterator[int]:
    yield 1
    await gate.wait()
    yield 2


async def _consume(gate: asyncio.Event) -> None:
    async for _ in _ticks(gate):
        pass


async def test_identical_stacks_are_one_group_and_chains_reach_the_awaited_frames() -> None:
    gate = asyncio.Event()
    parked = [asyncio.create_task(_parked_outer(gate), name=f"parked-{i}") for i in range(5)]
    consumer = asyncio.create_task(_consume(gate), name="consumer")
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    try:
        data = report("tasks", task_stacks())
        groups = {tuple(g["names"]): g for g in data["groups"]}
        [five] = [g for g in data["groups"] if g["count"] == 5]
        assert sorted(five["names"]) == [f"parked-{i}" for i in range(5)]
        assert five["states"] == {"pending": 5}
        functions = [frame.rsplit(" in ", 1)[1] for frame in five["stack"][:-1]]
        assert functions[:2] == ["_parked_outer", "_parked_inner"]
        assert five["stack"][-1] == "<awaiting Future>"
        assert "test_diagnostics_inside.py:" in five["stack"][0]
        # Through `async for`: the async generator's own frame is in the chain.
        consumer_stack = groups[("consumer",)]["stack"]
        assert any(frame.endswith(" in _ticks") for frame in consumer_stack)
        # This test's own task is the running one.
        assert any(g["states"] == {"running": 1} for g in data["groups"])
        text = render(data)
        assert "5 tasks (5 pending): parked-" in text
        assert " in _parked_inner" in text
    finally:
        gate.set()
        await asyncio.gather(*parked, consumer)


def test_threads_show_every_thread_with_its_name() -> None:
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, name="diag-sleeper", daemon=True)
    worker.start()
    try:
        data = report("threads", thread_stacks())
        names = {name for g in data["groups"] for name in g["names"]}
        assert {"MainThread", "diag-sleeper"} <= names
        [mine] = [g for g in data["groups"] if "diag-sleeper" in g["names"]]
        assert mine["states"] == {"daemon": 1}
        assert any(frame.endswith(" in Event.wait") for frame in mine["stack"])
        assert "1 thread (1 current): MainThread" in render(data)
    finally:
        stop.set()
        worker.join()


def _spin(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(200))


async def test_a_profile_counts_a_busy_thread_and_leaves_waiting_ones_out() -> None:
    stop = threading.Event()
    busy = threading.Thread(target=_spin, args=(stop,), name="diag-busy")
    sleeper = threading.Thread(target=stop.wait, name="diag-waiting")
    busy.start()
    sleeper.start()
    try:
        profiler = Profiler()
        result = await profiler.run(seconds=1.0, interval=0.005)
        lines = result.collapsed.splitlines()
        assert result.samples > 0 and result.stacks == len(lines)
        assert result.sampler_cpu_seconds > 0
        assert any(line.startswith("diag-busy;") and "_spin (" in line for line in lines), (
            result.collapsed
        )
        assert not any(line.startswith("diag-waiting;") for line in lines)
        everything = await profiler.run(seconds=1.0, interval=0.005, idle=True)
        assert any(line.startswith("diag-waiting;") for line in everything.collapsed.splitlines())
    finally:
        stop.set()
        busy.join()
        sleeper.join()


async def test_only_one_profile_runs_at_a_time() -> None:
    profiler = Profiler(max_seconds=30)
    first = asyncio.create_task(profiler.run(seconds=30, interval=0.01))
    await asyncio.sleep(0)  # it takes the profiler before its first wait
    with pytest.raises(ProfilerBusy, match="already running"):
        await profiler.run(seconds=0.1, interval=0.01)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    with pytest.raises(ValueError, match="seconds"):
        await profiler.run(seconds=31, interval=0.01)


async def test_profiles_run_back_to_back() -> None:
    profiler = Profiler()
    for _ in range(3):
        # Each is free the moment the one before has answered.
        assert (await profiler.run(seconds=0.2, interval=0.005)).samples > 0


async def test_a_cancelled_profile_stops_sampling_and_frees_the_profiler() -> None:
    profiler = Profiler()
    task = asyncio.create_task(profiler.run(seconds=30, interval=0.01))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            await profiler.run(seconds=0.01, interval=0.005)
        except ProfilerBusy:
            await asyncio.sleep(0.01)
        else:
            return
    raise AssertionError("the profiler stayed busy after its request was cancelled")


def test_memory_tracing_starts_reports_and_stops() -> None:
    assert not tracemalloc.is_tracing()
    tracer = AllocationTracer(wall_clock=lambda: datetime(2026, 1, 2, tzinfo=UTC))
    plain = memory_report(top=3, tracer=tracer)
    assert plain["rss_bytes"] > 0 and len(plain["types"]) == 3
    assert plain["tracemalloc"] == {"tracing": False} and plain["allocations"] == []
    assert "allocation tracing is off" in render_memory(plain)
    try:
        state = tracer.start(4)
        assert state["tracing"] is True and state["frames"] == 4
        assert state["started_at"] == "2026-01-02T00:00:00+00:00"
        with pytest.raises(TracingError, match="already running"):
            tracer.start(2)
        kept = [bytearray(1000) for _ in range(100)]
        traced = memory_report(top=5, tracer=tracer)
        assert traced["allocations"], traced
        assert any(
            "test_diagnostics_inside.py" in frame
            for site in traced["allocations"]
            for frame in site["traceback"]
        )
        assert "top allocation sites" in render_memory(traced)
        del kept
    finally:
        assert tracer.stop() == {"tracing": False, "was_tracing": True}
    assert tracer.stop() == {"tracing": False, "was_tracing": False}


async def test_the_signal_dumps_threads_and_tasks_and_the_process_carries_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gate = asyncio.Event()
    parked = asyncio.create_task(_parked_outer(gate), name="parked-for-signal")
    log = logging.getLogger("llmgw.test.diag")
    with (tmp_path / "threads.txt").open("w") as out:
        undo = install_stack_dump(
            asyncio.get_running_loop(), log=log, file=out, signum=signal.SIGUSR1
        )
        try:
            with caplog.at_level(logging.WARNING, logger="llmgw.test.diag"):
                os.kill(os.getpid(), signal.SIGUSR1)
                for _ in range(1000):
                    if caplog.records:
                        break
                    await asyncio.sleep(0.01)
        finally:
            undo()
    [record] = caplog.records
    assert "SIGUSR1" in record.getMessage()
    assert "parked-for-signal" in record.getMessage()
    assert " in _parked_inner" in record.getMessage()
    threads = (tmp_path / "threads.txt").read_text()
    assert "Current thread 0x" in threads
    gate.set()
    await parked
