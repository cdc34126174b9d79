"""A sampling CPU profiler of the live process, in collapsed-stack form.

A thread wakes every `interval` seconds, reads every other thread's current
frame (`sys._current_frames()`) and, for the event loop's thread, the task the
loop is running (`asyncio.current_task(loop)`), and counts each stack. The
result is one `frame;frame;frame count` line per distinct stack, rooted at the
thread's name (and `[task NAME]` for the loop's running task): what
flamegraph.pl, inferno and speedscope read. Frames are `function (file)`,
without line numbers, so a function's time stays in one box.

A sample of a thread that is only waiting (its innermost Python frame is on
a line calling a blocking primitive: a lock's acquire, a queue's get, select,
sleep, recv, ...; or the event loop's thread with no callback running) is left
out unless `idle` is asked for, so the profile shows where CPU goes rather
than where threads sleep.

One profile runs at a time (`ProfilerBusy` otherwise), which bounds what
profiling can cost a loaded router: one extra thread taking the GIL for the
tens to hundreds of microseconds a sample needs, every few milliseconds (1-4%
of a core at 5 ms, bench/RESULTS.md). While it runs the interpreter's switch
interval is 0.1 ms instead of 5 ms (see `_Sampler.run`); it is put back after.

Not guaranteed: exact CPU accounting. Samples are wall-clock ticks of the
sampler; "waiting" is judged from the source line, so a thread blocked in C
called from another line counts as busy (and a quick `dict.get(` call as
waiting), and time the sampler waits for the GIL shifts its ticks.
"""

from __future__ import annotations

import asyncio
import contextlib
import linecache
import re
import sys
import threading
import time
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llmgw.diagnostics.stacks import PathNames

MAX_SECONDS = 60.0
DEFAULT_INTERVAL = 0.005
MIN_INTERVAL = 0.001
MAX_INTERVAL = 0.1
SAMPLER_THREAD = "llmgw-profiler"
# The interpreter's switch interval while a profile runs (see `_Sampler.run`).
SWITCH_INTERVAL = 0.0001
# A thread waits when its innermost Python frame is calling a blocking C
# function (a lock's acquire, a queue's get, select/poll, sleep, accept, recv):
# were it running Python, a deeper frame would be on top. Judged by the source
# line that frame is on.
BLOCKING_CALL = re.compile(
    r"(\.|\b)_?(acquire|get|wait|select|poll|epoll|sleep|accept|recv\w*|read|readline|join)\("
)
# Innermost frames of an event loop's thread when no callback runs (uvloop and
# asyncio's own loop run their select in C below these).
LOOP_IDLE_FUNCTIONS = frozenset({"run_forever", "run_until_complete", "run", "_run_once"})


class ProfilerBusy(Exception):
    """Another profile is running; the message says for how much longer."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class Profile:
    """A finished profile: how long it ran, how many samples, the collapsed stacks."""

    seconds: float
    interval: float
    samples: int
    stacks: int
    collapsed: str
    # CPU time the sampling thread itself used: what the profile cost.
    sampler_cpu_seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 3),
            "interval_ms": round(self.interval * 1000, 3),
            "samples": self.samples,
            "stacks": self.stacks,
            "sampler_cpu_seconds": round(self.sampler_cpu_seconds, 4),
            "collapsed": self.collapsed,
        }


class _Sampler:
    """One profile's sampling loop; runs on its own thread."""

    def __init__(
        self,
        *,
        loop: asyncio.AbstractEventLoop,
        loop_thread: int,
        interval: float,
        idle: bool,
        stop: threading.Event,
        clock: Callable[[], float],
    ) -> None:
        self._loop = loop
        self._loop_thread = loop_thread
        self._interval = interval
        self._idle = idle
        self._stop = stop
        self._clock = clock
        self._names = PathNames()
        self._labels: dict[types.CodeType, str] = {}
        self._blocking: dict[tuple[types.CodeType, int], bool] = {}
        self._counts: Counter[tuple[str, ...]] = Counter()
        self._samples = 0

    def _label(self, code: types.CodeType) -> str:
        label = self._labels.get(code)
        if label is None:
            text = f"{code.co_qualname} ({self._names.short(code.co_filename)})"
            label = self._labels[code] = text.replace(";", ":")
        return label

    def _waiting(self, ident: int, frame: types.FrameType, task: object) -> bool:
        code = frame.f_code
        if ident == self._loop_thread:
            if task is not None:
                return False
            if code.co_name in LOOP_IDLE_FUNCTIONS:
                return True
        key = (code, frame.f_lineno)
        blocking = self._blocking.get(key)
        if blocking is None:
            line = linecache.getline(code.co_filename, frame.f_lineno)
            blocking = self._blocking[key] = BLOCKING_CALL.search(line) is not None
        return blocking

    def _take(self, own: int, thread_names: dict[int, str]) -> None:
        task = asyncio.current_task(self._loop)
        for ident, frame in sys._current_frames().items():
            if ident == own:
                continue
            if not self._idle and self._waiting(ident, frame, task):
                continue
            labels: list[str] = []
            walk: types.FrameType | None = frame
            while walk is not None:
                labels.append(self._label(walk.f_code))
                walk = walk.f_back
            root = [thread_names.get(ident) or f"thread {ident}"]
            if ident == self._loop_thread and task is not None:
                coro = task.get_coro() if isinstance(task, asyncio.Task) else None
                what = getattr(coro, "__qualname__", None) or "?"
                root.append(f"[task {what}]")
            labels.reverse()
            self._counts[(*root, *labels)] += 1
        self._samples += 1

    def run(self, seconds: float) -> Profile:
        own = threading.get_ident()
        # The sampler gets the GIL when the loop's thread lets go of it: at a C
        # call that releases it (os.urandom, a syscall) or when the switch
        # interval (5 ms by default) forces it. Left at 5 ms, almost every sample
        # lands on the first GIL-releasing call after the tick, which points at
        # the wrong function; at SWITCH_INTERVAL the forced switch comes first,
        # so samples land where the loop's thread is spending its time.
        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, SWITCH_INTERVAL))
        try:
            return self._run(own, seconds)
        finally:
            sys.setswitchinterval(switch)

    def _run(self, own: int, seconds: float) -> Profile:
        cpu_started = time.thread_time()
        started = self._clock()
        deadline = started + seconds
        next_at = started
        names_at = started - 1.0
        thread_names: dict[int, str] = {}
        while True:
            now = self._clock()
            if now >= deadline:
                break
            if now - names_at >= 1.0:
                # Threads come and go; their names are looked up once a second.
                thread_names = {t.ident: t.name for t in threading.enumerate() if t.ident}
                names_at = now
            self._take(own, thread_names)
            next_at += self._interval
            delay = next_at - self._clock()
            if delay < 0:
                # Behind (the GIL was busy): carry on from now rather than burst.
                next_at, delay = self._clock(), 0.0
            if self._stop.wait(min(delay, max(0.0, deadline - now))):
                break
        lines = [
            f"{';'.join(stack)} {count}"
            for stack, count in sorted(self._counts.items(), key=lambda kv: (-kv[1], kv[0]))
        ]
        return Profile(
            seconds=self._clock() - started,
            interval=self._interval,
            samples=self._samples,
            stacks=len(lines),
            collapsed="\n".join(lines) + ("\n" if lines else ""),
            sampler_cpu_seconds=time.thread_time() - cpu_started,
        )


