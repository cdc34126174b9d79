"""`llmgw usage`: a usage report from the store's hourly and daily roll-ups.

Filters by key (id, name or prefix), model and time window, and groups by hour
or day, key and model. Reads only the roll-ups, so it stays fast and still
covers hours whose raw records have been pruned. Grouped by model, a report
with LoRA adapters in it has a BASE column: each adapter's base model, as the
catalog had it at the adapter's latest request ("-" for the other models).

Not guaranteed: sub-hour resolution. `--since` is rounded down to its hour (that
hour is included) and an hour is included if it starts before `--until`.

`--requests N` lists single requests instead (newest first, with their queue wait),
from the raw records, which are kept `usage.retention_days`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import typer

from llmgw.cli.storeopts import (
    DEFAULT_DATA_DIR,
    BadInput,
    DataDirOption,
    JsonOption,
    StoreOption,
    fail,
    format_time,
    parse_time,
    print_json,
    render_table,
    run_with_store,
)

if TYPE_CHECKING:
    from pathlib import Path

    from llmgw.store import Store, UsageDimension, UsageRecord, UsageRow

DIMENSIONS: tuple[UsageDimension, ...] = ("hour", "day", "team", "key", "end-user", "model")
NO_TEAM = "(no team)"
NO_KEY = "(no key)"


def usage(
    key: Annotated[
        str | None, typer.Option("--key", help="Only this key (id, name or prefix).")
    ] = None,
    model: Annotated[str | None, typer.Option("--model", help="Only this model.")] = None,
    team: Annotated[
        str | None,
        typer.Option("--team", help="Only the keys of this team (name or id)."),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            help="Start: YYYY-MM-DD, an ISO datetime (UTC), or a duration ago such as 24h "
            "or 7d [default: everything recorded].",
        ),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option("--until", help="End, in the same forms as --since [default: now]."),
    ] = None,
    by: Annotated[
        list[str] | None,
        typer.Option(
            "--by",
            help="Group by hour or day, team, key, end-user and/or model; repeat or "
            "comma-separate [default: key,model]. A key's usage counts for the team it is "
            "in now; by end-user (the `user` requests name) counts only requests that "
            "named one.",
        ),
    ] = None,
    end_user: Annotated[
        str | None,
        typer.Option("--end-user", help="Only this end user (as the requests named it)."),
    ] = None,
    requests: Annotated[
        int | None,
        typer.Option(
            "--requests",
            metavar="N",
            help="Instead of the report, list the N latest requests (newest first): status, "
            "tokens, latency, time to first token and time waited in the router's queue. "
            "Kept for usage.retention_days.",
            show_default=False,
        ),
    ] = None,
    json_out: JsonOption = False,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    store: StoreOption = None,
) -> None:
    """Show tokens, requests and errors per key and model (or hour, or day), or single
    requests with --requests."""
    from llmgw.usage.views import usage_row_view

    now = datetime.now(UTC)
    if requests is not None and requests < 1:
        fail(f"--requests {requests}: give how many of the latest requests to list (1 or more)")
    if requests is not None and team is not None:
        fail("--team narrows the report; --requests lists single requests: give one of them")
    if requests is not None and by:
        fail("--by groups the report; --requests lists single requests: give one of them")
    if requests is not None and end_user is not None:
        fail("--end-user narrows the report; --requests lists single requests: give one of them")
    try:
        group_by = _dimensions(by)
        start = parse_time("--since", since, now=now) if since is not None else None
        end = parse_time("--until", until, now=now) if until is not None else None
    except BadInput as exc:
        fail(str(exc))
    if start is not None and end is not None and start >= end:
        fail(f"--since ({format_time(start)} UTC) must be before --until ({format_time(end)} UTC)")
    if requests is not None:
        _requests(
            key, model, start, end, requests, now=now, json_out=json_out, data_dir=data_dir,
            store=store,
        )  # fmt: skip
        return

    async def action(opened: Store) -> tuple[list[UsageRow], dict[str, str]]:
        key_id = await _key_id(opened, key, now)
        team_id = (await opened.teams.get(team)).id if team is not None else None
        rows = await opened.usage.query(
            key_id=key_id,
            model=model,
            since=start,
            until=end,
            group_by=group_by,
            team_id=team_id,
            end_user=end_user,
        )
        names = {}
        if "key" in group_by and rows:
            names = {k.id: k.name for k in await opened.keys.list(include_revoked=True)}
        if "team" in group_by and rows:
            names.update({t.id: t.name for t in await opened.teams.list()})
        return rows, names

    rows, names = run_with_store(data_dir, store, action)
    if json_out:
        print_json([usage_row_view(row, group_by, names, names) for row in rows])
        return
    if not rows:
        typer.echo("no usage recorded" + _window(start, end))
        return
    typer.echo(_table(rows, group_by, names))


async def _key_id(opened: Store, key: str | None, now: datetime) -> str | None:
    """The id of the key given as an id, name or prefix (None: every key)."""
    from llmgw.auth import KeyService

    if key is None:
        return None
    return (await KeyService(keys=opened.keys, wall_clock=lambda: now).resolve(key)).id


def _requests(
    key: str | None,
    model: str | None,
    start: datetime | None,
    end: datetime | None,
    limit: int,
    *,
    now: datetime,
    json_out: bool,
    data_dir: Path,
    store: str | None,
) -> None:
    """`--requests N`: the latest requests' records."""
    from llmgw.usage.views import usage_record_view

    async def action(opened: Store) -> tuple[list[UsageRecord], dict[str, str]]:
        key_id = await _key_id(opened, key, now)
        records = await opened.usage.requests(
            key_id=key_id, model=model, since=start, until=end, limit=limit
        )
        names = {}
        if records:
            names = {k.id: k.name for k in await opened.keys.list(include_revoked=True)}
        return records, names

    records, names = run_with_store(data_dir, store, action)
    if json_out:
        print_json([usage_record_view(r, names) for r in records])
        return
    if not records:
        typer.echo("no requests recorded" + _window(start, end))
        return
    headers = ["TIME", "KEY", "MODEL", "ROUTE", "STATUS", "PROMPT", "COMPLETION"]
    headers += ["MS", "TTFT MS", "QUEUED MS", "END USER", "REQUEST"]
    cells = [
        [
            r.ts.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"),
            _key_label(r.key_id, names),
            r.model,
            r.route or "-",
            str(r.status),
            str(r.prompt_tokens),
            str(r.completion_tokens),
            f"{r.latency_ms:.0f}",
            "-" if r.ttft_ms is None else f"{r.ttft_ms:.0f}",
            f"{r.queue_ms:.0f}",
            r.end_user or "-",
            r.request_id,
        ]
        for r in records
    ]
    typer.echo(render_table(headers, cells, right=frozenset(range(4, 10))))


