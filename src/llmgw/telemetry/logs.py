"""Log formats: the human one (unchanged) and JSON, one object per line.

A JSON line has `time` (UTC, ISO 8601), `level`, `logger`, `message`, the context
fields a log call passed with `extra=` (request_id, model, node, replica, ...),
`trace_id`/`span_id` when the line was written inside a recorded span, and
`exception` with the traceback when there was one.

Not guaranteed: that a third-party library's lines carry context fields; they
carry what their logger passed.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Final, TextIO

import orjson
from opentelemetry import trace

HUMAN = "human"
JSON = "json"
LOG_FORMATS: Final = (HUMAN, JSON)
HUMAN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys() | {"message", "asctime", "taskName"}
)


def log_format(value: str, *, source: str) -> str:
    """`value` as a log format; ValueError naming `source` (the flag or variable)."""
    text = value.strip().lower()
    if text not in LOG_FORMATS:
        raise ValueError(f"{source} {value!r}: use human or json")
    return text


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring for the fields)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if "trace_id" not in entry:
            context = trace.get_current_span().get_span_context()
            if context.is_valid:
                entry["trace_id"] = trace.format_trace_id(context.trace_id)
                entry["span_id"] = trace.format_span_id(context.span_id)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(entry, default=str).decode()


def configure_logging(level: int, fmt: str, *, stream: TextIO | None = None) -> None:
    """Send the root logger's records to stderr in `fmt` (human or json) at `level`.

    A handler this function installed before is replaced (the root command sets the
    format, a sub-command then its level); a root logger with other handlers is left
    alone, like `logging.basicConfig` does (a test harness or an embedding program
    configured it)."""
    root = logging.getLogger()
    ours = [h for h in root.handlers if isinstance(h, _OwnHandler)]
    if len(ours) != len(root.handlers):
        return
    for old in ours:
        root.removeHandler(old)
    handler = _OwnHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == JSON else logging.Formatter(HUMAN_FORMAT))
    root.addHandler(handler)
    root.setLevel(level)


class _OwnHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler `configure_logging` installs (told apart from anyone else's)."""
