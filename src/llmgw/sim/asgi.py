"""Raw ASGI plumbing: types, reading a body, sending JSON and errors, watching disconnects.

The sim speaks ASGI directly instead of through a framework so that a zero-delay
request costs little more than uvicorn itself; these helpers are the whole framework.

Not guaranteed: `read_body` buffers the whole body in memory (request bodies here are
small JSON), and `until_disconnect` relies on the server's `receive()` reporting
`http.disconnect` only after the client really went away while the response is not
complete, which uvicorn and httpx's ASGI transport both do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any, Final

import orjson

from llmgw.sim.errors import SimError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

JSON_HEADERS: Final = ((b"content-type", b"application/json"),)


async def read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None when the client disconnected before sending it."""
    message = await receive()
    if message["type"] == "http.disconnect":
        return None
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        return body
    parts = [body]
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


async def send_bytes(
    send: Send,
    status: int,
    body: bytes,
    headers: Sequence[tuple[bytes, bytes]] = JSON_HEADERS,
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_json(send: Send, status: int, payload: object) -> None:
    await send_bytes(send, status, orjson.dumps(payload))


async def send_error(
    send: Send, error: SimError, extra_headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    headers = (*JSON_HEADERS, *extra_headers) if extra_headers else JSON_HEADERS
    await send_bytes(send, error.status, error.body(), headers)


class _Watch:
    __slots__ = ("disconnected", "finished")

    def __init__(self) -> None:
        self.disconnected = False
        self.finished = False


async def until_disconnect(receive: Receive, work: Awaitable[None]) -> bool:
    """Run `work`; cancel it if the client disconnects. True if it finished, False if not.

    Call it only after the request body was read, and keep the send that completes the
    response outside `work`: once a response is complete, `receive()` answers
    `http.disconnect` straight away, which would look like a departed client.
    """
    task = asyncio.current_task()
    if task is None:  # pragma: no cover - ASGI apps always run inside a task
        raise RuntimeError("until_disconnect must be awaited inside an asyncio task")
    watch = _Watch()

    async def watch_receive() -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not watch.finished:
                    watch.disconnected = True
                    task.cancel()
                return

    watcher = asyncio.get_running_loop().create_task(watch_receive())
    try:
        await work
    except asyncio.CancelledError:
        # Swallow only our own cancellation; a server shutdown must still propagate.
        if watch.disconnected and task.uncancel() == 0:
            return False
        raise
    finally:
        watch.finished = True
        watcher.cancel()
    return True
