"""The agent service's metrics, over a real grpc.aio server on loopback with a test agent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import grpc
import pytest
from placement_fixtures import placements_fixture  # noqa: F401
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from llmgw.control.agentsvc import AgentListener, AgentServicer, serve_agents
from llmgw.control.inventory import Inventory
from llmgw.control.placements import PlacementBook
from llmgw.proto import agent_pb2, agent_pb2_grpc

Call = grpc.aio.StreamStreamCall[agent_pb2.AgentMessage, agent_pb2.ServerMessage]


@dataclass
class Served:
    listener: AgentListener
    inventory: Inventory
    registry: CollectorRegistry
    stub: agent_pb2_grpc.AgentServiceStub

    def count(self, kind: str) -> float | None:
        return self.registry.get_sample_value("llmgw_agent_message_seconds_count", {"kind": kind})

    def streams(self) -> float | None:
        return self.registry.get_sample_value("llmgw_agent_streams")


@pytest.fixture
async def served(placements: PlacementBook) -> AsyncIterator[Served]:
    loop = asyncio.get_running_loop()
    inventory = Inventory(
        clock=loop.time,
        wall_clock=lambda: datetime.now(UTC),
        unreachable_after=15.0,
        lost_after=60.0,
    )
    registry = CollectorRegistry()
    servicer = AgentServicer(
        inventory=inventory,
        placements=placements,
        heartbeat_interval=5.0,
        leader_id="server-1",
        server_version="9.9.9",
        command_timeout=5.0,
        registry=registry,
    )
    listener = await serve_agents(servicer=servicer, host="127.0.0.1", port=0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{listener.port}")
    try:
        yield Served(listener, inventory, registry, agent_pb2_grpc.AgentServiceStub(channel))
    finally:
        await channel.close()
        await listener.stop(0)


async def register(served: Served, node_id: str) -> Call:
    call: Call = served.stub.Connect()
    gpu = agent_pb2.Gpu(index=0, uuid="GPU-aaa", name="NVIDIA L40S", memory_total_bytes=48 << 30)
    await call.write(
        agent_pb2.AgentMessage(
            register=agent_pb2.Register(
                node_id=node_id,
                hostname=f"{node_id}.lab",
                hardware=agent_pb2.Hardware(gpus=[gpu], gpu_source="declared"),
                port_range_start=20000,
                port_range_end=20099,
            )
        )
    )
    reply = await asyncio.wait_for(call.read(), 5)
    assert reply.WhichOneof("kind") == "registered"
    return call


async def eventually(predicate: Callable[[], bool], what: str) -> None:
    for _ in range(500):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


async def test_a_heartbeat_is_timed_under_its_kind(served: Served) -> None:
    call = await register(served, "node-a")
    assert served.count("register") == 1
    assert served.count("heartbeat") == 0

    await call.write(
        agent_pb2.AgentMessage(
            heartbeat=agent_pb2.Heartbeat(
                gpus=[agent_pb2.GpuUsage(index=0, utilization_percent=87.5)], sequence=1
            )
        )
    )
    # Applying the heartbeat and timing it happen in one step, without an await between.
    await eventually(
        lambda: served.inventory.node("node-a").gpus[0].utilization == 87.5,
        "the heartbeat reached the inventory",
    )
    assert served.count("heartbeat") == 1
    seconds = served.registry.get_sample_value(
        "llmgw_agent_message_seconds_sum", {"kind": "heartbeat"}
    )
    assert seconds is not None
    assert 0 < seconds < 0.1
    # The smallest bucket is 10 µs, the largest finite one 100 ms.
    exposition = generate_latest(served.registry).decode()
    assert 'llmgw_agent_message_seconds_bucket{kind="heartbeat",le="1e-05"}' in exposition
    assert 'llmgw_agent_message_seconds_bucket{kind="heartbeat",le="0.1"} 1.0' in exposition
    await call.done_writing()


async def test_open_streams_are_read_at_scrape_time(served: Served) -> None:
    assert served.streams() == 0
    first = await register(served, "node-a")
    second = await register(served, "node-b")
    assert served.streams() == 2

    await first.done_writing()
    await eventually(lambda: served.streams() == 1, "the closed stream is no longer counted")
    assert served.inventory.node("node-b").state == "ready"
    await second.done_writing()
    await eventually(lambda: served.streams() == 0, "no stream is counted")


async def test_without_a_registry_nothing_is_registered(placements: PlacementBook) -> None:
    loop = asyncio.get_running_loop()
    inventory = Inventory(
        clock=loop.time,
        wall_clock=lambda: datetime.now(UTC),
        unreachable_after=15.0,
        lost_after=60.0,
    )
    # Two servicers without a registry must not clash on a shared default one.
    for _ in range(2):
        AgentServicer(
            inventory=inventory,
            placements=placements,
            heartbeat_interval=5.0,
            leader_id="server-1",
            server_version="9.9.9",
            command_timeout=5.0,
        )
    assert REGISTRY.get_sample_value("llmgw_agent_streams") is None
