"""One HTTP GET against an engine's readiness path (and the POSTs that put an engine
to sleep and wake it) with the stdlib only, and the GET that lists an adopted
engine's adapters with httpx (a body of any transfer encoding).

For a probe the agent only needs the status code of a local GET, so it speaks
just enough HTTP/1.1 over an asyncio stream (one connection per probe,
`Connection: close`), cheap enough to run every second for every engine.

Not guaranteed: redirects, TLS or proxies; a body past `http_get`'s cap (the
engines' answers read here are small).
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx


class ProbeError(Exception):
    """The engine did not answer with an HTTP status (refused, reset, garbage)."""


async def http_status(host: str, port: int, path: str) -> int:
    """GET `path` on host:port and return the response status code.

    Has no deadline of its own: callers wrap it in `asyncio.timeout`.
    """
    try:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(
                f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                "User-Agent: llmgw-agent\r\nConnection: close\r\n\r\n".encode("ascii")
            )
            await writer.drain()
            status_line = await reader.readline()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    except OSError as exc:
        raise ProbeError(exc.strerror or str(exc)) from exc
    parts = status_line.split(maxsplit=2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise ProbeError(f"not an HTTP response: {status_line[:80]!r}")
    return int(parts[1])


async def http_post(host: str, port: int, path: str, body: bytes) -> tuple[int, bytes]:
    """POST `body` (JSON when not empty) to `path` on host:port; the status and up to
    4 KiB of the answer, for an error message. No deadline of its own."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: llmgw-agent\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    try:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(head.encode("ascii") + body)
            await writer.drain()
            # To the end (Connection: close) or the cap: the head and the body may come
            # in separate reads, and an error's body is the engine's reason.
            answer = b""
            while len(answer) < 4096:
                chunk = await reader.read(4096 - len(answer))
                if not chunk:
                    break
                answer += chunk
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    except OSError as exc:
        raise ProbeError(exc.strerror or str(exc)) from exc
    status_line, _, rest = answer.partition(b"\r\n")
    parts = status_line.split(maxsplit=2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise ProbeError(f"not an HTTP response: {status_line[:80]!r}")
    return int(parts[1]), rest.partition(b"\r\n\r\n")[2]


# The most `http_get` reads of an answer: /v1/models of an engine with hundreds of
# adapters is still far below it.
GET_LIMIT = 1 << 20


async def http_get(host: str, port: int, path: str) -> tuple[int, bytes]:
    """GET `path` on host:port with httpx; the status and the body (any transfer
    encoding decoded by httpx). `ProbeError` for no HTTP answer or a body over
    `GET_LIMIT`. No deadline of its own."""
    url = f"http://{host}:{port}{path}"
    headers = {"User-Agent": "llmgw-agent", "Connection": "close"}
    try:
        async with (
            httpx.AsyncClient(trust_env=False, timeout=None) as client,
            client.stream("GET", url, headers=headers) as answer,
        ):
            body = bytearray()
            async for chunk in answer.aiter_bytes():
                body += chunk
                if len(body) > GET_LIMIT:
                    raise ProbeError(f"GET {path}: the answer is over {GET_LIMIT} bytes")
            return answer.status_code, bytes(body)
    except httpx.RemoteProtocolError as exc:
        raise ProbeError(f"not an HTTP response: {exc}") from exc
    except httpx.HTTPError as exc:
        raise ProbeError(str(exc) or type(exc).__name__) from exc


async def is_sleeping(host: str, port: int, path: str) -> bool:
    """GET vLLM's `/is_sleeping` (`{"is_sleeping": true}`); False for any other answer."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "User-Agent: llmgw-agent\r\nConnection: close\r\n\r\n".encode("ascii")
        )
        await writer.drain()
        answer = await reader.read(4096)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    head, _, body = answer.partition(b"\r\n\r\n")
    if not head.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")):
        return False
    try:
        return json.loads(body).get("is_sleeping") is True
    except (ValueError, AttributeError):
        return False
