"""The dashboard: server-rendered pages (Jinja2) that refresh themselves with htmx.

Mounted into the admin app (`create_dashboard_routes(...)` in its extra
routes), so it is served on the admin listener and, behind the login, on the
API port through the portal:

    GET  /admin/                      overview: nodes, GPUs, models, replicas, charts, leader
    GET  /admin/nodes                 nodes (?q= filter, ?page=, GPU rows folded); drain / undrain
    GET  /admin/models                models and their state; add one
    GET  /admin/models/{name}         one model: replicas, failure + output tail, placement
    GET  /admin/usage, /usage.csv     tokens and requests by key, team, end user, model and hour
    GET  /admin/keys                  keys; create, edit, revoke, rotate
    GET  /admin/keys/{ref}/edit       one key's edit form (htmx only), outside the live part
    GET  /admin/events                recent decisions and transitions
    GET  /admin/teams/{team}          a team's keys and usage (`llmgw.web.team_page`)
    GET  /admin/static/{file}         htmx and the stylesheet, from the package
    POST (see `llmgw.web.actions`)    the changes, answered with a message fragment

A plain GET gets the whole page; a GET with `HX-Request: true` (htmx polling
every `refresh_seconds`) gets only the page's live part. Pages carry no
inline script or style, so the Content-Security-Policy allows scripts and
styles from this origin only.

Each page shows only what the caller's role may do (`llmgw.auth.roles`): the
nav leaves out pages the role may not open, and a viewer gets no drain,
activate, add or edit controls. The guard in front (the portal, or the admin
listener's key check) refuses the requests themselves.

Not guaranteed: pages that stay correct when the admin app is mounted under
another prefix; the paths above are absolute.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from llmgw.auth import may, may_see, scope_role
from llmgw.auth.views import key_view
from llmgw.store import StoreError
from llmgw.web import views
from llmgw.web.actions import Actions, store_status
from llmgw.web.assets import StaticAssets
from llmgw.web.htmx import PAGE_HEADERS, compressed, is_htmx, portal_user
from llmgw.web.key_form import form_values
from llmgw.web.nodes_page import (
    clean_filter,
    clean_page,
    known_versions,
    node_changes,
    nodes_view,
    page_url,
)
from llmgw.web.render import Renderer
from llmgw.web.sources import DashboardSources
from llmgw.web.team_page import TeamPages
from llmgw.web.usage_page import (
    UsageInputError,
    parse_by,
    parse_range,
    usage_csv,
    usage_page,
    usage_rows,
)

PREFIX = "/admin"
NAV: tuple[tuple[str, str, str], ...] = (
    ("overview", "/admin/", "Overview"),
    ("nodes", "/admin/nodes", "Nodes"),
    ("models", "/admin/models", "Models"),
    ("usage", "/admin/usage", "Usage"),
    ("keys", "/admin/keys", "Keys"),
    ("events", "/admin/events", "Events"),
)
# Paths the portal forwards to the admin app (besides /admin/api/).
_PAGE_PATHS = frozenset(href for _, href, _ in NAV) | {"/admin/usage.csv"}
_PAGE_PREFIXES = (
    "/admin/nodes/",
    "/admin/models/",
    "/admin/keys/",
    "/admin/static/",
    "/admin/teams/",
)
# htmx settings: no eval, no inline indicator styles (the CSP forbids both), and
# 4xx answers are swapped in too, so an action's error message shows on the page.
HTMX_CONFIG: dict[str, object] = {
    "allowEval": False,
    "allowScriptTags": False,
    "includeIndicatorStyles": False,
    "historyCacheSize": 0,
    "responseHandling": [
        {"code": "204", "swap": False},
        {"code": "[23]..", "swap": True},
        {"code": "4..", "swap": True, "error": True},
        {"code": "...", "swap": False, "error": True},
    ],
}
EXAMPLE_MODEL = """\
name: my-model
weights: org/my-model
profiles:
  - name: tp1
    engine: vllm
    gpus: 1
min_replicas: 0
max_replicas: 1
"""


def is_dashboard_path(path: str) -> bool:
    """Whether `path` is one of the dashboard's pages, actions or static files."""
    return path in _PAGE_PATHS or path.startswith(_PAGE_PREFIXES)


Handler = Callable[[Request], Awaitable[Response]]


