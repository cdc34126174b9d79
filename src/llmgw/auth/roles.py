"""What each role may do on the admin surface: one table, checked by every entry to it.

A user (on the admin pages) and an admin API key each have a role:

    admin     everything: keys, usage, users, and everything below
    operator  the fleet: drain and undrain nodes, add, change, remove and activate
              models, join tokens, debug endpoints; no keys and no usage (usage
              names keys)
    viewer    reads the fleet (nodes, models, endpoints, events, leader); changes
              nothing, sees no keys, usage, join tokens or debug endpoints

The admin API guard, the admin pages' portal and the dashboard all ask `may`
with the request's method and path, so a route added later falls under the
same rules without a change here: anything not named below is readable by
every role and changeable by operators and admins. The role the guard or the
portal settled on travels in the ASGI scope under `ROLE_SCOPE_KEY`, so the
dashboard shows only what that role may do.

Teams (`/admin/api/teams`) are for admins here; team members reach their own
team's keys and usage through `llmgw.auth.teams`.

Not guaranteed: finer grain than a path prefix (an operator may change every
model, not only some).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from llmgw.auth.errors import UserInputError
from llmgw.store import ADMIN_ROLES, AdminRole

ROLE_SCOPE_KEY = "llmgw.admin_role"
_READS = frozenset({"GET", "HEAD"})
# Keys, and usage (whose rows name keys): admins only.
_ADMIN_ONLY = (
    "/admin/api/keys",
    "/admin/api/usage",
    # Teams: admins, and team members for their own team (llmgw.auth.teams).
    "/admin/api/teams",
    "/admin/teams",
    "/admin/keys",
    "/admin/usage",
)
# Reads that are not for viewers: stack dumps and allocation sites can hold
# secrets; join tokens let a machine into the fleet.
_OPERATOR = (
    "/debug/",
    "/admin/api/debug/",
    "/admin/api/join-tokens",
)
# POSTs that change nothing: where a model would go (a question sent as a body).
_POST_READS = frozenset({"/admin/api/placement/dry-run"})
_WHAT = {
    "admin": "admins may do everything",
    "operator": "operators run the fleet (nodes, models, activation, join tokens) but "
    "see no keys or usage",
    "viewer": "viewers only read the fleet (nodes, models, events)",
}


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    # "/admin/usage" covers /admin/usage, /admin/usage/... and /admin/usage.csv.
    return any(
        path == p or path.startswith((p + "/", p + "."))
        for p in (prefix.rstrip("/") for prefix in prefixes)
    )


def may(role: AdminRole | None, method: str, path: str) -> bool:
    """Whether `role` may make a `method` request to `path` on the admin surface."""
    if role == "admin":
        return True
    if role is None or _under(path, _ADMIN_ONLY):
        return False
    if role == "operator":
        return True
    reads = method.upper() in _READS or (method.upper() == "POST" and path in _POST_READS)
    return reads and not _under(path, _OPERATOR)


def may_see(role: AdminRole | None, section: str) -> bool:
    """Whether the dashboard shows `section` (`keys`, `usage`, `changes`: the forms and
    buttons that change the fleet) to `role`."""
    if section in ("keys", "usage"):
        return role == "admin"
    if section == "changes":
        return role in ("admin", "operator")
    return role is not None


def refusal(who: str, role: AdminRole | None, method: str, path: str) -> str:
    """Why `who` (e.g. "user 'ann'") with `role` may not `method` `path`, and what to do."""
    if role is None:
        return f"{who} has no admin role; ask an admin to give it one (admin, operator, viewer)"
    return (
        f"{who} has the role {role}, which may not {method.upper()} {path}: {_WHAT[role]}; "
        "ask an admin for a role that may"
    )


def check_role(value: str | None) -> AdminRole | None:
    """`value` as a role (None, "" and "none": no role); `UserInputError` naming the
    choices for anything else."""
    if value is None or value in ("", "none"):
        return None
    for known in ADMIN_ROLES:
        if value == known:
            return known
    raise UserInputError(
        f"role {value!r} is not one of {', '.join(ADMIN_ROLES)} (or none, for no admin access)"
    )


def scope_role(scope: MutableMapping[str, Any]) -> AdminRole | None:
    """The role a guard or the portal put in the ASGI scope; admin when none did (the
    admin listener's loopback callers without a key: whoever is on the machine)."""
    if ROLE_SCOPE_KEY not in scope:
        return "admin"
    role = scope[ROLE_SCOPE_KEY]
    return next((known for known in ADMIN_ROLES if known == role), None)
