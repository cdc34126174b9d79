"""A node is its certificate's key, and one node has one stream.

A real grpc.aio agent listener with mTLS, a real SQLite store for the node id
bindings, certificates from `llmgw.pki` in a temp folder; the test plays the
agents with raw stubs (to see exactly the status the server sends), and, for
the backoff, runs the agent's real connection loop in injected time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
import test_agent_connection
from cryptography.hazmat.primitives import serialization
from placement_fixtures import placements_fixture  # noqa: F401
from prometheus_client import CollectorRegistry
from test_agent_connection import Servers, connection, run_until_stopped
from test_agent_failover import FreezingProxy
from test_agentsvc_stream import register_message

from llmgw import pki
from llmgw.agent.refusal import explain
from llmgw.config import AgentTLSConfig
from llmgw.control.agentsvc import AgentListener, AgentServicer, serve_agents
from llmgw.control.agentsvc.convert import shard_spec
from llmgw.control.agentsvc.identity import (
    EVENT_REPEAT_SECONDS,
    REPLACE_LIMIT,
    REPLACE_WINDOW_SECONDS,
)
from llmgw.control.inventory import Inventory
from llmgw.control.placements import PlacementBook
from llmgw.pki.keyhash import certificate_key_hash, public_key_hash
from llmgw.proto import agent_pb2, agent_pb2_grpc
from llmgw.store import Store, open_store, store_url

Call = grpc.aio.StreamStreamCall[agent_pb2.AgentMessage, agent_pb2.ServerMessage]
NOW = datetime.now(UTC)
HEARTBEAT = 5.0
servers = test_agent_connection.servers  # the fixture


@dataclass
class Certs:
    ca: Path
    server: pki.Issued
    node_a: pki.Issued
    node_a_again: pki.Issued  # node-a, another key (a second machine, or a re-issue)
    node_b: pki.Issued

    def config(self) -> AgentTLSConfig:
        return AgentTLSConfig(cert=str(self.server.cert), key=str(self.server.key), ca=str(self.ca))


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    base = tmp_path_factory.mktemp("pki")
    ca = base / "ca"
    pki.init_ca(ca, now=NOW)
    (base / "again").mkdir()
    return Certs(
        ca=ca / pki.CA_CERT,
        server=pki.issue_server(ca, ["127.0.0.1", "localhost"], now=NOW),
        node_a=pki.issue_node(ca, "node-a", now=NOW),
        node_a_again=pki.issue_node(ca, "node-a", now=NOW, out_dir=base / "again"),
        node_b=pki.issue_node(ca, "node-b", now=NOW),
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Served:
    listener: AgentListener
    servicer: AgentServicer
    inventory: Inventory
    store: Store
    registry: CollectorRegistry
    clock: Clock
    events: list[tuple[str, str]] = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.listener.port

    def registers(self, outcome: str) -> float:
        value = self.registry.get_sample_value("llmgw_agent_registers_total", {"outcome": outcome})
        return value or 0.0


Factory = Callable[..., Awaitable[Served]]


@pytest.fixture
async def serve(tmp_path: Path, certs: Certs, placements: PlacementBook) -> AsyncIterator[Factory]:
    started: list[Served] = []

    async def start(
        *, tls: bool = True, migrated: bool = True, ping_interval: float | None = 10.0
    ) -> Served:
        store = await open_store(store_url(tmp_path / f"data-{len(started)}", None))
        if migrated:
            await store.upgrade()
        loop = asyncio.get_running_loop()
        inventory = Inventory(
            clock=loop.time, wall_clock=lambda: datetime.now(UTC), unreachable_after=15.0,
            lost_after=60.0,
        )  # fmt: skip
        registry = CollectorRegistry()
        clock = Clock()
        events: list[tuple[str, str]] = []
        servicer = AgentServicer(
            inventory=inventory, placements=placements, heartbeat_interval=HEARTBEAT,
            leader_id="server-1",
            server_version="9.9.9", command_timeout=5.0, registry=registry,
            require_identity=tls, identities=store.nodeids,
            record_event=lambda node, message: events.append((node, message)), clock=clock,
        )  # fmt: skip
        listener = await serve_agents(
            servicer=servicer,
            host="127.0.0.1",
            port=0,
            tls=certs.config() if tls else None,
            ping_interval=ping_interval,
        )
        served = Served(listener, servicer, inventory, store, registry, clock, events)
        started.append(served)
        return served

    yield start
    for served in started:
        await served.listener.stop(0)
        await served.store.close()


def channel(port: int, issued: pki.Issued | None, ca: Path) -> grpc.aio.Channel:
    address = f"127.0.0.1:{port}"
    options = [("grpc.use_local_subchannel_pool", 1)]
    if issued is None:
        return grpc.aio.insecure_channel(address, options=options)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(),
        private_key=issued.key.read_bytes(),
        certificate_chain=issued.cert.read_bytes(),
    )
    return grpc.aio.secure_channel(address, credentials, options=options)


async def register(chan: grpc.aio.Channel, node_id: str) -> Call:
    call: Call = agent_pb2_grpc.AgentServiceStub(chan).Connect()
    await call.write(agent_pb2.AgentMessage(register=register_message(node_id)))
    reply = await asyncio.wait_for(call.read(), 10)
    assert isinstance(reply, agent_pb2.ServerMessage)
    assert reply.WhichOneof("kind") == "registered"
    return call


async def refused(chan: grpc.aio.Channel, node_id: str) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await register(chan, node_id)
    return caught.value


async def still_serves(served: Served, call: Call, node_id: str) -> None:
    """The node's stream carries a command and its answer."""
    spec = agent_pb2.ShardSpec(shard_id="m-1", model="m", engine="sim", gpu_indices=[0], port=1)
    started = asyncio.create_task(served.servicer.start_shard(node_id, shard_spec(spec)))
    command = await asyncio.wait_for(call.read(), 10)
    assert isinstance(command, agent_pb2.ServerMessage)
    assert command.WhichOneof("kind") == "start_shard"
    await call.write(
        agent_pb2.AgentMessage(
            command_result=agent_pb2.CommandResult(command_id=command.command_id, ok=True)
        )
    )
    await asyncio.wait_for(started, 10)


