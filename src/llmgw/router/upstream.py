"""A lean HTTP/1.1 client for talking to engines: keep-alive pools, streamed bodies.

Why not aiohttp: profiling the gateway under load showed aiohttp's client as a
third of its CPU per request (request and response objects, header multidicts,
cookie and tracing hooks), for features an engine connection never uses. This
client does only what the proxy needs: one request at a time per connection,
the request head written from bytes, the response parsed by httptools (the
parser uvicorn uses), the body handed over chunk by chunk as it arrives, with
the transport paused while the reader is behind.

Errors are a small tree (`UpstreamError`): `ConnectFailed` (nothing was sent),
`Disconnected` (the connection ended before the response head), `BrokenBody`
(it ended mid-body) and `BadResponse` (not HTTP). Their messages say what
happened and never where (no host, port or URL): callers add the endpoint's id
for API clients and its URL for the log and the admin API. A request that fails on a
*reused* keep-alive connection before any response byte is sent once more on a
new connection: the engine closed an idle connection as we reused it.

Not guaranteed: TLS to engines, HTTP/2, pipelining, proxies, redirects or
decompression. Deadlines are the caller's (`asyncio.timeout`); cancelling a
request closes its connection, which is how an engine learns to stop.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections import deque
from collections.abc import Callable
from typing import cast
from urllib.parse import urlsplit

import httptools

# Engine answers that another replica may serve instead.
RETRY_STATUSES = frozenset({429, 502, 503, 504})
EVENT_STREAM = b"text/event-stream"
# Pauses between looks at the pool while only replicas that just failed are in
# it: the control plane takes a dead engine's replica out within moments, and a
# replica that failed once (a stale pooled connection) is tried again soon.
RECHECK_FIRST = 0.25
RECHECK_MAX = 2.0
_HIGH_WATER = 256 * 1024  # buffered body bytes before reading from the engine pauses


class UpstreamError(Exception):
    """Base of every failure talking to an engine."""


class ConnectFailed(UpstreamError):
    """The TCP connection could not be made (refused, unreachable, timed out)."""


class Disconnected(UpstreamError):
    """The connection closed before the response head arrived."""


class BrokenBody(UpstreamError):
    """The connection closed or failed in the middle of the response body."""


class BadResponse(UpstreamError):
    """The engine did not answer with valid HTTP/1.1."""


def _reason(exc: OSError) -> str:
    """What went wrong with a connection, without the address asyncio puts in its
    messages ("Connect call failed ('10.0.3.7', 20001)")."""
    if isinstance(exc, socket.gaierror):
        return f"the engine's host name does not resolve ({exc.strerror})"
    if exc.errno is not None and exc.errno > 0:
        return os.strerror(exc.errno)
    return type(exc).__name__


class Origin:
    """Scheme-less host and port of an engine URL, and the Host header for it."""

    __slots__ = ("host", "host_header", "port")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{url!r}: only http:// engine URLs are supported")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.host_header = parts.netloc.encode()


class _Connection(asyncio.Protocol):
    """One TCP connection and the response being read on it."""

    def __init__(self, on_idle_close: Callable[[_Connection], None]) -> None:
        self._on_idle_close = on_idle_close
        self.transport: asyncio.Transport | None = None
        self.reused = False
        self.last_used = 0.0
        self._busy = False
        self._parser = httptools.HttpResponseParser(self)
        self._head: asyncio.Future[None] | None = None
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._complete = False
        self._error: UpstreamError | None = None
        self._got_bytes = False
        self._keep_alive = False
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is a transport without subclassing asyncio.Transport.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self._got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(BadResponse(f"engine sent invalid HTTP: {exc}"))
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if not self._busy:
            self._on_idle_close(self)
            return
        if self._complete:
            return
        if self._head is not None and not self._head.done():
            detail = f": {_reason(exc)}" if isinstance(exc, OSError) else ""
            self._fail(Disconnected(f"engine closed the connection before answering{detail}"))
        else:
            self._fail(BrokenBody("engine closed the connection in the middle of the answer"))

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        if self._head is not None and not self._head.done():
            self._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self._complete = True
        # Asked here: the parser's answer is only meaningful while the message is current.
        self._keep_alive = self._parser.should_keep_alive()
        self._wake()

    # used by Upstream and Response

    def start(self, request: bytes) -> asyncio.Future[None]:
        assert self.transport is not None
        self._busy = True
        self._complete = False
        self._keep_alive = False
        self._error = None
        self._got_bytes = False
        self._chunks.clear()
        self._buffered = 0
        self.status = 0
        self.headers = []
        self._head = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self._head

    @property
    def got_bytes(self) -> bool:
        return self._got_bytes

    def keep_alive(self) -> bool:
        return (
            self._complete
            and self._keep_alive
            and self._error is None
            and self.transport is not None
        )

    def finish(self) -> None:
        self._busy = False
        self._head = None
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        self._busy = False
        if self.transport is not None:
            self.transport.abort()
            self.transport = None

    async def next_chunk(self) -> bytes:
        while True:
            if self._chunks:
                # Everything that has arrived, at once: one relay step for a burst of
                # events instead of one per HTTP chunk, and never a wait for more.
                if len(self._chunks) == 1:
                    chunk = self._chunks.popleft()
                else:
                    chunk = b"".join(self._chunks)
                    self._chunks.clear()
                self._buffered -= len(chunk)
                if self._paused and self._buffered < _HIGH_WATER // 2 and self.transport:
                    self._paused = False
                    self.transport.resume_reading()
                return chunk
            if self._error is not None:
                raise self._error
            if self._complete:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def _fail(self, error: UpstreamError) -> None:
        if self._error is None:
            self._error = error
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
            # Read by the caller's await; keeps asyncio from reporting it unretrieved.
            self._head.exception()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class Response:
    """The engine's answer: status and headers at once, the body as it comes."""

    __slots__ = ("_conn", "_done", "_upstream", "headers", "origin", "status")

    def __init__(self, upstream: Upstream, origin: Origin, conn: _Connection) -> None:
        self._upstream = upstream
        self.origin = origin
        self._conn = conn
        self._done = False
        self.status = conn.status
        self.headers = conn.headers

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    @property
    def content_type(self) -> bytes:
        value = self.header(b"content-type") or b""
        return value.split(b";", 1)[0].strip().lower()

    async def next_chunk(self) -> bytes:
        """The next piece of the body; b"" at its end. BrokenBody if it breaks off."""
        return await self._conn.next_chunk()

    async def read(self) -> bytes:
        """The whole body."""
        parts = []
        while chunk := await self._conn.next_chunk():
            parts.append(chunk)
        return b"".join(parts)

    def release(self) -> None:
        """Done with the answer: pool the connection if the body was read to its end."""
        if self._done:
            return
        self._done = True
        self._upstream.put_back(self.origin, self._conn)

    def close(self) -> None:
        """Abandon the answer and its connection (tells the engine to stop)."""
        if self._done:
            return
        self._done = True
        self._conn.close()


