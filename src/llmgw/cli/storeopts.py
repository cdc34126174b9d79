"""What the store commands (`llmgw keys`, `llmgw usage`, `llmgw db`) share.

The `--data-dir` / `--store` options, opening the store with migrations applied
and closing it, turning errors into one `error: ...` line and an exit code
(2: bad input, 1: store unavailable or failing), parsing times as people type
them, and plain-text tables. Imports only typer and the standard library at the
top, so `llmgw --help` stays fast; the store is imported when a command runs.

Not guaranteed: a stable text layout for tables; scripts should use `--json`.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer

if TYPE_CHECKING:
    from llmgw.store import Store

T = TypeVar("T")

EXIT_BAD_INPUT = 2
EXIT_STORE = 1
DEFAULT_DATA_DIR = Path("~/.local/share/llmgw")

DataDirOption = Annotated[
    Path,
    typer.Option(
        "--data-dir",
        envvar="LLMGW_DATA_DIR",
        help="Directory of the SQLite store (llmgw.db); ignored when --store is given.",
        show_default="~/.local/share/llmgw",
    ),
]
StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        envvar="LLMGW_STORE",
        help="Store URL: sqlite:///PATH or postgresql://USER[:PASS]@HOST[:PORT]/DB "
        "(overrides --data-dir).",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

_DURATION = re.compile(r"^(\d+)\s*(s|sec|m|min|h|d|w)$")
_UNITS = {
    "s": "seconds",
    "sec": "seconds",
    "m": "minutes",
    "min": "minutes",
    "h": "hours",
    "d": "days",
    "w": "weeks",
}


class BadInput(Exception):
    """A command-line value is wrong; the message names the flag. Exit code 2."""


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print `error: message` on stderr and exit with `code`."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=code)


def run_with_store(data_dir: Path, store: str | None, action: Callable[[Store], Awaitable[T]]) -> T:
    """Open the store, apply migrations, run `action`, close it; errors become exits."""
    from llmgw.store import (
        Ambiguous,
        BadStoreUrl,
        Conflict,
        InvalidValue,
        NotFound,
        StoreError,
        StoreUnavailable,
    )

    try:
        return asyncio.run(_with_store(data_dir, store, action))
    except BadInput as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except (BadStoreUrl, NotFound, Ambiguous, Conflict, InvalidValue) as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except StoreUnavailable as exc:
        fail(str(exc), EXIT_STORE)
    except StoreError as exc:
        fail(str(exc), EXIT_STORE)


async def _with_store(
    data_dir: Path, store: str | None, action: Callable[[Store], Awaitable[T]]
) -> T:
    from llmgw.store import open_store, store_url

    opened = await open_store(store_url(data_dir, store))
    try:
        await opened.upgrade()
        return await action(opened)
    finally:
        await opened.close()


def parse_time(flag: str, value: str, *, now: datetime, future: bool = False) -> datetime:
    """An aware UTC datetime from what people type after `flag`.

    YYYY-MM-DD (midnight UTC), an ISO datetime (UTC unless it carries an offset),
    or a duration like 3600s, 30m, 24h, 7d, 2w: that long before `now`, or after
    it when `future`. A bare number is refused rather than guessed at: it could
    mean seconds or a compact date (20250301).
    """
    text = value.strip()
    relative = "from now" if future else "ago"
    match = _DURATION.match(text)
    if match:
        delta = timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
        return now + delta if future else now - delta
    if text.isdigit() and len(text) != 8:
        raise BadInput(
            f"{flag} {value!r}: a duration needs a unit: {text}s (seconds), {text}m, "
            f"{text}h or {text}d {relative}; or give a date YYYY-MM-DD"
        )
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise BadInput(
            f"{flag} {value!r}: expected YYYY-MM-DD, an ISO datetime such as "
            f"2025-03-01T12:00 (UTC unless it has an offset), or a duration {relative} "
            "such as 3600s, 30m, 24h, 7d or 2w"
        ) from None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def format_time(ts: datetime | None, empty: str = "-") -> str:
    """A UTC time for tables: `2025-03-01 12:00`."""
    return ts.astimezone(UTC).strftime("%Y-%m-%d %H:%M") if ts is not None else empty


def iso(ts: datetime | None) -> str | None:
    """A UTC time for JSON output."""
    return ts.astimezone(UTC).isoformat() if ts is not None else None


def render_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], *, right: frozenset[int] = frozenset()
) -> str:
    """A plain-text table; columns in `right` (by index) are right-aligned."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        padded = [
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(padded).rstrip()

    return "\n".join([line(headers), *(line(row) for row in rows)])


def print_json(data: Any) -> None:
    """Pretty JSON on stdout."""
    typer.echo(json.dumps(data, indent=2, sort_keys=False))
