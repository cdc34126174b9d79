"""The supervisor with small real engine processes (stdlib HTTP servers and scripts).

A test adapter plans `python -c SCRIPT PORT` processes, so state transitions,
readiness probes, SIGTERM → SIGKILL escalation, output tails and refusals are
exercised on real processes in shortened time (probe intervals of 20 ms, grace
periods under a second).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path

import pytest
from hub_standin import make_repo, serve_hub
from procs import free_port_block

from llmgw.agent.errors import (
    AgentClosingError,
    LaunchError,
    ShardConflictError,
    SpecError,
    WeightsPathError,
)
from llmgw.agent.flags import PortRange
from llmgw.agent.settings import SupervisorSettings
from llmgw.agent.shard import ShardReport, ShardState
from llmgw.agent.state import EngineStore
from llmgw.agent.supervisor import Supervisor
from llmgw.engines import (
    EngineAdapter,
    EngineLoad,
    EngineSettings,
    EngineSpec,
    EngineTimings,
    LaunchPlan,
    LoraApi,
)
from llmgw.engines import adapter_for as real_adapter_for
from llmgw.proto import agent_pb2

SERVE = """
import http.server, signal, sys
port = int(sys.argv[1])
if "--ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/ready" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
print("engine listening on", port, flush=True)
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""
SLOW = """
import sys, time
print("still loading", flush=True)
time.sleep(120)
"""
CHILD = (
    "import signal, sys, time\n"
    "def term(*_):\n"
    "    print('child: SIGTERM', flush=True)\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "print('child started', flush=True)\n"
    "while True:\n"
    "    time.sleep(1)\n"
)
FAMILY = (
    "import http.server, signal, subprocess, sys, threading, time\n"
    "port = int(sys.argv[1])\n"
    f"child = subprocess.Popen([sys.executable, '-c', {CHILD!r}])\n"
    "def term(*_):\n"
    "    print('main: SIGTERM, finishing in-flight requests', flush=True)\n"
    "    time.sleep(0.3)\n"
    "    print('main: done', flush=True)\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "class Handler(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200 if self.path == '/ready' else 404)\n"
    "        self.end_headers()\n"
    "    def log_message(self, *args):\n"
    "        pass\n"
    "server = http.server.HTTPServer(('127.0.0.1', port), Handler)\n"
    "threading.Thread(target=server.serve_forever, daemon=True).start()\n"
    "while True:\n"
    "    time.sleep(0.05)\n"
)
RENAMES = """
import http.server, os, sys, threading, time
port = int(sys.argv[1])
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/ready" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", port), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
# Like an engine setting its process title once running: the same process (pid and
# start time) with a new command line.
time.sleep(1.0)
server.server_close()
os.execv(sys.executable, [sys.executable, "-c", os.environ["SERVE_SCRIPT"], str(port), "renamed"])
"""
CRASH = """
import sys
print("loading weights", flush=True)
print("error: weights not found: /nope", file=sys.stderr, flush=True)
sys.exit(3)
"""
FAST = SupervisorSettings(
    probe_interval_loading_seconds=0.02,
    probe_interval_ready_seconds=0.05,
    probe_timeout_seconds=1.0,
    default_grace_seconds=2.0,
    output_poll_seconds=0.02,
)
TIMINGS = EngineTimings(load_timeout=60.0, unhealthy_after=30.0, drain_grace=2.0)


@dataclass
class ScriptAdapter:
    """Plans `python -c SCRIPT PORT ARGS...`; records the specs it was given."""

    script: str
    name: str = "script"
    needs_gpus: bool = False
    specs: list[EngineSpec] = field(default_factory=list)
    program: str = sys.executable
    # A script engine loads no LoRA adapters at run time.
    lora: LoraApi | None = None

    def validate(self, spec: EngineSpec) -> None:
        pass

    def plan(self, spec: EngineSpec) -> LaunchPlan:
        self.specs.append(spec)
        return LaunchPlan(
            argv=(self.program, "-c", self.script, str(spec.port), *spec.engine_args),
            env={"CUDA_VISIBLE_DEVICES": ",".join(map(str, spec.gpu_indices)), **spec.env},
            unset_env=("LLMGW_UNSET_ME",),
            ready_path="/ready",
            metrics_path=None,
            timings=TIMINGS.resolve(spec),
        )

    def parse_metrics(self, text: str) -> EngineLoad:
        return EngineLoad(running=None, waiting=None, kv_cache_usage=None)


