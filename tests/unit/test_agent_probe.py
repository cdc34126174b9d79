"""`http_get`, the agent's GET of an engine's model list: against a real local socket server, the body
comes back whole, with chunked transfer decoded and an over-long answer refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from llmgw.agent.probe import GET_LIMIT, ProbeError, http_get


@asynccontextmanager
async def answering(raw: bytes) -> AsyncIterator[int]:
    """A server on loopback that reads a request's head and writes `raw`, then closes."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(raw)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def test_a_sized_body_comes_back_whole() -> None:
    body = b'{"data": []}'
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    async with answering(head + body) as port:
        assert await http_get("127.0.0.1", port, "/v1/models") == (200, body)


async def test_a_chunked_body_is_decoded() -> None:
    raw = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'5\r\n{"dat\r\n7;ext=1\r\na": []}\r\n0\r\n\r\n'
    )
    async with answering(raw) as port:
        assert await http_get("127.0.0.1", port, "/v1/models") == (200, b'{"data": []}')


async def test_an_answer_over_the_limit_or_not_http_is_refused() -> None:
    async with answering(b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * (GET_LIMIT + 1)) as port:
        with pytest.raises(ProbeError, match="over"):
            await http_get("127.0.0.1", port, "/v1/models")
    async with answering(b"SSH-2.0-OpenSSH\r\n") as port:
        with pytest.raises(ProbeError, match="not an HTTP response"):
            await http_get("127.0.0.1", port, "/v1/models")
