"""One engine process on this node and its state machine.

    starting ──> loading ──> ready ──┐        (ready ──> loading when probes keep failing)
                             ready <──> sleeping                  (SleepShard / WakeShard)
        │           │          │     ├──> draining ──> stopped    (DrainShard)
        │           │          │     └──────────────> stopped    (StopShard, unconfirmed adoption)
        └───────────┴──────────┴────────────────────> failed     (exit while not stopping,
                                                                  load_timeout, unhealthy_after)

`starting` is reported when the process is spawned, `loading` once it is
running and the readiness probe has not passed yet, `ready` when GET ready_path
answers 200. An engine adopted from an earlier agent starts at `ready` or
`loading`, as one probe finds it. Every transition is handed to `on_change` as
an immutable `ShardReport`.

Deadlines (`EngineTimings`): an engine not ready `load_timeout` seconds after
it was spawned fails ("did not become ready within 120s"); a ready engine
whose probe keeps failing for `unhealthy_after` seconds fails ("health probe
failing for 60s: ..."); both are stopped first and reported with their output
tail, so the control plane frees the GPUs and retries with backoff.

A stop (and a drain) sends SIGTERM to the engine's *main process* only and
gives its in-flight requests up to `drain_grace` seconds; then the whole
process group gets SIGTERM, and SIGKILL after the command's grace period.

`sleep_engine()` and `wake()` POST the engine's own sleep endpoints (the
`SleepApi` of its launch plan: vLLM's `/sleep?level=N` and `/wake_up`) and move a
ready shard to `sleeping` and back; a sleeping engine keeps its process and is
probed as before (vLLM's `/health` answers while it sleeps). An adopted engine
that says it sleeps (`/is_sleeping`) starts at `sleeping`. An adopted engine's
LoRA adapters are read from the engine once its probe passes while `ready`
(`ShardAdapters.read_loaded`; retried at each probe until the engine answers), so
the shard reports what the engine holds, not nothing until each is asked again.

`detach()` ends the watch and leaves the engine running (the agent stops, a
later agent adopts it); so does cancelling `run()`.

Not guaranteed: that `ready` means more than "the readiness path answered 200";
that a stopped engine finished its in-flight requests (drain_grace is all they
get); exit codes of processes killed by a signal are reported as minus the
signal number, and those of adopted engines (not this agent's children) are
unknown.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from llmgw.agent.errors import AdapterError, SleepError
from llmgw.agent.lora import ShardAdapters
from llmgw.agent.output import LogFollower, OutputTail
from llmgw.agent.probe import ProbeError, http_get, http_post, http_status
from llmgw.agent.process import EngineProcess
from llmgw.agent.settings import SupervisorSettings
from llmgw.engines import EngineTimings, LoraApi, SleepApi
from llmgw.proto import agent_pb2

if TYPE_CHECKING:
    from llmgw.agent.hub import Progress

log = logging.getLogger("llmgw.agent.shard")

# How often a stopping engine's process group is checked for leftovers.
_GROUP_POLL_SECONDS = 0.05


class ShardState(enum.StrEnum):
    STARTING = "starting"
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"
    SLEEPING = "sleeping"

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
    download: Progress | None = None  # while its hub weights download (of spec.weights)
    # LoRA adapters the engine has loaded, least recently loaded first.
    adapters: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    """Where the readiness probe goes: always this machine, whatever the engine binds."""

    host: str
    port: int
    path: str


def describe_exit(code: int | None) -> str:
    if code is None:
        return "engine exited (adopted; exit code unknown)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"engine was killed by {name}"
    return f"engine exited with code {code}"


async def probe_once(target: ProbeTarget, deadline_seconds: float) -> str:
    """One readiness probe: "" when it answered 200, else what went wrong."""
    try:
        async with asyncio.timeout(deadline_seconds):
            status = await http_status(target.host, target.port, target.path)
    except ProbeError as exc:
        return f"{target.path}: {exc}"
    except TimeoutError:
        return f"{target.path}: no answer in {deadline_seconds:g}s"
    return "" if status == 200 else f"{target.path} answered {status}"


class _End(enum.Enum):
    STOP = "stop"
    FAIL = "fail"
    DETACH = "detach"


class Shard:
    """Watches one engine process from `starting` (or adoption) to `stopped` or `failed`.

    `run()` owns the watch; `stop()` asks the engine to end and waits;
    `detach()` ends the watch and leaves the engine running.
    """

    def __init__(
        self,
        *,
        spec: agent_pb2.ShardSpec,
        process: EngineProcess,
        endpoint_url: str,
        probe: ProbeTarget,
        timings: EngineTimings,
        log_path: Path,
        started: float,
        settings: SupervisorSettings,
        on_change: Callable[[ShardReport], None],
        wall_clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
        adopted: ShardState | None = None,
        been_ready: bool = False,
        sleep_api: SleepApi | None = None,
        lora_api: LoraApi | None = None,
    ) -> None:
        """`adopted`: the state an engine taken over from an earlier agent starts in;
        `been_ready`: it was ready before (its probe failing is then a health problem,
        not a slow load); `lora_api`: for an adopted engine, how to read the adapters
        it holds (None: not read)."""
        self._spec = spec
        # An adopted engine's adapters, still to read (None: nothing to read).
        self._unread_lora = (
            lora_api if adopted is not None and lora_api and lora_api.list_path else None
        )
        self._sleep_api = sleep_api
        self._sleep_lock = asyncio.Lock()
        self._lora = ShardAdapters(post=self._engine_post)
        self._process = process
        self._probe = probe
        self._timings = timings
        self._started = started
        self._settings = settings
        self._on_change = on_change
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._tail = OutputTail(max_lines=settings.output_lines)
        self._follower = LogFollower(log_path, self._tail, max_bytes=settings.log_max_bytes)
        self._end: _End | None = None
        self._end_message = ""
        self._ending = asyncio.Event()
        self._stop_grace = settings.default_grace_seconds
        self._drain = False
        self._done = asyncio.Event()
        self.been_ready = been_ready or adopted is ShardState.READY
        self.adopted = adopted is not None
        if adopted is None:
            state, message = ShardState.STARTING, "engine process spawned"
        else:
            state = adopted
            message = f"adopted: engine (pid {process.pid}) kept running from an earlier agent"
        self._report = ShardReport(
            shard_id=spec.shard_id,
            model=spec.model,
            state=state,
            since=wall_clock(),
            spec=spec,
            message=message,
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
    def follower(self) -> LogFollower:
        return self._follower

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
        if state is ShardState.READY:
            self.been_ready = True
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
            # An engine that ended took its adapters with it.
            adapters=() if state.terminal else self._report.adapters,
        )
        self._report = report
        log.info("shard %s (%s): %s — %s", report.shard_id, report.model, state, message)
        self._on_change(report)

    def _request_end(self, end: _End, message: str = "") -> None:
        if self._end is None:
            self._end = end
            self._end_message = message
            self._ending.set()

    async def stop(self, *, grace: float, drain: bool, reason: str = "stopped") -> ShardReport:
        """Ask the engine to stop (the first request's grace and drain win) and wait for it."""
        if self._end is None:
            self._stop_grace = grace
            self._drain = drain
            self._request_end(_End.STOP, reason)
        await self._done.wait()
        return self._report

    async def sleep_engine(self, level: int) -> ShardReport:
        """Put a ready engine to sleep (`level` 1: weights to host RAM; 2: discarded)."""
        async with self._sleep_lock:
            state = self._report.state
            if state is ShardState.SLEEPING:
                return self._report
            api = self._checked_api("sleep", ShardState.READY)
            began = self._wall_clock()
            await self._post(api.sleep_target(level), api.body, "sleep")
            took = self._wall_clock() - began
            kept = "weights kept in host memory" if level == 1 else "weights discarded"
            self._set(
                ShardState.SLEEPING,
                f"asleep (level {level}, {kept}; GPU memory released in {took:.2f}s)",
            )
            return self._report

    async def wake(self) -> ShardReport:
        """Wake a sleeping engine; returns once it serves again (`ready`)."""
        async with self._sleep_lock:
            if self._report.state is ShardState.READY:
                return self._report
            api = self._checked_api("wake", ShardState.SLEEPING)
            began = self._wall_clock()
            await self._post(api.wake_path, api.body, "wake")
            self._set(ShardState.READY, f"woken in {self._wall_clock() - began:.2f}s")
            return self._report

    async def load_adapter(self, name: str, path: str, api: LoraApi | None) -> ShardReport:
        """Load a LoRA adapter into the ready engine through `api` (None: the engine has
        no runtime adapter API), served under `name`; reported."""
        self._require_ready(f"load adapter {name!r} into")
        self._adapters_changed(await self._lora.load(name, path, api))
        return self._report

    async def unload_adapter(self, name: str, api: LoraApi | None) -> ShardReport:
        """Unload a LoRA adapter from the engine; reported."""
        self._adapters_changed(await self._lora.unload(name, api))
        return self._report

    def _require_ready(self, what: str) -> None:
        if self._report.state is not ShardState.READY:
            raise AdapterError(
                f"cannot {what} shard {self._spec.shard_id!r}: it is {self._report.state}, "
                "not ready"
            )

    def _adapters_changed(self, adapters: tuple[str, ...]) -> None:
        if adapters == self._report.adapters:
            return
        self._report = replace(self._report, adapters=adapters)
        log.info("shard %s (%s): adapters %s", self._report.shard_id, self._report.model, adapters)
        self._on_change(self._report)

    async def _engine_post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST to the engine within its load deadline; `AdapterError` when it does not answer."""
        deadline = self._timings.load_timeout
        try:
            async with asyncio.timeout(deadline):
                return await http_post(self._probe.host, self._probe.port, path, body)
        except ProbeError as exc:
            raise AdapterError(f"POST {path} failed: {exc}") from exc
        except TimeoutError:
            raise AdapterError(f"POST {path} did not answer within {deadline:g}s") from None

    def _checked_api(self, what: str, needs: ShardState) -> SleepApi:
        if self._sleep_api is None:
            raise SleepError(
                f"cannot {what} shard {self._spec.shard_id!r}: its engine was not started in "
                "sleep mode (the model has no sleep_after)"
            )
        if self._report.state is not needs:
            raise SleepError(
                f"cannot {what} shard {self._spec.shard_id!r}: it is {self._report.state}, "
                f"not {needs}"
            )
        return self._sleep_api

    async def _post(self, path: str, body: bytes, what: str) -> None:
        deadline = self._timings.load_timeout
        try:
            async with asyncio.timeout(deadline):
                status, answer = await http_post(self._probe.host, self._probe.port, path, body)
        except ProbeError as exc:
            raise SleepError(f"{what}: POST {path} failed: {exc}") from exc
        except TimeoutError:
            raise SleepError(f"{what}: POST {path} did not answer within {deadline:g}s") from None
        if status != 200:
            text = answer.decode("utf-8", "replace").strip()[:300]
            raise SleepError(f"{what}: the engine answered POST {path} with {status}: {text}")

    async def detach(self) -> None:
        """End the watch and leave the engine running; waits for the watch to end."""
        self._request_end(_End.DETACH)
        await self._done.wait()

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                output = group.create_task(self._follow_output())
                probing = group.create_task(self._probe_loop())
                exited = group.create_task(self._process.wait())
                ending = group.create_task(self._ending.wait())
                await asyncio.wait({exited, ending}, return_when=asyncio.FIRST_COMPLETED)
                probing.cancel()
                if self._end is _End.DETACH and not exited.done():
                    for task in (output, exited, ending):
                        task.cancel()
                    return
                if not exited.done():
                    await self._terminate(exited)
                code = await exited
                ending.cancel()
                output.cancel()
                # Whatever the engine left in its group goes with it.
                self._process.send_group(signal.SIGKILL)
            for line in await asyncio.to_thread(self._follower.read) + self._tail.close():
                log.debug("[%s] %s", self._spec.shard_id, line)
            self._report_end(code)
        finally:
            # Cancelled (the agent stopping hard): the engine keeps running for the
            # next agent to adopt; only the watch ends.
            self._process.close()
            self._done.set()

    def _report_end(self, code: int | None) -> None:
        if self._end is _End.STOP:
            self._set(
                ShardState.STOPPED, f"{self._end_message} ({describe_exit(code)})", exit_code=code
            )
        elif self._end is _End.FAIL:
            self._set(
                ShardState.FAILED,
                self._end_message,
                exit_code=code,
                output_tail=self._tail.lines(),
            )
        else:
            self._set(
                ShardState.FAILED,
                f"{describe_exit(code)} while {self._report.state}",
                exit_code=code,
                output_tail=self._tail.lines(),
            )

    async def _terminate(self, exited: asyncio.Task[int | None]) -> None:
        settings = self._settings
        if self._end is _End.STOP:
            main_wait, group_wait = self._timings.drain_grace, self._stop_grace
            if self._drain:
                self._set(ShardState.DRAINING, "draining: no new requests, then stopping")
        else:
            # A failing engine has no requests worth waiting for.
            main_wait = min(self._timings.drain_grace, settings.default_grace_seconds)
            group_wait = settings.default_grace_seconds
        log.info(
            "shard %s: SIGTERM to the engine's main process %d (in-flight requests get %gs)",
            self._spec.shard_id,
            self._process.pid,
            main_wait,
        )
        self._process.send(signal.SIGTERM)
        await asyncio.wait({exited}, timeout=main_wait)
        if not exited.done():
            log.warning(
                "shard %s: the engine is still running %gs after SIGTERM; SIGTERM to its "
                "process group (SIGKILL in %gs)",
                self._spec.shard_id,
                main_wait,
                group_wait,
            )
        await self._end_group(exited, group_wait)

    async def _end_group(self, exited: asyncio.Task[int | None], grace: float) -> None:
        """SIGTERM to the process group, SIGKILL once `grace` has passed with any left."""
        if not self._process.send_group(signal.SIGTERM):
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while loop.time() < deadline:
            if exited.done() and not await asyncio.to_thread(self._process.group_alive):
                return
            await asyncio.sleep(_GROUP_POLL_SECONDS)
        if not exited.done() or await asyncio.to_thread(self._process.group_alive):
            log.warning(
                "shard %s: SIGKILL to process group %d (%gs after SIGTERM)",
                self._spec.shard_id,
                self._process.pid,
                grace,
            )
            self._process.send_group(signal.SIGKILL)

    async def _follow_output(self) -> None:
        while True:
            for line in await asyncio.to_thread(self._follower.read):
                log.debug("[%s] %s", self._spec.shard_id, line)
            await self._sleep(self._settings.output_poll_seconds)

    async def _probe_loop(self) -> None:
        settings = self._settings
        timings = self._timings
        if not self._probe.path:
            # A rank > 0 of a multi-node replica serves no HTTP: it is ready while it
            # runs, and rank 0's probe says when the replica serves.
            if self._report.state is not ShardState.READY:
                self._set(ShardState.READY, "running (a follower rank; rank 0 serves)")
            return
        if self._report.state is ShardState.STARTING:
            self._set(ShardState.LOADING, f"engine running; waiting for {self._probe.path}")
        failures = 0
        failing_since: float | None = None
        while True:
            problem = await probe_once(self._probe, settings.probe_timeout_seconds)
            state = self._report.state
            now = self._wall_clock()
            if not problem:
                failures, failing_since = 0, None
                if state is ShardState.LOADING:
                    self._set(ShardState.READY, f"{self._probe.path} answered 200")
                if self._unread_lora is not None and self._report.state is ShardState.READY:
                    await self._read_adopted_adapters(self._unread_lora)
            elif not self.been_ready:
                if now - self._started >= timings.load_timeout:
                    self._fail(
                        f"did not become ready within {timings.load_timeout:g}s "
                        f"(last probe: {problem})"
                    )
                    return
            else:
                failures += 1
                failing_since = now if failing_since is None else failing_since
                if now - failing_since >= timings.unhealthy_after:
                    self._fail(f"health probe failing for {timings.unhealthy_after:g}s: {problem}")
                    return
                if state is ShardState.READY and failures >= settings.ready_failures_before_loading:
                    self._set(ShardState.LOADING, f"engine stopped answering: {problem}")
            ready = self._report.state is ShardState.READY
            await self._sleep(
                settings.probe_interval_ready_seconds
                if ready
                else settings.probe_interval_loading_seconds
            )

    async def _read_adopted_adapters(self, api: LoraApi) -> None:
        """Report the adapters an adopted engine holds; on failure, the next probe retries."""
        deadline = self._settings.probe_timeout_seconds
        try:
            async with asyncio.timeout(deadline):
                loaded = await self._lora.read_loaded(self._engine_get, api)
        except (AdapterError, TimeoutError) as exc:
            problem = str(exc) or f"no answer in {deadline:g}s"
            log.warning(
                "shard %s: cannot read the adapters of the adopted engine (retrying): %s",
                self._spec.shard_id,
                problem,
            )
            return
        self._unread_lora = None
        if loaded:
            log.info("shard %s: the adopted engine holds adapters %s", self._spec.shard_id, loaded)
        self._adapters_changed(loaded)

    async def _engine_get(self, path: str) -> tuple[int, bytes]:
        try:
            return await http_get(self._probe.host, self._probe.port, path)
        except ProbeError as exc:
            raise AdapterError(f"GET {path} failed: {exc}") from exc

    def _fail(self, reason: str) -> None:
        log.warning("shard %s (%s): %s; stopping it", self._spec.shard_id, self._spec.model, reason)
        self._request_end(_End.FAIL, reason)
