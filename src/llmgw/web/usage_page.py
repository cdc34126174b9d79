"""The usage page and its CSV export: tokens and requests by key, by team, by end user,
by model and over time.

Rows come from the usage repository's roll-ups through the same
`usage_row_view` the admin API's `/admin/api/usage` and `llmgw usage --json`
use, with key names from the key service (revoked keys included, so old usage
keeps its name). A range is a preset ("1h", "24h", "7d", "30d") ending now, or
`since`/`until` given as ISO 8601 or as a browser's datetime-local value
(read as UTC). The charts are per hour up to 7 days and per day beyond, so
a month is 30 points read from the daily roll-ups, not 720 hours.

Not guaranteed: resolution below an hour (the roll-ups are hourly, so "last
hour" covers the current and the previous clock hour), or a CSV that
spreadsheets read as formulas: cells starting with =, +, -, @ get a leading
apostrophe so they stay text.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, get_args

from llmgw.store import UsageDimension
from llmgw.usage.views import usage_row_view
from llmgw.web.charts import LineChart, line_chart, share
from llmgw.web.sources import DashboardSources

PRESETS: dict[str, timedelta] = {
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}
DEFAULT_PRESET = "24h"
DIMENSIONS: tuple[str, ...] = get_args(UsageDimension)
TOP = 10
# End users shown on the page (the CSV by end user has them all).
END_USER_ROWS = 50
# Ranges longer than this are charted per day.
HOURLY_CHART_LIMIT = timedelta(days=7)
CSV_COLUMNS = (
    "requests",
    "errors",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "mean_latency_ms",
)
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


class UsageInputError(Exception):
    """A range or grouping the page cannot read; the message says what to send."""


@dataclass(frozen=True, slots=True)
class UsageRange:
    since: datetime
    until: datetime
    preset: str  # "" for a custom range

    def query(self) -> str:
        """The range as URL query parameters (for links and the CSV export)."""
        if self.preset:
            return f"range={self.preset}"
        return f"since={self.since.isoformat()}&until={self.until.isoformat()}"


def _parse_time(field: str, text: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise UsageInputError(
            f"'{field}' is not a date and time (e.g. 2026-01-31T09:00 or "
            f"2026-01-31T09:00:00+00:00): {text!r}"
        ) from exc
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def parse_range(params: Mapping[str, str], now: datetime) -> UsageRange:
    since_text, until_text = params.get("since", ""), params.get("until", "")
    if since_text or until_text:
        since = _parse_time("since", since_text) if since_text else now - PRESETS["24h"]
        until = _parse_time("until", until_text) if until_text else now
        if since >= until:
            raise UsageInputError(
                f"'since' ({since:%Y-%m-%d %H:%M}) must be before 'until' ({until:%Y-%m-%d %H:%M})"
            )
        return UsageRange(since, until, "")
    preset = params.get("range") or DEFAULT_PRESET
    if preset not in PRESETS:
        raise UsageInputError(f"'range' takes {', '.join(PRESETS)}; got {preset!r}")
    return UsageRange(now - PRESETS[preset], now, preset)


def parse_by(text: str) -> tuple[UsageDimension, ...]:
    by = tuple(p.strip() for p in text.split(",") if p.strip())
    for dimension in by:
        if dimension not in DIMENSIONS:
            raise UsageInputError(f"'by' takes {', '.join(DIMENSIONS)}; got {dimension!r}")
    if "hour" in by and "day" in by:
        raise UsageInputError("'by' takes hour or day, not both")
    return by  # type: ignore[return-value]


async def usage_rows(
    sources: DashboardSources,
    span: UsageRange,
    by: Sequence[UsageDimension],
    top: int | None = None,
) -> list[dict[str, Any]]:
    """Rows as `/admin/api/usage` gives them (the `top` by tokens when given); raises the
    store's `StoreError`."""
    rows = await sources.usage.query(since=span.since, until=span.until, group_by=by, top=top)
    names = {k.id: k.name for k in await sources.keys.list(include_revoked=True)}
    team_names = (
        {t.id: t.name for t in await sources.teams.list()}
        if sources.teams is not None and "team" in by and rows
        else {}
    )
    return [usage_row_view(r, by, names, team_names) for r in rows]


def team_label(row: Mapping[str, Any]) -> str:
    if row.get("team"):
        return str(row["team"])
    return str(row["team_id"]) if row.get("team_id") else "(no team)"


def end_user_label(row: Mapping[str, Any]) -> str:
    return f"{row['end_user']} · {key_label(row)}"


