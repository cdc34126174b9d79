"""The supervisor: runs engine processes on this node on the control plane's command.

`start` turns a wire `ShardSpec` into an `EngineSpec` (port in the node's range
and free on this machine, GPUs that exist), asks the engine's adapter for a
`LaunchPlan` (which validates first) and spawns the process: its own session and
process group, stdout and stderr merged into the shard's output ring, and the
kernel told to SIGKILL it if the agent dies (see `_deathsig_exec.py`). `stop`
and `drain` end a shard; `remove_weights` deletes files strictly inside the
weights directory; `shutdown` stops every engine and refuses new ones.

Every shard transition goes to `on_change`. Stopped and failed shards stay in
`reports()` until `forget()` is called for that report (the connection does so
once the control plane has been told), so a failure that happens while
disconnected reaches the next Register.

Not guaranteed: that a spec which is accepted also loads (that is reported as
`failed` later); engines surviving an agent restart (they die with the agent);
that processes an engine spawned itself die when the agent is SIGKILLed (only
the engine's leader gets the kernel's signal; a normal stop kills the group).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from llmgw.agent.addresses import EngineAddresses, probe_host
from llmgw.agent.errors import (
    AgentClosingError,
    CommandError,
    LaunchError,
    ShardConflictError,
    SpecError,
    WeightsPathError,
)
from llmgw.agent.flags import PortRange
from llmgw.agent.settings import SupervisorSettings
from llmgw.agent.shard import ProbeTarget, Shard, ShardReport
from llmgw.agent.spec import engine_spec
from llmgw.agent.weights import remove_path, resolve_removable
from llmgw.engines import EngineAdapter, EngineError, LaunchPlan, ProfileError
from llmgw.proto import agent_pb2

DEATHSIG_EXEC = str(Path(__file__).with_name("_deathsig_exec.py"))


def endpoint_url(host: str, port: int) -> str:
    """The URL the router uses to reach an engine on this node."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def launch_env(plan: LaunchPlan, base: Mapping[str, str]) -> dict[str, str]:
    """The engine's environment: the agent's, less `unset_env`, plus the plan's."""
    env = {key: value for key, value in base.items() if key not in plan.unset_env}
    env.update(plan.env)
    return env


def _in_use(weights_dir: Path, target: Path, shards: list[tuple[str, str]]) -> str | None:
    """The first shard whose weights lie at or under `target` (blocking: realpath)."""
    for shard_id, weights in shards:
        if not weights:
            continue
        used = Path(os.path.realpath(weights_dir / weights))
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
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        helper_python: str = sys.executable,
        environ: Mapping[str, str] = os.environ,
    ) -> None:
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
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._helper_python = helper_python
        self._environ = environ
        self._shards: dict[str, Shard] = {}
        self._launching: dict[str, int] = {}  # shard id -> port, while being spawned
        self._launches: set[asyncio.Task[ShardReport | CommandError]] = set()
        self._group: asyncio.TaskGroup | None = None
        self._closing = False
        self._closed = asyncio.Event()

    # ---- lifecycle ----

    async def run(self) -> None:
        """Watch every shard until `shutdown()` has stopped them all.

        Cancelled, it SIGKILLs every engine (each shard's watcher does on its way out).
        """
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                await self._closed.wait()
        finally:
            self._group = None

    async def shutdown(self, *, grace: float | None = None) -> None:
        """Refuse new shards, stop every engine (SIGTERM, SIGKILL after `grace`), end `run()`."""
        self._closing = True
        grace = self._settings.default_grace_seconds if grace is None else grace
        while True:
            launches = list(self._launches)
            live = [shard for shard in self._shards.values() if shard.live]
            if not launches and not live:
                break
            if launches:
                await asyncio.wait(launches)
            await asyncio.gather(*(shard.stop(grace=grace, drain=False) for shard in live))
        self._closed.set()

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
                return current.report
            raise ShardConflictError(
                f"shard {spec.shard_id!r} is already running here with another spec "
                f"(model {current.spec.model!r}, port {current.spec.port}); stop it first"
            )
        if spec.shard_id in self._launching:
            raise ShardConflictError(f"shard {spec.shard_id!r} is already being started")
        for other_id, port in self._ports_in_use():
            if port == spec.port:
                raise SpecError("port", f"{spec.port} is in use by shard {other_id!r} on this node")
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
        shard = self._shards.get(shard_id)
        if shard is None:
            return None
        if not shard.live:
            self.forget(shard.report)
            return shard.report
        if grace <= 0:
            grace = self._settings.default_grace_seconds
        return await shard.stop(grace=grace, drain=drain)

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
        return [shard.report for shard in self._shards.values()]

    def forget(self, report: ShardReport) -> None:
        """The control plane was told this terminal report; drop the shard if still at it."""
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
            plan = self._plan(spec)
            if not await asyncio.to_thread(port_is_free, self._addresses.bind, spec.port):
                raise SpecError(
                    "port",
                    f"{spec.port} is in use by another process on this node (not one of "
                    "this agent's engines); stop it or move --port-range off it",
                )
            env = launch_env(plan, self._environ)
            program = await asyncio.to_thread(shutil.which, plan.argv[0], path=env.get("PATH"))
            if program is None:
                raise LaunchError(
                    f"cannot start shard {spec.shard_id!r}: {plan.argv[0]!r} is not installed "
                    f"on this node (not found on PATH); install the {spec.engine} engine or "
                    "point --engine-python at an environment that has it"
                )
            process = await self._spawn(spec, (program, *plan.argv[1:]), env)
            shard = Shard(
                spec=spec,
                process=process,
                endpoint_url=endpoint_url(self._addresses.advertise, spec.port),
                probe=ProbeTarget(
                    host=probe_host(self._addresses.bind), port=spec.port, path=plan.ready_path
                ),
                settings=self._settings,
                on_change=self._on_change,
                wall_clock=self._wall_clock,
                sleep=self._sleep,
            )
            self._shards[spec.shard_id] = shard
            group.create_task(shard.run(), name=f"shard {spec.shard_id}")
            return shard.report
        except CommandError as exc:
            return exc
        finally:
            self._launching.pop(spec.shard_id, None)

    def _plan(self, spec: agent_pb2.ShardSpec) -> LaunchPlan:
        converted = engine_spec(
            spec,
            port_range=self._port_range,
            bind_host=self._addresses.bind,
            gpu_count=self._gpu_count,
        )
        try:
            return self._adapters(spec.engine).plan(converted)
        except ProfileError as exc:
            raise SpecError(exc.field, exc.message) from exc
        except EngineError as exc:
            raise SpecError("engine", str(exc)) from exc

    async def _spawn(
        self, spec: agent_pb2.ShardSpec, argv: tuple[str, ...], env: dict[str, str]
    ) -> asyncio.subprocess.Process:
        try:
            # Spawned from the event loop's thread (the main thread): PR_SET_PDEATHSIG
            # fires when the *thread* that forked the engine ends.
            process = await asyncio.create_subprocess_exec(
                self._helper_python,
                "-I",
                "-S",
                DEATHSIG_EXEC,
                str(os.getpid()),
                "--",
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            raise LaunchError(
                f"cannot start shard {spec.shard_id!r}: spawning {argv[0]!r} failed: "
                f"{exc.strerror or exc}"
            ) from exc
        return process


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
