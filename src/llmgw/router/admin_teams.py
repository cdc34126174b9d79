"""Admin API for teams: `/admin/api/teams`, their members, and each team's keys and usage.

Admins (the `admin` role, or loopback callers of the admin listener) manage
teams and members here, as `llmgw teams` does:

    GET    /admin/api/teams                    every team
    POST   /admin/api/teams                    {"name", "rpm", "tpm", "budget_tokens",
                                               "period", "models"} -> the team
    GET    /admin/api/teams/T                  the team, its members and key count
    PATCH  /admin/api/teams/T                  the same fields (null clears a limit)
    DELETE /admin/api/teams/T                  refused while active keys belong to it
    POST   /admin/api/teams/T/members          {"user", "role": "team-admin" | "member"}
    DELETE /admin/api/teams/T/members/U

and each team's own part, which team admins (users with the team role
`team-admin`, logged in through the portal) reach for their team only:

    GET    /admin/api/teams/T/keys             the team's keys (never secrets)
    POST   /admin/api/teams/T/keys             a new key of the team (the key fields of
                                               POST /admin/api/keys, except role)
    POST   /admin/api/teams/T/keys/K/revoke    revoke one of the team's keys
    GET    /admin/api/teams/T/usage            the team's usage (also for members),
                                               ?by=day,key,model&since=&until=

A key of another team is "not found" here, whoever asks: a team admin learns
nothing of other teams' keys, not even that they exist.
Not guaranteed: pagination; lists are whole.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from llmgw.auth import (
    USER_SCOPE_KEY,
    KeyService,
    TeamAccess,
    scope_role,
    team_role_may,
)
from llmgw.auth.views import key_view
from llmgw.router.admin_keys import (
    AdminInputError,
    _answer,
    _error,
    _int,
    _json,
    _models,
    _object,
    _period,
    _priority,
    _scopes,
    _seconds,
    _time,
    _weight,
    usage_group_by,
)
from llmgw.store import (
    KEEP,
    NotFound,
    Team,
    TeamLimits,
    TeamRepository,
    UsageRepository,
)
from llmgw.usage.views import usage_row_view

_TEAM_FIELDS = {"name", "rpm", "tpm", "budget_tokens", "period", "models"}
_KEY_FIELDS = {
    "name",
    "models",
    "rpm",
    "tpm",
    "budget_tokens",
    "period",
    "expires_at",
    "priority",
    "weight",
    "max_queue_wait",
    "scopes",
    "user_rpm",
    "user_tpm",
    "user_budget_tokens",
}


def team_view(team: Team, **extra: Any) -> dict[str, Any]:
    return {
        "id": team.id,
        "name": team.name,
        "rpm": team.rpm,
        "tpm": team.tpm,
        "budget_tokens": team.budget_tokens,
        "budget_period": team.budget_period,
        "models": list(team.models) if team.models is not None else None,
        "created_at": team.created_at.isoformat(),
        "updated_at": team.updated_at.isoformat(),
        **extra,
    }


def _limits(body: dict[str, Any]) -> TeamLimits:
    """The team fields of a request body; absent fields stay as they are (KEEP)."""

    def pick(field: str, parse: Callable[[object], Any]) -> Any:
        return parse(body[field]) if field in body else KEEP

    name = body.get("name", KEEP)
    if name is not KEEP and not isinstance(name, str):
        raise AdminInputError("'name' must be a string", param="name")
    return TeamLimits(
        name=name,
        rpm=pick("rpm", lambda v: _int("rpm", v)),
        tpm=pick("tpm", lambda v: _int("tpm", v)),
        budget_tokens=pick("budget_tokens", lambda v: _int("budget_tokens", v)),
        budget_period=pick("period", _period),
        models=pick("models", lambda v: tuple(m) if (m := _models(v)) is not None else None),
    )


def team_routes(
    *,
    teams: TeamRepository,
    access: TeamAccess,
    keys: KeyService,
    usage: UsageRepository,
    wall_clock: Callable[[], datetime],
) -> list[Route]:
    async def allowed(request: Request, section: str) -> Team | Response:
        """The team of the path when the caller may reach `section` of it; else a 403/404."""
        ref = request.path_params["team"]
        if scope_role(request.scope) == "admin":
            return await teams.get(ref)
        user = request.scope.get(USER_SCOPE_KEY)
        found = await access.role_in(user, ref) if isinstance(user, str) else None
        if found is None or not team_role_may(found[1], request.method, section):
            return _error(
                403,
                f"you may not {request.method} the {section} of team {ref!r}: only admins "
                "and that team's team-admins may (members may read its usage)",
                "permission_error",
                "team_not_allowed",
            )
        return found[0]

    def admin_only(request: Request) -> Response | None:
        if scope_role(request.scope) == "admin":
            return None
        return _error(
            403,
            "only admins manage teams and their members; team-admins manage their team's "
            "keys under /admin/api/teams/T/keys",
            "permission_error",
            "admin_required",
        )

    def guarded(
        handler: Callable[[Request], Awaitable[Response]], section: str | None = None
    ) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            if section is None and (refused := admin_only(request)) is not None:
                return refused
            return await _answer(lambda: handler(request))

        return run

    async def list_teams(request: Request) -> Response:
        counts = await teams.key_counts()
        return _json(
            {"teams": [team_view(t, keys=counts.get(t.id, 0)) for t in await teams.list()]}
        )

    async def create_team(request: Request) -> Response:
        body = _object(await request.body(), _TEAM_FIELDS)
        name = body.get("name")
        if not isinstance(name, str):
            raise AdminInputError("'name' is required and must be a string", param="name")
        return _json(team_view(await teams.create(name, _limits(body))), status=201)

    async def show_team(request: Request) -> Response:
        team = await teams.get(request.path_params["team"])
        members = await teams.members(team.id)
        count = (await teams.key_counts()).get(team.id, 0)
        return _json(
            team_view(
                team,
                keys=count,
                members=[{"user": m.user_name, "role": m.role} for m in members],
            )
        )

    async def update_team(request: Request) -> Response:
        raw = await request.body()
        body = _object(raw, _TEAM_FIELDS) if raw.strip() else {}
        return _json(team_view(await teams.update(request.path_params["team"], _limits(body))))

    async def remove_team(request: Request) -> Response:
        return _json(team_view(await teams.remove(request.path_params["team"])))

    async def add_member(request: Request) -> Response:
        body = _object(await request.body(), {"user", "role"})
        user, role = body.get("user"), body.get("role", "member")
        if not isinstance(user, str):
            raise AdminInputError("'user' is required: a user's name", param="user")
        if not isinstance(role, str):
            raise AdminInputError("'role' must be 'team-admin' or 'member'", param="role")
        member = await teams.add_member(request.path_params["team"], user, role)
        return _json({"team_id": member.team_id, "user": member.user_name, "role": member.role})

    async def remove_member(request: Request) -> Response:
        team = await teams.remove_member(request.path_params["team"], request.path_params["user"])
        return _json({"team_id": team.id, "user": request.path_params["user"], "removed": True})

    async def team_keys(request: Request) -> Response:
        team = await allowed(request, "keys")
        if isinstance(team, Response):
            return team
        include = request.query_params.get("all", "").lower() in ("1", "true", "yes")
        listed = await keys.list(include_revoked=include, team_id=team.id)
        now = wall_clock()
        return _json({"team": team.name, "keys": [key_view(k, now) for k in listed]})

    async def create_team_key(request: Request) -> Response:
        team = await allowed(request, "keys")
        if isinstance(team, Response):
            return team
        body = _object(await request.body(), _KEY_FIELDS)
        name = body.get("name")
        if not isinstance(name, str):
            raise AdminInputError("'name' is required and must be a string", param="name")
        key, secret = await keys.create(
            name=name,
            models=_models(body.get("models")),
            rpm=_int("rpm", body.get("rpm")),
            tpm=_int("tpm", body.get("tpm")),
            budget_tokens=_int("budget_tokens", body.get("budget_tokens")),
            period=_period(body.get("period")),
            expires_at=_time("expires_at", body.get("expires_at")),
            priority=_priority(body.get("priority", "default")),
            weight=_weight(body.get("weight", 1.0)),
            max_queue_wait=_seconds("max_queue_wait", body.get("max_queue_wait")),
            scopes=_scopes(body.get("scopes")),
            team_id=team.id,
            user_rpm=_int("user_rpm", body.get("user_rpm")),
            user_tpm=_int("user_tpm", body.get("user_tpm")),
            user_budget_tokens=_int("user_budget_tokens", body.get("user_budget_tokens")),
        )
        return _json({**key_view(key, wall_clock()), "secret": secret}, status=201)

    async def revoke_team_key(request: Request) -> Response:
        team = await allowed(request, "keys")
        if isinstance(team, Response):
            return team
        ref = request.path_params["key"]
        # Looked up among the team's keys only: a key of another team is "not found",
        # as one that does not exist (nothing leaks, not even an ambiguity).
        own = await keys.list(include_revoked=True, team_id=team.id)
        key = next((k for k in own if k.id == ref), None) or next(
            (k for k in own if ref in (k.name, k.prefix) and not k.revoked), None
        )
        if key is None:
            raise NotFound(f"team {team.name!r} has no key {ref!r}")
        return _json(key_view(await keys.revoke(key.id), wall_clock()))

    async def team_usage(request: Request) -> Response:
        team = await allowed(request, "usage")
        if isinstance(team, Response):
            return team
        params = request.query_params
        group_by = usage_group_by(params.get("by", "key,model"))
        rows = await usage.query(
            team_id=team.id,
            model=params.get("model") or None,
            since=_time("since", params.get("since")),
            until=_time("until", params.get("until")),
            group_by=group_by,
        )
        names = {k.id: k.name for k in await keys.list(include_revoked=True, team_id=team.id)}
        team_names = {team.id: team.name}
        return _json(
            {
                "team": team.name,
                "usage": [usage_row_view(r, group_by, names, team_names) for r in rows],
            }
        )

    return [
        Route("/admin/api/teams", guarded(list_teams), methods=["GET"]),
        Route("/admin/api/teams", guarded(create_team), methods=["POST"]),
        Route("/admin/api/teams/{team}", guarded(show_team), methods=["GET"]),
        Route("/admin/api/teams/{team}", guarded(update_team), methods=["PATCH"]),
        Route("/admin/api/teams/{team}", guarded(remove_team), methods=["DELETE"]),
        Route("/admin/api/teams/{team}/members", guarded(add_member), methods=["POST"]),
        Route("/admin/api/teams/{team}/members/{user}", guarded(remove_member), methods=["DELETE"]),
        Route("/admin/api/teams/{team}/keys", guarded(team_keys, "keys"), methods=["GET"]),
        Route("/admin/api/teams/{team}/keys", guarded(create_team_key, "keys"), methods=["POST"]),
        Route(
            "/admin/api/teams/{team}/keys/{key}/revoke",
            guarded(revoke_team_key, "keys"),
            methods=["POST"],
        ),
        Route("/admin/api/teams/{team}/usage", guarded(team_usage, "usage"), methods=["GET"]),
    ]
