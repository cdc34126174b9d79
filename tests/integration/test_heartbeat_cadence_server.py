"""The heartbeat interval grows with the fleet, against a real `llmgw server`.

The server is configured to scale above one connected node (`heartbeat_scale_above: 1`),
so every registration makes the interval longer. The nodes are real gRPC agent streams
opened by this test (as `bench/agents_heartbeat.py` opens them): one registers as an
older agent (it does not follow `HeartbeatInterval`), three as agents that do and that
heartbeat at whatever interval they were last told, as `llmgw agent` does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from procs import Server, free_port, role, wait_for

from llmgw.proto import agent_pb2, agent_pb2_grpc

BASE = 0.5  # heartbeat_interval
# Thresholds of a node told the configured interval. The followers end up told 4 x
# BASE = 2 s: without scaling they would be unreachable after 1 s of each 2 s pause
# (the server sweeps every second), with it after 4 s.
UNREACHABLE, LOST = 1.0, 2.0

Call = grpc.aio.StreamStreamCall[agent_pb2.AgentMessage, agent_pb2.ServerMessage]


def register(node_id: str, *, follows: bool) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(
        register=agent_pb2.Register(
            node_id=node_id,
            hostname=f"{node_id}.test",
            agent_version="test",
            hardware=agent_pb2.Hardware(
                gpus=[agent_pb2.Gpu(index=0, uuid=f"GPU-{node_id}", memory_total_bytes=1 << 34)],
                gpu_source="declared",
            ),
            port_range_start=20000,
            port_range_end=20009,
            follows_heartbeat_interval=follows,
        )
    )


class Agent:
    """One agent stream: registers, then heartbeats every interval it was last told
    (while `beating`), recording every interval the server told it."""

    def __init__(self, stub: agent_pb2_grpc.AgentServiceStub, node_id: str, follows: bool):
        self.node_id = node_id
        self.follows = follows
        self.call: Call = stub.Connect()
        self.told: list[float] = []
        self.changed = asyncio.Event()
        self.beating = True
        self.beats = 0  # heartbeats sent at the last interval told
        self._tasks: list[asyncio.Task[None]] = []

    async def register(self) -> float:
        await self.call.write(register(self.node_id, follows=self.follows))
        reply = await self.call.read()
        assert isinstance(reply, agent_pb2.ServerMessage) and reply.HasField("registered")
        self.told.append(reply.registered.heartbeat_interval_seconds)
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._beat())]
        return self.told[0]

    async def _read(self) -> None:
        while True:
            message = await self.call.read()
            if not isinstance(message, agent_pb2.ServerMessage):
                return
            if message.HasField("heartbeat_interval"):
                self.told.append(message.heartbeat_interval.seconds)
                self.beats = 0
                self.changed.set()

    async def _beat(self) -> None:
        sequence = 0
        while True:
            await asyncio.sleep(self.told[-1])
            if self.beating:
                self.beats += 1
                sequence += 1
                await self.call.write(
                    agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(sequence=sequence))
                )

    async def wait_told(self, seconds: float) -> None:
        async with asyncio.timeout(20):
            while self.told[-1] != seconds:
                self.changed.clear()
                await self.changed.wait()

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        self.call.cancel()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[Server, int]]:
    config = tmp_path / "llmgw.yaml"
    config.write_text(
        f"control: {{heartbeat_interval: {BASE}, heartbeat_scale_above: 1, "
        f"unreachable_after: {UNREACHABLE}, lost_after: {LOST}}}\n"
    )
    agent_port = free_port()
    srv = Server(
        "--endpoint", "x=http://127.0.0.1:1=unused", "--agent-listen", f"127.0.0.1:{agent_port}",
        "--config", str(config), data_dir=tmp_path / "data", wait_ready=False,
    )  # fmt: skip
    try:
        # Agents are refused (UNAVAILABLE) until the server leads the control plane.
        wait_for(lambda: role(srv) == "leader", "the server to lead the control plane")
        yield srv, agent_port
    finally:
        srv.proc.stop()


async def states(admin: str) -> dict[str, str]:
    async with httpx.AsyncClient() as client:
        listed = (await client.get(admin + "/admin/api/nodes")).json()["nodes"]
    return {n["id"]: n["state"] for n in listed}


async def test_the_interval_grows_with_the_fleet_and_each_node_ages_by_its_own(
    server: tuple[Server, int],
) -> None:
    srv, agent_port = server
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{agent_port}")
    stub = agent_pb2_grpc.AgentServiceStub(channel)  # type: ignore[no-untyped-call]
    old = Agent(stub, "old", follows=False)
    followers = [Agent(stub, f"n{i}", follows=True) for i in (1, 2, 3)]
    try:
        # One node per registration, one registration at a time: the interval
        # handed out is BASE x the nodes connected, the newcomer included.
        told = [await agent.register() for agent in (old, *followers)]
        assert told == [BASE, 2 * BASE, 3 * BASE, 4 * BASE]
        # Followers registered earlier are told each change; the older agent is not.
        for agent in followers:
            await agent.wait_told(4 * BASE)
        assert followers[0].told == [2 * BASE, 3 * BASE, 4 * BASE]
        assert followers[1].told == [3 * BASE, 4 * BASE]
        assert followers[2].told == [4 * BASE]

        # The older agent stops heartbeating; the followers keep their 2 s beat.
        old.beating = False
        async with asyncio.timeout(30):
            while True:
                now = await states(srv.admin)
                assert all(now[a.node_id] == "ready" for a in followers), now
                # The old node is lost after LOST without a beat, and the followers
                # were ready at every look through three pauses of 2 s (twice LOST).
                if now["old"] == "lost" and min(a.beats for a in followers) >= 3:
                    break
                await asyncio.sleep(0.1)

        # Once a follower stops too, its own (scaled) thresholds still age it.
        followers[2].beating = False
        async with asyncio.timeout(30):
            while True:
                if (await states(srv.admin))["n3"] != "ready":
                    break
                await asyncio.sleep(0.1)
    finally:
        for agent in (old, *followers):
            agent.close()
        with contextlib.suppress(Exception):
            await channel.close()
