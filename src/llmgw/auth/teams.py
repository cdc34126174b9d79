"""What a team role lets a user do on the admin surface: its own team's keys and usage.

Admin roles (`llmgw.auth.roles`) are for the whole gateway; teams are managed by
admins only. A user who is a member of a team reaches, under
`/admin/api/teams/T/` (T: the team's name or id):

    team-admin  keys (list, create, revoke) and usage of team T
    member      usage of team T (reads only)

and nothing of any other team, nor anything else on the admin surface (unless
their admin role allows it). The same holds for the team's dashboard page,
`/admin/teams/T` (its usage: both roles) and its key actions under
`/admin/teams/T/keys` (team-admins). The portal asks `TeamAccess.allows` for a user
whose admin role refuses a path; the team routes ask `TeamAccess.role_in` again
before they act, so a route never trusts the path alone.

Not guaranteed: that a removed member loses access before their next request
(each request re-reads the membership, so it ends there).
"""

from __future__ import annotations

from typing import Protocol

from llmgw.store import Team, TeamMember, TeamRole

TEAMS_API = "/admin/api/teams/"
TEAM_PAGES = "/admin/teams/"
# The logged-in user's name, put in the ASGI scope by the portal for the team routes.
USER_SCOPE_KEY = "llmgw.user_name"
# What each team role may reach under /admin/api/teams/T/, and with which methods.
_SECTIONS: dict[TeamRole, dict[str, frozenset[str]]] = {
    "team-admin": {
        "keys": frozenset({"GET", "HEAD", "POST"}),
        "usage": frozenset({"GET", "HEAD"}),
    },
    "member": {"usage": frozenset({"GET", "HEAD"})},
}


class TeamDirectory(Protocol):
    """The teams and memberships `TeamAccess` reads (`TeamRepository` is one)."""

    async def find(self, ref: str) -> Team | None: ...

    async def memberships(self, user_name: str) -> list[TeamMember]: ...


def team_path(path: str) -> tuple[str, str] | None:
    """(team ref, section) of a path `/admin/api/teams/T/section[/...]`, or of a team
    page: `/admin/teams/T` (section usage) and `/admin/teams/T/keys[/...]` (keys);
    None otherwise."""
    if path.startswith(TEAM_PAGES):
        ref, _, rest = path[len(TEAM_PAGES) :].partition("/")
        if not ref:
            return None
        if not rest:
            return ref, "usage"
        return (ref, "keys") if rest.split("/")[0] == "keys" else None
    if not path.startswith(TEAMS_API):
        return None
    parts = path[len(TEAMS_API) :].split("/")
    if len(parts) < 2 or not parts[0] or not parts[1]:
        return None
    return parts[0], parts[1]


def team_role_may(role: TeamRole, method: str, section: str) -> bool:
    """Whether a user with team `role` may make a `method` request to `section` of
    their own team."""
    return method.upper() in _SECTIONS[role].get(section, frozenset())


class TeamAccess:
    """Answers whether a user may reach a team path, from the store's memberships."""

    def __init__(self, *, teams: TeamDirectory) -> None:
        self._teams = teams

    async def role_in(self, user_name: str, ref: str) -> tuple[Team, TeamRole] | None:
        """The team `ref` names and the user's role in it; None when either is missing."""
        team = await self._teams.find(ref)
        if team is None:
            return None
        for member in await self._teams.memberships(user_name):
            if member.team_id == team.id:
                return team, member.role
        return None

    async def allows(self, user_name: str, method: str, path: str) -> bool:
        """Whether the user's team role lets them make this request."""
        parsed = team_path(path)
        if parsed is None:
            return False
        found = await self.role_in(user_name, parsed[0])
        return found is not None and team_role_may(found[1], method, parsed[1])
