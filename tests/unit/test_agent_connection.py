"""The connection loop against real gRPC servers on loopback, in injected time.

Each address fails a different way (nothing listening, a server that refuses the
stream, a server that never answers Register) or registers. The sleep and the
random source are injected: the test sees every backoff delay without waiting
for it, and the Ceiling RNG makes each delay the top of its full-jitter interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import grpc.aio
import pytest
from procs import free_port

from llmgw.agent.backoff import Backoff
from llmgw.agent.connection import Connection
from llmgw.agent.feed import StatusFeed
from llmgw.agent.flags import PortRange
from llmgw.agent.hardware import DeclaredGpus, Hardware
from llmgw.agent.settings import ConnectionSettings, SupervisorSettings
from llmgw.agent.silence import SilentServers
from llmgw.agent.state import EngineStore
from llmgw.agent.supervisor import Supervisor
from llmgw.agent.wire import NodeIdentity
from llmgw.control.agentsvc.server import server_options
from llmgw.engines import EngineSettings, adapter_for
from llmgw.pki import TlsMaterial
from llmgw.proto import agent_pb2, agent_pb2_grpc

HEARTBEAT = 1000.0  # never reached: heartbeats are not what these tests watch
RETIMED = 250.0  # a new interval: the fake sleep records it
# A registering server answers well within this even on a loaded machine; a silent
# one is only waited for in the test that names SILENT_TIMEOUT.
CONNECT_TIMEOUT = 10.0
SILENT_TIMEOUT = 1.5
# How long a "slow" server takes to answer a Register it has read: past a short
# connect timeout, well within the register timeout.
SLOW_ANSWER = 1.0


class Ceiling(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return b


class Stop(Exception):
    """Raised by the fake sleep to end the loop after enough backoffs."""


class Servicer(agent_pb2_grpc.AgentServiceServicer):
    """`behaviour(n)` decides the n-th stream.

    "refuse", "standby" (UNAVAILABLE with the refusal metadata), "deny"
    (PERMISSION_DENIED after Register), "silent", "register" (then the stream
    ends), "slow" (registers SLOW_ANSWER seconds after reading Register, then ends), "hold" (registers and keeps the stream open) or "retime" (holds, and tells
    the agent a new heartbeat interval, RETIMED, right after Registered).
    """

    def __init__(self, name: str, events: list[str], behaviour: Callable[[int], str]) -> None:
        self.name = name
        self.events = events
        self.behaviour = behaviour
        self.streams = 0
        self.registers: list[agent_pb2.Register] = []

    async def Connect(self, request_iterator: object, context: grpc.aio.ServicerContext) -> None:
        self.streams += 1
        what = self.behaviour(self.streams)
        self.events.append(f"{self.name}:{what}")
        if what == "refuse":
            # What a standby does: refuse before reading, naming the leader.
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "standby; leader is ctl-1")
        if what == "standby":
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                "this server is a standby; the leader's agent listener is ctl-1:9443",
                trailing_metadata=(("llmgw-refused", "standby"),),
            )
        first = await context.read()
        assert isinstance(first, agent_pb2.AgentMessage)
        self.registers.append(first.register)
        if what == "deny":
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                "certificate is for node 'n0' but the agent registered as 'n1'",
            )
        if what == "silent":
            await asyncio.sleep(3600)
        if what == "slow":
            await asyncio.sleep(SLOW_ANSWER)
        await context.write(
            agent_pb2.ServerMessage(
                registered=agent_pb2.Registered(heartbeat_interval_seconds=HEARTBEAT)
            )
        )
        if what == "retime":
            await context.write(
                agent_pb2.ServerMessage(
                    heartbeat_interval=agent_pb2.HeartbeatInterval(seconds=RETIMED)
                )
            )
        if what in ("hold", "retime"):
            while await context.read() is not grpc.aio.EOF:
                pass
        # ...and the stream ends at once: the agent must dial again.


class Servers:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.servers: list[grpc.aio.Server] = []

    async def add(
        self,
        name: str,
        behaviour: Callable[[int], str],
        *,
        credentials: grpc.ServerCredentials | None = None,
        port: int | None = None,
    ) -> tuple[str, Servicer]:
        port = port or free_port()
        servicer = Servicer(name, self.events, behaviour)
        # The agent listener's options: they let the agents' keepalive pings in.
        server = grpc.aio.server(options=server_options())
        agent_pb2_grpc.add_AgentServiceServicer_to_server(servicer, server)
        if credentials is None:
            server.add_insecure_port(f"127.0.0.1:{port}")
        else:
            server.add_secure_port(f"127.0.0.1:{port}", credentials)
        await server.start()
        self.servers.append(server)
        return f"127.0.0.1:{port}", servicer


@pytest.fixture
async def servers() -> AsyncIterator[Servers]:
    found = Servers()
    try:
        yield found
    finally:
        for server in found.servers:
            await server.stop(grace=None)


def connection(
    addresses: list[str],
    events: list[str],
    tmp_path: Path,
    *,
    sleeps: int,
    tls: TlsMaterial | None = None,
    settings: ConnectionSettings | None = None,
    silent: SilentServers | None = None,
) -> Connection:
    async def sleep(delay: float) -> None:
        if delay >= HEARTBEAT:
            await asyncio.Event().wait()  # a heartbeat wait: park until cancelled
        events.append(f"sleep {delay:g}")
        if sum(e.startswith("sleep") for e in events) >= sleeps:
            raise Stop
        await asyncio.sleep(0)

    feed = StatusFeed()
    gpus = DeclaredGpus(node_id="n1", memory_bytes=(2**30,))
    supervisor = Supervisor(
        adapters=lambda engine: adapter_for(engine, settings=EngineSettings(python="python")),
        port_range=PortRange(20000, 20010),
        advertise_host="127.0.0.1",
        weights_dir=tmp_path,
        gpu_count=1,
        settings=SupervisorSettings(),
        on_change=feed.publish,
        store=EngineStore(tmp_path / "state", node_id="n1"),
    )
    return Connection(
        addresses=addresses,
        identity=NodeIdentity(
            node_id="n1",
            hostname="host-1",
            agent_version="test",
            labels={"zone": "a"},
            fabric={"ib-domain": "pod3"},
            port_range=PortRange(20000, 20010),
            weights_dir=tmp_path,
        ),
        supervisor=supervisor,
        feed=feed,
        hardware=Hardware(gpus=gpus, weights_dir=tmp_path),
        backoff=Backoff(rng=Ceiling()),
        settings=settings
        or ConnectionSettings(
            connect_timeout_seconds=CONNECT_TIMEOUT, register_timeout_seconds=CONNECT_TIMEOUT
        ),
        tls=tls,
        sleep=sleep,
        silent=silent,
    )


async def run_until_stopped(conn: Connection) -> None:
    with pytest.raises(Stop):
        async with asyncio.timeout(30):
            await conn.run()


async def test_every_address_is_tried_in_order_before_one_backoff(
    servers: Servers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    refused = f"127.0.0.1:{free_port()}"  # nothing listens there
    standby, _ = await servers.add("standby", lambda n: "refuse")
    silent, _ = await servers.add("silent", lambda n: "silent")
    caplog.set_level(logging.DEBUG, logger="llmgw.agent.connection")

    await run_until_stopped(
        connection(
            [refused, standby, silent],
            servers.events,
            tmp_path,
            sleeps=3,
            settings=ConnectionSettings(
                connect_timeout_seconds=CONNECT_TIMEOUT, register_timeout_seconds=SILENT_TIMEOUT
            ),
        )
    )

    one_pass = ["standby:refuse", "silent:silent"]
    assert servers.events == [
        *one_pass, "sleep 0.5", *one_pass, "sleep 1", *one_pass, "sleep 2",
    ]  # fmt: skip
    # The refused address, which no server can record, is tried first in each pass.
    tried = [
        m.group(1)
        for r in caplog.records
        if (m := re.match(r"control plane (\S+): ", r.getMessage()))
    ]
    assert tried == [refused, standby, silent] * 3
    failures = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("control plane")
    ]
    assert "UNAVAILABLE" in failures[0]
    # gRPC aio reports a write that races the server's abort as INTERNAL, losing the
    # server's status; either way the address counts as failed and the next is tried.
    assert (
        "FAILED_PRECONDITION: standby; leader is ctl-1" in failures[1]
        or "INTERNAL: Internal error from Core" in failures[1]
    ), failures[1]
    assert f"no Registered answer within {SILENT_TIMEOUT:g}s of sending Register" in failures[2]


async def test_a_register_answered_after_the_connect_timeout_is_waited_for_not_dialled_again(
    servers: Servers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A leader working through a whole fleet's Registers answers this one late: the
    # connection was up well within the connect timeout, so the agent keeps waiting.
    slow, _ = await servers.add("slow", lambda n: "slow" if n == 1 else "refuse")
    caplog.set_level(logging.DEBUG, logger="llmgw.agent.connection")
    settings = ConnectionSettings(
        connect_timeout_seconds=SLOW_ANSWER / 4, register_timeout_seconds=CONNECT_TIMEOUT
    )

    await run_until_stopped(
        connection([slow], servers.events, tmp_path, sleeps=1, settings=settings)
    )

    assert servers.events == ["slow:slow", "slow:refuse", "sleep 0.5"]
    assert any(m.startswith(f"registered as n1 with {slow}") for m in caplog.messages), (
        caplog.messages
    )
    assert not any("within" in m for m in caplog.messages), caplog.messages


async def test_a_server_that_accepts_tcp_and_never_speaks_costs_the_connect_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A frozen process or a half-dead host: TCP is accepted (by the kernel), HTTP/2
    # never comes up. The long register timeout does not apply to it.
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    listener = await asyncio.start_server(hold, "127.0.0.1", 0)
    mute = f"127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    caplog.set_level(logging.DEBUG, logger="llmgw.agent.connection")
    settings = ConnectionSettings(
        connect_timeout_seconds=SILENT_TIMEOUT, register_timeout_seconds=3600.0
    )
    try:
        await run_until_stopped(connection([mute], [], tmp_path, sleeps=1, settings=settings))
    finally:
        for writer in held:
            writer.close()
        listener.close()
        await listener.wait_closed()

    failures = [m for m in caplog.messages if m.startswith(f"control plane {mute}")]
    assert failures and f"no connection within {SILENT_TIMEOUT:g}s" in failures[0], caplog.messages


async def test_backoff_grows_while_failing_and_resets_after_a_registration(
    servers: Servers, tmp_path: Path
) -> None:
    refused = f"127.0.0.1:{free_port()}"
    # Streams 1-3 refused, 4 registers (then ends), 5+ refused again.
    flaky, servicer = await servers.add("flaky", lambda n: "register" if n == 4 else "refuse")

    await run_until_stopped(connection([refused, flaky], servers.events, tmp_path, sleeps=5))

    assert servers.events == [
        "flaky:refuse", "sleep 0.5",
        "flaky:refuse", "sleep 1",
        "flaky:refuse", "sleep 2",
        "flaky:register",  # registered: the next failing pass starts from the base again
        "flaky:refuse", "sleep 0.5",
        "flaky:refuse", "sleep 1",
    ]  # fmt: skip
    [register] = servicer.registers[-1:]
    assert register.node_id == "n1" and dict(register.fabric) == {"ib-domain": "pod3"}
    assert [g.uuid for g in register.hardware.gpus] == ["declared-n1-0"]


async def test_a_single_address_reconnects_at_once_after_a_registered_stream_ends(
    servers: Servers, tmp_path: Path
) -> None:
    # Registers three times (each stream ends right after), then refuses.
    only, servicer = await servers.add("only", lambda n: "register" if n <= 3 else "refuse")

    await run_until_stopped(connection([only], servers.events, tmp_path, sleeps=1))

    assert servers.events == [
        "only:register", "only:register", "only:register", "only:refuse", "sleep 0.5",
    ]  # fmt: skip
    assert len(servicer.registers) == 3


async def test_a_stream_the_server_ends_during_a_write_is_one_plain_warning(
    servers: Servers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Each stream ends right after Registered, while the agent is sending its first
    # heartbeat: gRPC then fails the send and the read alike with INTERNAL. The
    # operator must read that the control plane closed the stream, once per stream,
    # never a second "write failed" warning with gRPC's internals in it.
    rounds = 15
    only, _ = await servers.add("only", lambda n: "register" if n <= rounds else "refuse")
    caplog.set_level(logging.INFO, logger="llmgw.agent.connection")

    await run_until_stopped(connection([only], servers.events, tmp_path, sleeps=1))

    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and not r.getMessage().startswith("no control plane")
    ]
    assert warnings == [f"the control plane at {only} closed the stream"] * rounds


async def test_cancelling_the_loop_closes_the_stream(servers: Servers, tmp_path: Path) -> None:
    silent, _ = await servers.add("silent", lambda n: "silent")
    conn = connection([silent], servers.events, tmp_path, sleeps=100)
    task = asyncio.create_task(conn.run())
    while True:
        if servers.events:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert task.cancelled()


async def test_the_agent_says_it_follows_interval_changes_and_does(
    servers: Servers, tmp_path: Path
) -> None:
    address, servicer = await servers.add("leader", lambda n: "retime")
    conn = connection([address], servers.events, tmp_path, sleeps=100)
    task = asyncio.create_task(conn.run())
    try:
        # The heartbeat after Registered, then its wait: HEARTBEAT parks, until the
        # HeartbeatInterval moves the due time to RETIMED after the wait began.
        for _ in range(2000):
            if any(e.startswith("sleep") for e in servers.events):
                break
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert servicer.registers[0].follows_heartbeat_interval
    waits = [float(e.split()[1]) for e in servers.events if e.startswith("sleep")]
    assert waits and RETIMED - 10 < waits[0] <= RETIMED, servers.events


async def test_a_server_that_comes_up_where_nothing_listened_is_registered_with_at_once(
    servers: Servers, tmp_path: Path
) -> None:
    # The agent keeps each address's channel between dials, but not one whose
    # connection failed: gRPC would hold that address in its own reconnect backoff and
    # fail the next dials at once, long after the server (a restarted leader) is back.
    port = free_port()
    conn = connection([f"127.0.0.1:{port}"], servers.events, tmp_path, sleeps=100)
    try:
        assert await conn.run_pass() is False  # nothing listens: refused
        await servers.add("late", lambda n: "register", port=port)
        assert await conn.run_pass() is True  # registered (the stream then ended)
    finally:
        await conn.close()
    assert servers.events == ["late:register"]
