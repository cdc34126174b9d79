"""The supervisor: runs engine processes on this node on the control plane's command.

`start` turns a wire `ShardSpec` into an `EngineSpec` (port in the node's range
and free on this machine, GPUs that exist, a relative weights path resolved
against the weights directory when it exists there), asks the engine's adapter
for a `LaunchPlan` (which validates first) and spawns the process detached
from the agent: its own session and process group, stdout and stderr appended
to a log file in the state directory (`process.spawn`). `stop` and `drain` end
a shard; `remove_weights` deletes files strictly inside the weights directory.

Hub weights (`org/name@commit`) are made sure of first (`hub.Snapshots`): a
snapshot not on disk is downloaded while the shard is reported `starting` with
the download's progress as its message, and the engine then starts on the local
snapshot with `HF_HUB_OFFLINE=1`. Engines get their compile caches
(`VLLM_CACHE_ROOT`, torch inductor, Triton) in the weights directory.

Engines outlive the agent. Every change is written to the engines state file
(`state.py`); `adopt()`, run once at start before the first Register, takes
back each engine an earlier agent left that is still the same process, probes
it and reports it (`ready` at once when it answers), so a control plane adopts
it without a reload. An adopted engine that no control plane confirms within
`adopt_grace_seconds` (confirmed: a leader answered Registered to a Register
that listed it, see `confirm`, or sent StartShard with its exact spec) is
stopped, so a retired node leaves nothing running. `shutdown` either stops
every engine or leaves them running for the next agent ("leaving N engines
running; a restarted agent adopts them").

Every shard transition goes to `on_change`. Stopped and failed shards stay in
`reports()` until `forget()` is called for that report (the connection does so
once the control plane has been told), so a failure that happens while
disconnected reaches the next Register.

Not guaranteed: that a spec which is accepted also loads (that is reported as
`failed` later); exit codes of adopted engines (not this agent's children);
adoption of an engine whose record could not be written (a full disk is
logged as an error); that processes an engine spawned itself and moved out of
its process group are stopped.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path

from llmgw.agent.addresses import EngineAddresses, probe_host
from llmgw.agent.errors import (
    AdapterError,
    AgentClosingError,
    CommandError,
    LaunchError,
    ShardConflictError,
    SleepError,
    SpecError,
    WeightsPathError,
)
from llmgw.agent.flags import PortRange, WeightsLimit
from llmgw.agent.hub import Progress, Snapshots
from llmgw.agent.probe import is_sleeping
from llmgw.agent.process import EngineProcess, attach, spawn
from llmgw.agent.settings import SupervisorSettings
from llmgw.agent.shard import ProbeTarget, Shard, ShardReport, ShardState, probe_once
from llmgw.agent.spec import engine_spec
from llmgw.agent.state import (
    EMPTY_CMDLINE,
    EngineRecord,
    EngineStore,
    ProcessIdentity,
    StateDirError,
    cmdline_sha256,
    read_identity,
)
from llmgw.agent.weights import remove_path, resolve_removable
from llmgw.config.hub import HubRef, hub_ref
from llmgw.engines import (
    EngineAdapter,
    EngineError,
    EngineTimings,
    LaunchPlan,
    LoraApi,
    ProfileError,
    SleepApi,
)
from llmgw.proto import agent_pb2

log = logging.getLogger("llmgw.agent.supervisor")

# How often a download's progress is read from disk and, when it moved, reported.
_PROGRESS_SECONDS = 1.0


def endpoint_url(host: str, port: int) -> str:
    """The URL the router uses to reach an engine on this node."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


# The agent's own settings (its join token, admin key, TLS key paths, ...) are for
# the agent: an engine runs code the catalog names, and must not read them.
AGENT_ENV_PREFIX = "LLMGW_"


def launch_env(plan: LaunchPlan, base: Mapping[str, str]) -> dict[str, str]:
    """The engine's environment: the agent's, less `unset_env` and every `LLMGW_*`
    variable (the join token among them), plus the plan's."""
    env = {
        key: value
        for key, value in base.items()
        if key not in plan.unset_env and not key.startswith(AGENT_ENV_PREFIX)
    }
    env.update(plan.env)
    return env


