"""The agent listener's gates: mTLS with node identity, and a standby's admission refusal.

Real grpc.aio servers on loopback with certificates made by `llmgw.pki` in a
temp folder; the test plays the agent with a raw stub, so it sees exactly the
status and metadata the server sends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from placement_fixtures import placements_fixture  # noqa: F401
from test_agentsvc_stream import register_message

from llmgw import pki
from llmgw.config import AgentTLSConfig
from llmgw.control.agentsvc import AgentListener, AgentListenerError, AgentServicer, serve_agents
from llmgw.control.agentsvc.servicer import REFUSED_METADATA_KEY, REFUSED_STANDBY
from llmgw.control.inventory import Inventory
from llmgw.control.placements import PlacementBook
from llmgw.proto import agent_pb2, agent_pb2_grpc

Call = grpc.aio.StreamStreamCall[agent_pb2.AgentMessage, agent_pb2.ServerMessage]
NOW = datetime.now(UTC)


@dataclass
class Certs:
    ca: Path
    server: pki.Issued
    node_a: pki.Issued
    foreign_a: pki.Issued  # node-a, from another CA

    def config(self) -> AgentTLSConfig:
        return AgentTLSConfig(cert=str(self.server.cert), key=str(self.server.key), ca=str(self.ca))


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    base = tmp_path_factory.mktemp("pki")
    pki.init_ca(base / "ca", now=NOW)
    pki.init_ca(base / "other", now=NOW)
    return Certs(
        ca=base / "ca" / pki.CA_CERT,
        server=pki.issue_server(base / "ca", ["127.0.0.1", "localhost"], now=NOW),
        node_a=pki.issue_node(base / "ca", "node-a", now=NOW),
        foreign_a=pki.issue_node(base / "other", "node-a", now=NOW),
    )


@dataclass
class Listener:
    listener: AgentListener
    inventory: Inventory
    admissions: list[str | None]


Factory = Callable[..., Awaitable[Listener]]


@pytest.fixture
async def listen(placements: PlacementBook) -> AsyncIterator[Factory]:
    started: list[AgentListener] = []

    async def start(
        *, tls: AgentTLSConfig | None, require_identity: bool, refusal: str | None = None
    ) -> Listener:
        loop = asyncio.get_running_loop()
        inventory = Inventory(
            clock=loop.time, wall_clock=lambda: datetime.now(UTC), unreachable_after=15.0,
            lost_after=60.0,
        )  # fmt: skip
        admissions: list[str | None] = []

        def admission() -> str | None:
            admissions.append(refusal)
            return refusal

        servicer = AgentServicer(
            inventory=inventory, placements=placements, heartbeat_interval=5.0,
            leader_id="server-1", server_version="9.9.9", command_timeout=5.0,
            require_identity=require_identity, admission=admission,
        )  # fmt: skip
        listener = await serve_agents(servicer=servicer, host="127.0.0.1", port=0, tls=tls)
        started.append(listener)
        return Listener(listener, inventory, admissions)

    yield start
    for listener in started:
        await listener.stop(0)


def channel(
    port: int, issued: pki.Issued | None, ca: Path, host: str = "127.0.0.1"
) -> grpc.aio.Channel:
    address = f"{host}:{port}"
    options = [("grpc.use_local_subchannel_pool", 1)]
    if issued is None:
        return grpc.aio.insecure_channel(address, options=options)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(),
        private_key=issued.key.read_bytes(),
        certificate_chain=issued.cert.read_bytes(),
    )
    return grpc.aio.secure_channel(address, credentials, options=options)


async def register(chan: grpc.aio.Channel, node_id: str) -> agent_pb2.ServerMessage:
    call: Call = agent_pb2_grpc.AgentServiceStub(chan).Connect()
    await call.write(agent_pb2.AgentMessage(register=register_message(node_id)))
    reply = await asyncio.wait_for(call.read(), 5)
    assert isinstance(reply, agent_pb2.ServerMessage)
    return reply


async def test_a_node_registers_under_its_certificate_name(listen: Factory, certs: Certs) -> None:
    served = await listen(tls=certs.config(), require_identity=True)
    async with channel(served.listener.port, certs.node_a, certs.ca) as chan:
        reply = await register(chan, "node-a")
        assert reply.WhichOneof("kind") == "registered"
        assert served.inventory.node("node-a").connected


async def test_a_node_claiming_another_id_is_refused_and_logged(
    listen: Factory, certs: Certs, caplog: pytest.LogCaptureFixture
) -> None:
    served = await listen(tls=certs.config(), require_identity=True)
    caplog.set_level(logging.WARNING, logger="llmgw.control.agentsvc")
    async with channel(served.listener.port, certs.node_a, certs.ca) as chan:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await register(chan, "node-b")
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    details = refused.value.details() or ""
    assert "certificate is for node 'node-a' but the agent registered as 'node-b'" in details
    assert "--node-id node-a" in details
    assert served.inventory.nodes() == []
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    message = warning.getMessage()
    assert "127.0.0.1" in message and "'node-a'" in message and "'node-b'" in message


async def test_identity_required_without_a_certificate_is_refused(
    listen: Factory, certs: Certs
) -> None:
    served = await listen(tls=None, require_identity=True)
    async with channel(served.listener.port, None, certs.ca) as chan:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await register(chan, "node-a")
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "--tls-ca/--tls-cert/--tls-key" in (refused.value.details() or "")
    assert served.inventory.nodes() == []


@pytest.mark.parametrize("who", ["plaintext", "foreign-ca", "server-cert"])
async def test_clients_without_a_certificate_from_the_ca_never_reach_the_servicer(
    listen: Factory, certs: Certs, who: str
) -> None:
    served = await listen(tls=certs.config(), require_identity=True)
    issued = {"plaintext": None, "foreign-ca": certs.foreign_a, "server-cert": certs.server}[who]
    async with channel(served.listener.port, issued, certs.ca) as chan:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await register(chan, "node-a")
    # The handshake fails; gRPC reports only that the socket closed.
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "Socket closed" in (refused.value.details() or "")
    assert served.admissions == []  # no stream was opened at all
    assert served.inventory.nodes() == []


async def test_a_standby_refuses_before_reading_and_says_why(listen: Factory, certs: Certs) -> None:
    why = "this server is a standby; the leader's agent listener is 10.0.0.1:9443"
    served = await listen(tls=None, require_identity=False, refusal=why)
    async with channel(served.listener.port, None, certs.ca) as chan:
        # The agent writes nothing: the refusal must come without a first message.
        call: Call = agent_pb2_grpc.AgentServiceStub(chan).Connect()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await asyncio.wait_for(call.read(), 5)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert refused.value.details() == why
    assert (REFUSED_METADATA_KEY, REFUSED_STANDBY) in tuple(refused.value.trailing_metadata() or ())
    assert served.admissions == [why]
    assert served.inventory.nodes() == []


async def test_an_admitted_stream_is_served(listen: Factory, certs: Certs) -> None:
    served = await listen(tls=None, require_identity=False, refusal=None)
    async with channel(served.listener.port, None, certs.ca) as chan:
        assert (await register(chan, "node-z")).WhichOneof("kind") == "registered"
    assert served.admissions == [None]


@pytest.mark.parametrize("field", ["cert", "key", "ca"])
async def test_a_missing_tls_file_names_its_field(
    listen: Factory, certs: Certs, field: str
) -> None:
    config = certs.config().model_copy(update={field: "/nonexistent/file.pem"})
    with pytest.raises(AgentListenerError) as failed:
        await listen(tls=config, require_identity=True)
    assert f"agent_tls.{field}: /nonexistent/file.pem: cannot read" in str(failed.value)


async def test_a_key_that_is_not_the_certificates_is_a_startup_error(
    listen: Factory, certs: Certs
) -> None:
    config = certs.config().model_copy(update={"key": str(certs.node_a.key)})
    with pytest.raises(AgentListenerError) as failed:
        await listen(tls=config, require_identity=True)
    assert "agent_tls.key" in str(failed.value)
    assert "does not belong to the certificate" in str(failed.value)


async def test_agents_keepalive_pings_are_welcome(listen: Factory, certs: Certs) -> None:
    """gRPC's default server policy would answer the third ping with GOAWAY too_many_pings."""
    served = await listen(tls=certs.config(), require_identity=True)
    options = [
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.keepalive_time_ms", 1200),
        ("grpc.keepalive_timeout_ms", 5000),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 1),
    ]
    credentials = grpc.ssl_channel_credentials(
        root_certificates=certs.ca.read_bytes(),
        private_key=certs.node_a.key.read_bytes(),
        certificate_chain=certs.node_a.cert.read_bytes(),
    )
    address = f"127.0.0.1:{served.listener.port}"
    async with grpc.aio.secure_channel(address, credentials, options=options) as chan:
        call: Call = agent_pb2_grpc.AgentServiceStub(chan).Connect()
        await call.write(agent_pb2.AgentMessage(register=register_message("node-a")))
        await asyncio.wait_for(call.read(), 5)
        # About four pings and no data either way; the stream must survive them.
        reading = asyncio.ensure_future(call.read())
        done, _ = await asyncio.wait({reading}, timeout=5)
        assert not done and not call.done()
        assert served.inventory.node("node-a").connected
        await call.done_writing()
        assert await asyncio.wait_for(reading, 5) is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK
