"""The agent's dial loop across several servers: order, refusals, TLS mismatches, a frozen server.

Builds on the harness of test_agent_connection.py (real grpc.aio servers on
loopback, injected sleep, the Ceiling RNG). Certificates come from `llmgw.pki`
in a temp folder. Each refusal must be a warning that says what happened and
what to do, and must move the agent on to the next address at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
import test_agent_connection
from test_agent_connection import Servers, connection, run_until_stopped

from llmgw import pki
from llmgw.agent.settings import ConnectionSettings

NOW = datetime.now(UTC)
servers = test_agent_connection.servers  # the fixture


@dataclass
class Certs:
    ca_dir: Path
    agent: pki.TlsMaterial  # node n1, from the CA
    foreign_agent: pki.TlsMaterial  # node n1, from another CA (trusting the right one)
    server: grpc.ServerCredentials  # 127.0.0.1 and localhost, from the CA
    foreign_server: grpc.ServerCredentials  # 127.0.0.1, from another CA
    ip_only_server: grpc.ServerCredentials  # 127.0.0.1 only, from the CA


def credentials(issued: pki.Issued, ca: Path) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials(
        [(issued.key.read_bytes(), issued.cert.read_bytes())],
        root_certificates=ca.read_bytes(),
        require_client_auth=True,
    )


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    base = tmp_path_factory.mktemp("pki")
    ca, other = base / "ca", base / "other"
    pki.init_ca(ca, now=NOW)
    pki.init_ca(other, now=NOW)
    node = pki.issue_node(ca, "n1", now=NOW)
    foreign = pki.issue_node(other, "n1", now=NOW)
    return Certs(
        ca_dir=ca,
        agent=pki.load_tls_material(cert=node.cert, key=node.key, ca=ca / pki.CA_CERT),
        foreign_agent=pki.load_tls_material(
            cert=foreign.cert, key=foreign.key, ca=ca / pki.CA_CERT
        ),
        server=credentials(
            pki.issue_server(ca, ["127.0.0.1", "localhost"], now=NOW), ca / pki.CA_CERT
        ),
        foreign_server=credentials(
            pki.issue_server(other, ["127.0.0.1"], now=NOW), other / pki.CA_CERT
        ),
        ip_only_server=credentials(
            pki.issue_server(ca, ["127.0.0.1"], now=NOW, out_dir=base / "ip"), ca / pki.CA_CERT
        ),
    )


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and not r.getMessage().startswith("no control plane")
    ]


async def test_after_a_served_stream_the_next_pass_starts_at_the_next_address(
    servers: Servers, tmp_path: Path
) -> None:
    a, _ = await servers.add("a", lambda n: "register" if n == 1 else "refuse")
    b, _ = await servers.add("b", lambda n: "register" if n == 2 else "refuse")

    await run_until_stopped(connection([a, b], servers.events, tmp_path, sleeps=2))

    assert servers.events == [
        "a:register",  # served, then ended: the next pass starts at b
        "b:refuse", "a:refuse", "sleep 0.5",  # a failed pass keeps its start (b)
        "b:register",  # served: the next pass starts at a again (wrapping round)
        "a:refuse", "b:refuse", "sleep 0.5",  # the registration reset the backoff
    ]  # fmt: skip


async def test_a_standby_and_a_refused_node_id_are_warnings_and_the_next_is_tried(
    servers: Servers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    standby, _ = await servers.add("standby", lambda n: "standby")
    denies, _ = await servers.add("denies", lambda n: "deny")
    leader, _ = await servers.add("leader", lambda n: "register" if n == 1 else "refuse")
    caplog.set_level(logging.DEBUG, logger="llmgw.agent.connection")

    conn = connection([standby, denies, leader], servers.events, tmp_path, sleeps=1)
    await run_until_stopped(conn)

    assert servers.events == [
        "standby:standby", "denies:deny", "leader:register",
        # The leader served; the next pass starts after it, wrapping round.
        "standby:standby", "denies:deny", "leader:refuse", "sleep 0.5",
    ]  # fmt: skip
    refusals = [
        f"{standby} is a standby: this server is a standby; the leader's agent listener is "
        "ctl-1:9443; trying the next server",
        f"the server at {denies} refused this agent: certificate is for node 'n0' but the "
        "agent registered as 'n1'; trying the next server",
    ]
    expected = [
        *refusals,
        f"the control plane at {leader} closed the stream",
        *refusals,  # the leader's plain refusal is no warning of its own, only in the summary
    ]
    # gRPC may lose the standby's refusal to the Register send crossing it and report
    # INTERNAL instead (the agent logs that as a plain failure); the rest is exact.
    lost = sum(1 for m in caplog.messages if m.startswith(f"control plane {standby}: INTERNAL"))
    got = warnings(caplog)
    assert [w for w in got if w != refusals[0]] == [w for w in expected if w != refusals[0]]
    assert got.count(refusals[0]) + lost == 2, got
    assert any(m.startswith(f"registered as n1 with {leader}") for m in caplog.messages)


@pytest.mark.parametrize(
    ("server_tls", "agent_tls", "dial_host", "expected"),
    [
        (
            "server",
            None,
            "127.0.0.1",
            "the server at {address} refused the connection; it probably requires TLS: join "
            "this node with --token TOKEN",
        ),
        (
            None,
            "agent",
            "127.0.0.1",
            "the server at {address} does not speak TLS (its agent listener is plaintext): "
            "configure agent_tls on the server, or start the agent without "
            "--tls-ca/--tls-cert/--tls-key",
        ),
        (
            "server",
            "foreign_agent",
            "127.0.0.1",
            "the server at {address} closed the connection during the TLS handshake; it "
            "probably does not accept this agent's certificate",
        ),
        (
            "foreign_server",
            "agent",
            "127.0.0.1",
            "the server at {address} presented a certificate that --tls-ca does not accept "
            "(unable to get local issuer certificate)",
        ),
        (
            "ip_only_server",
            "agent",
            "localhost",
            "the certificate of the server at {address} is not valid for 'localhost'",
        ),
    ],
    ids=[
        "plaintext-agent",
        "plaintext-server",
        "foreign-agent-cert",
        "foreign-server-cert",
        "wrong-host",
    ],
)
async def test_tls_on_one_side_only_is_explained(
    servers: Servers,
    certs: Certs,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    server_tls: str | None,
    agent_tls: str | None,
    dial_host: str,
    expected: str,
) -> None:
    creds = None if server_tls is None else getattr(certs, server_tls)
    listening, _ = await servers.add("s", lambda n: "register", credentials=creds)
    address = listening.replace("127.0.0.1", dial_host)
    caplog.set_level(logging.INFO, logger="llmgw.agent.connection")

    tls = None if agent_tls is None else getattr(certs, agent_tls)
    await run_until_stopped(connection([address], servers.events, tmp_path, sleeps=1, tls=tls))

    assert servers.events == ["sleep 0.5"]  # the handshake failed: no stream reached it
    [warning] = warnings(caplog)
    assert warning.startswith(expected.format(address=address)), warning
    assert not warning.endswith("trying the next server")  # there is no next one


async def test_an_agent_with_the_cas_certificate_registers_over_tls(
    servers: Servers, certs: Certs, tmp_path: Path
) -> None:
    address, servicer = await servers.add(
        "tls", lambda n: "register" if n == 1 else "refuse", credentials=certs.server
    )
    await run_until_stopped(
        connection([address], servers.events, tmp_path, sleeps=1, tls=certs.agent)
    )
    assert servers.events == ["tls:register", "tls:refuse", "sleep 0.5"]
    assert servicer.registers[0].node_id == "n1"


class FreezingProxy:
    """A TCP relay to one port that can stop relaying, like a SIGSTOPped server."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.frozen = asyncio.Event()
        self.accepted = 0  # TCP connections relayed
        self.tasks: set[asyncio.Task[None]] = set()
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        self.writers += [writer, up_writer]
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(source, sink))
            self.tasks.add(task)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await source.read(65536):
                if self.frozen.is_set():  # hold the bytes, as a stopped process would
                    await asyncio.get_running_loop().create_future()
                sink.write(data)
                await sink.drain()

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for writer in self.writers:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest.fixture
async def proxy_to() -> AsyncIterator[list[FreezingProxy]]:
    made: list[FreezingProxy] = []
    yield made
    for proxy in made:
        await proxy.close()