CACHE_DIR = ".engine-cache"
"""Under the weights directory: engines' compile and graph caches, kept across starts."""


def cache_env(weights_dir: Path) -> dict[str, str]:
    """Where engines keep what they compile (vLLM's cache root, torch.compile's inductor
    and Triton kernels): in the weights directory, so the second start of an engine on
    this node skips the compile. A profile's own `env` (or the agent's) wins."""
    root = weights_dir / CACHE_DIR
    return {
        "VLLM_CACHE_ROOT": str(root / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(root / "torchinductor"),
        "TRITON_CACHE_DIR": str(root / "triton"),
    }


def _in_use(weights_dir: Path, target: Path, shards: list[tuple[str, str]]) -> str | None:
    """The first shard whose weights lie at or under `target` (blocking: realpath).

    A hub id (org/name) is also in use at its Hugging Face cache folder in the
    weights directory (`hub/models--org--name`), where vLLM and SGLang download it.
    """
    for shard_id, weights in shards:
        if not weights:
            continue
        places = [weights_dir / weights]
        ref = hub_ref(weights)
        if ref is not None:
            places.append(weights_dir / "hub" / ("models--" + ref.repo.replace("/", "--")))
        for place in places:
            used = Path(os.path.realpath(place))
            if used == target or used.is_relative_to(target):
                return shard_id
    return None


class Supervisor:
    """Owns this node's engine processes; `run()` must be running for `start()` to work."""

    def __init__(
        self,
        *,
        adapters: Callable[[str], EngineAdapter],
        port_range: PortRange,
        advertise_host: str | EngineAddresses,
        weights_dir: Path,
        gpu_count: int,
        settings: SupervisorSettings,
        on_change: Callable[[ShardReport], None],
        store: EngineStore,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        environ: Mapping[str, str] = os.environ,
        snapshots: Snapshots | None = None,
        weights_limit: WeightsLimit | None = None,
    ) -> None:
        """`store` is the engines state directory, already locked by the caller;
        `snapshots` downloads hub weights (None: from `environ`, no token file)."""
        self._adapters = adapters
        self._port_range = port_range
        # Read at each launch: the connection learns the advertised address (addresses.py).
        self._addresses = (
            advertise_host
            if isinstance(advertise_host, EngineAddresses)
            else EngineAddresses(advertise_host=advertise_host)
        )
        self._weights_dir = weights_dir
        self._gpu_count = gpu_count
        self._settings = settings
        self._on_change = on_change
        self._store = store
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._environ = environ
        self._shards: dict[str, Shard] = {}
        self._records: dict[str, EngineRecord] = {}  # live shards, as the state file has them
        self._unconfirmed: set[str] = set()  # adopted shards no control plane confirmed yet
        self._group_ready = asyncio.Event()
        self._grace_task: asyncio.Task[None] | None = None
        self._launching: dict[str, int] = {}  # shard id -> port, while being spawned
        self._launches: set[asyncio.Task[ShardReport | CommandError]] = set()
        self._group: asyncio.TaskGroup | None = None
        self._closing = False
        self._closed = asyncio.Event()
        self._snapshots = snapshots or Snapshots(weights_dir=weights_dir, environ=environ)
        self._weights_limit = weights_limit  # None: snapshots are never evicted
        # Shards waiting for their hub weights: their report (a failed one until
        # forgotten) and the task that downloads, then launches.
        self._fetching: dict[str, ShardReport] = {}
        self._fetch_tasks: dict[str, asyncio.Task[None]] = {}

    # ---- lifecycle ----

    async def run(self) -> None:
        """Watch every shard until `shutdown()` has ended every watch.

        Cancelled, it ends the watches and leaves the engines running (the state
        file still lists them, for the next agent to adopt).
        """
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                self._group_ready.set()
                refresh = group.create_task(self._refresh_identities(), name="engine identities")
                await self._closed.wait()
                refresh.cancel()
        finally:
            self._group = None

    async def shutdown(self, *, grace: float | None = None, stop_engines: bool = True) -> None:
        """Refuse new shards and end `run()`: with `stop_engines`, after stopping every
        engine (SIGTERM, SIGKILL after `grace`); without, leaving them running."""
        self._closing = True
        grace = self._settings.default_grace_seconds if grace is None else grace
        for task in list(self._fetch_tasks.values()):
            task.cancel()  # a half-done download is resumed by the next agent
        while True:
            launches = list(self._launches)
            live = [shard for shard in self._shards.values() if shard.live]
            if not launches and not live:
                break
            if launches:
                await asyncio.wait(launches)
                continue
            if stop_engines:
                await asyncio.gather(*(shard.stop(grace=grace, drain=False) for shard in live))
                continue
            await asyncio.gather(*(shard.detach() for shard in live))
            log.info(
                "leaving %d engine%s running (%s); a restarted agent adopts them",
                len(live),
                "" if len(live) == 1 else "s",
                ", ".join(f"{s.spec.shard_id} pid {s.pid}" for s in live),
            )
            break
        if self._grace_task is not None:
            self._grace_task.cancel()
        self._closed.set()

    async def adopt(self) -> list[ShardReport]:
        """Take back the engines an earlier agent left running; their reports.

        Waits for `run()` to have started. Each recorded engine that is still the
        same process is watched and probed once (so a ready one is reported ready
        at once); records of processes that are gone or are now another process
        are dropped. Those adopted are stopped unless confirmed within the grace.
        """
        await self._group_ready.wait()
        group = self._group
        if group is None:
            return []
        records = await asyncio.to_thread(self._store.load)
        found = [
            (record, process) for record in records if (process := self._attach(record)) is not None
        ]
        probes = await asyncio.gather(
            *(
                probe_once(
                    ProbeTarget(record.probe_host, record.port, record.ready_path),
                    self._settings.probe_timeout_seconds,
                )
                for record, _ in found
            )
        )
        asleep = await asyncio.gather(
            *(
                self._adopted_asleep(record) if not problem else _false()
                for (record, _), problem in zip(found, probes, strict=True)
            )
        )
        adopted: list[ShardReport] = []
        for (record, process), problem, sleeping in zip(found, probes, asleep, strict=True):
            shard = Shard(
                spec=record.spec,
                process=process,
                endpoint_url=record.endpoint_url,
                probe=ProbeTarget(record.probe_host, record.port, record.ready_path),
                timings=EngineTimings(
                    load_timeout=record.load_timeout,
                    unhealthy_after=record.unhealthy_after,
                    drain_grace=record.drain_grace,
                ),
                log_path=Path(record.log_path),
                started=record.started_unix,
                settings=self._settings,
                on_change=self._changed,
                wall_clock=self._wall_clock,
                sleep=self._sleep,
                adopted=(
                    ShardState.LOADING
                    if problem
                    else ShardState.SLEEPING
                    if sleeping
                    else ShardState.READY
                ),
                been_ready=record.been_ready,
                sleep_api=self._adopted_sleep_api(record.spec),
                lora_api=self._lora_api(record.spec),
            )
            await asyncio.to_thread(shard.follower.start_at_end)
            self._shards[record.shard_id] = shard
            self._records[record.shard_id] = record
            self._unconfirmed.add(record.shard_id)
            group.create_task(shard.run(), name=f"shard {record.shard_id}")
            adopted.append(shard.report)
        self._save()
        if adopted:
            grace = self._settings.adopt_grace_seconds
            log.info(
                "adopted %d engine%s an earlier agent left running (%s); those no control "
                "plane confirms within %gs are stopped",
                len(adopted),
                "" if len(adopted) == 1 else "s",
                ", ".join(f"{r.shard_id} pid {r.pid} {r.state}" for r in adopted),
                grace,
            )
            self._grace_task = group.create_task(
                self._stop_unconfirmed(grace), name="adoption grace"
            )
        return adopted

    def confirm(self, reports: list[ShardReport]) -> None:
        """A control plane's leader answered Registered to a Register listing `reports`:
        from now on, keeping or stopping those engines is its call."""
        confirmed = [r.shard_id for r in reports if r.shard_id in self._unconfirmed]
        if confirmed:
            self._unconfirmed.difference_update(confirmed)
            log.info("the control plane confirmed adopted engines: %s", ", ".join(confirmed))

    # ---- commands ----

    async def start(self, spec: agent_pb2.ShardSpec) -> ShardReport:
        """Validate and spawn a shard; returns its `starting` report.

        A repeated StartShard for a shard that is running with the same spec returns
        its current report (commands may be resent after a reconnect).
        """
        group = self._group
        if group is None or self._closing:
            raise AgentClosingError(
                f"cannot start shard {spec.shard_id!r}: the agent is shutting down"
            )
        current = self._shards.get(spec.shard_id)
        if current is not None and current.live:
            if current.spec == spec:
                self._unconfirmed.discard(spec.shard_id)
                return current.report
            raise ShardConflictError(
                f"shard {spec.shard_id!r} is already running here with another spec "
                f"(model {current.spec.model!r}, port {current.spec.port}); stop it first"
            )
        fetching = self._fetching.get(spec.shard_id)
        if fetching is not None and not fetching.state.terminal:
            if fetching.spec == spec:
                return fetching
            raise ShardConflictError(
                f"shard {spec.shard_id!r} is already waiting for its weights here with "
                "another spec; stop it first"
            )
        if spec.shard_id in self._launching:
            raise ShardConflictError(f"shard {spec.shard_id!r} is already being started")
        for other_id, port in self._ports_in_use():
            if port == spec.port:
                raise SpecError("port", f"{spec.port} is in use by shard {other_id!r} on this node")
        ref = hub_ref(spec.weights)
        if ref is not None and not (self._weights_dir / spec.weights).exists():
            snapshot = await asyncio.to_thread(self._snapshots.local, ref)
            if snapshot is None:
                return self._fetch_then_launch(spec, group)
        self._launching[spec.shard_id] = spec.port
        # Spawned in the supervisor's group so that a dropped stream (which cancels the
        # command) cannot leave a process running that no shard watches.
        task = group.create_task(self._launch(spec, group), name=f"launch {spec.shard_id}")
        self._launches.add(task)
        task.add_done_callback(self._launches.discard)
        outcome = await asyncio.shield(task)
        if isinstance(outcome, CommandError):
            raise outcome
        return outcome

    async def stop(self, shard_id: str, *, grace: float, drain: bool = False) -> ShardReport | None:
        """Stop a shard and wait for it; None when there is no such shard (already gone).

        `grace` <= 0 means the default (proto3 cannot send "unset"). A stop for a
        shard that already stopped or failed returns that report and forgets it.
        """
        fetch = self._fetch_tasks.get(shard_id)
        if fetch is not None:
            fetch.cancel()
            await asyncio.wait({fetch})
        shard = self._shards.get(shard_id)
        if shard is None:
            waiting = self._fetching.get(shard_id)
            if waiting is not None:
                self.forget(waiting)
            return waiting
        if not shard.live:
            self.forget(shard.report)
            return shard.report
        if grace <= 0:
            grace = self._settings.default_grace_seconds
        return await shard.stop(grace=grace, drain=drain)

    async def sleep(self, shard_id: str, level: int) -> ShardReport:
        """Put a ready shard's engine to sleep (level 0 means 1, proto3's unset)."""
        if level not in (0, 1, 2):
            raise SpecError("level", f"must be 1 or 2, got {level}")
        return await self._live(shard_id, "sleep").sleep_engine(level or 1)

    async def wake(self, shard_id: str) -> ShardReport:
        """Wake a sleeping shard's engine; returns once it serves again."""
        return await self._live(shard_id, "wake").wake()

    async def load_adapter(self, shard_id: str, name: str, path: str) -> ShardReport:
        """Load a LoRA adapter into a ready shard's engine; the engine's words if it refuses."""
        shard = self._shards.get(shard_id)
        if shard is None or not shard.live:
            raise AdapterError(
                f"cannot load adapter {name!r} into shard {shard_id!r}: it is not running on "
                "this node"
            )
        files = await self._adapter_files(path)
        return await shard.load_adapter(name, files, self._lora_api(shard.spec))

    async def _adapter_files(self, path: str) -> str:
        """Where the engine reads an adapter: a path in the weights directory made
        absolute, a hub repo downloaded first (like a model's weights: the snapshot's
        directory; `DownloadError` with the hub's reason), anything else as given."""
        local = await asyncio.to_thread(local_weights, self._weights_dir, path)
        ref = hub_ref(path)
        if ref is None or local != path:
            return local
        return str(await self._snapshots.ensure(ref))

    async def unload_adapter(self, shard_id: str, name: str) -> ShardReport | None:
        """Unload a LoRA adapter from a shard's engine; None when the shard is gone (and its
        adapters with it)."""
        shard = self._shards.get(shard_id)
        if shard is None or not shard.live:
            return None
        return await shard.unload_adapter(name, self._lora_api(shard.spec))

    def _lora_api(self, spec: agent_pb2.ShardSpec) -> LoraApi | None:
        try:
            return self._adapters(spec.engine).lora
        except EngineError:
            return None

    def _live(self, shard_id: str, what: str) -> Shard:
        shard = self._shards.get(shard_id)
        if shard is None or not shard.live:
            raise SleepError(f"cannot {what} shard {shard_id!r}: it is not running on this node")
        return shard

    async def pull_weights(self, ref: HubRef) -> None:
        """Download `ref` ahead of demand (PullWeights); returns once it is under way.
        Once it is complete, the weights limit is kept as after a start's download:
        other snapshots no shard runs on may go, never this one."""
        await self._snapshots.pull(ref)
        group = self._group
        if self._weights_limit is not None and group is not None:
            group.create_task(self._room_after_pull(ref, self._weights_limit), name=f"pull {ref}")

    async def _room_after_pull(self, ref: HubRef, limit: WeightsLimit) -> None:
        running = self._snapshots.running(ref)
        if running is not None:
            try:
                await asyncio.shield(running)
            except CommandError:
                return  # the heartbeat reports the failure; nothing came in
        users = (hub_ref(s.spec.weights) for s in self._shards.values() if s.live)
        keep = frozenset({ref.repo, *(u.repo for u in users if u is not None)})
        await self._snapshots.make_room(limit, keep)

    async def remove_weights(self, path: str) -> Path | None:
        """Remove a file or tree inside the weights dir; None when it was already absent."""
        users = [(s.spec.shard_id, s.spec.weights) for s in self._shards.values() if s.live]
        return await asyncio.to_thread(self._remove_weights, path, users)

    def _remove_weights(self, path: str, users: list[tuple[str, str]]) -> Path | None:
        target = resolve_removable(self._weights_dir, path)
        user = _in_use(self._weights_dir, target, users)
        if user is not None:
            raise WeightsPathError(
                f"refusing to remove {path!r}: shard {user!r} is running from it; stop it first"
            )
        return target if remove_path(target) else None

    # ---- state ----

    def reports(self) -> list[ShardReport]:
        """Every shard's current report: running ones, and stopped/failed ones not forgotten."""
        reports = [shard.report for shard in self._shards.values()]
        return reports + [r for r in self._fetching.values() if r.shard_id not in self._shards]

    def forget(self, report: ShardReport) -> None:
        """The control plane was told this terminal report; drop the shard if still at it."""
        if self._fetching.get(report.shard_id) is report and report.state.terminal:
            del self._fetching[report.shard_id]
        shard = self._shards.get(report.shard_id)
        if shard is not None and shard.report is report and report.state.terminal:
            del self._shards[report.shard_id]

    # ---- internals ----

    def _ports_in_use(self) -> list[tuple[str, int]]:
        ports = [(s.spec.shard_id, s.spec.port) for s in self._shards.values() if s.live]
        ports.extend(self._launching.items())
        return ports

    async def _launch(
        self, spec: agent_pb2.ShardSpec, group: asyncio.TaskGroup
    ) -> ShardReport | CommandError:
        # A refusal is returned, not raised: a failed task would end the whole group.
        try:
            weights, offline = await self._local_weights(spec)
            plan = self._plan(spec, weights)
            if offline:
                # The snapshot is on disk: the engine must read it, never the network.
                plan = replace(plan, env={**plan.env, "HF_HUB_OFFLINE": "1"})
            if not await asyncio.to_thread(port_is_free, self._addresses.bind, spec.port):
                raise SpecError(
                    "port",
                    f"{spec.port} is in use by another process on this node (not one of "
                    "this agent's engines); stop it or move --port-range off it",
                )
            env = launch_env(plan, self._environ)
            for key, value in cache_env(self._weights_dir).items():
                env.setdefault(key, value)
            program = await asyncio.to_thread(shutil.which, plan.argv[0], path=env.get("PATH"))
            if program is None:
                raise LaunchError(
                    f"cannot start shard {spec.shard_id!r}: {plan.argv[0]!r} is not installed "
                    f"on this node (not found on PATH); install the {spec.engine} engine or "
                    f"point --engine {spec.engine}=PATH at it"
                )
            log_path = self._store.log_path(spec.shard_id)
            await asyncio.to_thread(_fresh_log, log_path)
            process = self._spawn(spec, (program, *plan.argv[1:]), env, log_path)
            probe = ProbeTarget(
                host=probe_host(self._addresses.bind), port=spec.port, path=plan.ready_path
            )
            url = endpoint_url(self._addresses.advertise, spec.port)
            started = self._wall_clock()
            identity = read_identity(process.pid)
            argv = (program, *plan.argv[1:])
            shard = Shard(
                spec=spec,
                process=process,
                endpoint_url=url,
                probe=probe,
                timings=plan.timings,
                log_path=log_path,
                started=started,
                settings=self._settings,
                on_change=self._changed,
                wall_clock=self._wall_clock,
                sleep=self._sleep,
                sleep_api=plan.sleep,
            )
            self._shards[spec.shard_id] = shard
            self._records[spec.shard_id] = EngineRecord(
                shard_id=spec.shard_id,
                pid=process.pid,
                start_ticks=identity.start_ticks if identity is not None else 0,
                cmdline_sha256=cmdline_sha256(argv),
                port=spec.port,
                spec=spec,
                log_path=str(log_path),
                endpoint_url=url,
                probe_host=probe.host,
                ready_path=probe.path,
                load_timeout=plan.timings.load_timeout,
                unhealthy_after=plan.timings.unhealthy_after,
                drain_grace=plan.timings.drain_grace,
                started_unix=started,
                been_ready=False,
            )
            self._save()
            group.create_task(shard.run(), name=f"shard {spec.shard_id}")
            return shard.report
        except CommandError as exc:
            return exc
        finally:
            self._launching.pop(spec.shard_id, None)

    async def _local_weights(self, spec: agent_pb2.ShardSpec) -> tuple[str, bool]:
        """The weights the engine is started on, and whether they are a hub snapshot."""
        local = await asyncio.to_thread(local_weights, self._weights_dir, spec.weights)
        ref = hub_ref(spec.weights)
        if ref is None or local != spec.weights:
            return local, False
        snapshot = await self._snapshots.ensure(ref)
        if self._weights_limit is not None:
            # Room for what came in, from what no shard here runs on (nor this one).
            users = (hub_ref(s.spec.weights) for s in self._shards.values() if s.live)
            keep = frozenset({ref.repo, *(u.repo for u in users if u is not None)})
            await self._snapshots.make_room(self._weights_limit, keep)
        return str(snapshot), True

    def _fetch_then_launch(
        self, spec: agent_pb2.ShardSpec, group: asyncio.TaskGroup
    ) -> ShardReport:
        """Report the shard `starting` (downloading) now; launch it once its weights are here."""
        ref = hub_ref(spec.weights)
        note = f"downloading {ref.short()}" if ref is not None else "downloading weights"
        report = self._fetch_report(spec, ShardState.STARTING, note)
        # Told before the command's answer, as a spawned shard is: a control plane that
        # saw the answer first would think nothing runs and place the replica again.
        self._fetch_changed(report)
        self._launching[spec.shard_id] = spec.port  # the port stays reserved meanwhile
        task = group.create_task(self._fetch(spec, group), name=f"fetch {spec.shard_id}")
        self._fetch_tasks[spec.shard_id] = task
        task.add_done_callback(lambda _: self._fetch_tasks.pop(spec.shard_id, None))
        return report

    def _fetch_report(
        self,
        spec: agent_pb2.ShardSpec,
        state: ShardState,
        message: str,
        download: Progress | None = None,
    ) -> ShardReport:
        return ShardReport(
            shard_id=spec.shard_id,
            model=spec.model,
            state=state,
            since=self._wall_clock(),
            spec=spec,
            message=message,
            download=download,
        )

    def _fetch_changed(self, report: ShardReport) -> None:
        self._fetching[report.shard_id] = report
        self._on_change(report)

    async def _fetch(self, spec: agent_pb2.ShardSpec, group: asyncio.TaskGroup) -> None:
        ref = hub_ref(spec.weights)
        assert ref is not None  # only hub weights are fetched
        download = asyncio.ensure_future(self._snapshots.ensure(ref))
        try:
            while not download.done():
                progress = await asyncio.to_thread(self._snapshots.progress, ref)
                message = progress.describe(ref) if progress is not None else "downloading"
                if message != self._fetching[spec.shard_id].message:
                    self._fetch_changed(
                        self._fetch_report(spec, ShardState.STARTING, message, progress)
                    )
                await asyncio.wait({download}, timeout=_PROGRESS_SECONDS)
            download.result()
        except asyncio.CancelledError:
            download.cancel()
            self._launching.pop(spec.shard_id, None)
            self._fetch_changed(
                self._fetch_report(spec, ShardState.STOPPED, "stopped while downloading weights")
            )
            raise
        except CommandError as exc:
            self._launching.pop(spec.shard_id, None)
            self._fetch_changed(self._fetch_report(spec, ShardState.FAILED, str(exc)))
            return
        outcome = await self._launch(spec, group)
        if isinstance(outcome, CommandError):
            self._fetch_changed(self._fetch_report(spec, ShardState.FAILED, str(outcome)))
            return
        del self._fetching[spec.shard_id]
        self._on_change(outcome)

    def _plan(self, spec: agent_pb2.ShardSpec, weights: str) -> LaunchPlan:
        converted = engine_spec(
            spec,
            port_range=self._port_range,
            bind_host=self._addresses.bind,
            gpu_count=self._gpu_count,
        )
        if weights != converted.weights:
            converted = replace(converted, weights=weights)
        try:
            return self._adapters(spec.engine).plan(converted)
        except ProfileError as exc:
            raise SpecError(exc.field, exc.message) from exc
        except EngineError as exc:
            raise SpecError("engine", str(exc)) from exc

    async def _adopted_asleep(self, record: EngineRecord) -> bool:
        """Whether an adopted engine is asleep (its /health answers either way)."""
        api = self._adopted_sleep_api(record.spec)
        if api is None or not api.state_path:
            return False
        try:
            async with asyncio.timeout(self._settings.probe_timeout_seconds):
                return await is_sleeping(record.probe_host, record.port, api.state_path)
        except (OSError, TimeoutError):
            return False

    def _adopted_sleep_api(self, spec: agent_pb2.ShardSpec) -> SleepApi | None:
        """How an adopted engine sleeps, planned again from its recorded spec."""
        if not spec.sleep_mode:
            return None
        try:
            return self._plan(spec, local_weights(self._weights_dir, spec.weights)).sleep
        except CommandError:
            return None

    def _spawn(
        self, spec: agent_pb2.ShardSpec, argv: tuple[str, ...], env: dict[str, str], log: Path
    ) -> EngineProcess:
        try:
            return spawn(argv[0], argv, env, log_path=log)
        except OSError as exc:
            raise LaunchError(
                f"cannot start shard {spec.shard_id!r}: spawning {argv[0]!r} failed: "
                f"{exc.strerror or exc}"
            ) from exc

    def _attach(self, record: EngineRecord) -> EngineProcess | None:
        process = attach(
            record.pid,
            expected=ProcessIdentity(record.start_ticks, record.cmdline_sha256),
        )
        if process is None:
            log.info(
                "not adopting shard %s (model %s): pid %d is gone or is another process now",
                record.shard_id,
                record.spec.model,
                record.pid,
            )
        return process

    async def _stop_unconfirmed(self, grace: float) -> None:
        await self._sleep(grace)
        stale = [self._shards[i] for i in sorted(self._unconfirmed) if i in self._shards]
        self._unconfirmed.clear()
        reason = (
            f"stopped: no control plane confirmed this adopted engine within {grace:g}s "
            "of the agent's start"
        )
        for shard in stale:
            if shard.live:
                log.warning("shard %s (pid %d): %s", shard.spec.shard_id, shard.pid, reason)
        await asyncio.gather(
            *(
                shard.stop(grace=self._settings.default_grace_seconds, drain=False, reason=reason)
                for shard in stale
                if shard.live
            )
        )

    async def _refresh_identities(self) -> None:
        """Keep each engine's command-line hash current: engines may rename their
        process while loading (vLLM sets a process title), and the next agent must
        still recognise them. The start time, which no process can change, stays."""
        while True:
            await self._sleep(self._settings.identity_refresh_seconds)
            changed = False
            for shard_id, record in list(self._records.items()):
                identity = read_identity(record.pid)
                if (
                    identity is not None
                    and identity.start_ticks == record.start_ticks
                    and identity.cmdline_sha256 not in (record.cmdline_sha256, EMPTY_CMDLINE)
                ):
                    self._records[shard_id] = replace(
                        record, cmdline_sha256=identity.cmdline_sha256
                    )
                    changed = True
            if changed:
                self._save()

    def _changed(self, report: ShardReport) -> None:
        """Every shard transition: keep the state file current, then tell the connection."""
        record = self._records.get(report.shard_id)
        if record is not None:
            if report.state.terminal:
                del self._records[report.shard_id]
                self._unconfirmed.discard(report.shard_id)
                self._save()
            elif report.state is ShardState.READY and not record.been_ready:
                # Engines may rename their process once loaded (vLLM does): the
                # command line is read again, so the next agent recognises it.
                identity = read_identity(record.pid)
                renamed = (
                    identity is not None
                    and identity.start_ticks == record.start_ticks
                    and identity.cmdline_sha256 != EMPTY_CMDLINE
                )
                self._records[report.shard_id] = replace(
                    record,
                    been_ready=True,
                    cmdline_sha256=(
                        identity.cmdline_sha256
                        if renamed and identity is not None
                        else record.cmdline_sha256
                    ),
                )
                self._save()
        self._on_change(report)

    def _save(self) -> None:
        try:
            self._store.save(list(self._records.values()))
        except StateDirError as exc:
            log.error(
                "%s; engines started since keep running but a restarted agent will not adopt them",
                exc,
            )


async def _false() -> bool:
    return False


def local_weights(weights_dir: Path, weights: str) -> str:
    """A relative weights path that exists in the weights directory, made absolute there;
    anything else as given (an absolute path, a hub id such as org/model). Blocking: stat."""
    if not weights or os.path.isabs(weights):
        return weights
    candidate = weights_dir / weights
    return str(candidate) if candidate.exists() else weights


def _fresh_log(path: Path) -> None:
    """Keep the previous run's log as PATH.1 and start an empty one."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.exists():
        path.replace(path.with_name(path.name + ".1"))


def port_is_free(host: str, port: int) -> bool:
    """Whether an engine could listen on host:port now (SO_REUSEADDR, as engines bind).

    Checked before spawning so that a port held by some other program is a clear
    refusal, not an engine that dies at bind while the readiness probe talks to
    whatever holds the port.
    """
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError:
            return False
    return True