class Profiler:
    """Runs one profile at a time; build one per process, in the composition root."""

    def __init__(
        self, *, max_seconds: float = MAX_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_seconds = max_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._running: tuple[float, float] | None = None  # (started, seconds)

    async def run(self, *, seconds: float, interval: float, idle: bool = False) -> Profile:
        """Profile for `seconds` (at most `max_seconds`), sampling every `interval`."""
        if not 0 < seconds <= self.max_seconds:
            raise ValueError(f"seconds must be in (0, {self.max_seconds:g}], got {seconds!r}")
        if not MIN_INTERVAL <= interval <= MAX_INTERVAL:
            raise ValueError(f"interval must be in [{MIN_INTERVAL}, {MAX_INTERVAL}] s")
        if not self._lock.acquire(blocking=False):
            raise ProfilerBusy(self._busy_message())
        try:
            loop = asyncio.get_running_loop()
            done: asyncio.Future[Profile] = loop.create_future()
            stop = threading.Event()
            sampler = _Sampler(
                loop=loop,
                loop_thread=threading.get_ident(),
                interval=interval,
                idle=idle,
                stop=stop,
                clock=self._clock,
            )
            self._running = (self._clock(), seconds)
            thread = threading.Thread(
                target=self._work,
                args=(sampler, seconds, loop, done),
                name=SAMPLER_THREAD,
                daemon=True,
            )
            thread.start()
        except BaseException:
            self._running = None
            self._lock.release()
            raise
        try:
            return await done
        finally:
            # A request that goes away (or a shutdown) ends the sampling early.
            stop.set()

    def _work(
        self,
        sampler: _Sampler,
        seconds: float,
        loop: asyncio.AbstractEventLoop,
        done: asyncio.Future[Profile],
    ) -> None:
        result: Profile | None = None
        error: BaseException | None = None
        try:
            result = sampler.run(seconds)
        except BaseException as exc:  # handed to the awaiting request, which reports it
            error = exc
        finally:
            # Free before answering: a caller may start the next profile at once.
            self._running = None
            self._lock.release()
        with contextlib.suppress(RuntimeError):  # the loop has closed meanwhile
            if result is not None:
                loop.call_soon_threadsafe(_succeed, done, result)
            else:
                assert error is not None
                loop.call_soon_threadsafe(_fail, done, error)

    def _busy_message(self) -> str:
        running = self._running
        if running is None:
            left = "a moment"
        else:
            started, seconds = running
            left = f"about {max(0.0, started + seconds - self._clock()):.0f} s"
        return (
            "a profile is already running, and only one runs at a time (so that profiling "
            f"a loaded router costs one sampler, not many); try again in {left}"
        )


def _succeed(done: asyncio.Future[Profile], result: Profile) -> None:
    if not done.done():
        done.set_result(result)


def _fail(done: asyncio.Future[Profile], exc: BaseException) -> None:
    if not done.done():
        done.set_exception(exc)