async def test_a_server_that_stops_answering_is_left_for_the_next(
    servers: Servers,
    tmp_path: Path,
    proxy_to: list[FreezingProxy],
    caplog: pytest.LogCaptureFixture,
) -> None:
    leader, _ = await servers.add("leader", lambda n: "hold")
    other, _ = await servers.add("other", lambda n: "register" if n == 1 else "refuse")
    proxy = FreezingProxy(int(leader.rpartition(":")[2]))
    proxy_to.append(proxy)
    frozen_leader = await proxy.start()
    caplog.set_level(logging.INFO, logger="llmgw.agent.connection")
    settings = ConnectionSettings(
        connect_timeout_seconds=2.0, keepalive_time_seconds=0.5, keepalive_timeout_seconds=0.5
    )
    conn = connection([frozen_leader, other], servers.events, tmp_path, sleeps=1, settings=settings)
    task = asyncio.create_task(run_until_stopped(conn))
    for _ in range(1000):
        if servers.events == ["leader:hold"]:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # let Registered through
    proxy.frozen.set()  # the leader stops answering, its TCP connection stays up

    async with asyncio.timeout(20):
        await task
    # Noticed by keepalive: the next address is tried at once and registers; then a
    # pass finds the frozen leader silent (connect timeout) and `other` refusing.
    assert servers.events == ["leader:hold", "other:register", "other:refuse", "sleep 0.5"]
    assert any(
        m.startswith(f"stream to {frozen_leader} ended: the server stopped answering")
        for m in caplog.messages
    ), caplog.messages


