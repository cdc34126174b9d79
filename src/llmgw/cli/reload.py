"""`llmgw models reload`: the server reads its config file's models again, no restart.

Calls `POST /admin/api/config/reload` (the same as sending SIGHUP to the server)
and prints what changed: models added, changed (rolled: their replicas roll to
the new spec, one by one, as after `llmgw models add --replace`; the others
changed in place), removed (their replicas drain) and the file's other sections
that changed and need a restart. A file the server refuses (it does not read or
validate) is named with the field at fault, and nothing changes (exit 2).

Not guaranteed: a stable text layout; scripts should use `--json`.
"""

from __future__ import annotations

from typing import Any

import typer

from llmgw.cli.adminclient import (
    AdminConfigOption,
    AdminKeyOption,
    AdminOption,
    request,
    resolve_admin,
)
from llmgw.cli.storeopts import JsonOption, print_json


def reload_text(answer: dict[str, Any]) -> str:
    """What a reload did, for people."""

    def names(key: str) -> str:
        return ", ".join(answer.get(key) or []) or "none"

    rolled = set(answer.get("rolled") or [])
    in_place = [n for n in answer.get("changed") or [] if n not in rolled]
    lines = [
        f"reloaded the models of {answer.get('file')}",
        f"  added:             {names('added')}",
        f"  rolling out:       {names('rolled')}"
        + ("  (`llmgw models rollout status M` follows each)" if rolled else ""),
        f"  changed in place:  {', '.join(in_place) or 'none'}",
        f"  removed:           {names('removed')}",
        f"  unchanged:         {len(answer.get('unchanged') or [])}",
    ]
    restart = answer.get("restart_needed") or []
    if restart:
        lines.append(
            f"not applied until the server restarts (only models: reload): {', '.join(restart)}"
        )
    return "\n".join(lines)


def reload_models(
    json_out: JsonOption = False,
    admin: AdminOption = None,
    admin_key: AdminKeyOption = None,
    admin_config: AdminConfigOption = None,
) -> None:
    """Reload the models of the server's config file without a restart (as SIGHUP does):
    a change to what a model runs rolls its replicas, other changes apply in place, and
    a file with a mistake is refused whole."""
    answer = request(
        "POST", resolve_admin(admin, admin_key, admin_config), "/admin/api/config/reload"
    )
    if json_out:
        print_json(answer)
        return
    typer.echo(reload_text(answer))
