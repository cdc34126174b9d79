"""The dashboard's Jinja2 environment: package templates, autoescaping, formatting filters.

Every value put into a page is HTML-escaped (autoescape on for every
template); undefined names are errors, not blank text, so a renamed field in
a view shows up in the tests instead of as an empty cell.

Not guaranteed: localised formatting. Sizes are binary (GiB), times UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined

GIB = float(1 << 30)
# What a page shows for a value it does not have (an en dash).
NONE = "\u2013"


def gib(value: object) -> str:
    """Bytes as GiB with one decimal (TiB from 10 TiB on); '?' when unknown."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "?"
    if value >= 10 * 1024 * GIB:
        return f"{value / (1024 * GIB):,.1f} TiB"
    return f"{value / GIB:,.1f} GiB"


def number(value: object) -> str:
    """An integer with thousands separators; floats to one decimal."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return NONE if value is None else str(value)
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.1f}"
    return f"{int(value):,}"


def seconds(value: object) -> str:
    """A duration in s, min or h, for ages and intervals."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return NONE
    if value < 10:
        return f"{value:.1f} s"
    if value < 120:
        return f"{value:.0f} s"
    if value < 7200:
        return f"{value / 60:.0f} min"
    if value < 172800:
        return f"{value / 3600:.0f} h"
    return f"{value / 86400:.0f} d"


def when(value: object) -> str:
    """An ISO 8601 time as 'YYYY-MM-DD HH:MM:SS' UTC; the text itself if it is not one."""
    if not isinstance(value, str) or not value:
        return NONE
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return value
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(UTC)
    return parsed.strftime("%Y-%m-%d %H:%M:%S")


def hub_bytes(value: object) -> str:
    """Bytes as the hub counts them (1 GB = 10^9 bytes), as download progress shows."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return NONE
    amount = float(value)
    for unit in ("B", "kB", "MB", "GB"):
        if amount < 1000 or unit == "GB":
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1000
    return f"{amount:.1f} TB"


def percent(value: object) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return NONE
    return f"{value:.0f}%"


def milliseconds(value: object) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return NONE
    return f"{value:,.0f} ms"


class Renderer:
    """Renders the package's templates; one per dashboard (built with its routes)."""

    def __init__(self) -> None:
        self._env = Environment(
            loader=PackageLoader("llmgw.web", "templates"),
            autoescape=True,
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            auto_reload=False,
        )
        self._env.filters.update(
            gib=gib,
            number=number,
            seconds=seconds,
            when=when,
            percent=percent,
            ms=milliseconds,
            hub_bytes=hub_bytes,
        )

    def render(self, template: str, context: dict[str, Any]) -> str:
        return self._env.get_template(template).render(context)
