"""Splitting a stream of server-sent events into (event name, data) pairs, and writing them.

Used by the API translators, which re-shape every event anyway. Comments
(`: ...` lines, the router's keep-alives and replica notes) come out as
("comment", line) so they can be passed on.
Not guaranteed: events with bare "\\r" line endings are not split; multi-line
`data:` fields are joined with "\\n" as the SSE specification says.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import orjson

_EVENT_END = re.compile(rb"\r?\n\r?\n")


def format_event(name: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


class SSEEvents:
    """Feeds bytes in, yields complete events."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> Iterator[tuple[str, bytes]]:
        buf = self._pending + data if self._pending else data
        pos = 0
        for match in _EVENT_END.finditer(buf):
            event = buf[pos : match.start()]
            pos = match.end()
            parsed = _parse(event)
            if parsed is not None:
                yield parsed
        self._pending = buf[pos:]


def _parse(event: bytes) -> tuple[str, bytes] | None:
    name = "message"
    data: list[bytes] = []
    comment: bytes | None = None
    for line in event.splitlines():
        if line.startswith(b":"):
            comment = line
        elif line.startswith(b"event:"):
            name = line[6:].strip().decode("utf-8", "replace")
        elif line.startswith(b"data:"):
            data.append(line[5:].lstrip(b" "))
    if data:
        return name, b"\n".join(data)
    if comment is not None:
        return "comment", comment
    return None
