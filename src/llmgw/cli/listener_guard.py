"""Stalled clients are cut and connections capped, inside uvicorn's httptools protocol.

uvicorn has a keep-alive timeout and `limit_concurrency`, but no header or body
timeout: a client that sends half a request line, headers that never end, or a
body that stops holds its connection (and, once the headers are in, a task)
for ever. `GuardedHttpProtocol` subclasses uvicorn's `HttpToolsProtocol` and
adds, per connection of one listener (`ConnectionGate` holds its settings):

- **Headers**: the request line and headers must be complete within
  `header_timeout`, counted from the connection's start, or from the first
  byte of the next request on a kept-alive connection. Otherwise the connection
  is closed without an answer (no request was understood to answer to), as Go's
  `ReadHeaderTimeout` does.
- **Body**: while a request body is incomplete, `body_timeout` without a byte
  arriving ends it: the client gets 408 with an OpenAI-style error body and
  `Connection: close`, the app sees `http.disconnect`, and the connection is
  closed. Time during which this server is not reading is not the client's
  fault and does not count: uvicorn pauses reading while the app has not taken
  the body buffered so far (a request waiting in the router's queue), or while
  a pipelined request waits for the one before it; and a client that sent
  `Expect: 100-continue` waits for the app to ask for the body.
- **Connections**: at most `max_connections` connections are admitted; one
  beyond that is answered 503 (OpenAI-style, `Retry-After: 1`,
  `Connection: close`) as soon as its headers are in, without reaching the app,
  and closed. Admission is decided once, when the connection opens, so a flood
  of new connections never turns an admitted keep-alive connection's next
  request into a 503. Refused connections are held to the header timeout too.

One timer per connection does all of it: it is armed when a phase starts and
no timer is pending, and when it fires it re-arms itself for what is left. The
request path pays a clock read per parser callback, not a timer per request
(`bench/RESULTS.md`, "Listener guard").

Not guaranteed: a minimum transfer rate (a client that sends one byte just
within every `body_timeout` keeps its request, as with nginx's
`client_body_timeout`); limits across router processes; the TLS handshake,
which asyncio bounds by its own `ssl_handshake_timeout` (60 s) before any of
this starts.
"""

from __future__ import annotations

import asyncio
import logging
from asyncio import TimerHandle
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import orjson
from uvicorn._types import ASGIReceiveCallable, ASGISendCallable, Scope
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from llmgw.config import HttpServerConfig
from llmgw.metrics.listeners import CutReason, ListenerMetrics

log = logging.getLogger("llmgw.server")

_Phase = Literal["idle", "headers", "body"]
# A listener at its limit says so in the log at most this often.
_FULL_LOG_INTERVAL = 10.0
OVER_LIMIT_RETRY_AFTER = 1


def _error_body(message: str, code: str) -> bytes:
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    return orjson.dumps({"error": error})