def _dimensions(by: list[str] | None) -> tuple[UsageDimension, ...]:
    if not by:
        return ("key", "model")
    wanted: list[str] = []
    for value in by:
        for part in value.split(","):
            name = part.strip().lower()
            if name not in DIMENSIONS:
                raise BadInput(
                    f"--by {part.strip()!r}: use hour, day, team, key, end-user or model"
                )
            if name not in wanted:
                wanted.append(name)
    if "hour" in wanted and "day" in wanted:
        raise BadInput("--by takes hour or day, not both")
    return tuple(d for d in DIMENSIONS if d in wanted)


def _window(start: datetime | None, end: datetime | None) -> str:
    if start is None and end is None:
        return ""
    parts = []
    if start is not None:
        parts.append(f"since {format_time(start)} UTC")
    if end is not None:
        parts.append(f"until {format_time(end)} UTC")
    return " " + " ".join(parts)


def _key_label(key_id: str | None, names: dict[str, str]) -> str:
    if key_id is None:
        return NO_KEY
    name = names.get(key_id)
    return f"{key_id} ({name})" if name else key_id


def _table(
    rows: list[UsageRow], group_by: tuple[UsageDimension, ...], names: dict[str, str]
) -> str:
    # Beside the model, the base of each LoRA adapter, when the report has any.
    labels: list[str] = list(group_by)
    if "model" in group_by and any(row.base for row in rows):
        labels.insert(labels.index("model") + 1, "base")
    headers = [d.upper() for d in labels]
    headers += ["REQUESTS", "ERRORS", "PROMPT", "COMPLETION", "TOTAL", "MEAN MS"]
    cells: list[list[str]] = []
    for row in rows:
        group = {
            "hour": format_time(row.hour),
            "day": row.day.date().isoformat() if row.day is not None else "",
            "key": _key_label(row.key_id, names),
            "team": names.get(row.team_id, row.team_id) if row.team_id else NO_TEAM,
            "end-user": row.end_user or "",
            "model": row.model or "",
            "base": row.base or "-",
        }
        cells.append([group[d] for d in labels] + _numbers(row))
    if len(rows) > 1 and labels:
        total = _total(rows)
        cells.append(["TOTAL"] + [""] * (len(labels) - 1) + _numbers(total))
    numeric = frozenset(range(len(labels), len(headers)))
    return render_table(headers, cells, right=numeric)


def _numbers(row: UsageRow) -> list[str]:
    return [
        str(row.requests),
        str(row.errors),
        str(row.prompt_tokens),
        str(row.completion_tokens),
        str(row.total_tokens),
        f"{row.mean_latency_ms:.0f}",
    ]


def _total(rows: list[UsageRow]) -> UsageRow:
    from llmgw.store import UsageRow

    return UsageRow(
        hour=None,
        key_id=None,
        model=None,
        requests=sum(r.requests for r in rows),
        errors=sum(r.errors for r in rows),
        prompt_tokens=sum(r.prompt_tokens for r in rows),
        completion_tokens=sum(r.completion_tokens for r in rows),
        latency_ms_sum=sum(r.latency_ms_sum for r in rows),
    )
