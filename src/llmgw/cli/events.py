"""`llmgw events`: the control plane's recent decisions and transitions, from the admin API.

Reads `GET /admin/api/events` (placements, readiness, failures, node
transitions, hub downloads: start, each quarter, end) and prints them newest
first, one line each: time (UTC), kind, model, node, message. `--model` and
`--node` filter on the server; `--kind` (repeatable) keeps only those kinds.
`--json` prints the admin API's own list. Failures are one `error: ...` line on
stderr: exit 1 when the admin API cannot be reached, 2 for bad input.

Not guaranteed: history beyond what the leader keeps in memory (the last few
hundred events; gone after a restart), or a stable text layout (use `--json`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import urlencode

import typer

from llmgw.cli.adminclient import (
    AdminConfigOption,
    AdminError,
    AdminKeyOption,
    AdminOption,
    call,
    fail,
    resolve_admin,
)
from llmgw.cli.storeopts import JsonOption, print_json


def _time(text: Any) -> str:
    try:
        return datetime.fromisoformat(str(text)).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return str(text)


def event_line(event: dict[str, Any]) -> str:
    """`2026-12-04 13:40:01  download  tiny  node-a  downloaded org/tiny@abc1234 ...`."""
    cells = [_time(event.get("at")), str(event.get("kind") or "-")]
    cells += [str(event.get("model") or "-"), str(event.get("node") or "-")]
    return "  ".join(cells) + "  " + str(event.get("message") or "")


def events(
    model: Annotated[
        str | None, typer.Option("--model", help="Only this model's events.", show_default=False)
    ] = None,
    node: Annotated[
        str | None, typer.Option("--node", help="Only this node's events.", show_default=False)
    ] = None,
    kind: Annotated[
        list[str] | None,
        typer.Option(
            "--kind",
            help="Only events of this kind (start, stop, ready, failed, node, download, "
            "rollout, ...); repeat for several.",
            show_default=False,
        ),
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", min=1, help="At most this many events (newest first).")
    ] = 100,
    json_out: JsonOption = False,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
) -> None:
    """The control plane's recent events, newest first: placements, readiness, failures,
    node transitions and hub downloads."""
    target = resolve_admin(admin, admin_key, admin_config)
    query: dict[str, str] = {}
    if model:
        query["model"] = model
    if node:
        query["node"] = node
    # Filtered by kind here, so the server's limit would cut before the filter.
    query["limit"] = str(limit if not kind else max(limit, 1000))
    try:
        found: list[dict[str, Any]] = call("GET", target, "/admin/api/events?" + urlencode(query))[
            "events"
        ]
    except AdminError as exc:
        fail(exc.message, exc.code)
    if kind:
        wanted = {k.strip().lower() for k in kind}
        found = [e for e in found if str(e.get("kind")) in wanted]
    found = found[:limit]
    if json_out:
        print_json({"events": found})
        return
    if not found:
        typer.echo("no events recorded since the server started", err=True)
        return
    for event in found:
        typer.echo(event_line(event))
