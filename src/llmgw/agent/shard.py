"""One engine process on this node and its state machine.

    starting ──> loading ──> ready ──┐        (ready ──> loading when probes keep failing)
        │           │          │     ├──> draining ──> stopped    (DrainShard)
        │           │          │     └──────────────> stopped    (StopShard, agent shutdown)
        └───────────┴──────────┴────────────────────> failed     (exit while not stopping)

`starting` is reported when the process is spawned, `loading` once it is
running and the readiness probe has not passed yet, `ready` when GET ready_path
answers 200. A stop sends SIGTERM to the engine's process group and SIGKILL
after the grace period. Every transition is handed to `on_change` as an
immutable `ShardReport`.

Not guaranteed: that `ready` means more than "the readiness path answered 200";
that a stopped engine finished its in-flight requests (that is what draining
and the grace period are for); exit codes of processes killed by a signal are
reported as minus the signal number.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from llmgw.agent.output import OutputTail
from llmgw.agent.probe import ProbeError, http_status
from llmgw.agent.settings import SupervisorSettings
from llmgw.proto import agent_pb2

log = logging.getLogger("llmgw.agent.shard")

# After the engine's leader exits, its output pipe may be held open by a child
# it left behind; the tail is read for at most this long.
_OUTPUT_DRAIN_SECONDS = 1.0


class ShardState(enum.StrEnum):
    STARTING = "starting"
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in (ShardState.STOPPED, ShardState.FAILED)


@dataclass(frozen=True, slots=True)
class ShardReport:
    """A shard's state at one moment, as it goes on the wire (ShardStatus)."""

    shard_id: str
    model: str
    state: ShardState
    since: float
    spec: agent_pb2.ShardSpec  # never mutated after the shard is created
    message: str = ""
    pid: int = 0
    endpoint_url: str = ""
    exit_code: int | None = None
    output_tail: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    """Where the readiness probe goes: always this machine, whatever the engine binds."""

    host: str
    port: int
    path: str


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"engine was killed by {name}"
    return f"engine exited with code {code}"