def key_of(issued: pki.Issued) -> str:
    return certificate_key_hash(issued.cert.read_bytes())


async def test_another_certificate_for_a_connected_node_id_is_refused_and_the_node_keeps_serving(
    serve: Factory, certs: Certs, caplog: pytest.LogCaptureFixture
) -> None:
    served = await serve()
    caplog.set_level(logging.WARNING, logger="llmgw.control.agentsvc")
    async with (
        channel(served.port, certs.node_a, certs.ca) as real,
        channel(served.port, certs.node_a_again, certs.ca) as impostor,
    ):
        live = await register(real, "node-a")
        binding = await served.store.nodeids.binding("node-a")
        assert binding is not None and binding.key_hash == key_of(certs.node_a)

        error = await refused(impostor, "node-a")
        assert error.code() == grpc.StatusCode.ALREADY_EXISTS
        details = error.details() or ""
        assert "node id 'node-a' belongs to another certificate" in details
        assert f"key sha256:{key_of(certs.node_a)[:16]}" in details
        assert "--node-id NAME" in details and "llmgw nodes remove node-a" in details

        # The real node: still connected, its stream still carries commands.
        assert served.servicer.connected() == ["node-a"]
        assert served.inventory.node("node-a").connected
        await still_serves(served, live, "node-a")
        await live.done_writing()
    [(node, message)] = served.events
    assert node == "node-a"
    assert "registering as node-a: the id belongs to another certificate" in message
    assert "the node keeps its id" in message
    assert served.registers("taken") == 1 and served.registers("accepted") == 1
    assert any("belongs to another certificate" in r.getMessage() for r in caplog.records)


async def test_the_id_stays_with_its_first_key_while_the_node_is_away(
    serve: Factory, certs: Certs
) -> None:
    served = await serve()
    async with channel(served.port, certs.node_a, certs.ca) as real:
        live = await register(real, "node-a")
        await live.done_writing()
        await asyncio.wait_for(live.code(), 10)
    async with channel(served.port, certs.node_a_again, certs.ca) as impostor:
        error = await refused(impostor, "node-a")
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS
    assert served.inventory.node("node-a").connected is False


