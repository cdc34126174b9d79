"""`llmgw models rollout`: where a model's rollout to a changed spec stands, undo, and a
canary's promote or abort.

A rollout starts by itself when a change to a model (`llmgw models add --replace`,
the admin API) changes what its replicas run; these commands show it and take
it back. `status` lists the replicas of the new spec and of the old one and the
step; `undo` puts the previous spec (weights and profiles) back, and the
replicas roll back the same way. `promote` makes a canary's spec (`versions:`)
the model's own (its other replicas roll to it); `abort` drops the canary (its
replicas drain). Exit codes as `llmgw models`.

Not guaranteed: a stable text layout; scripts should use `--json`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from llmgw.cli.adminclient import (
    AdminConfigOption,
    AdminKeyOption,
    AdminOption,
    request,
    resolve_admin,
)
from llmgw.cli.storeopts import JsonOption, print_json, render_table

ModelArgument = Annotated[
    str, typer.Argument(help="The model's name or an alias, as `llmgw models list` shows.")
]

rollout_app = typer.Typer(
    name="rollout",
    help="See a model's rollout to a changed spec, undo it, or promote or abort a canary.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def rollout_text(answer: dict[str, Any]) -> str:
    """The status of one model's rollout, for people."""
    rollout = answer.get("rollout")
    if not isinstance(rollout, dict):
        state = "none: every replica runs the current spec"
    elif rollout.get("state") == "halted":
        state = f"stopped: {rollout.get('reason')}"
    else:
        state = f"rolling: {rollout.get('step')}"
    lines = [
        f"model:    {answer['model']}",
        f"rollout:  {state}",
        f"replicas: {answer.get('ready_replicas')} of {answer.get('desired_replicas')} ready; "
        f"max surge {answer.get('max_surge')}, max unavailable {answer.get('max_unavailable')}",
    ]
    rows = [
        [
            kind,
            str(r.get("id", "-")),
            str(r.get("node", "-")),
            str(r.get("state", "-")),
            " ".join(r.get("engine_args") or []) or "-",
        ]
        for kind, key in (("new", "new_replicas"), ("old", "old_replicas"))
        for r in answer.get(key) or []
    ]
    if rows:
        table = render_table(["SPEC", "REPLICA", "NODE", "STATE", "ARGS"], rows)
        lines += ["", *table.splitlines()]
    canary = answer.get("canary")
    if isinstance(canary, dict):
        lines += [
            "",
            f"canary:   {canary.get('name')} (weight {canary.get('weight')}) beside "
            f"{canary.get('stable')} (weight {canary.get('stable_weight')}); "
            f"{len(canary.get('replicas') or [])} canary replica(s)",
        ]
        if canary.get("halted"):
            lines.append(f"canary stopped: {canary.get('halted')}")
    previous = answer.get("previous")
    if isinstance(previous, dict):
        profiles = ", ".join(
            f"{p.get('name')}: {p.get('engine')} {' '.join(p.get('engine_args') or [])}".rstrip()
            for p in previous.get("profiles") or []
        )
        lines += ["", f"undo goes back to: weights {previous.get('weights')}; {profiles}"]
    return "\n".join(lines)


@rollout_app.command("status")
def status(
    name: ModelArgument,
    json_out: JsonOption = False,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
) -> None:
    """Show the replicas of the new and the old spec, and the step the rollout is at."""
    _call("GET", "", name, json_out, (admin, admin_key, admin_config), None)


@rollout_app.command("undo")
def undo(
    name: ModelArgument,
    json_out: JsonOption = False,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
) -> None:
    """Put the model's previous spec back; its replicas roll back one by one."""
    _call(
        "POST",
        "/undo",
        name,
        json_out,
        (admin, admin_key, admin_config),
        "model {model} is back on its previous spec; its replicas roll back",
    )


@rollout_app.command("promote")
def promote(
    name: ModelArgument,
    json_out: JsonOption = False,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
) -> None:
    """Make the model's canary its spec: every new conversation goes to it, and the
    other replicas roll to it one by one."""
    _call(
        "POST",
        "/promote",
        name,
        json_out,
        (admin, admin_key, admin_config),
        "model {model}: the canary is its spec now; its other replicas roll",
    )


@rollout_app.command("abort")
def abort(
    name: ModelArgument,
    json_out: JsonOption = False,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
) -> None:
    """Drop the model's canary: new conversations all go to its own spec, and the canary's
    replicas drain."""
    _call(
        "POST",
        "/abort",
        name,
        json_out,
        (admin, admin_key, admin_config),
        "model {model}: the canary is dropped; its replicas drain",
    )


def _call(
    method: str,
    action: str,
    name: str,
    json_out: bool,
    admin: tuple[str | None, str | None, Path | None],
    said: str | None,
) -> None:
    """One rollout route of the admin API (`/rollout` + `action`), its answer printed:
    JSON, or `said` (with {model} filled in) and the rollout's status."""
    from llmgw.cli.models import model_path

    answer = request(method, resolve_admin(*admin), model_path(name, "/rollout" + action))
    if json_out:
        print_json(answer)
        return
    if said is not None:
        typer.echo(said.format(model=answer["model"]))
    typer.echo(rollout_text(answer))
