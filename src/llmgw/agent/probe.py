"""One HTTP GET against an engine's readiness path, with the stdlib only.

The agent only needs the status code of a local GET, so it speaks just enough
HTTP/1.1 over an asyncio stream (one connection per probe, `Connection: close`)
rather than pulling an HTTP client into every GPU node.

Not guaranteed: anything about the body, redirects, TLS or proxies.
"""

from __future__ import annotations

import asyncio
import contextlib


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
