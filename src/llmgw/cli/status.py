"""`llmgw status`: the fleet at a glance, from the admin API.

One screen: who leads (`GET /admin/api/leader`) and which servers share the
store (`GET /admin/api/servers`), the nodes (state, draining,
GPUs assigned, GPU memory as a text bar, live shards, last heartbeat), the
models (state, ready/desired replicas, where they run, why one is not
running) and a totals line. `--json` prints `{leader, servers, nodes, models}` in the
admin API's own shapes; `--watch N` redraws every N seconds until Ctrl-C
(exit 0). Failures are one `error: ...` line on stderr: exit 1 when the admin
API cannot be reached (`--watch` keeps trying), 2 for bad input.

Not guaranteed: a stable text layout; scripts should use `--json`. The three
requests are not one snapshot: a change between them may show in one only.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any

import click
import typer

from llmgw.cli.adminclient import (
    EXIT_UNREACHABLE,
    Admin,
    AdminConfigOption,
    AdminError,
    AdminKeyOption,
    AdminOption,
    call,
    fail,
    resolve_admin,
)
from llmgw.cli.progress import ENDED_STATES
from llmgw.cli.storeopts import JsonOption, format_time, print_json, render_table

BAR_WIDTH = 8
MIN_NOTE_WIDTH = 30
GIB = 1 << 30


# ---- reading ----


def snapshot(admin: Admin) -> dict[str, Any]:
    """`{leader, servers, nodes, models, queue}` from the admin API; raises `AdminError`.

    `leader` is None and `servers` empty for a server that does not report
    leadership (404).
    """
    try:
        leader = call("GET", admin, "/admin/api/leader")
        servers = call("GET", admin, "/admin/api/servers")["servers"]
    except AdminError as exc:
        if exc.status != 404:
            raise
        leader, servers = None, []
    nodes = call("GET", admin, "/admin/api/nodes")["nodes"]
    models = call("GET", admin, "/admin/api/models")["models"]
    try:
        queue = call("GET", admin, "/admin/api/queue")["models"]
    except AdminError as exc:
        if exc.status != 404:
            raise
        queue = []
    return {"leader": leader, "servers": servers, "nodes": nodes, "models": models, "queue": queue}


# ---- formatting ----


def _since(text: Any) -> str:
    if not isinstance(text, str):
        return "-"
    return format_time(datetime.fromisoformat(text)) + " UTC"


def leader_line(leader: dict[str, Any] | None) -> str:
    if leader is None:
        return "leadership: not reported by this server"
    server, role = leader.get("server"), leader.get("role")
    lease = f"epoch {leader.get('epoch')}, since {_since(leader.get('leader_since'))}"
    if role == "leader":
        return f"server {server}: leader ({lease})"
    if not leader.get("leader"):
        return f"server {server}: {role}; no server holds the lease"
    return f"server {server}: {role}; leader {leader['leader']} ({lease})"


def servers_line(servers: list[dict[str, Any]]) -> str | None:
    """`servers: a (leader), b (standby), c (gone)`; None when there are none to list."""
    if not servers:
        return None
    return "servers: " + ", ".join(f"{s.get('server')} ({s.get('role')})" for s in servers)


def _gib(value: float) -> str:
    gib = value / GIB
    return f"{gib:.0f}" if gib >= 10 or gib == int(gib) else f"{gib:.1f}"


def memory_bar(gpus: list[dict[str, Any]]) -> str:
    """`[###-----] 30/80 GiB`: GPU memory in use on a node, all GPUs together."""
    total = sum(int(g["memory_total_bytes"]) for g in gpus)
    if total <= 0:
        return "-"
    used = 0
    for gpu in gpus:
        if gpu.get("memory_used_bytes") is not None:
            used += int(gpu["memory_used_bytes"])
        else:  # no heartbeat yet: what was not free when the node registered
            used += int(gpu["memory_total_bytes"]) - int(gpu.get("memory_free_bytes") or 0)
    filled = min(BAR_WIDTH, max(0, round(BAR_WIDTH * used / total)))
    return f"[{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {_gib(used)}/{_gib(total)} GiB"


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h ago"
    return f"{seconds / 86400:.0f}d ago"


def _node_state(node: dict[str, Any]) -> str:
    return str(node["state"]) + ("" if node["connected"] else ", disconnected")


def _shards(node: dict[str, Any]) -> str:
    live = sum(1 for s in node["shards"] if s["state"] not in ENDED_STATES)
    failed = sum(1 for s in node["shards"] if s["state"] == "failed")
    return f"{live} (+{failed} failed)" if failed else str(live)


def nodes_table(nodes: list[dict[str, Any]]) -> str:
    rows = []
    for node in nodes:
        gpus = node["gpus"]
        used = sum(1 for g in gpus if g["in_use"])
        rows.append(
            [
                node["id"],
                _node_state(node),
                "yes" if node["draining"] else "-",
                f"{used}/{len(gpus)}" if gpus else "-",
                memory_bar(gpus),
                _shards(node),
                _age(node["heartbeat_age_seconds"]),
            ]
        )
    headers = ["NODE", "STATE", "DRAINING", "GPUS", "GPU MEMORY", "SHARDS", "HEARTBEAT"]
    return render_table(headers, rows, right=frozenset({3}))


def _status(model: dict[str, Any]) -> dict[str, Any]:
    status = model.get("status")
    return status if isinstance(status, dict) else {}


def _where(status: dict[str, Any]) -> str:
    places = []
    for replica in status.get("replicas") or []:
        node, state = replica.get("node") or "?", replica.get("state")
        place = str(node) if state == "ready" else f"{node} ({state})"
        if place not in places:
            places.append(place)
    return ", ".join(places) or "-"


def _short(text: str, width: int | None) -> str:
    text = " ".join(text.split())
    if width is None or len(text) <= width:
        return text
    return text[: max(width, 4) - 3] + "..."


def model_note(status: dict[str, Any], width: int | None = None) -> str:
    """Why a model is not running as wanted, in one short line; "-" when it is."""
    state = status.get("state")
    failure = status.get("last_failure")
    if state == "unplaceable" and status.get("unplaceable"):
        return _short(str(status["unplaceable"]), width)
    if isinstance(failure, dict) and state != "ready":
        text = f"failed on {failure.get('node')}: {failure.get('message')}"
        if failure.get("exit_code") is not None:
            text += f" (exit code {failure['exit_code']})"
        if state == "backoff" and status.get("retry_in_seconds"):
            text += f"; retry in {status['retry_in_seconds']:g} s"
        return _short(text, width)
    return "-"


def _ready(status: dict[str, Any]) -> str:
    ready, desired = status.get("ready_replicas"), status.get("desired_replicas")
    if ready is None and desired is None:
        return "-"
    return f"{ready if ready is not None else '-'}/{desired if desired is not None else '-'}"


def models_table(models: list[dict[str, Any]], columns: int | None = None) -> str:
    """The models; with `columns` (a terminal's width) long notes are cut to fit it."""
    headers = ["MODEL", "STATE", "READY", "WHERE", "NOTE"]
    rows = []
    for model in models:
        status = _status(model)
        row = [model["name"], str(status.get("state", "-")), _ready(status), _where(status)]
        rows.append((row, status))
    width = None
    if columns is not None:
        used = sum(
            max(len(h), *(len(r[i]) for r, _ in rows)) + 2 for i, h in enumerate(headers[:4])
        )
        width = max(MIN_NOTE_WIDTH, columns - used - 1)
    table = [[*row, model_note(status, width)] for row, status in rows]
    return render_table(headers, table, right=frozenset({2}))


NODE_ORDER = ("ready", "unreachable", "lost", "draining", "disconnected")
MODEL_ORDER = ("ready", "starting", "backoff", "unplaceable", "stopped")


def _counts(values: list[str], order: tuple[str, ...]) -> str:
    """ "2 ready, 1 draining": counts in `order`, then any other value by name."""
    counts = Counter(values)
    rank = {v: i for i, v in enumerate(order)}
    keys = sorted(counts, key=lambda v: (rank.get(v, len(order)), v))
    return ", ".join(f"{counts[v]} {v}" for v in keys)


def totals_line(nodes: list[dict[str, Any]], models: list[dict[str, Any]]) -> str:
    parts = []
    node_states = [str(n["state"]) for n in nodes]
    node_states += ["draining" for n in nodes if n["draining"]]
    node_states += ["disconnected" for n in nodes if not n["connected"]]
    node_text = f"{len(nodes)} node{'' if len(nodes) == 1 else 's'}"
    parts.append(node_text + (f" ({_counts(node_states, NODE_ORDER)})" if nodes else ""))
    gpus = [g for n in nodes for g in n["gpus"]]
    parts.append(f"{sum(1 for g in gpus if g['in_use'])}/{len(gpus)} GPUs assigned")
    statuses = [_status(m) for m in models]
    model_text = f"{len(models)} model{'' if len(models) == 1 else 's'}"
    states = [str(s.get("state", "unknown")) for s in statuses]
    parts.append(model_text + (f" ({_counts(states, MODEL_ORDER)})" if models else ""))
    ready = sum(int(s.get("ready_replicas") or 0) for s in statuses)
    desired = sum(int(s.get("desired_replicas") or 0) for s in statuses)
    parts.append(f"{ready}/{desired} replicas ready")
    return ", ".join(parts)


def status_text(snap: dict[str, Any], columns: int | None = None) -> str:
    """The whole screen; `columns` is the terminal's width (None: a pipe, cut nothing)."""
    nodes, models = snap["nodes"], snap["models"]
    lines = [leader_line(snap["leader"])]
    listed = servers_line(snap.get("servers", []))
    if listed is not None:
        lines.append(listed)
    lines.append("")
    lines.append(
        nodes_table(nodes) if nodes else "no nodes: no agent has registered with this server"
    )
    lines.append("")
    lines.append(
        models_table(models, columns)
        if models
        else "no models: declare them under `models:` in the config file, or `llmgw models add`"
    )
    lines += ["", totals_line(nodes, models)]
    queued = queue_lines(snap.get("queue", []))
    if queued:
        lines += ["", *queued]
    return "\n".join(lines)


def queue_lines(queue: list[dict[str, Any]]) -> list[str]:
    """One line per model that is saturated or has requests waiting in this router."""
    lines = []
    for entry in queue:
        if not entry.get("waiting") and not entry.get("saturated"):
            continue
        classes = entry.get("classes", {})
        parts = [
            f"{name} {info['waiting']} (oldest {info['oldest_wait_seconds']:g}s)"
            for name, info in classes.items()
            if info.get("waiting")
        ]
        waiting = ", ".join(parts) if parts else "none"
        reserve = entry.get("reserve") or 0
        kept = f"; {reserve} kept for keys under their share" if reserve else ""
        lines.append(
            f"queue {entry['model']}: {entry['state']}; waiting: {waiting}{kept}{_elsewhere(entry)}"
        )
    return lines


def _elsewhere(entry: dict[str, Any]) -> str:
    """The other routers' requests for the model (shared through Redis), if any."""
    other = entry.get("elsewhere") or {}
    if not other.get("in_flight") and not other.get("waiting"):
        return ""
    return f"; other routers: {other['in_flight']} in flight, {other['waiting']} waiting"


# ---- the command ----


def _columns() -> int | None:
    """The terminal's width, or None when stdout is not a terminal."""
    if not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size().columns


def _watch(
    admin: Admin, every: float, *, json_out: bool, sleep: Callable[[float], None] = time.sleep
) -> None:
    """Redraw every `every` seconds until interrupted; unreachable is shown, not fatal."""
    while True:
        try:
            snap = snapshot(admin)
        except AdminError as exc:
            if exc.code != EXIT_UNREACHABLE:
                fail(exc.message, exc.code)
            if not json_out:
                click.clear()
            typer.echo(f"error: {exc.message} (retrying every {every:g} s)", err=True)
        else:
            if json_out:
                typer.echo(json.dumps(snap, separators=(",", ":")))
            else:
                click.clear()
                stamp = time.strftime("%Y-%m-%d %H:%M:%S")
                typer.echo(f"llmgw status, every {every:g} s (Ctrl-C to stop)  {stamp}\n")
                typer.echo(status_text(snap, _columns()))
        sleep(every)


def status(
    json_out: JsonOption = False,
    watch: Annotated[
        float | None,
        typer.Option(
            "--watch",
            min=0.1,
            metavar="SECONDS",
            help="Redraw every SECONDS until Ctrl-C; with --json, one JSON object per line.",
            show_default=False,
        ),
    ] = None,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
) -> None:
    """The fleet at a glance: leader, nodes, models, replicas."""
    target = resolve_admin(admin, admin_key, admin_config)
    if watch is None:
        try:
            snap = snapshot(target)
        except AdminError as exc:
            fail(exc.message, exc.code)
        if json_out:
            print_json(snap)
        else:
            typer.echo(status_text(snap, _columns()))
        return
    try:
        _watch(target, watch, json_out=json_out)
    except KeyboardInterrupt:
        raise typer.Exit(code=0) from None