class ConnectionGate:
    """One listener's limits and the count of the connections it admitted."""

    def __init__(
        self,
        *,
        name: str,
        limits: HttpServerConfig,
        metrics: ListenerMetrics | None,
        clock: Callable[[], float],
    ) -> None:
        self.name = name
        self.limits = limits
        self._metrics = metrics
        self._clock = clock
        self.admitted = 0
        self._full_logged_at: float | None = None
        self.over_limit_body = _error_body(
            f"this server's {name} listener has its maximum of {limits.max_connections} "
            "connections open (server.max_connections); retry in a moment",
            "too_many_connections",
        )
        self.stalled_body = _error_body(
            f"the request body stalled: nothing arrived for {limits.body_timeout:g}s "
            "(server.body_timeout); send the body without pausing, and check the network "
            "between the client and this server",
            "request_timeout",
        )

    def admit(self) -> bool:
        """Whether a new connection is within `max_connections` (then it counts)."""
        if self.admitted >= self.limits.max_connections:
            now = self._clock()
            if self._full_logged_at is None or now - self._full_logged_at >= _FULL_LOG_INTERVAL:
                self._full_logged_at = now
                log.warning(
                    "the %s listener has %d connections open, its maximum "
                    "(server.max_connections): answering new ones 503 until some close",
                    self.name,
                    self.admitted,
                )
            return False
        self.admitted += 1
        if self._metrics is not None:
            self._metrics.opened(self.name)
        return True

    def release(self) -> None:
        self.admitted -= 1
        if self._metrics is not None:
            self._metrics.closed(self.name)

    def cut(self, reason: CutReason) -> None:
        if self._metrics is not None:
            self._metrics.cut(self.name, reason)


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header and body timeouts and a connection cap.

    Made per listener by `protocol_for(gate)`, since uvicorn builds protocols
    from a class.
    """

    gate: ClassVar[ConnectionGate]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        limits = self.gate.limits
        self._header_timeout = limits.header_timeout
        self._body_timeout = limits.body_timeout
        self._now = self.loop.time
        self._phase: _Phase = "idle"
        self._since = 0.0
        self._timer: TimerHandle | None = None
        self._admitted = False

    # ---- connection ----

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._admitted = self.gate.admit()
        if not self._admitted:
            self.app = self._refuse
            self.gate.cut("over_limit")
        self._start("headers", self._header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._admitted:
            self._admitted = False
            self.gate.release()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._phase = "idle"
        super().connection_lost(exc)

    # ---- parser callbacks (on every request: kept to a clock read each) ----

    def on_message_begin(self) -> None:
        HttpToolsProtocol.on_message_begin(self)
        if self._phase == "idle":
            # The next request on a kept-alive connection: its clock starts now.
            self._start("headers", self._header_timeout)

    def on_headers_complete(self) -> None:
        self._start("body", self._body_timeout)
        HttpToolsProtocol.on_headers_complete(self)

    def on_body(self, body: bytes) -> None:
        self._since = self._now()
        HttpToolsProtocol.on_body(self, body)

    def on_message_complete(self) -> None:
        self._phase = "idle"
        HttpToolsProtocol.on_message_complete(self)

    # ---- the timer ----

    def _start(self, phase: _Phase, limit: float) -> None:
        self._phase = phase
        self._since = self._now()
        if self._timer is None:
            self._timer = self.loop.call_later(limit, self._check)

    def _check(self) -> None:
        self._timer = None
        phase = self._phase
        if phase == "idle" or self.transport.is_closing():
            return
        limit = self._header_timeout if phase == "headers" else self._body_timeout
        now = self._now()
        if self.flow.read_paused or self._holding(phase):
            # This server is not reading (the app has not taken the body yet, or a
            # pipelined request waits for the one before it), or has not yet asked
            # for the body (`Expect: 100-continue`): not the client's fault.
            self._since = now
        left = self._since + limit - now
        if left > 0:
            self._timer = self.loop.call_later(left, self._check)
            return
        if phase == "headers":
            self._cut_headers()
        else:
            self._cut_body()

    def _holding(self, phase: _Phase) -> bool:
        cycle = self.cycle
        if cycle is None:
            return False
        if phase == "headers":
            return not cycle.response_complete
        return cycle.waiting_for_100_continue and not cycle.response_started

    def _cut_headers(self) -> None:
        log.debug(
            "%s listener: closed a connection from %s whose request headers did not arrive "
            "within %gs (server.header_timeout)",
            self.gate.name,
            _peer(self.client),
            self.gate.limits.header_timeout,
        )
        self.gate.cut("header_timeout")
        self._phase = "idle"
        self.transport.close()

    def _cut_body(self) -> None:
        log.debug(
            "%s listener: a request body from %s stalled for %gs (server.body_timeout): "
            "answered 408 and closed",
            self.gate.name,
            _peer(self.client),
            self.gate.limits.body_timeout,
        )
        self.gate.cut("body_timeout")
        self._phase = "idle"
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:
            # The app (waiting in receive) sees a disconnect; whatever it sends after
            # this is dropped, since the 408 below is the answer.
            cycle.disconnected = True
            cycle.message_event.set()
            self.transport.write(
                _raw_response(408, self.gate.stalled_body, self.server_state.default_headers)
            )
        self.transport.close()

    async def _refuse(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        body = self.gate.over_limit_body
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"retry-after", str(OVER_LIMIT_RETRY_AFTER).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _raw_response(status: int, body: bytes, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    parts = [STATUS_LINE[status]]
    for name, value in default_headers:
        parts.extend([name, b": ", value, b"\r\n"])
    parts.extend(
        [
            b"content-type: application/json\r\n",
            b"content-length: " + str(len(body)).encode() + b"\r\n",
            b"connection: close\r\n\r\n",
            body,
        ]
    )
    return b"".join(parts)


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "an unknown address"


def protocol_for(gate: ConnectionGate) -> type[GuardedHttpProtocol]:
    """The protocol class uvicorn builds the connections of `gate`'s listener from."""
    return type(f"GuardedHttpProtocol_{gate.name}", (GuardedHttpProtocol,), {"gate": gate})