@dataclass
class Harness:
    supervisor: Supervisor
    reports: list[ShardReport]
    adapters: dict[str, ScriptAdapter]
    ports: PortRange
    weights: Path

    def states(self, shard_id: str) -> list[ShardState]:
        return [r.state for r in self.reports if r.shard_id == shard_id]

    async def wait_for(self, shard_id: str, state: ShardState, within: float = 10.0) -> ShardReport:
        async with asyncio.timeout(within):
            while True:
                for report in self.reports:
                    if report.shard_id == shard_id and report.state is state:
                        return report
                await asyncio.sleep(0.01)

    def spec(
        self, shard_id: str, *args: str, engine: str = "serve", port: int = 0
    ) -> agent_pb2.ShardSpec:
        return agent_pb2.ShardSpec(
            shard_id=shard_id,
            model=f"m-{shard_id}",
            engine=engine,
            weights=f"w-{shard_id}",
            port=port or self.ports.start,
            engine_args=list(args),
        )


def make_supervisor(
    tmp_path: Path,
    reports: list[ShardReport],
    adapters: dict[str, ScriptAdapter],
    *,
    advertise: str = "127.0.0.1",
    ports: PortRange | None = None,
    settings: SupervisorSettings = FAST,
    hub_url: str = "http://127.0.0.1:9",  # no hub: nothing in these tests downloads by accident
) -> tuple[Supervisor, PortRange]:
    if ports is None:
        low = free_port_block(6)
        ports = PortRange(low, low + 5)

    def adapter_for(engine: str) -> EngineAdapter:
        if engine in adapters:
            return adapters[engine]
        return real_adapter_for(engine, settings=EngineSettings(python=sys.executable))

    supervisor = Supervisor(
        adapters=adapter_for,
        port_range=ports,
        advertise_host=advertise,
        weights_dir=tmp_path,
        gpu_count=2,
        settings=settings,
        on_change=reports.append,
        store=EngineStore(tmp_path / "state", node_id="n1"),
        environ={**os.environ, "LLMGW_UNSET_ME": "x", "HF_ENDPOINT": hub_url},
    )
    return supervisor, ports


@pytest.fixture(autouse=True)
def _no_engine_left(tmp_path: Path) -> Iterator[None]:
    """Engines outlive their supervisor: kill any a failed test left behind."""
    yield
    for state in tmp_path.glob("state/engines/*/state.json"):
        for engine in json.loads(state.read_text())["engines"]:
            if alive(engine["pid"]):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(engine["pid"], signal.SIGKILL)


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    reports: list[ShardReport] = []
    adapters = {
        "serve": ScriptAdapter(SERVE),
        "crash": ScriptAdapter(CRASH),
        "missing": ScriptAdapter("", program="no-such-engine-binary-xyz"),
    }
    with serve_hub() as hub:
        hub.add(make_repo("org/model", {"config.json": b"{}", "model.safetensors": b"w" * 1000}))
        supervisor, ports = make_supervisor(tmp_path, reports, adapters, hub_url=hub.url)
        running = asyncio.create_task(supervisor.run())
        await asyncio.sleep(0)
        try:
            yield Harness(supervisor, reports, adapters, ports, tmp_path)
        finally:
            await supervisor.shutdown(grace=1.0)
            await running


