"""The lean upstream client against small real TCP servers on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from llmgw.router.upstream import BadResponse, BrokenBody, ConnectFailed, Upstream

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Engine:
    """A loopback server whose answer per request is scripted by the test."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.server: asyncio.Server | None = None
        self.url = ""

    async def __aenter__(self) -> Engine:
        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.handler(reader, writer)
            finally:
                writer.close()

        self.server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


def plain(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    client = Upstream(connect_timeout=1.0, idle_timeout=30.0)
    yield client
    await client.close()


async def test_keep_alive_reuses_one_connection(upstream: Upstream) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                request = await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(plain(request.split(b"\r\n\r\n", 1)[1]))
            await writer.drain()

    async with Engine(serve) as engine:
        for body in (b'{"n": 1}', b'{"n": 2}', b'{"n": 3}'):
            resp = await upstream.request(b"POST", engine.url, "/v1/x", body, ((b"X-A", b"1"),))
            assert resp.status == 200
            assert resp.content_type == b"application/json"
            assert await resp.read() == body
            resp.release()
        assert engine.connections == 1


async def test_idle_connection_closed_by_the_engine_is_replaced_transparently(
    upstream: Upstream,
) -> None:
    async def serve_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(plain(b"ok"))
        await writer.drain()
        # Then close the keep-alive connection, as engines do when it idles.

    async with Engine(serve_once) as engine:
        first = await upstream.request(b"GET", engine.url, "/health")
        await first.read()
        first.release()
        await asyncio.sleep(0.05)  # let the close arrive
        second = await upstream.request(b"GET", engine.url, "/health")
        assert await second.read() == b"ok"
        second.release()
        assert engine.connections == 2


async def test_chunked_stream_arrives_piece_by_piece(upstream: Upstream) -> None:
    gate = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        writer.write(b"7\r\ndata: 1\r\n")
        await writer.drain()
        await gate.wait()
        writer.write(b"7\r\ndata: 2\r\n0\r\n\r\n")
        await writer.drain()

    async with Engine(serve) as engine:
        resp = await upstream.request(b"POST", engine.url, "/v1/x", b"{}")
        assert resp.content_type == b"text/event-stream"
        assert await resp.next_chunk() == b"data: 1"
        gate.set()
        assert await resp.next_chunk() == b"data: 2"
        assert await resp.next_chunk() == b""
        resp.release()


async def test_body_cut_short_is_a_broken_body(upstream: Upstream) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly a part")
        await writer.drain()

    async with Engine(serve) as engine:
        resp = await upstream.request(b"POST", engine.url, "/v1/x", b"{}")
        with pytest.raises(BrokenBody):
            await resp.read()
        resp.release()


async def test_not_http_is_a_bad_response(upstream: Upstream) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async with Engine(serve) as engine:
        with pytest.raises(BadResponse):
            await upstream.request(b"POST", engine.url, "/v1/x", b"{}")


async def test_nobody_listening_is_connect_failed(upstream: Upstream) -> None:
    async with Engine(read_request) as engine:
        url = engine.url
    with pytest.raises(ConnectFailed, match="cannot connect"):
        await upstream.request(b"GET", url, "/health")


async def test_cancelling_a_request_closes_its_connection(upstream: Upstream) -> None:
    closed = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await reader.read()  # returns at EOF: the client went away
        closed.set()

    async with Engine(serve) as engine:
        resp = await upstream.request(b"POST", engine.url, "/v1/x", b"{}")
        assert await resp.next_chunk() == b"first"
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await resp.next_chunk()
        resp.close()
        await asyncio.wait_for(closed.wait(), 2)
