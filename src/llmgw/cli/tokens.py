"""`llmgw nodes token`: create, list and revoke the join tokens new nodes join with.

Talks HTTP to a running server's admin listener (see `llmgw.cli.adminclient`),
like the other `llmgw nodes` commands. `create` prints the token and the agent
command that uses it; the token is shown this once (the store keeps only a
hash of its secret). Failures are one `error: ...` line and exit code 1
(unreachable, failed) or 2 (bad input, unknown token, refused).

Not guaranteed: a stable text layout; scripts should use `--json`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from urllib.parse import quote

import typer

from llmgw.cli.adminclient import (
    EXIT_BAD_INPUT,
    AdminConfigOption,
    AdminKeyOption,
    AdminOption,
    fail,
    request,
    resolve_admin,
)
from llmgw.cli.storeopts import JsonOption, format_time, print_json, render_table

token_app = typer.Typer(
    name="token",
    help="Join tokens: a new node runs `llmgw agent --server HOST:PORT --token TOKEN` with one.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _labels(text: str | None, flag: str = "--labels") -> dict[str, str]:
    from llmgw.agent.errors import FlagError
    from llmgw.agent.flags import parse_key_values

    try:
        return parse_key_values(flag, text)
    except FlagError as exc:
        fail(str(exc), EXIT_BAD_INPUT)


def _ttl(text: str) -> float:
    from llmgw.config.models import parse_duration

    try:
        seconds = parse_duration(text)
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        fail(f"--ttl {text!r}: give a duration such as 24h, 30m or 3600 (seconds)", EXIT_BAD_INPUT)
    return seconds


def _time(text: str | None) -> str:
    return format_time(datetime.fromisoformat(text) if text else None)


@token_app.command("create")
def create(
    ttl: Annotated[
        str, typer.Option(help="How long the token can be used: 24h, 30m, 7d or seconds.")
    ] = "24h",
    uses: Annotated[
        int | None,
        typer.Option(
            min=1, help="How many nodes may join with it [default: no limit].", show_default=False
        ),
    ] = None,
    labels: Annotated[
        str | None,
        typer.Option(
            help="Labels k=v,k=v given to every node that joins with it; they bind (its agent "
            "may add labels, never change these), e.g. zone=a.",
            show_default=False,
        ),
    ] = None,
    fabric: Annotated[
        str | None,
        typer.Option(
            help="Fabric labels k=v,k=v fixed the same way for its nodes (multi-node replicas "
            "are placed on nodes sharing one), e.g. ib-domain=pod3.",
            show_default=False,
        ),
    ] = None,
    server: Annotated[
        str | None,
        typer.Option(
            help="HOST:PORT agents dial, for the printed agent command [default: the "
            "server's own agent address].",
            show_default=False,
        ),
    ] = None,
    json_out: JsonOption = False,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
) -> None:
    """Make a join token; prints it (once) and the agent command that joins a node with it."""
    body: dict[str, Any] = {
        "ttl_seconds": _ttl(ttl),
        "max_uses": uses,
        "labels": _labels(labels),
        "fabric": _labels(fabric, "--fabric"),
    }
    made = request(
        "POST", resolve_admin(admin, admin_key, admin_config), "/admin/api/join-tokens",
        json_body=body,
    )  # fmt: skip
    if json_out:
        print_json(made)
        return
    limit = "no limit" if made["max_uses"] is None else f"{made['max_uses']} uses"
    typer.echo(f"join token {made['id']} (until {_time(made['expires_at'])} UTC, {limit}):")
    typer.echo(made["token"])
    typer.echo("")
    typer.echo("on the new node:")
    if server is not None:
        typer.echo(f"  llmgw agent --server {server} --token {made['token']}")
    else:
        typer.echo(f"  {made['agent_command']}")


@token_app.command("list")
def list_tokens(
    json_out: JsonOption = False,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
) -> None:
    """List join tokens (without their secrets): state, uses, expiry, labels, fabric."""
    tokens: list[dict[str, Any]] = request(
        "GET", resolve_admin(admin, admin_key, admin_config), "/admin/api/join-tokens"
    )["tokens"]
    if json_out:
        print_json(tokens)
        return
    if not tokens:
        typer.echo("no join tokens; make one with `llmgw nodes token create`")
        return
    rows = [
        [
            t["id"],
            t["state"],
            f"{t['uses']}/{t['max_uses'] if t['max_uses'] is not None else '-'}",
            _time(t["created_at"]),
            _time(t["expires_at"]),
            ",".join(f"{k}={v}" for k, v in t["labels"].items()) or "-",
            ",".join(f"{k}={v}" for k, v in t.get("fabric", {}).items()) or "-",
        ]
        for t in tokens
    ]
    typer.echo(
        render_table(["ID", "STATE", "USES", "CREATED", "EXPIRES", "LABELS", "FABRIC"], rows)
    )


@token_app.command("revoke")
def revoke(
    token_id: Annotated[str, typer.Argument(help="The token's id, as `token list` shows.")],
    json_out: JsonOption = False,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
) -> None:
    """Revoke a join token: no node can join with it any more (joined nodes stay)."""
    if not token_id.strip():
        fail("ID must not be empty", EXIT_BAD_INPUT)
    token = request(
        "POST",
        resolve_admin(admin, admin_key, admin_config),
        f"/admin/api/join-tokens/{quote(token_id, safe='')}/revoke",
    )
    if json_out:
        print_json(token)
        return
    typer.echo(f"join token {token['id']} is revoked; nodes that joined with it keep working")