async def test_the_same_certificate_reconnecting_replaces_its_old_stream(
    serve: Factory, certs: Certs
) -> None:
    served = await serve()
    async with (
        channel(served.port, certs.node_a, certs.ca) as first,
        channel(served.port, certs.node_a, certs.ca) as second,
    ):
        old = await register(first, "node-a")
        new = await register(second, "node-a")
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await asyncio.wait_for(old.read(), 10)
        assert ended.value.code() == grpc.StatusCode.ABORTED
        assert "replaced by a newer stream" in (ended.value.details() or "")
        assert served.servicer.connected() == ["node-a"]
        await still_serves(served, new, "node-a")
        await new.done_writing()
    assert served.registers("reconnected") == 1
    assert served.events == []


async def test_two_agents_sharing_one_certificate_stop_replacing_each_other(
    serve: Factory, certs: Certs
) -> None:
    # A copied state directory: both machines hold node-a's key. Each Register
    # would close the other's stream; past a few in a row the live one stays.
    served = await serve()
    calls: list[Call] = []
    async with channel(served.port, certs.node_a, certs.ca) as chan:
        for _ in range(1 + REPLACE_LIMIT):
            calls.append(await register(chan, "node-a"))
        error = await refused(chan, "node-a")
        assert error.code() == grpc.StatusCode.ALREADY_EXISTS
        details = error.details() or ""
        assert "two agents share this node's certificate" in details
        assert "--node-id NAME" in details
        live = calls[-1]
        await still_serves(served, live, "node-a")
        # Later on, a reconnect replaces the stream again.
        served.clock.now += REPLACE_WINDOW_SECONDS
        again = await register(chan, "node-a")
        await again.done_writing()
    assert served.registers("reconnected") == REPLACE_LIMIT + 1
    assert served.registers("in_use") == 1
    [(node, message)] = served.events
    assert node == "node-a" and "two machines share its certificate" in message


async def test_a_revoked_key_is_refused_and_a_new_key_takes_the_id(
    serve: Factory, certs: Certs
) -> None:
    served = await serve()
    async with channel(served.port, certs.node_a, certs.ca) as chan:
        live = await register(chan, "node-a")
        await live.done_writing()
        await asyncio.wait_for(live.code(), 10)
        await served.store.nodeids.revoke("node-a", now=NOW, reason="stolen laptop")
        error = await refused(chan, "node-a")
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    details = error.details() or ""
    assert "node node-a's certificate was revoked (llmgw nodes remove)" in details
    assert "stolen laptop" in details and "join again with a new token" in details
    assert served.registers("revoked") == 1
    # The node joined again: its new key takes the id.
    async with channel(served.port, certs.node_a_again, certs.ca) as rejoined:
        call = await register(rejoined, "node-a")
        await call.done_writing()
    binding = await served.store.nodeids.binding("node-a")
    assert binding is not None and binding.key_hash == key_of(certs.node_a_again)


async def test_a_plaintext_register_for_a_connected_node_is_refused_naming_the_live_peer(
    serve: Factory, certs: Certs
) -> None:
    served = await serve(tls=False)
    async with (
        channel(served.port, None, certs.ca) as first,
        channel(served.port, None, certs.ca) as second,
    ):
        live = await register(first, "node-a")
        for _ in range(3):
            error = await refused(second, "node-a")
            assert error.code() == grpc.StatusCode.ALREADY_EXISTS
        details = error.details() or ""
        assert (
            "node id 'node-a' is in use: an agent is connected under it from ipv4:127.0.0.1:"
            in (details)
        )
        assert "--node-id NAME" in details
        await still_serves(served, live, "node-a")
        await live.done_writing()
    # Three refusals, one event: an agent retrying does not flood the event list.
    assert served.registers("in_use") == 3
    [(node, message)] = served.events
    assert node == "node-a" and "the node is connected from ipv4:127.0.0.1:" in message
    # Plaintext streams claim nothing in the store.
    assert await served.store.nodeids.bindings() == []


async def test_refusal_events_repeat_after_a_while(serve: Factory, certs: Certs) -> None:
    served = await serve(tls=False)
    async with (
        channel(served.port, None, certs.ca) as first,
        channel(served.port, None, certs.ca) as second,
    ):
        live = await register(first, "node-a")
        await refused(second, "node-a")
        # Time moves on, and the live node heartbeats (so its stream is not silent).
        served.clock.now += EVENT_REPEAT_SECONDS
        before = served.inventory.node("node-a").last_heartbeat
        await live.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(sequence=1)))
        for _ in range(500):
            if served.inventory.node("node-a").last_heartbeat != before:
                break
            await asyncio.sleep(0.02)
        await refused(second, "node-a")
        await live.done_writing()
    assert len(served.events) == 2