class Upstream:
    """Keep-alive connections to engines, one request at a time per connection."""

    def __init__(self, *, connect_timeout: float, idle_timeout: float) -> None:
        self._connect_timeout = connect_timeout
        # Engines (uvicorn) close idle keep-alive connections after 5 s; reusing
        # one near that age races with the close, so ours retire sooner.
        self._idle_timeout = idle_timeout
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._origins: dict[str, Origin] = {}
        self._closed = False

    def origin(self, base_url: str) -> Origin:
        found = self._origins.get(base_url)
        if found is None:
            found = self._origins[base_url] = Origin(base_url)
        return found

    async def request(
        self,
        method: bytes,
        base_url: str,
        path: str,
        body: bytes = b"",
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> Response:
        """Send a request and wait for the response head."""
        origin = self.origin(base_url)
        head = [
            method,
            b" ",
            path.encode(),
            b" HTTP/1.1\r\nHost: ",
            origin.host_header,
            b"\r\nContent-Length: ",
            str(len(body)).encode(),
            b"\r\n",
        ]
        for name, value in headers:
            head += (name, b": ", value, b"\r\n")
        head.append(b"\r\n")
        request = b"".join(head) + body
        conn = await self._checkout(origin)
        try:
            await conn.start(request)
        except Disconnected:
            if not conn.reused or conn.got_bytes:
                conn.close()
                raise
            # The engine closed this idle connection as we reused it: one more try.
            conn.close()
            conn = await self._connect(origin)
            try:
                await conn.start(request)
            except BaseException:
                conn.close()
                raise
        except BaseException:
            conn.close()
            raise
        return Response(self, origin, conn)

    async def _checkout(self, origin: Origin) -> _Connection:
        idle = self._idle.get((origin.host, origin.port))
        if idle:
            now = asyncio.get_running_loop().time()
            while idle:
                conn = idle.pop()
                if conn.transport is not None and now - conn.last_used < self._idle_timeout:
                    conn.reused = True
                    return conn
                conn.close()
        return await self._connect(origin)

    async def _connect(self, origin: Origin) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self._forget), origin.host, origin.port
                )
        except TimeoutError as exc:
            raise ConnectFailed(f"connecting timed out after {self._connect_timeout:g}s") from exc
        except OSError as exc:
            raise ConnectFailed(f"cannot connect: {_reason(exc)}") from exc
        return conn

    def put_back(self, origin: Origin, conn: _Connection) -> None:
        if self._closed or not conn.keep_alive():
            conn.close()
            return
        conn.finish()
        conn.last_used = asyncio.get_running_loop().time()
        self._idle.setdefault((origin.host, origin.port), []).append(conn)

    def _forget(self, conn: _Connection) -> None:
        for idle in self._idle.values():
            if conn in idle:
                idle.remove(conn)
                return

    async def close(self) -> None:
        """Close every pooled connection; requests in flight keep theirs until done."""
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
