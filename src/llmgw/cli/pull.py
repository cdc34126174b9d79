"""`llmgw models pull MODEL [--nodes N | --node ID ...]`: weights onto nodes ahead of demand.

Asks the admin API (`POST /admin/api/models/{name}/pull`) to have the nodes
download the model's hub snapshot without starting an engine, then follows the
pull in the model's view (`pull.nodes`): on a terminal, one progress bar per
node redrawn in place on stderr; otherwise a line per change (`[  3.1s] node-a:
downloading org/name@abc1234 66% of 30.0 MB, 2 s left`). It ends when every
node holds the weights (exit 0), or with `error:` naming each node that failed
and the hub's or agent's reason (exit 1). `--no-wait` returns once the nodes
were asked; `--json` prints the final view on stdout.

Not guaranteed: that the downloads stop when this command does (on Ctrl-C or
timeout the nodes go on; `llmgw models show` follows them).
"""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any

import typer

from llmgw.cli.adminclient import (
    EXIT_BAD_INPUT,
    EXIT_UNREACHABLE,
    Admin,
    AdminConfigOption,
    AdminError,
    AdminKeyOption,
    AdminOption,
    PollOption,
    call,
    fail,
    request,
    resolve_admin,
)
from llmgw.cli.progress import Progress, bar
from llmgw.cli.storeopts import JsonOption, print_json

EXIT_INTERRUPTED = 130


def pull_model(
    name: Annotated[str, typer.Argument(help="The model's name or an alias.")],
    nodes: Annotated[
        int | None,
        typer.Option(
            "--nodes",
            min=1,
            help="Pull onto this many nodes that could run the model, those placement would "
            "pick first (nodes holding the weights, then by fit) [default: 1].",
            show_default=False,
        ),
    ] = None,
    node: Annotated[
        list[str] | None,
        typer.Option("--node", help="Pull onto this node (repeatable).", show_default=False),
    ] = None,
    no_wait: Annotated[
        bool, typer.Option("--no-wait", help="Return once the nodes were asked.")
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(min=0.1, help="Seconds to wait for every node before giving up (exit 1)."),
    ] = 3600.0,
    json_out: JsonOption = False,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
    poll_interval: PollOption = 0.5,
) -> None:
    """Download a model's hub weights onto nodes ahead of demand, without starting it."""
    if nodes is not None and node:
        fail("give --nodes (a count) or --node (ids), not both", EXIT_BAD_INPUT)
    target = resolve_admin(admin, admin_key, admin_config)
    body: dict[str, Any] = {"nodes": nodes} if nodes is not None else {}
    if node:
        body = {"node": node}
    path = "/admin/api/models/" + _quote(name)
    answer = request("POST", target, path + "/pull", json_body=body)
    if no_wait:
        if json_out:
            print_json(answer)
        else:
            chosen = ", ".join(r["node"] for r in (answer.get("pull") or {}).get("nodes", []))
            typer.echo(f"pulling {(answer.get('pull') or {}).get('weights')} onto {chosen}")
        return
    _follow(target, path, answer, timeout=timeout, poll=poll_interval, json_out=json_out)


def _quote(name: str) -> str:
    from urllib.parse import quote

    return quote(name, safe="")


def _follow(
    admin: Admin,
    path: str,
    answer: dict[str, Any],
    *,
    timeout: float,
    poll: float,
    json_out: bool,
) -> None:
    progress = Progress()
    show = _Bars(progress) if sys.stderr.isatty() else _Lines(progress)
    pull = answer.get("pull") or {}
    try:
        while True:
            show.update(pull.get("nodes") or [])
            if pull.get("state") in ("done", "failed", "gone"):
                break
            if progress.elapsed() >= timeout:
                show.end()
                fail(
                    f"the pull is not done after {timeout:g} s; the nodes go on: follow it "
                    f"with `llmgw models show {answer.get('name')}`",
                    EXIT_UNREACHABLE,
                )
            time.sleep(poll)
            try:
                view = call("GET", admin, path)
            except AdminError as exc:
                progress.say(f"cannot read the pull's state: {exc.message}")
                continue
            pull = view.get("pull") or {}
            answer = view
    except KeyboardInterrupt:
        show.end()
        fail(
            "stopped waiting (interrupted); the nodes go on downloading: follow them with "
            f"`llmgw models show {answer.get('name')}`",
            EXIT_INTERRUPTED,
        )
    show.end()
    if json_out:
        print_json(answer)
    rows = pull.get("nodes") or []
    failed = [r for r in rows if r.get("state") in ("failed", "gone")]
    if failed:
        for row in failed:
            typer.echo(f"error: node {row['node']}: {row.get('message')}", err=True)
        raise typer.Exit(code=EXIT_UNREACHABLE)
    typer.echo(
        f"{pull.get('weights')} is on {', '.join(r['node'] for r in rows)} "
        f"after {progress.elapsed():.1f} s",
        err=json_out,
    )


class _Lines:
    """A line on stderr for each node whose state or message changed."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._seen: dict[str, tuple[str, str]] = {}

    def update(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            now = (str(row.get("state")), str(row.get("message")))
            if self._seen.get(row["node"]) != now:
                self._seen[row["node"]] = now
                self._progress.say(f"{row['node']}: {now[1]}")

    def end(self) -> None:
        return


class _Bars:
    """One progress bar per node on stderr, redrawn in place (a terminal)."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._drawn = 0

    def update(self, rows: list[dict[str, Any]]) -> None:
        out = sys.stderr
        if self._drawn:
            out.write(f"\x1b[{self._drawn}F")
        for row in rows:
            total = int(row.get("total") or 0)
            done = int(row.get("done") or 0)
            share = done / total if total else (1.0 if row.get("state") == "done" else 0.0)
            out.write(f"\x1b[2K{row['node']:<12} [{bar(share)}] {row.get('message')}\n")
        out.flush()
        self._drawn = len(rows)

    def end(self) -> None:
        self._drawn = 0