def key_label(row: Mapping[str, Any]) -> str:
    if row.get("key_name"):
        return str(row["key_name"])
    return str(row["key_id"]) if row.get("key_id") else "(no key)"


def _bars(rows: Sequence[dict[str, Any]], label: str) -> list[dict[str, Any]]:
    top = sorted(rows, key=lambda r: r["total_tokens"], reverse=True)[:TOP]
    largest = top[0]["total_tokens"] if top else 0
    return [
        {"label": r[label], "tokens": r["total_tokens"], "share": share(r["total_tokens"], largest)}
        for r in top
    ]


def chart_step(span: UsageRange) -> UsageDimension:
    """ "hour" or "day": what one point of the page's charts covers."""
    return "hour" if span.until - span.since <= HOURLY_CHART_LIMIT else "day"


def _charts(
    rows: Sequence[Mapping[str, Any]], span: UsageRange, step: UsageDimension
) -> list[LineChart]:
    if step == "day":
        by_time = {datetime.fromisoformat(r["day"]).replace(tzinfo=UTC): r for r in rows}
        start = span.since.replace(hour=0, minute=0, second=0, microsecond=0)
        delta, fmt = timedelta(days=1), "%m-%d"
    else:
        by_time = {datetime.fromisoformat(r["hour"]): r for r in rows if r.get("hour")}
        start = span.since.replace(minute=0, second=0, microsecond=0)
        delta, fmt = timedelta(hours=1), "%m-%d %H:00"
    moments = []
    moment = start
    while moment < span.until:
        moments.append(moment)
        moment += delta
    x_range = (0.0, float(max(1, len(moments) - 1)))
    left = f"{start:{fmt}}"
    right = f"{moments[-1]:{fmt}}" if moments else left

    def series(field: str) -> list[tuple[float, float | None]]:
        return [
            (float(i), float(by_time[m][field]) if m in by_time else 0.0)
            for i, m in enumerate(moments)
        ]

    return [
        line_chart(
            f"Tokens / {step}",
            series("total_tokens"),
            x_range=x_range,
            fmt=lambda v: f"{v:,.0f}",
            left_label=left,
            right_label=right,
        ),
        line_chart(
            f"Requests / {step}",
            series("requests"),
            x_range=x_range,
            fmt=lambda v: f"{v:,.0f}",
            left_label=left,
            right_label=right,
        ),
    ]


async def usage_page(sources: DashboardSources, span: UsageRange) -> dict[str, Any]:
    """The page's context; raises the store's `StoreError`."""
    by_key = await usage_rows(sources, span, ("key",))
    by_model = await usage_rows(sources, span, ("model",))
    by_team = await usage_rows(sources, span, ("team",))
    by_end_user = await usage_rows(sources, span, ("key", "end-user"), top=END_USER_ROWS)
    step = chart_step(span)
    over_time = await usage_rows(sources, span, (step,))
    for row in by_key:
        row["label"] = key_label(row)
    for row in by_model:
        row["label"] = row["model"]
    for row in by_team:
        row["label"] = team_label(row)
    for row in by_end_user:
        row["label"] = end_user_label(row)
    totals = {c: sum(r[c] for r in by_model) for c in CSV_COLUMNS if c != "mean_latency_ms"}
    return {
        "span": span,
        "presets": list(PRESETS),
        "by_key": sorted(by_key, key=lambda r: r["total_tokens"], reverse=True),
        "by_model": sorted(by_model, key=lambda r: r["total_tokens"], reverse=True),
        "by_team": sorted(by_team, key=lambda r: r["total_tokens"], reverse=True),
        # The top end users only (read so from the store): an application may have millions.
        "by_end_user": sorted(by_end_user, key=lambda r: r["total_tokens"], reverse=True),
        "key_bars": _bars(by_key, "label"),
        "model_bars": _bars(by_model, "label"),
        "charts": _charts(over_time, span, step),
        "totals": totals,
    }


def _cell(value: object) -> object:
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return "" if value is None else value


def usage_csv(rows: Sequence[Mapping[str, Any]], by: Sequence[UsageDimension]) -> str:
    """One header line, then one line per row; the columns of `usage_row_view`."""
    columns: list[str] = []
    if "hour" in by:
        columns.append("hour")
    if "day" in by:
        columns.append("day")
    if "team" in by:
        columns += ["team_id", "team"]
    if "key" in by:
        columns += ["key_id", "key_name"]
    if "end-user" in by:
        columns.append("end_user")
    if "model" in by:
        columns.append("model")
    columns += CSV_COLUMNS
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell(row.get(c)) for c in columns])
    return out.getvalue()
