"""`--log-format` (and `LLMGW_LOG_FORMAT`), shared by every command.

The root command takes it for the short commands (their warnings); the long-running
ones (server, agent, sim, up) take it too, beside `--log-level`.
"""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from llmgw.telemetry.logs import configure_logging, log_format

LogFormat = Annotated[
    str,
    typer.Option(
        "--log-format",
        envvar="LLMGW_LOG_FORMAT",
        help="human (one readable line per record) or json (one JSON object per line: "
        "time, level, logger, message and context fields such as request_id, trace_id, "
        "model, node, replica).",
    ),
]


def setup_logging(level_name: str, fmt: str) -> int:
    """Configure the root logger; the level. typer.Exit(2) saying what to pass on a
    bad level or format."""
    level = getattr(logging, level_name.upper(), None)
    if not isinstance(level, int):
        message = f"--log-level {level_name!r}: use debug, info, warning or error"
        typer.echo(f"error: {message}", err=True)
        raise typer.Exit(code=2)
    try:
        chosen = log_format(fmt, source="--log-format (or LLMGW_LOG_FORMAT)")
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    configure_logging(level, chosen)
    return level