class Dashboard:
    """The page handlers; build with `create_dashboard_routes`."""

    def __init__(self, *, sources: DashboardSources, refresh_seconds: float) -> None:
        if refresh_seconds <= 0:
            raise ValueError(f"refresh_seconds must be positive, got {refresh_seconds:g}")
        self.sources = sources
        self.renderer = Renderer()
        self.assets = StaticAssets()
        self._refresh_ms = max(100, round(refresh_seconds * 1000))

    def page(
        self,
        request: Request,
        *,
        name: str,
        title: str,
        context: dict[str, Any],
        status: int = 200,
        template: str | None = None,
        live_url: str | None = None,
    ) -> Response:
        """The whole page, or only its live part for htmx's refresh."""
        template = template or name
        if live_url is None:
            query = request.url.query
            live_url = request.url.path + (f"?{query}" if query else "")
        role = scope_role(request.scope)
        context = {
            **context,
            "live_url": live_url,
            "refresh_ms": self._refresh_ms,
            "can_change": may_see(role, "changes"),
        }
        if is_htmx(request):
            body = self.renderer.render(f"live/{template}.html", context)
        else:
            body = self.renderer.render(
                f"pages/{template}.html",
                {
                    **context,
                    "title": title,
                    "heading": context.get("heading", title),
                    "nav": [item for item in NAV if may(role, "GET", item[1])],
                    "active": name,
                    "user": portal_user(request),
                    "assets": {
                        "css": self.assets.url("dashboard.css"),
                        "js": self.assets.url("htmx.min.js"),
                        "app": self.assets.url("dashboard.js"),
                    },
                    "htmx_config": HTMX_CONFIG,
                    "live_template": f"live/{template}.html",
                },
            )
        return compressed(request, HTMLResponse(body, status_code=status, headers=PAGE_HEADERS))

    async def overview(self, request: Request) -> Response:
        return self.page(
            request, name="overview", title="Overview", context=views.overview(self.sources)
        )

    async def nodes(self, request: Request) -> Response:
        """The page, its live part (a filter's answer), or, for a refresh that sends
        the versions it shows, only the cards that changed (see `nodes_page`)."""
        params = request.query_params
        q = clean_filter(params.get("q"))
        can_change = may_see(scope_role(request.scope), "changes")
        view = nodes_view(
            self.renderer,
            self.sources.node_briefs(),
            q,
            clean_page(params.get("page")),
            views=self.sources.node_views,
            can_change=can_change,
        )
        versions = params.getlist("v")
        if versions and is_htmx(request):
            body = node_changes(self.renderer, view, known_versions(versions))
            if body is None:
                return Response(status_code=204, headers=PAGE_HEADERS)
            return compressed(request, HTMLResponse(body, headers=PAGE_HEADERS))
        return self.page(
            request,
            name="nodes",
            title="Nodes",
            context={"q": q, "summary": view.summary, "cards": view.cards},
            live_url=page_url(f"{PREFIX}/nodes", q, view.page),
        )

    async def models(self, request: Request) -> Response:
        return self.page(
            request,
            name="models",
            title="Models",
            context={**views.models_page(self.sources), "example": EXAMPLE_MODEL},
        )

    async def model(self, request: Request) -> Response:
        name: str = request.path_params["name"]
        context = views.model_page(self.sources, name)
        live_url = f"{PREFIX}/models/{quote(name, safe='/')}"
        if context is None:
            return self.page(
                request,
                name="models",
                template="model",
                title=f"Model {name}",
                context={"model": None, "name": name},
                status=404,
                live_url=live_url,
            )
        model = context["model"]
        return self.page(
            request,
            name="models",
            template="model",
            title=f"Model {model['name']}",
            context={
                **context,
                "name": name,
                "model_url": f"{PREFIX}/models/{quote(str(model['name']), safe='/')}",
                "spec": views.spec_text(model),
            },
            live_url=live_url,
        )

    async def events(self, request: Request) -> Response:
        params = request.query_params
        context = views.events_page(
            self.sources, model=params.get("model", ""), kind=params.get("kind", "")
        )
        return self.page(request, name="events", title="Events", context=context)

    async def usage(self, request: Request) -> Response:
        now = self.sources.wall_clock()
        context: dict[str, Any] = {"span": None, "presets": [], "error": None}
        status = 200
        try:
            span = parse_range(request.query_params, now)
            context = {**await usage_page(self.sources, span), "error": None}
        except UsageInputError as exc:
            context["error"], status = str(exc), 400
        except StoreError as exc:
            context["error"] = f"cannot read usage from the store right now ({exc}); retry shortly"
            status = 503
        else:
            context["span_text"] = f"{span.since:%Y-%m-%d %H:%M} to {span.until:%Y-%m-%d %H:%M}"
        span_now = context.get("span")
        context.update(
            presets=context.get("presets") or ["1h", "6h", "24h", "7d", "30d"],
            since_value=f"{span_now.since:%Y-%m-%dT%H:%M}" if span_now else "",
            until_value=f"{span_now.until:%Y-%m-%dT%H:%M}" if span_now else "",
        )
        return self.page(request, name="usage", title="Usage", context=context, status=status)

    async def usage_export(self, request: Request) -> Response:
        params = request.query_params
        try:
            span = parse_range(params, self.sources.wall_clock())
            by = parse_by(params.get("by", "key,model"))
            rows = await usage_rows(self.sources, span, by)
        except UsageInputError as exc:
            return Response(str(exc) + "\n", status_code=400, media_type="text/plain")
        except StoreError as exc:
            return Response(
                f"cannot read usage from the store right now ({exc}); retry shortly\n",
                status_code=503,
                media_type="text/plain",
            )
        filename = f"llmgw-usage-{span.since:%Y%m%dT%H%M}-{span.until:%Y%m%dT%H%M}.csv"
        return Response(
            usage_csv(rows, by),
            media_type="text/csv; charset=utf-8",
            headers={
                "content-disposition": f'attachment; filename="{filename}"',
                "cache-control": "no-store",
            },
        )

    async def keys(self, request: Request) -> Response:
        show_revoked = request.query_params.get("all", "") in ("1", "true", "yes")
        context: dict[str, Any] = {"show_revoked": show_revoked, "error": None, "keys": []}
        status = 200
        try:
            keys = await self.sources.keys.list(include_revoked=show_revoked)
        except StoreError as exc:
            context["error"] = f"cannot read keys from the store right now ({exc}); retry shortly"
            status = 503
        else:
            now = self.sources.wall_clock()
            context["keys"] = [key_view(k, now) for k in keys]
        return self.page(request, name="keys", title="API keys", context=context, status=status)

    async def key_editor(self, request: Request) -> Response:
        """The edit form of one key, for the page's `#key-edit` area.

        The form is fetched when the Edit button is pressed and lives outside
        the live part, so the table's refreshes never replace what is being
        typed. A plain GET (a link opened in a tab) goes to the Keys page.
        """
        if not is_htmx(request):
            return RedirectResponse(f"{PREFIX}/keys", status_code=303, headers=PAGE_HEADERS)
        try:
            key = await self.sources.keys.resolve(request.path_params["ref"])
        except StoreError as exc:
            return self._fragment("flash.html", _refusal(str(exc)), store_status(exc))
        if key.revoked:
            message = f"key {key.name} is revoked and cannot be changed; create a new key instead"
            return self._fragment("flash.html", _refusal(message), 409)
        return self._fragment("key_edit.html", {"key": key, "values": form_values(key)}, 200)

    def _fragment(self, template: str, context: dict[str, Any], status: int) -> Response:
        body = self.renderer.render(template, context)
        return HTMLResponse(body, status_code=status, headers=PAGE_HEADERS)