async def test_a_standbys_refusals_and_the_registration_after_them_share_one_tls_connection(
    servers: Servers, certs: Certs, tmp_path: Path, proxy_to: list[FreezingProxy]
) -> None:
    # After a failover the whole fleet registers with the standby that now leads: the
    # connections it refused the agents on carry their Registers, so the new leader
    # has no storm of TLS handshakes to get through first.
    address, _ = await servers.add(
        "tls",
        lambda n: "standby" if n <= 3 else "register" if n == 4 else "refuse",
        credentials=certs.server,
    )
    proxy = FreezingProxy(int(address.rpartition(":")[2]))
    proxy_to.append(proxy)
    relayed = await proxy.start()

    await run_until_stopped(
        connection([relayed], servers.events, tmp_path, sleeps=4, tls=certs.agent)
    )

    streams = [e for e in servers.events if not e.startswith("sleep")]
    assert streams == ["tls:standby"] * 3 + ["tls:register", "tls:refuse"]
    assert proxy.accepted == 1


async def test_a_renewed_certificate_is_used_from_the_next_dial_on_a_new_connection(
    servers: Servers, certs: Certs, tmp_path: Path, proxy_to: list[FreezingProxy]
) -> None:
    address, servicer = await servers.add(
        "tls", lambda n: "register" if n <= 2 else "refuse", credentials=certs.server
    )
    proxy = FreezingProxy(int(address.rpartition(":")[2]))
    proxy_to.append(proxy)
    relayed = await proxy.start()
    renewed = pki.issue_node(certs.ca_dir, "n1", now=NOW, out_dir=tmp_path / "renewed")
    material = [certs.agent]

    def current() -> pki.TlsMaterial:
        if servicer.registers:  # renewed once the first stream registered
            material[0] = pki.load_tls_material(
                cert=renewed.cert, key=renewed.key, ca=certs.ca_dir / pki.CA_CERT
            )
        return material[0]

    await run_until_stopped(connection([relayed], servers.events, tmp_path, sleeps=1, tls=current))

    assert servers.events == ["tls:register", "tls:register", "tls:refuse", "sleep 0.5"]
    # The first stream's connection had the old certificate; every dial after the
    # renewal is on one new connection.
    assert proxy.accepted == 2