async def test_a_silent_stream_does_not_keep_its_node_id(serve: Factory, certs: Certs) -> None:
    # A host that vanished leaves its stream open until keepalive notices; a
    # stream silent for three heartbeats is dead, and the node's restart gets in.
    served = await serve(tls=False)
    async with (
        channel(served.port, None, certs.ca) as first,
        channel(served.port, None, certs.ca) as second,
    ):
        old = await register(first, "node-a")
        served.clock.now += 3 * HEARTBEAT
        new = await register(second, "node-a")
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await asyncio.wait_for(old.read(), 10)
        assert ended.value.code() == grpc.StatusCode.ABORTED
        await still_serves(served, new, "node-a")
        await new.done_writing()
    assert served.registers("reconnected") == 1


async def test_the_servers_pings_end_the_stream_of_a_host_that_vanished(
    serve: Factory, certs: Certs
) -> None:
    # The host stops answering without closing TCP (a relay that holds every byte):
    # only the server's keepalive ping, unanswered for its timeout, ends the stream.
    served = await serve(tls=False, ping_interval=1.0)
    relay = FreezingProxy(served.port)
    address = await relay.start()
    try:
        async with channel(int(address.rsplit(":", 1)[1]), None, certs.ca) as chan:
            call = await register(chan, "node-a")
            assert served.inventory.node("node-a").connected
            relay.frozen.set()
            for _ in range(3000):  # the ping's timeout is 10 s; wait at most 60 s
                if not served.inventory.node("node-a").connected:
                    break
                await asyncio.sleep(0.02)
            assert not served.inventory.node("node-a").connected
            call.cancel()
    finally:
        await relay.close()


async def test_a_store_that_cannot_answer_refuses_with_unavailable(
    serve: Factory, certs: Certs
) -> None:
    served = await serve(migrated=False)
    async with channel(served.port, certs.node_a, certs.ca) as chan:
        error = await refused(chan, "node-a")
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "could not check node 'node-a'" in (error.details() or "")
    assert served.inventory.nodes() == []
    assert served.registers("unavailable") == 1


async def test_the_agent_backs_off_while_its_node_id_is_in_use(
    serve: Factory, certs: Certs, servers: Servers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    served = await serve(tls=False)
    # A standby next to the leader: its short retry must not apply to an id refusal.
    standby, _ = await servers.add("standby", lambda n: "standby")
    caplog.set_level(logging.WARNING, logger="llmgw.agent.connection")
    async with channel(served.port, None, certs.ca) as chan:
        live = await register(chan, "n1")  # the agent under test registers as n1
        await run_until_stopped(
            connection([f"127.0.0.1:{served.port}", standby], servers.events, tmp_path, sleeps=4)
        )
        await live.done_writing()
    # The Ceiling RNG draws the top of each full-jitter interval: the delays grow.
    sleeps = [e for e in servers.events if e.startswith("sleep")]
    assert sleeps == ["sleep 0.5", "sleep 1", "sleep 2", "sleep 4"]
    assert served.registers("in_use") == 4
    refusals = [
        r.getMessage() for r in caplog.records if "refused this agent's node id" in r.getMessage()
    ]
    assert len(refusals) == 4
    assert "node id 'n1' is in use" in refusals[0] and "--node-id" in refusals[0]


def test_a_node_id_refusal_is_explained_with_the_flag() -> None:
    plain = explain("ctl:9443", grpc.StatusCode.ALREADY_EXISTS, "in use", tls=False, standby=False)
    assert plain.notable
    assert plain.message == (
        "the server at ctl:9443 refused this agent's node id: in use; give this agent a node id "
        "of its own with --node-id NAME"
    )
    named = explain(
        "ctl:9443", grpc.StatusCode.ALREADY_EXISTS, "set --node-id X", tls=True, standby=False
    )
    assert named.message.endswith("set --node-id X")


def test_the_key_hash_is_the_keys_not_the_certificates(certs: Certs) -> None:
    key = serialization.load_pem_private_key(certs.node_a.key.read_bytes(), password=None)
    assert key_of(certs.node_a) == public_key_hash(key.public_key())
    assert len(key_of(certs.node_a)) == 64
    assert key_of(certs.node_a) != key_of(certs.node_a_again)
    with pytest.raises(pki.PkiInputError, match="not a PEM certificate"):
        certificate_key_hash(b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
