"""The last lines an engine printed, kept in a bounded ring for failure reports.

Bytes are split into lines on \\n and \\r (progress bars redraw with \\r), decoded
leniently, and each line is cut to a maximum length, so a chatty or binary
engine cannot grow the agent's memory.

Not guaranteed: a complete log. Only the last `max_lines` lines survive; the
full output is the engine's own business (or the agent's debug log).
"""

from __future__ import annotations

import re
from collections import deque

DEFAULT_MAX_LINES = 200
DEFAULT_MAX_LINE_CHARS = 2000
_BREAK = re.compile(rb"\r\n|\r|\n")


class OutputTail:
    """A ring buffer of the most recent output lines."""

    def __init__(
        self, *, max_lines: int = DEFAULT_MAX_LINES, max_line_chars: int = DEFAULT_MAX_LINE_CHARS
    ) -> None:
        self._lines: deque[str] = deque(maxlen=max_lines)
        self._partial = b""
        self._max_chars = max_line_chars

    def feed(self, data: bytes) -> list[str]:
        """Add raw output; returns the lines it completed."""
        parts = _BREAK.split(self._partial + data)
        # The last part has no line break yet; keep it (bounded) for the next chunk.
        self._partial = parts.pop()[: self._max_chars * 4]
        done = [self._decode(p) for p in parts if p.strip()]
        self._lines.extend(done)
        return done

    def close(self) -> list[str]:
        """The process ended: keep whatever line was not terminated."""
        rest, self._partial = self._partial, b""
        if not rest.strip():
            return []
        line = self._decode(rest)
        self._lines.append(line)
        return [line]

    def lines(self) -> tuple[str, ...]:
        return tuple(self._lines)

    def _decode(self, raw: bytes) -> str:
        text = raw.decode("utf-8", errors="replace").rstrip()
        if len(text) > self._max_chars:
            text = text[: self._max_chars] + " …"
        return text