def cmdline_of(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def environ_of(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone, or going
        return False


async def test_start_probe_ready_then_stop(harness: Harness) -> None:
    spec = harness.spec("a")
    spec.gpu_indices.append(1)
    spec.env["ENGINE_FLAG"] = "on"
    started = await harness.supervisor.start(spec)
    assert started.state is ShardState.STARTING and started.pid > 0
    assert started.endpoint_url == f"http://127.0.0.1:{harness.ports.start}"
    ready = await harness.wait_for("a", ShardState.READY)
    assert harness.states("a") == [ShardState.STARTING, ShardState.LOADING, ShardState.READY]
    assert ready.spec == spec and ready.message == "/ready answered 200"
    environ = environ_of(ready.pid)
    assert b"ENGINE_FLAG=on" in environ and b"CUDA_VISIBLE_DEVICES=1" in environ
    assert not any(v.startswith(b"LLMGW_UNSET_ME=") for v in environ)
    # Its own session and process group, so a stop reaches everything it spawned.
    assert os.getsid(ready.pid) == ready.pid and os.getpgid(ready.pid) == ready.pid
    # The engine binds loopback when the advertised host is loopback.
    assert harness.adapters["serve"].specs[-1].host == "127.0.0.1"

    stopped = await harness.supervisor.stop("a", grace=2.0)
    assert stopped is not None and stopped.state is ShardState.STOPPED
    assert stopped.exit_code == -15 and "SIGTERM" in stopped.message
    assert not alive(ready.pid)
    # Stopped shards stay reported until the control plane has been told.
    assert harness.supervisor.reports() == [stopped]
    harness.supervisor.forget(stopped)
    assert harness.supervisor.reports() == []
    assert await harness.supervisor.stop("a", grace=1.0) is None


async def test_sigkill_after_the_grace_when_sigterm_is_ignored(harness: Harness) -> None:
    await harness.supervisor.start(harness.spec("stubborn", "--ignore-term"))
    ready = await harness.wait_for("stubborn", ShardState.READY)
    stopped = await harness.supervisor.stop("stubborn", grace=0.3, drain=True)
    assert stopped is not None
    assert harness.states("stubborn")[-2:] == [ShardState.DRAINING, ShardState.STOPPED]
    assert stopped.exit_code == -9 and "SIGKILL" in stopped.message
    assert not alive(ready.pid)


async def test_an_engine_that_exits_is_failed_with_its_output(harness: Harness) -> None:
    await harness.supervisor.start(harness.spec("c", engine="crash"))
    failed = await harness.wait_for("c", ShardState.FAILED)
    assert failed.exit_code == 3
    assert failed.message.startswith("engine exited with code 3 while ")
    assert failed.output_tail[-2:] == ("loading weights", "error: weights not found: /nope")
    # A failed shard stays in the reports (for the next Register) until forgotten.
    assert harness.supervisor.reports() == [failed]
    # Starting it again replaces the failed one.
    await harness.supervisor.start(harness.spec("c", engine="crash", port=harness.ports.start + 1))
    await harness.wait_for("c", ShardState.STARTING)


async def test_refusals_before_launch(harness: Harness) -> None:
    supervisor = harness.supervisor
    with pytest.raises(SpecError, match=r"^port: .* outside this node's port range") as caught:
        await supervisor.start(harness.spec("x", port=harness.ports.end + 1))
    assert caught.value.field == "port"
    with pytest.raises(SpecError, match=r"^engine: unknown engine 'tensorflow'"):
        await supervisor.start(harness.spec("x", engine="tensorflow"))
    with pytest.raises(SpecError, match=r"^gpu_indices: GPU 2 does not exist"):
        spec = harness.spec("x")
        spec.gpu_indices.extend([0, 2])
        await supervisor.start(spec)
    with pytest.raises(SpecError, match=r"^shard_id: is empty"):
        await supervisor.start(harness.spec(""))
    with pytest.raises(SpecError, match=r"^engine_args: '--port' sets --port"):
        await supervisor.start(harness.spec("x", "--port", "1", engine="sim"))
    with pytest.raises(LaunchError, match="'no-such-engine-binary-xyz' is not installed"):
        await supervisor.start(harness.spec("x", engine="missing"))
    assert harness.reports == [] and supervisor.reports() == []


async def test_a_port_held_by_another_program_is_refused_before_launch(harness: Harness) -> None:
    taken = harness.ports.start + 2
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        with pytest.raises(SpecError, match=rf"^port: {taken} is in use by another process"):
            await harness.supervisor.start(harness.spec("x", port=taken))
        assert harness.adapters["serve"].specs[-1].port == taken  # planned, never spawned
        assert harness.reports == [] and harness.supervisor.reports() == []
    started = await harness.supervisor.start(harness.spec("x", port=taken))
    assert started.pid > 0
    await harness.wait_for("x", ShardState.READY)


async def test_repeated_and_conflicting_starts(harness: Harness) -> None:
    supervisor = harness.supervisor
    spec = harness.spec("a")
    first = await supervisor.start(spec)
    again = agent_pb2.ShardSpec()
    again.CopyFrom(spec)
    assert (await supervisor.start(again)).pid == first.pid
    other = harness.spec("a", port=harness.ports.start + 1)
    with pytest.raises(ShardConflictError, match="already running here with another spec"):
        await supervisor.start(other)
    with pytest.raises(SpecError, match=r"^port: .* in use by shard 'a'"):
        await supervisor.start(harness.spec("b"))
    assert len(supervisor.reports()) == 1


async def test_weights_in_use_are_not_removed(harness: Harness) -> None:
    (harness.weights / "w-a").mkdir()
    (harness.weights / "w-other.gguf").write_bytes(b"x")
    await harness.supervisor.start(harness.spec("a"))
    with pytest.raises(WeightsPathError, match="shard 'a' is running from it"):
        await harness.supervisor.remove_weights("w-a")
    with pytest.raises(WeightsPathError, match="not inside the weights directory"):
        await harness.supervisor.remove_weights("../x")
    assert (
        await harness.supervisor.remove_weights("w-other.gguf") == harness.weights / "w-other.gguf"
    )
    assert await harness.supervisor.remove_weights("w-other.gguf") is None
    assert (harness.weights / "w-a").is_dir()


async def test_shutdown_stops_everything_and_refuses_new_shards(tmp_path: Path) -> None:
    reports: list[ShardReport] = []
    supervisor, ports = make_supervisor(
        tmp_path, reports, {"serve": ScriptAdapter(SERVE)}, advertise="10.1.2.3"
    )
    running = asyncio.create_task(supervisor.run())
    await asyncio.sleep(0)
    spec = agent_pb2.ShardSpec(shard_id="a", model="m", engine="serve", port=ports.start)
    started = await supervisor.start(spec)
    assert started.endpoint_url == f"http://10.1.2.3:{ports.start}"
    await supervisor.start(
        agent_pb2.ShardSpec(shard_id="b", model="m", engine="serve", port=ports.start + 1)
    )
    await supervisor.shutdown(grace=1.0)
    await asyncio.wait_for(running, 5)
    assert {r.shard_id for r in reports if r.state is ShardState.STOPPED} == {"a", "b"}
    assert not alive(started.pid)
    with pytest.raises(AgentClosingError, match="shutting down"):
        await supervisor.start(
            agent_pb2.ShardSpec(shard_id="c", model="m", engine="serve", port=ports.start + 2)
        )


async def test_a_cancelled_supervisor_leaves_its_engines_for_the_next_to_adopt(
    tmp_path: Path,
) -> None:
    reports: list[ShardReport] = []
    supervisor, ports = make_supervisor(tmp_path, reports, {"serve": ScriptAdapter(SERVE)})
    running = asyncio.create_task(supervisor.run())
    await asyncio.sleep(0)
    spec = agent_pb2.ShardSpec(shard_id="a", model="m", engine="serve", port=ports.start)
    started = await supervisor.start(spec)
    async with asyncio.timeout(10):
        while True:
            if any(r.state is ShardState.READY for r in reports):
                break
            await asyncio.sleep(0.02)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert alive(started.pid)
    # The state file says how to find it again.
    path = tmp_path / "state" / "engines" / "n1" / "state.json"
    [record] = json.loads(path.read_text())["engines"]
    assert record["pid"] == started.pid and record["port"] == ports.start
    assert record["start_ticks"] > 0 and len(record["cmdline_sha256"]) == 64
    assert record["spec"]["shard_id"] == "a" and record["been_ready"] is True
    assert record["log_path"] == str(path.parent / "a.log")

    # The next supervisor (a restarted agent) adopts it: same pid, ready at once.
    again: list[ShardReport] = []
    successor, _ = make_supervisor(tmp_path, again, {"serve": ScriptAdapter(SERVE)}, ports=ports)
    running = asyncio.create_task(successor.run())
    [adopted] = await successor.adopt()
    assert adopted.pid == started.pid and adopted.state is ShardState.READY
    assert adopted.spec == spec and adopted.message.startswith("adopted")
    assert adopted.endpoint_url == f"http://127.0.0.1:{ports.start}"
    # The control plane wants it (StartShard with the same spec): the same shard.
    assert (await successor.start(spec)).pid == started.pid
    stopped = await successor.stop("a", grace=1.0)
    assert stopped is not None and stopped.state is ShardState.STOPPED
    # Not this agent's child: the exit code cannot be read.
    assert stopped.exit_code is None
    assert "engine exited (adopted; exit code unknown)" in stopped.message
    await wait_gone(started.pid)
    await successor.shutdown(grace=1.0)
    await running
    state = json.loads((tmp_path / "state" / "engines" / "n1" / "state.json").read_text())
    assert state["engines"] == []


async def test_shutdown_leaving_engines_and_an_unconfirmed_adoption_is_stopped(
    tmp_path: Path,
) -> None:
    reports: list[ShardReport] = []
    supervisor, ports = make_supervisor(tmp_path, reports, {"serve": ScriptAdapter(SERVE)})
    running = asyncio.create_task(supervisor.run())
    await asyncio.sleep(0)
    started = await supervisor.start(
        agent_pb2.ShardSpec(shard_id="a", model="m", engine="serve", port=ports.start)
    )
    await until_ready(reports)
    await supervisor.shutdown(grace=1.0, stop_engines=False)
    await running
    # Left running, and nothing reported: a clean agent stop is not a replica failure.
    assert alive(started.pid)
    assert not any(r.state.terminal for r in reports)

    again: list[ShardReport] = []
    short = FAST.model_copy(update={"adopt_grace_seconds": 0.3})
    successor, _ = make_supervisor(
        tmp_path, again, {"serve": ScriptAdapter(SERVE)}, ports=ports, settings=short
    )
    running = asyncio.create_task(successor.run())
    [adopted] = await successor.adopt()
    assert adopted.pid == started.pid
    async with asyncio.timeout(15):
        while True:
            if any(r.state is ShardState.STOPPED for r in again):
                break
            await asyncio.sleep(0.02)
    [stopped] = [r for r in again if r.state is ShardState.STOPPED]
    assert "no control plane confirmed this adopted engine within 0.3s" in stopped.message
    await wait_gone(started.pid)
    await successor.shutdown(grace=1.0)
    await running


async def test_a_confirmed_adoption_is_kept(tmp_path: Path) -> None:
    reports: list[ShardReport] = []
    supervisor, ports = make_supervisor(tmp_path, reports, {"serve": ScriptAdapter(SERVE)})
    running = asyncio.create_task(supervisor.run())
    await asyncio.sleep(0)
    started = await supervisor.start(
        agent_pb2.ShardSpec(shard_id="a", model="m", engine="serve", port=ports.start)
    )
    await until_ready(reports)
    await supervisor.shutdown(stop_engines=False)
    await running
    short = FAST.model_copy(update={"adopt_grace_seconds": 0.2})
    again: list[ShardReport] = []
    successor, _ = make_supervisor(
        tmp_path, again, {"serve": ScriptAdapter(SERVE)}, ports=ports, settings=short
    )
    running = asyncio.create_task(successor.run())
    adopted = await successor.adopt()
    successor.confirm(adopted)
    # Well past the grace, it still runs.
    for _ in range(40):
        await asyncio.sleep(0.02)
    assert alive(started.pid)
    assert not any(r.state.terminal for r in again)
    await successor.shutdown(grace=1.0)
    await running
    await wait_gone(started.pid)


async def test_an_adopted_engine_that_stopped_answering_is_unhealthy_not_slow(
    tmp_path: Path,
) -> None:
    reports: list[ShardReport] = []
    supervisor, ports = make_supervisor(tmp_path, reports, {"serve": ScriptAdapter(SERVE)})
    running = asyncio.create_task(supervisor.run())
    await asyncio.sleep(0)
    spec = agent_pb2.ShardSpec(
        shard_id="a",
        model="m",
        engine="serve",
        port=ports.start,
        unhealthy_after_seconds=0.5,
        drain_grace_seconds=0.2,
    )
    started = await supervisor.start(spec)
    async with asyncio.timeout(10):
        while True:
            if any(r.state is ShardState.READY for r in reports):
                break
            await asyncio.sleep(0.02)
    await supervisor.shutdown(stop_engines=False)
    await running
    os.kill(started.pid, signal.SIGSTOP)  # hung while no agent watched it
    again: list[ShardReport] = []
    successor, _ = make_supervisor(tmp_path, again, {"serve": ScriptAdapter(SERVE)}, ports=ports)
    running = asyncio.create_task(successor.run())
    [adopted] = await successor.adopt()
    assert adopted.state is ShardState.LOADING
    async with asyncio.timeout(20):
        while True:
            if any(r.state is ShardState.FAILED for r in again):
                break
            await asyncio.sleep(0.02)
    [failed] = [r for r in again if r.state is ShardState.FAILED]
    assert failed.message.startswith("health probe failing for 0.5s"), failed.message
    await wait_gone(started.pid)
    await successor.shutdown(grace=1.0)
    await running


async def test_an_engine_that_renames_itself_is_still_adopted(tmp_path: Path) -> None:
    reports: list[ShardReport] = []
    quick = FAST.model_copy(update={"identity_refresh_seconds": 0.05})
    supervisor, ports = make_supervisor(
        tmp_path, reports, {"renames": ScriptAdapter(RENAMES)}, settings=quick
    )
    running = asyncio.create_task(supervisor.run())
    await asyncio.sleep(0)
    spec = agent_pb2.ShardSpec(
        shard_id="a", model="m", engine="renames", port=ports.start, env={"SERVE_SCRIPT": SERVE}
    )
    started = await supervisor.start(spec)
    path = tmp_path / "state" / "engines" / "n1" / "state.json"
    async with asyncio.timeout(20):
        while True:
            cmdline = cmdline_of(started.pid)
            [record] = json.loads(path.read_text())["engines"]
            if b"renamed" in cmdline and record["cmdline_sha256"] == sha256(cmdline).hexdigest():
                break
            await asyncio.sleep(0.05)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    successor, _ = make_supervisor(
        tmp_path, [], {"renames": ScriptAdapter(RENAMES)}, ports=ports, settings=quick
    )
    running = asyncio.create_task(successor.run())
    [adopted] = await successor.adopt()
    assert adopted.pid == started.pid
    await successor.shutdown(grace=1.0)
    await running
    await wait_gone(started.pid)


async def test_a_reused_pid_is_not_adopted(tmp_path: Path) -> None:
    reports: list[ShardReport] = []
    supervisor, ports = make_supervisor(tmp_path, reports, {"serve": ScriptAdapter(SERVE)})
    running = asyncio.create_task(supervisor.run())
    await asyncio.sleep(0)
    started = await supervisor.start(
        agent_pb2.ShardSpec(shard_id="a", model="m", engine="serve", port=ports.start)
    )
    await until_ready(reports)
    await supervisor.shutdown(stop_engines=False)
    await running
    # The engine is gone and its pid now names another process: write that process's
    # pid into the record, as if the kernel had reused it.
    os.killpg(started.pid, signal.SIGKILL)
    await wait_gone(started.pid)
    other = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import time; time.sleep(60)"
    )
    try:
        path = tmp_path / "state" / "engines" / "n1" / "state.json"
        state = json.loads(path.read_text())
        state["engines"][0]["pid"] = other.pid
        path.write_text(json.dumps(state))
        successor, _ = make_supervisor(tmp_path, [], {"serve": ScriptAdapter(SERVE)}, ports=ports)
        running = asyncio.create_task(successor.run())
        assert await successor.adopt() == []
        assert json.loads(path.read_text())["engines"] == []
        assert other.returncode is None and alive(other.pid)  # never signalled
        await successor.shutdown(grace=1.0)
        await running
    finally:
        other.kill()
        await other.wait()


async def test_load_timeout_fails_the_shard_with_its_output(harness: Harness) -> None:
    harness.adapters["slow"] = ScriptAdapter(SLOW)
    spec = harness.spec("s", engine="slow")
    spec.load_timeout_seconds = 0.5
    started = await harness.supervisor.start(spec)
    failed = await harness.wait_for("s", ShardState.FAILED)
    assert failed.message.startswith("did not become ready within 0.5s (last probe: /ready:")
    assert "still loading" in failed.output_tail
    await wait_gone(started.pid)


async def test_unhealthy_after_restarts_a_hung_engine(harness: Harness) -> None:
    spec = harness.spec("h")
    spec.unhealthy_after_seconds = 0.5
    spec.drain_grace_seconds = 0.2
    await harness.supervisor.start(spec)
    ready = await harness.wait_for("h", ShardState.READY)
    os.kill(ready.pid, signal.SIGSTOP)  # hung: accepts nothing, answers nothing
    failed = await harness.wait_for("h", ShardState.FAILED, within=20)
    assert failed.message.startswith("health probe failing for 0.5s: /ready"), failed.message
    await wait_gone(ready.pid)


async def test_stop_signals_the_main_process_before_its_group(harness: Harness) -> None:
    harness.adapters["family"] = ScriptAdapter(FAMILY)
    spec = harness.spec("f", engine="family")
    spec.drain_grace_seconds = 5
    await harness.supervisor.start(spec)
    ready = await harness.wait_for("f", ShardState.READY)
    log = harness.weights / "state" / "engines" / "n1" / "f.log"
    async with asyncio.timeout(10):
        while True:
            if "child started" in log.read_text():
                break
            await asyncio.sleep(0.02)
    stopped = await harness.supervisor.stop("f", grace=2.0, drain=True)
    assert stopped is not None and stopped.state is ShardState.STOPPED
    assert stopped.exit_code == 0
    lines = [line for line in log.read_text().splitlines() if line.startswith(("main", "child:"))]
    # The main process got SIGTERM first and finished its in-flight work; only then
    # did the group (its child) get one.
    assert lines == ["main: SIGTERM, finishing in-flight requests", "main: done", "child: SIGTERM"]
    assert not alive(ready.pid)


async def test_a_hub_download_in_use_is_not_removed(harness: Harness) -> None:
    cache = harness.weights / "hub" / "models--org--model"
    (cache / "snapshots").mkdir(parents=True)
    spec = harness.spec("v")
    spec.weights = "org/model"
    await harness.supervisor.start(spec)  # downloads from the hub stand-in first
    await harness.wait_for("v", ShardState.READY)
    with pytest.raises(WeightsPathError, match="shard 'v' is running from it"):
        await harness.supervisor.remove_weights("hub/models--org--model")
    with pytest.raises(WeightsPathError, match="shard 'v' is running from it"):
        await harness.supervisor.remove_weights("hub")
    assert cache.is_dir()


async def test_relative_weights_resolve_in_the_weights_dir(harness: Harness) -> None:
    (harness.weights / "models").mkdir()
    (harness.weights / "models" / "m.gguf").write_bytes(b"x")
    spec = harness.spec("w")
    spec.weights = "models/m.gguf"
    await harness.supervisor.start(spec)
    assert harness.adapters["serve"].specs[-1].weights == str(harness.weights / "models/m.gguf")
    hub = harness.spec("x", port=harness.ports.start + 1)
    hub.weights = "org/model"  # not in the weights dir: a hub repo, downloaded first
    await harness.supervisor.start(hub)
    await harness.wait_for("x", ShardState.READY)
    snapshots = harness.weights / "hub" / "models--org--model" / "snapshots"
    [snapshot] = snapshots.iterdir()
    assert harness.adapters["serve"].specs[-1].weights == str(snapshot)


async def until_ready(reports: list[ShardReport]) -> None:
    """The engine answers its readiness probe (so it holds its port and runs)."""
    async with asyncio.timeout(15):
        while True:
            if any(r.state is ShardState.READY for r in reports):
                return
            await asyncio.sleep(0.02)


async def wait_gone(pid: int) -> None:
    async with asyncio.timeout(15):
        while True:
            if not alive(pid):
                return
            await asyncio.sleep(0.02)
