"""The real `llmgw agent` as a process, driven by a fake control plane on loopback.

The fake control plane is a real grpc.aio server in the test process with its own
servicer: it answers Register with Registered, records every message the agent
sends, and pushes the commands a test queues. Engines are real `llmgw sim`
processes started by the agent. Waits poll with deadlines; nothing asserts on
wall-clock durations. Every agent and engine is killed on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import grpc.aio
import httpx
import pytest
from procs import Proc, free_port, free_port_block, llmgw

from llmgw import __version__
from llmgw.proto import agent_pb2, agent_pb2_grpc

GIB = 2**30
HEARTBEAT = 0.2
S = agent_pb2


class FakeControlPlane(agent_pb2_grpc.AgentServiceServicer):
    """Registers every agent, records what it sends, sends what tests queue."""

    def __init__(self) -> None:
        self.messages: list[agent_pb2.AgentMessage] = []
        self.arrived = asyncio.Condition()
        self.commands: asyncio.Queue[agent_pb2.ServerMessage] = asyncio.Queue()
        self.streams = 0

    async def _record(self, message: agent_pb2.AgentMessage) -> None:
        async with self.arrived:
            self.messages.append(message)
            self.arrived.notify_all()

    async def Connect(
        self, request_iterator: object, context: grpc.aio.ServicerContext[object, object]
    ) -> None:
        first = await context.read()
        assert isinstance(first, agent_pb2.AgentMessage)
        await self._record(first)
        if self.streams:
            # Commands go to the newest stream: an old one (an agent that was killed)
            # may not have noticed yet that its peer is gone.
            self.commands = asyncio.Queue()
        commands = self.commands
        self.streams += 1
        await context.write(
            S.ServerMessage(
                registered=S.Registered(
                    heartbeat_interval_seconds=HEARTBEAT, leader_id="fake", server_version="test"
                )
            )
        )

        async def pump() -> None:
            while True:
                message = await context.read()
                if message is grpc.aio.EOF:
                    return
                assert isinstance(message, agent_pb2.AgentMessage)
                await self._record(message)

        reader = asyncio.create_task(pump())
        try:
            while True:
                command = asyncio.create_task(commands.get())
                done, _ = await asyncio.wait({reader, command}, return_when=asyncio.FIRST_COMPLETED)
                if command not in done:
                    command.cancel()
                    return
                await context.write(command.result())
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await reader

    async def expect(
        self,
        kind: str,
        match: Callable[[object], bool] = lambda _: True,
        *,
        after: int = 0,
        within: float = 20.0,
    ) -> object:
        """The first message of `kind` (from index `after` on) that `match`es."""

        def find() -> object | None:
            for message in self.messages[after:]:
                if message.WhichOneof("kind") == kind and match(getattr(message, kind)):
                    return getattr(message, kind)
            return None

        async with self.arrived:
            async with asyncio.timeout(within):
                await self.arrived.wait_for(lambda: find() is not None)
        return find()

    def statuses(self, shard_id: str) -> list[int]:
        return [
            m.shard_status.state
            for m in self.messages
            if m.WhichOneof("kind") == "shard_status" and m.shard_status.shard_id == shard_id
        ]

    def send(self, command_id: str, **kind: object) -> None:
        self.commands.put_nowait(S.ServerMessage(command_id=command_id, **kind))


async def start_server(servicer: FakeControlPlane, port: int) -> grpc.aio.Server:
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServiceServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


def alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone, or going
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def wait_gone(pid: int, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while True:
        if not alive(pid):
            return
        assert time.monotonic() < deadline, f"process {pid} still alive after {within}s"
        await asyncio.sleep(0.05)


def environ_of(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


class Agent:
    """The real agent process, plus the engine pids it reported (killed on cleanup)."""

    def __init__(
        self, server_port: int, ports: tuple[int, int], weights: Path, *extra: str
    ) -> None:
        args = [
            "--server", f"127.0.0.1:{server_port}",
            "--node-id", "node-a",
            "--gpus", "2x24GiB",
            "--labels", "zone=eu-1,tier=test",
            "--fabric", "ib-domain=pod3",
            "--port-range", f"{ports[0]}-{ports[1]}",
            "--weights-dir", str(weights),
            "--log-level", "debug",
            *extra,
        ]  # fmt: skip
        # The production default: engines outlive the agent (tests elsewhere stop them).
        self.proc = Proc(llmgw("agent", *args), env={"LLMGW_AGENT_STOP_ENGINES_ON_EXIT": "0"})
        self.engine_pids: set[int] = set()

    def kill_all(self) -> None:
        if self.proc.popen.poll() is None:
            os.killpg(self.proc.popen.pid, signal.SIGKILL)
            self.proc.popen.wait(5)
        self.proc.stop()
        for pid in self.engine_pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def sim_spec(shard_id: str, port: int, *args: str, engine: str = "sim") -> agent_pb2.ShardSpec:
    return S.ShardSpec(
        shard_id=shard_id,
        model=f"model-{shard_id}",
        engine=engine,
        port=port,
        gpu_indices=[1],
        engine_args=["--zero-delay", *args],
        env={"LLMGW_TEST_SHARD": shard_id},
    )


class Node:
    """One agent wired to one fake control plane, for one test."""

    def __init__(self, tmp_path: Path) -> None:
        self.port = free_port()
        low = free_port_block(21)
        self.range = (low, low + 20)
        self.plane = FakeControlPlane()
        self.server: grpc.aio.Server | None = None
        self.tmp = tmp_path
        self.agent: Agent | None = None

    async def start(self) -> None:
        self.server = await start_server(self.plane, self.port)
        self.agent = Agent(self.port, self.range, self.tmp / "weights")

    async def restart_server(self) -> None:
        assert self.server is not None
        await self.server.stop(grace=None)
        self.plane = FakeControlPlane()
        self.server = await start_server(self.plane, self.port)

    async def ready_shard(self, shard_id: str, port: int) -> agent_pb2.ShardStatus:
        assert self.agent is not None
        mark = len(self.plane.messages)
        self.plane.send(
            f"start-{shard_id}", start_shard=S.StartShard(spec=sim_spec(shard_id, port))
        )
        result = await self.plane.expect(
            "command_result", lambda r: r.command_id == f"start-{shard_id}", after=mark
        )
        assert result.ok, result.error
        ready = await self.plane.expect(
            "shard_status",
            lambda s: s.shard_id == shard_id and s.state == S.SHARD_STATE_READY,
            after=mark,
        )
        self.agent.engine_pids.add(ready.pid)
        return ready

    async def close(self) -> None:
        if self.agent is not None:
            self.agent.kill_all()
        if self.server is not None:
            await self.server.stop(grace=None)


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    node = Node(tmp_path)
    try:
        await node.start()
        yield node
    finally:
        await node.close()


async def test_register_start_ready_stop_fail_and_refuse(node: Node) -> None:
    plane = node.plane
    register = await plane.expect("register")
    assert register.node_id == "node-a"
    assert register.agent_version == __version__
    assert dict(register.fabric) == {"ib-domain": "pod3"}
    assert dict(register.labels) == {"zone": "eu-1", "tier": "test"}
    assert (register.port_range_start, register.port_range_end) == node.range
    assert register.weights_dir == str((node.tmp / "weights").resolve())
    hw = register.hardware
    assert hw.gpu_source == "declared"
    assert [(g.index, g.uuid, g.memory_total_bytes) for g in hw.gpus] == [
        (0, "declared-node-a-0", 24 * GIB),
        (1, "declared-node-a-1", 24 * GIB),
    ]
    assert hw.cpu_count >= 1 and hw.memory_total_bytes > 0 and hw.weights_disk_free_bytes > 0
    assert list(register.running_shards) == []

    # A sim engine: starting -> loading -> ready, and the endpoint really serves.
    port = node.range[0] + 1
    ready = await node.ready_shard("s1", port)
    assert plane.statuses("s1") == [
        S.SHARD_STATE_STARTING,
        S.SHARD_STATE_LOADING,
        S.SHARD_STATE_READY,
    ]
    assert ready.endpoint_url == f"http://127.0.0.1:{port}"
    assert ready.model == "model-s1" and ready.spec.engine == "sim" and ready.pid > 0
    async with httpx.AsyncClient() as client:
        models = (await client.get(ready.endpoint_url + "/v1/models")).json()
    assert [m["id"] for m in models["data"]] == ["model-s1"]
    environ = environ_of(ready.pid)
    assert b"LLMGW_TEST_SHARD=s1" in environ and b"CUDA_VISIBLE_DEVICES=1" in environ

    # Heartbeats flow on the interval Registered gave, with rising sequence numbers.
    first = await plane.expect("heartbeat")
    await plane.expect("heartbeat", lambda h: h.sequence > first.sequence)

    # Refused before launch: unknown engine, a port outside the range, a taken port.
    for command_id, spec, field in (
        ("bad-engine", sim_spec("s2", port + 1, engine="tensorflow"), "engine"),
        ("bad-port", sim_spec("s3", node.range[1] + 1), "port"),
        ("taken-port", sim_spec("s4", port), "port"),
        (
            "bad-gpu",
            S.ShardSpec(shard_id="s5", model="m", engine="sim", port=port + 2, gpu_indices=[7]),
            "gpu_indices",
        ),
    ):
        plane.send(command_id, start_shard=S.StartShard(spec=spec))
        result = await plane.expect("command_result", lambda r, c=command_id: r.command_id == c)
        assert not result.ok and result.error.startswith(f"{field}:"), result.error
    assert plane.statuses("s2") == plane.statuses("s3") == plane.statuses("s4") == []
    assert plane.statuses("s5") == []

    # An engine that exits on its own: failed, with its exit code and output tail.
    plane.send(
        "start-bad", start_shard=S.StartShard(spec=sim_spec("s6", port + 3, "--no-such-option"))
    )
    assert (await plane.expect("command_result", lambda r: r.command_id == "start-bad")).ok
    failed = await plane.expect(
        "shard_status", lambda s: s.shard_id == "s6" and s.state == S.SHARD_STATE_FAILED
    )
    assert failed.exit_code == 2, failed.message
    assert any("No such option" in line for line in failed.output_tail), failed.output_tail
    assert "exited with code 2" in failed.message
    assert not alive(failed.pid)

    # StopShard: stopped, and the process is gone.
    mark = len(plane.messages)
    plane.send("stop-s1", stop_shard=S.StopShard(shard_id="s1", grace_seconds=5))
    stopped = await plane.expect(
        "shard_status",
        lambda s: s.shard_id == "s1" and s.state == S.SHARD_STATE_STOPPED,
        after=mark,
    )
    assert (
        await plane.expect("command_result", lambda r: r.command_id == "stop-s1", after=mark)
    ).ok
    assert stopped.pid == ready.pid
    assert not alive(ready.pid)

    # RemoveWeights: inside the weights dir only.
    weights = node.tmp / "weights"
    (weights / "model-x").mkdir()
    (weights / "model-x" / "w.bin").write_bytes(b"w")
    plane.send("rm-out", remove_weights=S.RemoveWeights(path="../outside"))
    plane.send("rm-in", remove_weights=S.RemoveWeights(path="model-x"))
    refused = await plane.expect("command_result", lambda r: r.command_id == "rm-out")
    assert not refused.ok and "not inside the weights directory" in refused.error
    assert (await plane.expect("command_result", lambda r: r.command_id == "rm-in")).ok
    assert not (weights / "model-x").exists()

    # An unknown command id still gets an answer.
    plane.send("empty")
    unknown = await plane.expect("command_result", lambda r: r.command_id == "empty")
    assert not unknown.ok and "unknown command" in unknown.error


async def test_drain_then_sigterm_stops_engines_and_exits_0(node: Node) -> None:
    await node.plane.expect("register")
    base = node.range[0]
    first = await node.ready_shard("d1", base + 1)
    second = await node.ready_shard("d2", base + 2)

    mark = len(node.plane.messages)
    node.plane.send("drain", drain_shard=S.DrainShard(shard_id="d1", grace_seconds=5))
    await node.plane.expect("command_result", lambda r: r.command_id == "drain", after=mark)
    assert node.plane.statuses("d1")[-2:] == [S.SHARD_STATE_DRAINING, S.SHARD_STATE_STOPPED]
    assert not alive(first.pid)

    assert node.agent is not None
    mark = len(node.plane.messages)
    node.agent.proc.signal(signal.SIGTERM)
    for _ in range(200):
        if node.agent.proc.popen.poll() is not None:
            break
        await asyncio.sleep(0.05)
    assert node.agent.proc.popen.returncode == 0, node.agent.proc.output()
    # A clean agent stop leaves its engines running for the next agent, and reports
    # no replica failure.
    assert alive(second.pid)
    assert node.plane.statuses("d2")[-1] == S.SHARD_STATE_READY
    assert all(m.WhichOneof("kind") != "shard_status" for m in node.plane.messages[mark:])
    assert "leaving 1 engine running" in node.agent.proc.output()


async def test_reconnect_adopts_running_shard_and_sigkill_leaves_no_orphans(node: Node) -> None:
    await node.plane.expect("register")
    ready = await node.ready_shard("r1", node.range[0] + 1)

    # The control plane restarts on the same port: the agent re-registers by itself
    # and reports the engine it kept running, so the server can adopt it.
    await node.restart_server()
    register = await node.plane.expect("register")
    [adopted] = register.running_shards
    assert adopted.shard_id == "r1" and adopted.state == S.SHARD_STATE_READY
    assert adopted.pid == ready.pid and adopted.endpoint_url == ready.endpoint_url
    assert adopted.spec.model == "model-r1" and adopted.spec.port == node.range[0] + 1
    assert alive(ready.pid)

    # The agent is SIGKILLed: its engine keeps serving, and the restarted agent
    # adopts it (same pid, ready at once, no reload).
    assert node.agent is not None
    os.kill(node.agent.proc.popen.pid, signal.SIGKILL)
    node.agent.proc.popen.wait(10)
    assert alive(ready.pid)
    async with httpx.AsyncClient() as client:
        assert (await client.get(ready.endpoint_url + "/health")).status_code == 200
    mark = len(node.plane.messages)
    pids = node.agent.engine_pids
    node.agent = Agent(node.port, node.range, node.tmp / "weights")
    node.agent.engine_pids |= pids
    register = await node.plane.expect("register", after=mark)
    [adopted] = register.running_shards
    assert adopted.shard_id == "r1" and adopted.state == S.SHARD_STATE_READY
    assert adopted.pid == ready.pid and adopted.endpoint_url == ready.endpoint_url
    assert adopted.message.startswith("adopted")

    # StopShard on the adopted engine: stopped, exit code unknown (not a child).
    node.plane.send("stop-r1", stop_shard=S.StopShard(shard_id="r1", grace_seconds=5))
    try:
        stopped = await node.plane.expect(
            "shard_status",
            lambda s: s.shard_id == "r1" and s.state == S.SHARD_STATE_STOPPED,
            after=mark,
            within=60,
        )
    except TimeoutError:
        raise AssertionError(node.agent.proc.output()) from None
    assert "exit code unknown" in stopped.message
    await wait_gone(ready.pid)


async def test_an_adopted_engine_no_control_plane_confirms_is_stopped(node: Node) -> None:
    await node.plane.expect("register")
    ready = await node.ready_shard("g1", node.range[0] + 1)
    assert node.agent is not None
    os.kill(node.agent.proc.popen.pid, signal.SIGKILL)
    node.agent.proc.popen.wait(10)
    # The node is retired: no control plane answers any more.
    assert node.server is not None
    await node.server.stop(grace=None)
    node.server = None
    assert alive(ready.pid)
    pids = node.agent.engine_pids
    node.agent = Agent(node.port, node.range, node.tmp / "weights", "--adopt-grace", "1")
    node.agent.engine_pids |= pids
    await wait_gone(ready.pid, within=30)
    output = node.agent.proc.output()
    assert "adopted 1 engine" in output
    assert "no control plane confirmed this adopted engine within 1s" in output
