"""`llmgw nodes`: list, show, drain, undrain, remove GPU nodes and their weights (admin API).

Talks HTTP to a running server's admin listener: `--admin`, LLMGW_ADMIN_URL,
admin_url in the admin config file, or http://127.0.0.1:9090 (see
`llmgw.cli.adminclient`); reach a remote one by SSH tunnel, or pass an admin
key when it is not loopback. Failures are one `error: ...` line on stderr and
an exit code: 1 when the admin API cannot be reached or fails (or a drain
does not finish in time), 2 for bad input, an unknown node or a request the
node refuses. Progress goes to stderr, so `--json` output on stdout stays
clean. Imports only typer and the standard library at the top (httpx when a
command runs), so `llmgw --help` stays fast.

Not guaranteed: a stable text layout for tables; scripts should use `--json`.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import quote, urlencode

import typer

from llmgw.cli.adminclient import (
    EXIT_BAD_INPUT,
    Admin,
    AdminConfigOption,
    AdminKeyOption,
    AdminOption,
    PollOption,
    fail,
    request,
    resolve_admin,
)
from llmgw.cli.drainwait import shards_before_drain, wait_for_drain
from llmgw.cli.progress import Progress
from llmgw.cli.storeopts import JsonOption, format_time, print_json, render_table

# The server gives a node 30 s to answer a command; removing a large tree takes a while.
REMOVE_TIMEOUT_SECONDS = 60.0

nodes_app = typer.Typer(
    name="nodes",
    help="See the GPU nodes the agents registered and manage them: list, show, drain, undrain, "
    "remove-weights, remove.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

NodeArgument = Annotated[str, typer.Argument(help="The node's id, as `llmgw nodes list` shows.")]


def _node_path(node_id: str) -> str:
    if not node_id.strip():
        fail("NODE must not be empty", EXIT_BAD_INPUT)
    return f"/admin/api/nodes/{quote(node_id, safe='')}"


# ---- formatting ----


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h ago"
    return f"{seconds / 86400:.0f}d ago"


def _gib(value: int | None) -> str:
    return "-" if value is None else f"{value / (1 << 30):.1f} GiB"


def _size(value: int) -> str:
    """GiB, or MiB below one GiB (a small snapshot would read 0.0 GiB)."""
    if value < 1 << 30:
        return f"{value / (1 << 20):.1f} MiB"
    return f"{value / (1 << 30):.1f} GiB"


def _pairs(mapping: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(mapping.items())) or "-"


def _time(text: str | None) -> str:
    return format_time(datetime.fromisoformat(text) if text else None)


def _state(node: dict[str, Any]) -> str:
    flags = [node["state"]]
    if node["draining"]:
        flags.append("draining")
    if not node["connected"]:
        flags.append("disconnected")
    return ", ".join(flags)


def _shard_counts(node: dict[str, Any]) -> str:
    counts = Counter(shard["state"] for shard in node["shards"])
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "-"


def _gpu_summary(node: dict[str, Any]) -> tuple[str, str]:
    gpus = node["gpus"]
    if not gpus:
        return "-", "-"
    in_use = sum(1 for gpu in gpus if gpu["in_use"])
    names = Counter(gpu["name"] for gpu in gpus)
    kinds = ", ".join(f"{n}x {name}" for name, n in names.most_common())
    return f"{in_use}/{len(gpus)}", kinds


def _list_table(nodes: list[dict[str, Any]]) -> str:
    rows = []
    for node in nodes:
        used, kinds = _gpu_summary(node)
        rows.append(
            [
                node["id"],
                _state(node),
                node["hostname"],
                used,
                kinds,
                _shard_counts(node),
                _age(node["heartbeat_age_seconds"]),
                _pairs(node["labels"]),
            ]
        )
    headers = ["NODE", "STATE", "HOST", "GPUS USED", "GPU", "SHARDS", "HEARTBEAT", "LABELS"]
    return render_table(headers, rows, right=frozenset({3}))


def _disk(node: dict[str, Any]) -> str:
    """`12.0 GiB used of 100.0 GiB, 88.0 GiB free; downloads may take 80.0 GiB (85%)`."""
    free = int(node["weights_disk_free_bytes"])
    total = node.get("disk_total_bytes")
    said = (
        f"{_size(int(total) - free)} used of {_size(int(total))}, {_size(free)} free"
        if total
        else f"{_size(free)} free"
    )
    room = node.get("weights_room_bytes")
    limit = node.get("weights_max_use") or {}
    if "fraction" in limit:
        watermark = f"--weights-max-use {float(limit['fraction']) * 100:g}%"
    elif "bytes" in limit:
        watermark = f"--weights-max-use {_size(int(limit['bytes']))}"
    else:
        watermark = "no eviction"
    if room is not None:
        said += f"; downloads may take {_size(int(room))} ({watermark})"
    return said


def _memory(node: dict[str, Any]) -> str:
    """`, 50.1 GiB available, 1.2 GiB held by sleeping replicas (limit 64.0 GiB)`."""
    available = node.get("memory_available_bytes")
    said = f", {_size(int(available))} available" if available is not None else ""
    said += f", {_size(int(node.get('sleeping_memory_bytes') or 0))} held by sleeping replicas"
    limit = node.get("sleep_memory_max_bytes")
    return said + (f" (--sleep-memory-max {_size(int(limit))})" if limit else "")


def _show_text(node: dict[str, Any]) -> str:
    lines = [
        f"node:       {node['id']} ({node['hostname']})",
        f"state:      {_state(node)}",
        f"agent:      {node['agent_version']}",
        f"heartbeat:  {_age(node['heartbeat_age_seconds'])} "
        f"({_time(node['last_heartbeat_at'])} UTC)",
        f"registered: {_time(node['registered_at'])} UTC",
        f"cpu, ram:   {node['cpu_count']} CPUs, {_gib(node['memory_total_bytes'])}" + _memory(node),
        f"weights:    {node['weights_dir'] or '-'}",
        f"disk:       {_disk(node)}",
        f"ports:      {node['port_range'][0]}-{node['port_range'][1]}",
        f"labels:     {_pairs(node['labels'])}",
        f"fabric:     {_pairs(node['fabric'])}",
        f"address:    seen from {node.get('seen_from') or '-'}, engines advertised at "
        f"{node.get('advertise_host') or '-'}",
        *([f"warning:    {node['address_warning']}"] if node.get("address_warning") else []),
        "",
        f"GPUs ({node['gpu_source']}):",
    ]
    if node["gpus"]:
        gpu_rows = [
            [
                str(gpu["index"]),
                gpu["name"],
                _gib(gpu["memory_total_bytes"]),
                _gib(gpu["memory_used_bytes"]),
                "-" if gpu["utilization_percent"] is None else f"{gpu['utilization_percent']:.0f}%",
                "yes" if gpu["in_use"] else "no",
            ]
            for gpu in node["gpus"]
        ]
        table = render_table(
            ["IDX", "NAME", "MEMORY", "USED", "UTIL", "ASSIGNED"], gpu_rows, right=frozenset({0})
        )
        lines += ["  " + line for line in table.splitlines()]
    else:
        lines.append("  none")
    lines += ["", "shards:"]
    if node["shards"]:
        shard_rows = [
            [
                shard["id"],
                shard["model"],
                shard["engine"] or "-",
                shard["state"],
                ",".join(str(i) for i in shard["gpu_indices"]) or "-",
                str(shard["pid"]) if shard["pid"] is not None else "-",
                shard["endpoint_url"] or "-",
                _time(shard["since"]),
            ]
            for shard in node["shards"]
        ]
        headers = ["ID", "MODEL", "ENGINE", "STATE", "GPUS", "PID", "ENDPOINT", "SINCE (UTC)"]
        lines += ["  " + line for line in render_table(headers, shard_rows).splitlines()]
        for shard in node["shards"]:
            if shard["message"] or shard["output_tail"]:
                exit_code = shard["exit_code"]
                status = shard["message"] or shard["state"]
                if exit_code is not None:
                    status += f" (exit code {exit_code})"
                lines += ["", f"  {shard['id']}: {status}"]
                lines += ["    | " + line for line in shard["output_tail"]]
    else:
        lines.append("  none")
    lines += ["", "weights on disk (hub snapshots):"]
    held = node.get("weights") or []
    if held:
        rows = [
            [
                f"{w['repo']}@{str(w['revision'])[:7]}",
                _decimal_size(int(w["bytes"])),
                _time(w["last_used"]) if w["last_used"] else "never",
            ]
            for w in held
        ]
        table = render_table(["WEIGHTS", "SIZE", "LAST USED (UTC)"], rows)
        lines += ["  " + line for line in table.splitlines()]
    else:
        lines.append("  none")
    pulls = node.get("pulls") or []
    if pulls:
        lines += ["", "weights being pulled ahead of demand:"]
        for pull in pulls:
            what = f"{pull['repo']}@{str(pull['revision'])[:7]}"
            total = int(pull["total_bytes"])
            done = f"{_decimal_size(int(pull['done_bytes']))} of {_decimal_size(total)}"
            lines.append(
                f"  {what}: failed: {pull['error']}"
                if pull.get("error")
                else f"  {what}: {done if total else 'listing its files'}"
            )
    return "\n".join(lines)


def _decimal_size(count: int) -> str:
    """Bytes as the hub counts them (1 GB = 10^9 bytes), as download progress shows."""
    value = float(count)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


# ---- commands ----


# Nodes asked for per request: a fleet of 10,000 is listed in pages, never in one answer.
LIST_PAGE = 500


def _fetch_nodes(
    target: Admin, *, limit: int | None, after: str | None, state: str | None, words: str | None
) -> tuple[list[dict[str, Any]], int, str | None]:
    """The nodes asked for, page by page: (nodes, how many match, where the next would start)."""
    nodes: list[dict[str, Any]] = []
    total = 0
    while True:
        want = LIST_PAGE if limit is None else min(LIST_PAGE, limit - len(nodes))
        params = {"limit": str(want)}
        params |= {k: v for k, v in (("after", after), ("state", state), ("q", words)) if v}
        page = request("GET", target, f"/admin/api/nodes?{urlencode(params)}")
        nodes += page["nodes"]
        total = int(page["total"])
        after = page["next_after"]
        if after is None or (limit is not None and len(nodes) >= limit):
            return nodes, total, after


@nodes_app.command("list")
def list_nodes(
    json_out: JsonOption = False,
    limit: Annotated[
        int | None,
        typer.Option("--limit", min=1, help="Show at most this many nodes (default: all)."),
    ] = None,
    after: Annotated[
        str | None,
        typer.Option("--after", help="Start after this node id (the next page of a --limit)."),
    ] = None,
    state: Annotated[
        str | None,
        typer.Option(
            "--state", help="Only nodes in this state: ready, unreachable, lost, draining."
        ),
    ] = None,
    words: Annotated[
        str | None,
        typer.Option(
            "--filter", "-q", help="Only nodes whose id, host, state or labels (zone=a) match."
        ),
    ] = None,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
) -> None:
    """List the nodes: state, GPUs in use, shards, last heartbeat (fetched in pages)."""
    target = resolve_admin(admin, admin_key, admin_config)
    nodes, total, next_after = _fetch_nodes(
        target, limit=limit, after=after, state=state, words=words
    )
    if json_out:
        print_json(nodes)
        return
    if not nodes:
        if state or words or after:
            typer.echo("no node matches (try without --state / --filter / --after)")
        else:
            typer.echo("no nodes: no agent has registered with this server since it started")
        return
    typer.echo(_list_table(nodes))
    if next_after is not None:
        typer.echo(
            f"{len(nodes)} of {total} nodes shown; the next ones: llmgw nodes list "
            f"--limit {limit} --after {next_after}"
        )


@nodes_app.command("show")
def show(
    node_id: NodeArgument,
    json_out: JsonOption = False,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
) -> None:
    """Show one node: hardware, labels, each GPU and each shard."""
    node = request("GET", resolve_admin(admin, admin_key, admin_config), _node_path(node_id))
    if json_out:
        print_json(node)
        return
    typer.echo(_show_text(node))


@nodes_app.command("drain")
def drain(
    node_id: NodeArgument,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="Follow the drain until no replica is left on the node, showing each "
            "replacement coming up elsewhere and each old replica stopping.",
        ),
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(min=0.1, help="With --wait: seconds to wait before giving up (exit 1)."),
    ] = 600.0,
    json_out: JsonOption = False,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
    poll_interval: PollOption = 0.5,
) -> None:
    """Mark a node draining: no new work goes to it, and its replicas move elsewhere.

    The reconciler starts a replacement on another node for each replica, then
    drains the old one once the replacement is ready. --json prints the node;
    with --wait, an object with the node, drained (true/false), the replicas
    moved and what remains (with the reason).
    """
    target = resolve_admin(admin, admin_key, admin_config)
    known = shards_before_drain(target) if wait else set()
    node = request("POST", target, _node_path(node_id) + "/drain")
    if wait:
        wait_for_drain(
            target, node["id"], known=known, timeout=timeout, poll=poll_interval, json_out=json_out
        )
        return
    if json_out:
        print_json(node)
        return
    typer.echo(
        f"node {node['id']} is draining: no new work is placed on it, and its replicas move "
        f"elsewhere (`llmgw nodes drain {node['id']} --wait` follows that)"
    )


@nodes_app.command("undrain")
def undrain(
    node_id: NodeArgument,
    json_out: JsonOption = False,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
) -> None:
    """Clear a node's draining mark: new work may be placed on it again."""
    node = request(
        "POST", resolve_admin(admin, admin_key, admin_config), _node_path(node_id) + "/undrain"
    )
    if json_out:
        print_json(node)
        return
    typer.echo(f"node {node['id']} is no longer draining: new work may be placed on it")


