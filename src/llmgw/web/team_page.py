"""A team's page on the dashboard, `/admin/teams/T`: its keys and its usage.

    GET  /admin/teams/T                       the team's usage (by key, by end user);
                                              its keys, with a create form and revoke
                                              buttons, for admins and its team-admins
    POST /admin/teams/T/keys                  create a key in team T (htmx; its secret
                                              is in that one answer)
    POST /admin/teams/T/keys/K/revoke         revoke key K of team T (htmx)

Who may do what is the same as on the team admin API (`llmgw.auth.teams`):
admins every team; a team-admin their own team's keys and usage; a member their
own team's usage. Every handler checks again, from the store's memberships,
whatever the portal let through: a key of another team is "not found" here, and a
team the caller has no part in is refused the same way whether it exists or not,
so the page never tells an outsider which teams there are.

Not guaranteed: that the page lists a team's end users beyond the top
`END_USER_ROWS` (`/admin/api/teams/T/usage?by=end-user` has them all).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from llmgw.auth import USER_SCOPE_KEY, KeyInputError, scope_role, team_role_may
from llmgw.auth.views import key_view
from llmgw.store import StoreError, Team
from llmgw.usage.views import usage_row_view
from llmgw.web.actions import Actions, store_status
from llmgw.web.htmx import BodyTooLarge, htmx_required, read_form
from llmgw.web.key_form import form_int
from llmgw.web.sources import ActionError, TeamPageSources
from llmgw.web.usage_page import (
    END_USER_ROWS,
    UsageInputError,
    UsageRange,
    end_user_label,
    parse_range,
)

PREFIX = "/admin/teams/"


PageRenderer = Callable[..., Response]


class TeamPages:
    """The page and its two actions; build with `create_dashboard_routes`."""

    def __init__(
        self,
        *,
        sources: TeamPageSources,
        actions: Actions,
        page: PageRenderer,
        wall_clock: Callable[[], datetime],
    ) -> None:
        self._sources = sources
        self._actions = actions
        self._page = page
        self._wall_clock = wall_clock

    async def _team(self, request: Request, section: str) -> tuple[Team, bool]:
        """The path's team if the caller may make this request to `section` of it, and
        whether they manage its keys; ActionError (403) otherwise."""
        ref: str = request.path_params["team"]
        if scope_role(request.scope) == "admin":
            team = await self._sources.teams.find(ref)
            if team is None:
                raise ActionError(
                    f"there is no team {ref!r}; `llmgw teams list` shows the teams", status=404
                )
            return team, True
        user = request.scope.get(USER_SCOPE_KEY)
        found = await self._sources.access.role_in(user, ref) if isinstance(user, str) else None
        if found is None or not team_role_may(found[1], request.method, section):
            raise ActionError(
                f"you may not {'see' if section == 'usage' else 'change'} the "
                f"{section} of team {ref!r}: only admins and that team's team-admins may "
                "(its members may see its usage)",
                status=403,
            )
        return found[0], team_role_may(found[1], "POST", "keys")

    async def page(self, request: Request) -> Response:
        ref = request.path_params["team"]
        context: dict[str, Any] = {"team": None, "keys": [], "error": None, "manage": False}
        status = 200
        try:
            team, manage = await self._team(request, "usage")
            context.update(team=team, manage=manage)
            span = parse_range(request.query_params, self._wall_clock())
            context.update(await self._usage(team, span))
            if manage:
                now = self._wall_clock()
                listed = await self._sources.keys.list(team_id=team.id)
                context["keys"] = [key_view(k, now) for k in listed]
        except ActionError as exc:
            context["error"], status = exc.message, exc.status
        except UsageInputError as exc:
            context["error"], status = str(exc), 400
        except StoreError as exc:
            context["error"] = f"cannot read the team from the store right now ({exc}); retry"
            status = store_status(exc)
        team_obj = context["team"]
        title = f"Team {team_obj.name}" if team_obj is not None else f"Team {ref}"
        return self._page(
            request, name="team", title=title, context=context, status=status, live_url=None
        )

    async def _usage(self, team: Team, span: UsageRange) -> dict[str, Any]:
        names = {k.id: k.name for k in await self._sources.keys.list(include_revoked=True,
                                                                      team_id=team.id)}  # fmt: skip
        by_key = [
            usage_row_view(r, ("key",), names)
            for r in await self._sources.usage.query(
                team_id=team.id, since=span.since, until=span.until, group_by=("key",)
            )
        ]
        by_end_user = [
            usage_row_view(r, ("key", "end-user"), names)
            for r in await self._sources.usage.query(
                team_id=team.id,
                since=span.since,
                until=span.until,
                group_by=("key", "end-user"),
                top=END_USER_ROWS,
            )
        ]
        for row in by_end_user:
            row["label"] = end_user_label(row)
        by_end_user.sort(key=lambda r: r["total_tokens"], reverse=True)
        return {
            "span": span,
            "by_key": sorted(by_key, key=lambda r: r["total_tokens"], reverse=True),
            "by_end_user": by_end_user,
            "span_text": f"{span.since:%Y-%m-%d %H:%M} to {span.until:%Y-%m-%d %H:%M}",
        }

    async def create_key(self, request: Request) -> Response:
        return await self._guarded(request, self._create)

    async def revoke_key(self, request: Request) -> Response:
        return await self._guarded(request, self._revoke)

    async def _guarded(
        self, request: Request, action: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        reason = htmx_required(request)
        if reason is not None:
            return self._actions.refused(reason, 403)
        try:
            return await action(request)
        except ActionError as exc:
            return self._actions.refused(exc.message, exc.status)
        except KeyInputError as exc:
            return self._actions.refused(str(exc), 400)
        except StoreError as exc:
            return self._actions.refused(str(exc), store_status(exc))
        except BodyTooLarge:
            return self._actions.refused("the form is too large (64 KiB at most)", 413)

    async def _create(self, request: Request) -> Response:
        team, _ = await self._team(request, "keys")
        form = await read_form(request)
        name = form.get("name", "").strip()
        if not name:
            raise ActionError("give the key a name")
        key, secret = await self._sources.keys.create(
            name=name,
            team_id=team.id,
            rpm=form_int(form, "rpm"),
            user_rpm=form_int(form, "user_rpm"),
            user_budget_tokens=form_int(form, "user_budget_tokens"),
        )
        return self._actions.notice(
            f"key {key.name} created in team {team.name}", status=201, secret=secret
        )

    async def _revoke(self, request: Request) -> Response:
        team, _ = await self._team(request, "keys")
        ref = request.path_params["key"]
        # Among the team's keys only: another team's key is "not found", as a missing one.
        own = await self._sources.keys.list(team_id=team.id)
        key = next((k for k in own if ref in (k.id, k.name)), None)
        if key is None:
            raise ActionError(f"team {team.name!r} has no key {ref!r}", status=404)
        revoked = await self._sources.keys.revoke(key.id)
        return self._actions.notice(
            f"key {revoked.name} revoked; clients using it are refused from now on"
        )
