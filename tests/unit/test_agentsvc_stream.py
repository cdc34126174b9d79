"""The agent service over a real grpc.aio server on loopback, with a test client as the agent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime

import grpc
import pytest
from placement_fixtures import place, placements_fixture  # noqa: F401

from llmgw.control.agentsvc import (
    AgentListener,
    AgentListenerError,
    AgentServicer,
    CommandFailed,
    CommandTimeout,
    NodeNotConnected,
    ShardSpec,
    serve_agents,
)
from llmgw.control.inventory import Inventory
from llmgw.control.placements import PlacementBook
from llmgw.proto import agent_pb2, agent_pb2_grpc

Call = grpc.aio.StreamStreamCall[agent_pb2.AgentMessage, agent_pb2.ServerMessage]


class Service:
    def __init__(
        self,
        listener: AgentListener,
        inventory: Inventory,
        channel: grpc.aio.Channel,
        placements: PlacementBook,
    ) -> None:
        self.placements = placements
        self.listener = listener
        self.servicer = listener.servicer
        self.inventory = inventory
        self.channel = channel
        self.stub = agent_pb2_grpc.AgentServiceStub(channel)

    def connect(self) -> Call:
        call: Call = self.stub.Connect()
        return call

    async def register(self, node_id: str = "node-a", **fields: object) -> Call:
        call = self.connect()
        await call.write(agent_pb2.AgentMessage(register=register_message(node_id, **fields)))
        reply = await asyncio.wait_for(call.read(), 5)
        assert reply.WhichOneof("kind") == "registered"
        return call


def register_message(node_id: str, **fields: object) -> agent_pb2.Register:
    message = agent_pb2.Register(
        node_id=node_id,
        hostname=f"{node_id}.lab",
        agent_version="0.1.0",
        hardware=agent_pb2.Hardware(
            gpus=[
                agent_pb2.Gpu(
                    index=0,
                    uuid="GPU-aaa",
                    name="NVIDIA L40S",
                    memory_total_bytes=48 << 30,
                    memory_free_bytes=47 << 30,
                ),
                agent_pb2.Gpu(
                    index=1,
                    uuid="GPU-bbb",
                    name="NVIDIA L40S",
                    memory_total_bytes=48 << 30,
                    memory_free_bytes=46 << 30,
                ),
            ],
            cpu_count=32,
            memory_total_bytes=256 << 30,
            weights_disk_free_bytes=900 << 30,
            gpu_source="nvml",
        ),
        labels={"zone": "a"},
        fabric={"ib-domain": "pod3"},
        port_range_start=20000,
        port_range_end=20099,
        weights_dir="/var/lib/llmgw/weights",
    )
    for name, value in fields.items():
        if isinstance(value, list):
            getattr(message, name).extend(value)
        else:
            setattr(message, name, value)
    return message


async def eventually(predicate: Callable[[], bool], what: str) -> None:
    for _ in range(500):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


ServiceFactory = Callable[..., Awaitable[Service]]


@pytest.fixture
async def make_service(placements: PlacementBook) -> AsyncIterator[ServiceFactory]:
    opened: list[Service] = []

    async def make(command_timeout: float = 5.0, **servicer_args: object) -> Service:
        loop = asyncio.get_running_loop()
        inventory = Inventory(
            clock=loop.time,
            wall_clock=lambda: datetime.now(UTC),
            unreachable_after=15.0,
            lost_after=60.0,
        )
        servicer = AgentServicer(
            inventory=inventory,
            placements=placements,
            heartbeat_interval=5.0,
            leader_id="server-1",
            server_version="9.9.9",
            command_timeout=command_timeout,
            **servicer_args,  # type: ignore[arg-type]
        )
        listener = await serve_agents(servicer=servicer, host="127.0.0.1", port=0)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{listener.port}")
        service = Service(listener, inventory, channel, placements)
        opened.append(service)
        return service

    yield make
    for service in opened:
        await service.channel.close()
        await service.listener.stop(0)


@pytest.fixture
async def service(make_service: ServiceFactory) -> Service:
    return await make_service()


SPEC = ShardSpec(
    shard_id="llama-8b-0",
    model="llama-8b",
    engine="vllm",
    weights="/var/lib/llmgw/weights/llama-8b",
    gpu_indices=(0, 1),
    port=20001,
    engine_args=("--max-model-len", "8192"),
    env={"VLLM_LOGGING_LEVEL": "INFO"},
    tensor_parallel_size=2,
)


async def test_register_answers_registered_and_fills_the_inventory(service: Service) -> None:
    call = service.connect()
    await call.write(agent_pb2.AgentMessage(register=register_message("node-a")))
    reply = await asyncio.wait_for(call.read(), 5)
    assert reply.registered.heartbeat_interval_seconds == 5.0
    assert reply.registered.leader_id == "server-1"
    assert reply.registered.server_version == "9.9.9"

    node = service.inventory.node("node-a")
    assert node.connected and node.state == "ready"
    assert node.hostname == "node-a.lab"
    assert [(g.index, g.uuid, g.name, g.memory_total) for g in node.gpus] == [
        (0, "GPU-aaa", "NVIDIA L40S", 48 << 30),
        (1, "GPU-bbb", "NVIDIA L40S", 48 << 30),
    ]
    assert node.fabric == {"ib-domain": "pod3"}
    assert node.labels == {"zone": "a"}
    assert node.port_range == (20000, 20099)
    assert node.gpu_source == "nvml"
    assert service.servicer.connected() == ["node-a"]
    await call.done_writing()


async def test_reports_reach_the_inventory(service: Service) -> None:
    call = await service.register()
    spec = ShardSpec(shard_id="s1", model="llama-8b", engine="vllm", weights="w", port=20001)
    await place(service.placements, "node-a", spec)
    await call.write(
        agent_pb2.AgentMessage(
            heartbeat=agent_pb2.Heartbeat(
                gpus=[
                    agent_pb2.GpuUsage(
                        index=1,
                        utilization_percent=87.5,
                        memory_used_bytes=40 << 30,
                        memory_free_bytes=8 << 30,
                    )
                ],
                sequence=1,
            )
        )
    )
    await call.write(
        agent_pb2.AgentMessage(
            shard_status=agent_pb2.ShardStatus(
                shard_id="s1",
                model="llama-8b",
                state=agent_pb2.SHARD_STATE_FAILED,
                message="engine exited",
                pid=4242,
                output_tail=["CUDA out of memory"],
                exit_code=1,
                since_unix=1_700_000_000.0,
            )
        )
    )
    await eventually(
        lambda: "s1" in service.inventory.node("node-a").shards, "shard status recorded"
    )
    node = service.inventory.node("node-a")
    assert node.gpus[1].utilization == 87.5 and node.gpus[1].memory_used == 40 << 30
    shard = node.shards["s1"]
    assert shard.state == "failed" and shard.exit_code == 1 and shard.pid == 4242
    assert shard.output_tail == ("CUDA out of memory",)
    assert shard.since == datetime.fromtimestamp(1_700_000_000, UTC)
    await call.done_writing()


async def test_commands_arrive_and_their_results_come_back(service: Service) -> None:
    call = await service.register()
    started = asyncio.create_task(service.servicer.start_shard("node-a", SPEC))
    command = await asyncio.wait_for(call.read(), 5)
    assert command.WhichOneof("kind") == "start_shard"
    spec = command.start_shard.spec
    assert (spec.shard_id, spec.model, spec.engine, list(spec.gpu_indices), spec.port) == (
        "llama-8b-0",
        "llama-8b",
        "vllm",
        [0, 1],
        20001,
    )
    assert list(spec.engine_args) == ["--max-model-len", "8192"]
    assert dict(spec.env) == {"VLLM_LOGGING_LEVEL": "INFO"}
    assert spec.tensor_parallel_size == 2
    assert command.command_id
    await call.write(
        agent_pb2.AgentMessage(
            command_result=agent_pb2.CommandResult(command_id=command.command_id, ok=True)
        )
    )
    assert await asyncio.wait_for(started, 5) is None

    removed = asyncio.create_task(service.servicer.remove_weights("node-a", "/etc/passwd"))
    command = await asyncio.wait_for(call.read(), 5)
    assert command.remove_weights.path == "/etc/passwd"
    await call.write(
        agent_pb2.AgentMessage(
            command_result=agent_pb2.CommandResult(
                command_id=command.command_id,
                ok=False,
                error="/etc/passwd is outside the weights directory",
            )
        )
    )
    with pytest.raises(CommandFailed) as failed:
        await asyncio.wait_for(removed, 5)
    assert failed.value.error == "/etc/passwd is outside the weights directory"
    assert "outside the weights directory" in str(failed.value)
    assert not failed.value.retryable

    stopped = asyncio.create_task(service.servicer.stop_shard("node-a", "llama-8b-0", 10.0))
    drained = asyncio.create_task(service.servicer.drain_shard("node-a", "llama-8b-1", 20.0))
    first, second = await asyncio.wait_for(call.read(), 5), await asyncio.wait_for(call.read(), 5)
    assert (first.stop_shard.shard_id, first.stop_shard.grace_seconds) == ("llama-8b-0", 10.0)
    assert (second.drain_shard.shard_id, second.drain_shard.grace_seconds) == ("llama-8b-1", 20.0)
    # Answers may come in any order; each is matched by its command id.
    for command in (second, first):
        await call.write(
            agent_pb2.AgentMessage(
                command_result=agent_pb2.CommandResult(command_id=command.command_id, ok=True)
            )
        )
    await asyncio.wait_for(asyncio.gather(stopped, drained), 5)
    await call.done_writing()


async def test_a_command_nobody_answers_times_out(make_service: ServiceFactory) -> None:
    service = await make_service(command_timeout=0.2)
    call = await service.register()
    with pytest.raises(CommandTimeout) as timed_out:
        await service.servicer.remove_weights("node-a", "/var/lib/llmgw/weights/old")
    assert timed_out.value.retryable
    late = await asyncio.wait_for(call.read(), 5)
    # A late answer is ignored, and the stream keeps working.
    await call.write(
        agent_pb2.AgentMessage(
            command_result=agent_pb2.CommandResult(command_id=late.command_id, ok=True)
        )
    )
    await call.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(sequence=1)))
    await call.done_writing()
    await eventually(lambda: not service.inventory.node("node-a").connected, "disconnected")


async def test_unknown_nodes_are_not_connected(service: Service) -> None:
    with pytest.raises(NodeNotConnected) as not_connected:
        await service.servicer.start_shard("node-zz", SPEC)
    assert "node-zz" in str(not_connected.value)
    assert not_connected.value.retryable


@pytest.mark.parametrize(
    "first",
    [
        agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(sequence=1)),
        agent_pb2.AgentMessage(),
    ],
    ids=["heartbeat", "empty"],
)
async def test_the_first_message_must_be_register(
    service: Service, first: agent_pb2.AgentMessage
) -> None:
    call = service.connect()
    await call.write(first)
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await asyncio.wait_for(call.read(), 5)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "first message on the agent stream must be Register" in (error.value.details() or "")
    assert service.inventory.nodes() == []


async def test_a_register_without_node_id_is_refused(service: Service) -> None:
    call = service.connect()
    await call.write(agent_pb2.AgentMessage(register=register_message("")))
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await asyncio.wait_for(call.read(), 5)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "node_id is empty" in (error.value.details() or "")


async def test_closing_the_stream_disconnects_the_node_and_fails_waiting_commands(
    service: Service,
) -> None:
    call = await service.register()
    waiting = asyncio.create_task(service.servicer.start_shard("node-a", SPEC))
    await asyncio.wait_for(call.read(), 5)
    await call.done_writing()
    with pytest.raises(NodeNotConnected):
        await asyncio.wait_for(waiting, 5)
    await eventually(lambda: not service.inventory.node("node-a").connected, "node disconnected")
    assert await call.code() == grpc.StatusCode.OK
    assert service.servicer.connected() == []
    with pytest.raises(NodeNotConnected):
        await service.servicer.stop_shard("node-a", "llama-8b-0", 1.0)


async def test_a_cancelled_stream_disconnects_the_node(service: Service) -> None:
    call = await service.register()
    call.cancel()
    await eventually(lambda: not service.inventory.node("node-a").connected, "node disconnected")
    assert service.servicer.connected() == []


async def test_a_second_plaintext_stream_for_a_live_node_is_refused(service: Service) -> None:
    # Without certificates nothing says the second agent is the same node: the
    # live one keeps its stream (a reconnect with the node's key replaces it:
    # test_node_identity.py).
    live = await service.register()
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await service.register()
    assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS
    details = refused.value.details() or ""
    assert "node id 'node-a' is in use" in details and "--node-id" in details
    assert service.inventory.node("node-a").connected
    assert service.servicer.connected() == ["node-a"]

    started = asyncio.create_task(service.servicer.start_shard("node-a", SPEC))
    command = await asyncio.wait_for(live.read(), 5)
    await live.write(
        agent_pb2.AgentMessage(
            command_result=agent_pb2.CommandResult(command_id=command.command_id, ok=True)
        )
    )
    await asyncio.wait_for(started, 5)
    await live.done_writing()


async def test_reported_running_shards_are_adopted(service: Service) -> None:
    await place(service.placements, "node-a", SPEC)
    running = agent_pb2.ShardStatus(
        shard_id="llama-8b-0",
        model="llama-8b",
        state=agent_pb2.SHARD_STATE_READY,
        pid=777,
        endpoint_url="http://10.0.0.5:20001",
        spec=agent_pb2.ShardSpec(
            shard_id="llama-8b-0", model="llama-8b", engine="vllm", gpu_indices=[0, 1], port=20001
        ),
    )
    call = await service.register(running_shards=[running], advertise_host="10.0.0.5")
    node = service.inventory.node("node-a")
    assert list(node.shards) == ["llama-8b-0"]
    shard = node.shards["llama-8b-0"]
    assert (shard.state, shard.engine, shard.gpu_indices, shard.endpoint_url) == (
        "ready",
        "vllm",
        (0, 1),
        "http://10.0.0.5:20001",
    )
    # The spec is the one the leader recorded, not the one the node sent.
    assert shard.spec == SPEC
    await call.done_writing()


async def test_stopping_the_listener_ends_streams(service: Service) -> None:
    call = await service.register()
    await service.listener.stop(1.0)
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        await asyncio.wait_for(call.read(), 5)
    assert ended.value.code() in (grpc.StatusCode.ABORTED, grpc.StatusCode.UNAVAILABLE)
    assert not service.inventory.node("node-a").connected


async def test_a_protocol_violation_mid_stream_ends_it(service: Service) -> None:
    call = await service.register()
    await call.write(
        agent_pb2.AgentMessage(shard_status=agent_pb2.ShardStatus(shard_id="s1", model="m"))
    )
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await asyncio.wait_for(call.read(), 5)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "has no state" in (error.value.details() or "")
    await eventually(lambda: not service.inventory.node("node-a").connected, "node disconnected")

    again = await service.register()
    await again.write(agent_pb2.AgentMessage(register=register_message("node-a")))
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await asyncio.wait_for(again.read(), 5)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "only valid as the first message" in (error.value.details() or "")


async def test_a_port_in_use_is_a_clear_startup_error(service: Service) -> None:
    with pytest.raises(AgentListenerError) as error:
        await serve_agents(servicer=service.servicer, host="127.0.0.1", port=service.listener.port)
    assert f"cannot listen for agents on 127.0.0.1:{service.listener.port}" in str(error.value)


@pytest.mark.parametrize(
    ("node_id", "says"),
    [
        ("node-a\n", "without '/', whitespace or control characters"),
        ("node/a", "without '/'"),
        ("node a", "whitespace"),
        ("node-\x1ba", "control characters"),
    ],
)
async def test_a_register_under_a_bad_node_id_is_refused_naming_the_rule(
    service: Service, node_id: str, says: str
) -> None:
    call = service.connect()
    await call.write(agent_pb2.AgentMessage(register=register_message(node_id)))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await asyncio.wait_for(call.read(), 5)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in (refused.value.details() or "")
    assert "--node-id" in (refused.value.details() or "")
    assert service.inventory.nodes() == []


async def test_a_register_under_one_of_the_server_s_certificate_names_is_refused(
    make_service: ServiceFactory,
) -> None:
    service = await make_service(reserved_names=lambda: ("ctl-1.example", "127.0.0.1"))
    for node_id in ("CTL-1.example", "ctl-1.example.", "127.0.0.1"):
        call = service.connect()
        await call.write(agent_pb2.AgentMessage(register=register_message(node_id)))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await asyncio.wait_for(call.read(), 5)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "one of this server's own certificate names" in (refused.value.details() or "")
    assert service.inventory.nodes() == []
    await service.register("gpu-1")
    assert [n.id for n in service.inventory.nodes()] == ["gpu-1"]


def ready_status(shard_id: str, model: str, url: str, **fields: object) -> agent_pb2.ShardStatus:
    return agent_pb2.ShardStatus(
        shard_id=shard_id, model=model, state=agent_pb2.SHARD_STATE_READY, endpoint_url=url,
        **fields,  # type: ignore[arg-type]
    )  # fmt: skip


async def test_shards_never_placed_on_the_node_are_refused_stopped_and_noted(
    make_service: ServiceFactory,
) -> None:
    events: list[tuple[str, str]] = []
    service = await make_service(record_event=lambda node, message: events.append((node, message)))
    running = [
        ready_status("x1", "llama-8b", "http://10.0.0.5:20001"),
        agent_pb2.ShardStatus(shard_id="x2", model="llama-8b", state=agent_pb2.SHARD_STATE_FAILED),
    ]
    call = await service.register(running_shards=running, advertise_host="10.0.0.5")
    assert service.inventory.node("node-a").shards == {}
    # After Registered: a stop for the running one; nothing runs for the failed one.
    stop = await asyncio.wait_for(call.read(), 5)
    assert (stop.stop_shard.shard_id, stop.stop_shard.grace_seconds) == ("x1", 5.0)
    assert stop.command_id
    await call.write(
        agent_pb2.AgentMessage(
            command_result=agent_pb2.CommandResult(command_id=stop.command_id, ok=True)
        )
    )
    # Later, in a ShardStatus: the same.
    await call.write(
        agent_pb2.AgentMessage(shard_status=ready_status("x3", "llama-8b", "http://10.0.0.5:1"))
    )
    again = await asyncio.wait_for(call.read(), 5)
    assert again.stop_shard.shard_id == "x3"
    assert service.inventory.node("node-a").shards == {}
    messages = [m for node, m in events if node == "node-a"]
    assert not any("x2" in m for m in messages)  # nothing runs: nothing to say
    for shard in ("x1", "x3"):
        assert (
            f"node node-a reported shard {shard} of model llama-8b that was never placed there; "
            "not served"
        ) in messages
    await call.done_writing()


async def test_a_flood_of_invented_shards_notes_a_bounded_number_of_events(
    make_service: ServiceFactory,
) -> None:
    events: list[tuple[str, str]] = []
    service = await make_service(record_event=lambda node, message: events.append((node, message)))
    call = await service.register()
    registered_at = service.inventory.node("node-a").last_heartbeat
    for i in range(100):
        await call.write(
            agent_pb2.AgentMessage(
                shard_status=agent_pb2.ShardStatus(
                    shard_id=f"x{i}", model="m", state=agent_pb2.SHARD_STATE_LOADING
                )
            )
        )
    await call.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(sequence=1)))
    # The heartbeat is read after the hundred reports.
    await eventually(
        lambda: service.inventory.node("node-a").last_heartbeat != registered_at,
        "every report to be read",
    )
    assert len(events) == 20
    assert "the last such event about node node-a" in events[-1][1]
    await call.done_writing()


async def test_a_register_waits_for_the_term_s_placement_records(
    make_service: ServiceFactory,
) -> None:
    service = await make_service()
    await place(service.placements, "node-a", SPEC)
    epoch = 1
    service.placements.end_term()  # a server that has just taken over
    call = service.connect()
    await call.write(
        agent_pb2.AgentMessage(
            register=register_message(
                "node-a",
                advertise_host="10.0.0.5",
                running_shards=[ready_status("llama-8b-0", "llama-8b", "http://10.0.0.5:20001")],
            )
        )
    )
    reading = asyncio.create_task(call.read())
    await asyncio.sleep(0.05)
    assert not reading.done()  # no Registered before the records are read
    await service.placements.start_term(epoch)
    reply = await asyncio.wait_for(reading, 5)
    assert reply.HasField("registered")
    assert list(service.inventory.node("node-a").shards) == ["llama-8b-0"]
    await call.done_writing()
