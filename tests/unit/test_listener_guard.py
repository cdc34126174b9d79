"""The listener guard where the server, not the client, holds a request up.

A real uvicorn server (`make_server`, the gateway's) runs in the test's event
loop on loopback, with short limits, in front of a small ASGI app that reads a
request body only when the test says so. A client that waits for the server
(`Expect: 100-continue`, a body the app has not taken yet) is not cut, while
one that stalls on its own is. No sleeps decide anything: a probe connection
with half a request line is cut after `header_timeout`, and that cut is the
event that says enough time has passed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from llmgw.cli.listener_guard import ConnectionGate
from llmgw.cli.serving import bind, make_server
from llmgw.config import HttpServerConfig, ListenAddress

LIMITS = HttpServerConfig(header_timeout=0.3, body_timeout=0.3, max_connections=8)
READ_SECONDS = 30.0


@dataclass
class App:
    """Answers 200 with the body's length, once `release` is set."""

    release: asyncio.Event = field(default_factory=asyncio.Event)
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, scope: dict[str, object], receive: object, send: object) -> None:
        assert callable(receive) and callable(send)
        await self.release.wait()
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.disconnected.set()
                return
            size += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = str(size).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


@dataclass
class Running:
    app: App
    port: int


@pytest.fixture
async def served() -> AsyncIterator[Running]:
    app = App()
    listener = bind("test", "--listen", ListenAddress(host="127.0.0.1", port=0))
    gate = ConnectionGate(
        name="test", limits=LIMITS, metrics=None, clock=asyncio.get_running_loop().time
    )
    server = make_server(app, graceful_seconds=1, gate=gate)
    # The socket listens already: clients that connect before serve() accepts wait
    # in its backlog.
    task = asyncio.create_task(server.serve([listener.sock]))
    try:
        yield Running(app, listener.port)
    finally:
        app.release.set()
        server.should_exit = True
        await asyncio.wait_for(task, READ_SECONDS)


@contextlib.asynccontextmanager
async def connect(port: int) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def header_timeout_passed(port: int) -> None:
    """Returns once a connection with half a request line was cut: header_timeout passed."""
    async with connect(port) as (reader, writer):
        writer.write(b"GET /")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), READ_SECONDS) == b""


async def test_a_client_waiting_for_100_continue_is_not_cut(served: Running) -> None:
    async with connect(served.port) as (reader, writer):
        writer.write(
            b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n"
            b"Expect: 100-continue\r\n\r\n"
        )
        await writer.drain()
        # The app has not asked for the body: the client rightly waits, for longer
        # than body_timeout (two header timeouts of the same length pass meanwhile).
        await header_timeout_passed(served.port)
        await header_timeout_passed(served.port)
        served.app.release.set()
        first = await asyncio.wait_for(reader.readline(), READ_SECONDS)
        assert first == b"HTTP/1.1 100 Continue\r\n"
        writer.write(b"hello")
        answer = await asyncio.wait_for(reader.read(), READ_SECONDS)
    assert answer.lstrip(b"\r\n").startswith(b"HTTP/1.1 200"), answer
    assert answer.endswith(b"\r\n\r\n5")


async def test_a_body_the_app_has_not_taken_yet_is_not_the_clients_stall(
    served: Running,
) -> None:
    size = 1024 * 1024
    async with connect(served.port) as (reader, writer):
        writer.write(
            b"POST /upload HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            + f"Content-Length: {size}\r\n\r\n".encode()
        )
        # More than uvicorn buffers (64 KiB): it stops reading, so the client's
        # writes back up. That wait is the server's, not a stalled body.
        writer.write(b"x" * size)
        await header_timeout_passed(served.port)
        await header_timeout_passed(served.port)
        served.app.release.set()
        await asyncio.wait_for(writer.drain(), READ_SECONDS)
        answer = await asyncio.wait_for(reader.read(), READ_SECONDS)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert answer.endswith(str(size).encode())


async def test_a_body_the_client_stops_sending_is_408_and_the_app_sees_a_disconnect(
    served: Running,
) -> None:
    served.app.release.set()
    async with connect(served.port) as (reader, writer):
        writer.write(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b"y" * 10)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), READ_SECONDS)
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer
    assert b"request_timeout" in answer
    # The app, waiting for the rest of the body, is told the client is gone.
    await asyncio.wait_for(served.app.disconnected.wait(), READ_SECONDS)