class Shard:
    """Watches one spawned engine process from `starting` to `stopped` or `failed`.

    `run()` owns the whole life of the process; `stop()` asks it to end and
    waits. Cancelling `run()` SIGKILLs the process group, so no engine outlives
    its watcher.
    """

    def __init__(
        self,
        *,
        spec: agent_pb2.ShardSpec,
        process: asyncio.subprocess.Process,
        endpoint_url: str,
        probe: ProbeTarget,
        settings: SupervisorSettings,
        on_change: Callable[[ShardReport], None],
        wall_clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        self._spec = spec
        self._process = process
        self._probe = probe
        self._settings = settings
        self._on_change = on_change
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._tail = OutputTail(max_lines=settings.output_lines)
        self._stop_requested = asyncio.Event()
        self._stop_grace = settings.default_grace_seconds
        self._drain = False
        self._done = asyncio.Event()
        self._report = ShardReport(
            shard_id=spec.shard_id,
            model=spec.model,
            state=ShardState.STARTING,
            since=wall_clock(),
            spec=spec,
            message="engine process spawned",
            pid=process.pid,
            endpoint_url=endpoint_url,
        )
        on_change(self._report)

    @property
    def report(self) -> ShardReport:
        return self._report

    @property
    def spec(self) -> agent_pb2.ShardSpec:
        return self._spec

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def live(self) -> bool:
        """The process has not been reported stopped or failed yet."""
        return not self._report.state.terminal

    def _set(
        self,
        state: ShardState,
        message: str,
        *,
        exit_code: int | None = None,
        output_tail: tuple[str, ...] = (),
    ) -> None:
        report = ShardReport(
            shard_id=self._report.shard_id,
            model=self._report.model,
            state=state,
            since=self._wall_clock(),
            spec=self._spec,
            message=message,
            pid=self._report.pid,
            endpoint_url=self._report.endpoint_url,
            exit_code=exit_code,
            output_tail=output_tail,
        )
        self._report = report
        log.info("shard %s (%s): %s — %s", report.shard_id, report.model, state, message)
        self._on_change(report)

    async def stop(self, *, grace: float, drain: bool) -> ShardReport:
        """Ask the engine to stop (the first request's grace and drain win) and wait for it."""
        if not self._stop_requested.is_set():
            self._stop_grace = grace
            self._drain = drain
            self._stop_requested.set()
        await self._done.wait()
        return self._report

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                output = group.create_task(self._pump_output())
                probing = group.create_task(self._probe_loop())
                exited = group.create_task(self._process.wait())
                stop = group.create_task(self._stop_requested.wait())
                await asyncio.wait({exited, stop}, return_when=asyncio.FIRST_COMPLETED)
                if not exited.done():
                    probing.cancel()
                    await self._terminate(exited)
                code = await exited
                stop.cancel()
                probing.cancel()
                # Whatever the engine left in its group goes with it.
                self._kill_group(signal.SIGKILL)
                await asyncio.wait({output}, timeout=_OUTPUT_DRAIN_SECONDS)
                output.cancel()
            for line in self._tail.close():
                log.debug("[%s] %s", self._spec.shard_id, line)
            if self._stop_requested.is_set():
                self._set(ShardState.STOPPED, f"stopped ({describe_exit(code)})", exit_code=code)
            else:
                self._set(
                    ShardState.FAILED,
                    f"{describe_exit(code)} while {self._report.state}",
                    exit_code=code,
                    output_tail=self._tail.lines(),
                )
        finally:
            if self._process.returncode is None:
                # Cancelled (agent shutting down hard or a bug elsewhere): never leave
                # the engine running without a watcher.
                self._kill_group(signal.SIGKILL)
                await self._reap()
            self._done.set()

    async def _reap(self) -> None:
        # Wait (briefly) for the exit and the end of the output pipe, so that the
        # process's transport closes instead of leaking.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_OUTPUT_DRAIN_SECONDS):
                await self._process.wait()
                if self._process.stdout is not None:
                    await self._process.stdout.read()

    async def _terminate(self, exited: asyncio.Task[int]) -> None:
        if self._drain:
            self._set(ShardState.DRAINING, "draining: no new requests, then stopping")
        log.info(
            "shard %s: SIGTERM to process group %d (SIGKILL in %gs)",
            self._spec.shard_id,
            self._process.pid,
            self._stop_grace,
        )
        self._kill_group(signal.SIGTERM)
        await asyncio.wait({exited}, timeout=self._stop_grace)
        if not exited.done():
            log.warning(
                "shard %s did not exit %gs after SIGTERM; SIGKILL",
                self._spec.shard_id,
                self._stop_grace,
            )
            self._kill_group(signal.SIGKILL)

    def _kill_group(self, sig: signal.Signals) -> None:
        # The engine leads its own session and process group (start_new_session).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, sig)

    async def _pump_output(self) -> None:
        stream = self._process.stdout
        if stream is None:
            return
        while chunk := await stream.read(65536):
            for line in self._tail.feed(chunk):
                log.debug("[%s] %s", self._spec.shard_id, line)

    async def _probe_loop(self) -> None:
        settings = self._settings
        self._set(ShardState.LOADING, f"engine running; waiting for {self._probe.path}")
        failures = 0
        while True:
            try:
                async with asyncio.timeout(settings.probe_timeout_seconds):
                    status = await http_status(self._probe.host, self._probe.port, self._probe.path)
                problem = "" if status == 200 else f"{self._probe.path} answered {status}"
            except ProbeError as exc:
                problem = f"{self._probe.path}: {exc}"
            except TimeoutError:
                problem = f"{self._probe.path}: no answer in {settings.probe_timeout_seconds:g}s"
            state = self._report.state
            if not problem:
                failures = 0
                if state is ShardState.LOADING:
                    self._set(ShardState.READY, f"{self._probe.path} answered 200")
            elif state is ShardState.READY:
                failures += 1
                if failures >= settings.ready_failures_before_loading:
                    self._set(ShardState.LOADING, f"engine stopped answering: {problem}")
            ready = self._report.state is ShardState.READY
            await self._sleep(
                settings.probe_interval_ready_seconds
                if ready
                else settings.probe_interval_loading_seconds
            )