def _refusal(message: str) -> dict[str, Any]:
    return {"ok": False, "message": message, "secret": None, "link": None, "details": ()}


def create_dashboard_routes(
    *, sources: DashboardSources, refresh_seconds: float = 5.0
) -> list[BaseRoute]:
    """The dashboard's routes, for the admin app's `extra_routes`.

    `refresh_seconds` is how often an open page fetches its live part again.
    """
    dashboard = Dashboard(sources=sources, refresh_seconds=refresh_seconds)
    actions = Actions(sources=sources, renderer=dashboard.renderer)
    team_routes: list[BaseRoute] = []
    if sources.team_pages is not None:
        teams = TeamPages(
            sources=sources.team_pages,
            actions=actions,
            page=dashboard.page,
            wall_clock=sources.wall_clock,
        )
        team_routes = [
            Route("/admin/teams/{team}", teams.page, methods=["GET"]),
            Route("/admin/teams/{team}/keys", teams.create_key, methods=["POST"]),
            Route("/admin/teams/{team}/keys/{key}/revoke", teams.revoke_key, methods=["POST"]),
        ]
    return [
        *team_routes,
        Route("/admin/", dashboard.overview, methods=["GET"]),
        Route("/admin/nodes", dashboard.nodes, methods=["GET"]),
        Route("/admin/nodes/{node_id:path}/drain", actions.drain, methods=["POST"]),
        Route("/admin/nodes/{node_id:path}/undrain", actions.undrain, methods=["POST"]),
        Route("/admin/models", dashboard.models, methods=["GET"]),
        Route("/admin/models", actions.add_model, methods=["POST"]),
        # Suffix routes before the page: a model's name may contain '/'.
        Route("/admin/models/{name:path}/edit", actions.edit_model, methods=["POST"]),
        Route("/admin/models/{name:path}/remove", actions.remove_model, methods=["POST"]),
        Route("/admin/models/{name:path}/activate", actions.activate, methods=["POST"]),
        Route("/admin/models/{name:path}", dashboard.model, methods=["GET"]),
        Route("/admin/usage", dashboard.usage, methods=["GET"]),
        Route("/admin/usage.csv", dashboard.usage_export, methods=["GET"]),
        Route("/admin/keys", dashboard.keys, methods=["GET"]),
        Route("/admin/keys", actions.create_key, methods=["POST"]),
        Route("/admin/keys/{ref}/edit", dashboard.key_editor, methods=["GET"]),
        Route("/admin/keys/{ref}/edit", actions.edit_key, methods=["POST"]),
        Route("/admin/keys/{ref}/revoke", actions.revoke_key, methods=["POST"]),
        Route("/admin/keys/{ref}/rotate", actions.rotate_key, methods=["POST"]),
        Route("/admin/events", dashboard.events, methods=["GET"]),
        Route("/admin/static/{file}", dashboard.assets.serve, methods=["GET"]),
    ]