@nodes_app.command("remove-weights")
def remove_weights(
    node_id: NodeArgument,
    path: Annotated[
        str,
        typer.Argument(
            help="File or directory to delete, inside the node's weights directory "
            "(relative to it, or absolute)."
        ),
    ],
    json_out: JsonOption = False,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
) -> None:
    """Delete model weights on a node, to free its disk.

    The node's agent refuses paths outside its weights directory and weights a
    running replica uses (stop or move the replica first). A path that is
    already absent counts as removed.
    """
    target = resolve_admin(admin, admin_key, admin_config)
    if not path.strip():
        fail("PATH must not be empty", EXIT_BAD_INPUT)
    route = _node_path(node_id) + "/weights/remove"
    progress = Progress()
    progress.say(f"asking node {node_id} to remove {path} ...")
    answer = request(
        "POST", target, route, json_body={"path": path}, timeout=REMOVE_TIMEOUT_SECONDS
    )
    if json_out:
        print_json(answer)
    typer.echo(
        f"node {answer['node']} removed {answer['path']} (or it was already gone) "
        f"after {progress.elapsed():.1f} s",
        err=json_out,
    )


@nodes_app.command("remove")
def remove(
    node_id: NodeArgument,
    reason: Annotated[
        str,
        typer.Option(
            "--reason",
            help="Why the node is removed: kept with its revoked key, and told to its agent "
            "when it is refused.",
        ),
    ] = "removed with llmgw nodes remove",
    json_out: JsonOption = False,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
) -> None:
    """Remove a node for good: revoke its certificate, close its stream, forget it.

    Its certificate's key goes on the deny-list that every server checks at each
    Register, so the node cannot reconnect; to bring the machine back, join it
    again with a new token (it may take its old node id). Its replicas are
    placed elsewhere. The server does not stop its engines: stop the agent on
    that machine. A node that connected without TLS has no key to revoke; it is
    forgotten, and its agent registers again unless stopped. --json prints what
    was done (revoked, key_hash, stream_closed, peer, forgotten).
    """
    target = resolve_admin(admin, admin_key, admin_config)
    if not reason.strip():
        fail("--reason must not be empty", EXIT_BAD_INPUT)
    answer = request("POST", target, _node_path(node_id) + "/remove", json_body={"reason": reason})
    if json_out:
        print_json(answer)
        return
    typer.echo(answer["message"])
