"""The `send` that sits between the proxy and the client of a translated API.

The proxy writes an engine's chat completion answer as it always does (one JSON
body, or SSE events relayed whole); `TranslatingSend` hands each complete piece
to a `Translation` and sends what it gives back. Usage is still read by the
proxy from the engine's own answer, so accounting is the same for every API.
Headers pass through; a whole body's `content-length` is set to the new body's.
Comments (`: llmgw ...` keep-alives and replica notes) pass through unchanged.

When the proxy served the request natively (`ParsedRequest.served_natively`:
the engine speaks the client's API), the engine's answer passes through as
bytes; only the router's own mid-stream error event, which is OpenAI-shaped,
is rewritten into the API's error event.

Not guaranteed: a body that is not JSON is handed to the translation as raw bytes.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from llmgw.router.apis import Message, Send
from llmgw.router.apis.sse_events import SSEEvents
from llmgw.router.requests import ParsedRequest

# How the proxy ends a stream it cannot finish (`proxy._send_error_event`).
_ROUTER_ERROR_EVENT = b'event: error\ndata: {"error":'


class StreamTranslation(Protocol):
    """One stream's chat chunks in, the API's events out."""

    ended: bool

    def chunk(self, chunk: dict[str, Any]) -> bytes: ...

    def end(self) -> bytes:
        """The events that end the answer once the engine's stream is over."""
        ...

    def error(self, error: dict[str, Any]) -> bytes:
        """The event that ends a stream which failed after it began (`error` is the
        router's OpenAI-shaped error object)."""
        ...


class Translation(Protocol):
    def whole(self, status: int, chat: dict[str, Any] | None, raw: bytes) -> bytes:
        """The API's body for an engine's whole answer (`chat`: parsed, when JSON)."""
        ...

    def stream(self) -> StreamTranslation: ...


def loads(data: bytes) -> dict[str, Any] | None:
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


def error_message(parsed: dict[str, Any] | None, raw: bytes) -> str:
    """The message of an OpenAI-shaped error body, or the start of the raw body."""
    if parsed is not None:
        inner = parsed.get("error")
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
    return raw[:500].decode("utf-8", "replace") or "engine error"


class TranslatingSend:
    """The `send` of one translated request."""

    __slots__ = (
        "_body",
        "_events",
        "_passthrough",
        "_req",
        "_send",
        "_start",
        "_status",
        "_stream",
        "_translation",
    )

    def __init__(self, translation: Translation, send: Send, req: ParsedRequest) -> None:
        self._translation = translation
        self._send = send
        self._req = req
        self._passthrough = False
        self._status = 200
        self._start: Message | None = None
        self._body: list[bytes] = []
        self._events: SSEEvents | None = None
        self._stream: StreamTranslation | None = None

    async def __call__(self, message: Message) -> None:
        if not self._passthrough and self._req.served_natively:
            # A queued or activating stream's headers may have gone out before the
            # proxy chose a replica; only comments were sent then.
            self._passthrough = message["type"] == "http.response.start" or self._events is not None
        if self._passthrough:
            await self._send_native(message)
            return
        if message["type"] == "http.response.start":
            self._status = message["status"]
            if any(
                name == b"content-type" and value.startswith(b"text/event-stream")
                for name, value in message.get("headers", ())
            ):
                self._events = SSEEvents()
                self._stream = self._translation.stream()
                await self._send(message)
            else:
                self._start = message
            return
        if self._events is not None:
            await self._send_events(message)
            return
        self._body.append(message.get("body", b""))
        if not message.get("more_body", False):
            await self._send_whole(b"".join(self._body))

    async def _send_native(self, message: Message) -> None:
        body = message.get("body", b"")
        if message["type"] == "http.response.body" and body.startswith(_ROUTER_ERROR_EVENT):
            parsed = loads(body[len(b"event: error\ndata: ") :].strip()) or {}
            inner = parsed.get("error")
            error = inner if isinstance(inner, dict) else {"message": "stream failed"}
            message = {**message, "body": self._translation.stream().error(error)}
        await self._send(message)

    async def _send_whole(self, raw: bytes) -> None:
        assert self._start is not None
        body = self._translation.whole(self._status, loads(raw), raw)
        headers = [
            (name, str(len(body)).encode() if name == b"content-length" else value)
            for name, value in self._start.get("headers", ())
        ]
        await self._send({**self._start, "headers": headers})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def _send_events(self, message: Message) -> None:
        assert self._events is not None and self._stream is not None
        await _send_translated(self._events, self._stream, self._send, message)


class ResumedSend:
    """The `send` of a continuation of a natively served stream: the continuation's
    chat completion events become the API's events through `stream`, a translation
    that starts where the engine's own stream broke off (its answer's ids, its open
    block or item, its event numbering)."""

    __slots__ = ("_events", "_send", "_stream")

    def __init__(self, stream: StreamTranslation, send: Send) -> None:
        self._stream = stream
        self._send = send
        self._events = SSEEvents()

    async def __call__(self, message: Message) -> None:
        if message["type"] != "http.response.body":
            await self._send(message)
            return
        await _send_translated(self._events, self._stream, self._send, message)


async def _send_translated(
    events: SSEEvents, stream: StreamTranslation, send: Send, message: Message
) -> None:
    """Send a body message of chat completion events as the API's events."""
    more = message.get("more_body", False)
    out = b""
    for name, data in events.feed(message.get("body", b"")):
        if name == "comment":
            out += data + b"\n\n"
        elif name == "error":
            parsed = loads(data) or {}
            inner = parsed.get("error")
            out += stream.error(inner if isinstance(inner, dict) else {"message": str(data)})
            stream.ended = True
        elif stream.ended:
            continue
        elif data == b"[DONE]":
            out += stream.end()
        else:
            chunk = loads(data)
            if chunk is not None:
                out += stream.chunk(chunk)
    if not more and not stream.ended:
        out += stream.end()
    if out or not more:
        await send({"type": "http.response.body", "body": out, "more_body": more})
