"""A minimal HTTP/1.1 keep-alive load generator, and a canned server to measure it.

Closed loop: every connection sends one pre-built request, waits for the whole
answer and sends the next at once. All of it runs in `asyncio.Protocol`
callbacks on uvloop, with no coroutine, future or task per request, so that
one core drives several thousand requests (or tens of thousands of SSE events)
a second and leaves room for the server that shares its core.

Answers are parsed only as far as the benchmark needs: the status line,
`Content-Length` for plain answers, and for streams the number of SSE `data:`
fields and the chunked terminator (`\\r\\n0\\r\\n\\r\\n`). A stream counts as
complete only when it delivered exactly the expected number of events, which
also checks the cheap counting against the real framing.

`python bench/loadgen.py serve --port P` runs the canned server: it answers
any POST with a fixed JSON body, or (when the body says `"stream":true`) with
64 SSE events and `data: [DONE]`, each event written separately like an engine
does. With nothing behind it, it shows the load generator's own ceiling.

Not guaranteed: only for servers that answer in order on a keep-alive
connection, with a Content-Length body or a chunked stream; no pipelining,
TLS, redirects, compression or `Connection: close` answers. A connection that
fails is counted and not replaced, so a phase with errors runs with fewer
clients than asked for.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, cast

_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)
_DATA = b"data:"
_CHUNKED_END = b"\r\n0\r\n\r\n"
_KEEP_ERRORS = 20


def build_request(
    host: str, port: int, path: str, payload: dict[str, Any], headers: dict[str, str] | None = None
) -> bytes:
    """The exact bytes of one POST with a JSON body, sent as-is for every request."""
    body = json.dumps(payload, separators=(",", ":")).encode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    head = (
        f"POST {path} HTTP/1.1\r\n"
        f"Host: {host}:{port}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"{extra}\r\n"
    )
    return head.encode() + body


@dataclass
class PhaseResult:
    """What one closed-loop phase measured inside its window."""

    concurrency: int
    seconds: float
    completed: int
    events: int
    latencies: list[float]
    ttfts: list[float]
    error_count: int
    errors: list[str]
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def rps(self) -> float:
        return self.completed / self.seconds

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds

    def latency(self, q: float) -> float:
        return percentile(self.latencies, q)

    def ttft(self, q: float) -> float:
        return percentile(self.ttfts, q)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


class _Phase:
    __slots__ = (
        "active",
        "completed",
        "drained",
        "error_count",
        "errors",
        "events",
        "expect_events",
        "latencies",
        "measuring",
        "stopping",
        "ttfts",
    )

    def __init__(self, concurrency: int, expect_events: int) -> None:
        self.active = concurrency
        self.drained = asyncio.Event()
        self.expect_events = expect_events
        self.measuring = False
        self.stopping = False
        self.completed = 0
        self.events = 0
        self.latencies: list[float] = []
        self.ttfts: list[float] = []
        self.error_count = 0
        self.errors: list[str] = []

    def idle(self) -> None:
        self.active -= 1
        if self.active <= 0:
            self.drained.set()

    def error(self, message: str) -> None:
        self.error_count += 1
        if len(self.errors) < _KEEP_ERRORS:
            self.errors.append(message)


class _Conn(asyncio.Protocol):
    """Shared plumbing: send the next request, or go idle once the phase stops."""

    __slots__ = ("_busy", "_phase", "_request", "_sent_at", "_transport")

    def __init__(self, phase: _Phase, request: bytes) -> None:
        self._phase = phase
        self._request = request
        self._transport: asyncio.Transport | None = None
        self._busy = False
        self._sent_at = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only look-alikes.
        self._transport = cast(asyncio.Transport, transport)
        self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._busy:
            self._busy = False
            self._phase.error(f"connection closed mid-answer: {exc or 'by the server'}")
            self._phase.idle()

    def _reset(self) -> None:
        raise NotImplementedError

    def _next(self) -> None:
        if self._phase.stopping:
            self._busy = False
            self._phase.idle()
            return
        self._busy = True
        self._reset()
        self._sent_at = perf_counter()
        assert self._transport is not None
        self._transport.write(self._request)

    def _fail(self, message: str) -> None:
        self._phase.error(message)
        self._busy = False
        self._phase.idle()
        assert self._transport is not None
        self._transport.close()


class _PlainConn(_Conn):
    """One non-streaming answer per request, delimited by Content-Length."""

    __slots__ = ("_body_end", "_buf", "_ok")

    def _reset(self) -> None:
        self._buf = b""
        self._body_end = -1
        self._ok = True

    def data_received(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        if self._body_end < 0:
            head_end = buf.find(b"\r\n\r\n")
            if head_end < 0:
                self._buf = buf
                return
            match = _CONTENT_LENGTH.search(buf, 0, head_end + 2)
            if match is None:
                self._fail(f"answer without Content-Length: {buf[:head_end][:200]!r}")
                return
            self._ok = buf[9:12] == b"200"
            self._body_end = head_end + 4 + int(match[1])
        if len(buf) < self._body_end:
            self._buf = buf
            return
        if len(buf) > self._body_end:
            self._fail(f"{len(buf) - self._body_end} unexpected bytes after an answer")
            return
        phase = self._phase
        if not self._ok:
            phase.error(f"status {buf[9:12].decode()}: {buf[-300:]!r}")
        elif phase.measuring:
            phase.completed += 1
            phase.latencies.append(perf_counter() - self._sent_at)
        self._next()


class _StreamConn(_Conn):
    """One chunked SSE stream per request; counts `data:` fields as they arrive."""

    __slots__ = ("_buf", "_events", "_in_head", "_tail")

    def _reset(self) -> None:
        self._buf = b""
        self._in_head = True
        self._tail = b""
        self._events = 0

    def data_received(self, data: bytes) -> None:
        now = perf_counter()
        phase = self._phase
        if self._in_head:
            buf = self._buf + data if self._buf else data
            head_end = buf.find(b"\r\n\r\n")
            if head_end < 0:
                self._buf = buf
                return
            head = buf[:head_end]
            if head[9:12] != b"200" or b"chunked" not in head.lower():
                self._fail(f"not a chunked 200 stream: {buf[:400]!r}")
                return
            self._in_head = False
            self._buf = b""
            data = buf[head_end + 4 :]
            if not data:
                return
        # A `data:` split across two reads starts in the last 4 bytes of the
        # previous read; the 8-byte seam cannot hold one already counted.
        tail = self._tail
        count = data.count(_DATA)
        if tail:
            count += (tail[-4:] + data[:4]).count(_DATA)
        tail = data[-7:] if len(data) >= 7 else (tail + data)[-7:]
        self._tail = tail
        if count:
            if phase.measuring:
                if self._events == 0:
                    phase.ttfts.append(now - self._sent_at)
                phase.events += count
            self._events += count
        if tail == _CHUNKED_END:
            if self._events != phase.expect_events:
                phase.error(f"stream ended after {self._events} events, not {phase.expect_events}")
            elif phase.measuring:
                phase.completed += 1
                phase.latencies.append(now - self._sent_at)
            self._next()


class WindowHooks:
    """Called when the measuring window opens and closes (CPU sampling, profilers)."""

    def start(self) -> None:
        """The window opens now."""

    def end(self) -> dict[str, float]:
        """The window closed; what to store in `PhaseResult.cpu`."""
        return {}


async def run_phase(
    host: str,
    port: int,
    request: bytes,
    *,
    concurrency: int,
    warmup: float,
    duration: float,
    stream: bool,
    expect_events: int = 0,
    hooks: WindowHooks | None = None,
    drain_timeout: float = 10.0,
) -> PhaseResult:
    """Run `concurrency` closed-loop connections; measure only after `warmup`."""
    loop = asyncio.get_running_loop()
    phase = _Phase(concurrency, expect_events)
    conn_type: Callable[[_Phase, bytes], _Conn] = _StreamConn if stream else _PlainConn
    hooks = hooks or WindowHooks()
    transports: list[asyncio.BaseTransport] = []
    try:
        for _ in range(concurrency):
            transport, _ = await loop.create_connection(
                lambda: conn_type(phase, request), host, port
            )
            transports.append(transport)
        await asyncio.sleep(warmup)
        hooks.start()
        started = perf_counter()
        phase.measuring = True
        await asyncio.sleep(duration)
        phase.measuring = False
        seconds = perf_counter() - started
        cpu = hooks.end()
        phase.stopping = True
        try:
            async with asyncio.timeout(drain_timeout):
                await phase.drained.wait()
        except TimeoutError:
            phase.error(f"{phase.active} answers still unfinished {drain_timeout:g}s after the end")
    finally:
        for each in transports:
            each.close()
    return PhaseResult(
        concurrency=concurrency,
        seconds=seconds,
        completed=phase.completed,
        events=phase.events,
        latencies=phase.latencies,
        ttfts=phase.ttfts,
        error_count=phase.error_count,
        errors=phase.errors,
        cpu=cpu,
    )


# --- the canned server -------------------------------------------------------

_CANNED_JSON = json.dumps(
    {
        "id": "chatcmpl-canned",
        "object": "chat.completion",
        "created": 0,
        "model": "canned",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": " word" * 16},
                "logprobs": None,
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 16, "total_tokens": 21},
    },
    separators=(",", ":"),
).encode()
_PLAIN_ANSWER = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    b"content-length: " + str(len(_CANNED_JSON)).encode() + b"\r\n\r\n" + _CANNED_JSON
)
_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
)


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


_EVENT = _chunk(
    b"data: "
    + json.dumps(
        {
            "id": "chatcmpl-canned",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "canned",
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": " word"},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        },
        separators=(",", ":"),
    ).encode()
    + b"\n\n"
)
_DONE = _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
CANNED_STREAM_EVENTS = 65


class _CannedServer(asyncio.Protocol):
    __slots__ = ("_buf", "_transport")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._buf = b""

    def data_received(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        while True:
            head_end = buf.find(b"\r\n\r\n")
            if head_end < 0:
                break
            match = _CONTENT_LENGTH.search(buf, 0, head_end + 2)
            end = head_end + 4 + (int(match[1]) if match else 0)
            if len(buf) < end:
                break
            body = buf[head_end + 4 : end]
            buf = buf[end:]
            write = self._transport.write
            if b'"stream":true' in body:
                write(_STREAM_HEAD)
                for _ in range(CANNED_STREAM_EVENTS - 1):
                    write(_EVENT)
                write(_DONE)
            else:
                write(_PLAIN_ANSWER)
        self._buf = buf


async def _serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_CannedServer, host, port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the canned server")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    import uvloop

    uvloop.run(_serve(args.host, args.port))


if __name__ == "__main__":
    main()
