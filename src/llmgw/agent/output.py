"""The last lines an engine printed, kept in a bounded ring for failure reports.

Engines write to a log file per shard (see `process.spawn`); `LogFollower`
reads what they append, feeds the ring and keeps the file bounded.

Bytes are split into lines on \\n and \\r (progress bars redraw with \\r), decoded
leniently, and each line is cut to a maximum length, so a chatty or binary
engine cannot grow the agent's memory.

Not guaranteed: a complete log. Only the last `max_lines` lines survive in
the ring, and the log file holds at most about two rotations' worth.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections import deque
from pathlib import Path

DEFAULT_MAX_LINES = 200
DEFAULT_MAX_LINE_CHARS = 2000
MAX_READ_BYTES = 2**20
"""The most a `LogFollower` reads at once; anything older is skipped."""
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


class LogFollower:
    """Reads what an engine appends to its log file and feeds it to an `OutputTail`.

    The engine writes the file with O_APPEND, so the agent may cut it: once it
    is over `max_bytes`, its content is copied to `PATH.1` (replacing the
    previous copy) and the file truncated; the engine's next write lands at the
    new end. Lines written between the copy and the truncation are lost, and
    while no agent runs nothing cuts the file.
    """

    def __init__(self, path: Path, tail: OutputTail, *, max_bytes: int) -> None:
        self._path = path
        self._tail = tail
        self._max_bytes = max_bytes
        self._offset = 0

    def start_at_end(self, *, keep: int = 64 * 1024) -> None:
        """Skip all but about the last `keep` bytes already there, from a line start
        (an adopted engine's recent output; blocking: file I/O)."""
        try:
            with self._path.open("rb") as log_file:
                size = os.fstat(log_file.fileno()).st_size
                if size <= keep:
                    return
                log_file.seek(size - keep)
                chunk = log_file.read(keep)
        except FileNotFoundError:
            return
        newline = chunk.find(b"\n")
        self._offset = size - keep + (newline + 1 if newline >= 0 else len(chunk))

    def read(self) -> list[str]:
        """Feed whatever is new; returns the completed lines (blocking: file I/O)."""
        try:
            with self._path.open("rb") as log_file:
                size = os.fstat(log_file.fileno()).st_size
                if size < self._offset:
                    self._offset = 0  # cut by a rotation (ours or an earlier agent's)
                skipped = size - self._offset > MAX_READ_BYTES
                if skipped:
                    # Only the tail matters: jump over what a chatty engine wrote since.
                    self._offset = size - MAX_READ_BYTES
                log_file.seek(self._offset)
                data = log_file.read(max(0, size - self._offset))
        except FileNotFoundError:
            return []
        self._offset += len(data)
        if skipped:
            newline = data.find(b"\n")
            data = data[newline + 1 :] if newline >= 0 else b""
        lines = self._tail.feed(data) if data else []
        if self._offset > self._max_bytes:
            self._rotate()
        return lines

    def _rotate(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            shutil.copyfile(self._path, self._path.with_name(self._path.name + ".1"))
            os.truncate(self._path, 0)
        self._offset = 0
