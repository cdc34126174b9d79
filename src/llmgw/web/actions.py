"""The dashboard's changes: drain, models, activation and keys, answered with a message.

Each action is an htmx POST (`HX-Request: true` required, see
`htmx.htmx_required`) that calls the same service the admin API calls and
answers with a small notice fragment for the page's `#flash` area: what was
done, or why not (with the status the admin API would give). A success also
sends `HX-Trigger: llmgw-refresh`, so the page's live part reloads at once
instead of at the next tick. A new or rotated key's secret is in that one
answer and nowhere else. A key's edit form is sent whole; only the fields it
changes go to the key service (see `llmgw.web.key_form`), and a form that
changes nothing is answered with a notice, not an error.

Not guaranteed: idempotency. Posting "rotate" twice rotates twice.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from urllib.parse import quote

import yaml
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from llmgw.auth import KeyInputError
from llmgw.store import Ambiguous, Conflict, InvalidValue, NotFound, StoreError
from llmgw.web.htmx import PAGE_HEADERS, BodyTooLarge, htmx_required, read_form
from llmgw.web.key_form import KeyFields, form_expiry, form_int, form_models
from llmgw.web.render import Renderer
from llmgw.web.sources import ActionError, DashboardSources

REFRESH_EVENT = "llmgw-refresh"

_Action = Callable[[Request], Awaitable[Response]]


def parse_spec(text: str) -> object:
    """A model typed into the page (YAML, or JSON, which YAML reads too)."""
    if not text.strip():
        raise ActionError("the model is empty; enter it as YAML or JSON")
    try:
        # Anchors and aliases would let a few bytes expand into a huge document
        # for the validator; a model never needs them.
        if any(isinstance(e, yaml.AliasEvent) for e in yaml.parse(text, Loader=yaml.SafeLoader)):
            raise ActionError("the model may not use YAML aliases (*name); write it out")
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ActionError(f"the model is not valid YAML or JSON: {exc}") from exc
    if isinstance(data, list) and len(data) == 1:
        # An entry copied from a `models:` list, dash included.
        data = data[0]
    if not isinstance(data, dict):
        raise ActionError(
            "the model must be a mapping of fields (name, weights, profiles, ...), "
            f"not {type(data).__name__}"
        )
    return data


def store_status(exc: StoreError) -> int:
    """The status the admin API answers a store error with."""
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, Ambiguous | InvalidValue):
        return 400
    if isinstance(exc, Conflict):
        return 409
    return 503


class Actions:
    """The POST handlers; build with `create_dashboard_routes`."""

    def __init__(self, *, sources: DashboardSources, renderer: Renderer) -> None:
        self._sources = sources
        self._renderer = renderer

    def notice(
        self,
        message: str,
        *,
        ok: bool = True,
        status: int = 200,
        secret: str | None = None,
        link: tuple[str, str] | None = None,
        details: Sequence[str] = (),
    ) -> Response:
        body = self._renderer.render(
            "flash.html",
            {"ok": ok, "message": message, "secret": secret, "link": link, "details": details},
        )
        headers = dict(PAGE_HEADERS)
        if ok:
            headers["hx-trigger"] = REFRESH_EVENT
        return HTMLResponse(body, status_code=status, headers=headers)

    def refused(self, message: str, status: int) -> Response:
        return self.notice(message, ok=False, status=status)

    async def _guarded(self, request: Request, action: _Action) -> Response:
        reason = htmx_required(request)
        if reason is not None:
            return self.refused(reason, 403)
        try:
            return await action(request)
        except ActionError as exc:
            return self.refused(exc.message, exc.status)
        except KeyInputError as exc:
            return self.refused(str(exc), 400)
        except StoreError as exc:
            return self.refused(str(exc), store_status(exc))
        except BodyTooLarge:
            return self.refused("the form is too large (64 KiB at most)", 413)

    # ---- the routes ----

    async def drain(self, request: Request) -> Response:
        return await self._guarded(request, self._drain_node)

    async def undrain(self, request: Request) -> Response:
        return await self._guarded(request, self._undrain_node)

    async def add_model(self, request: Request) -> Response:
        return await self._guarded(request, self._add)

    async def edit_model(self, request: Request) -> Response:
        return await self._guarded(request, self._edit)

    async def remove_model(self, request: Request) -> Response:
        return await self._guarded(request, self._remove)

    async def activate(self, request: Request) -> Response:
        return await self._guarded(request, self._activate_model)

    async def create_key(self, request: Request) -> Response:
        return await self._guarded(request, self._create)

    async def edit_key(self, request: Request) -> Response:
        return await self._guarded(request, self._edit_key)

    async def revoke_key(self, request: Request) -> Response:
        return await self._guarded(request, self._revoke)

    async def rotate_key(self, request: Request) -> Response:
        return await self._guarded(request, self._rotate)

    # ---- what they do ----

    async def _drain_node(self, request: Request) -> Response:
        node = self._sources.set_draining(request.path_params["node_id"], True)
        return self.notice(
            f"node {node['id']} is draining: nothing new is placed there, and its replicas "
            "are moved to other nodes"
        )

    async def _undrain_node(self, request: Request) -> Response:
        node = self._sources.set_draining(request.path_params["node_id"], False)
        return self.notice(f"node {node['id']} takes new replicas again")

    async def _add(self, request: Request) -> Response:
        spec = parse_spec((await read_form(request)).get("spec", ""))
        model = await self._sources.add_model(spec)
        name = str(model["name"])
        return self.notice(f"model {name} added", link=(_model_url(name), "open its page"))

    async def _edit(self, request: Request) -> Response:
        name = request.path_params["name"]
        spec = parse_spec((await read_form(request)).get("spec", ""))
        model = await self._sources.replace_model(name, spec)
        return self.notice(f"model {model['name']} saved; the reconciler applies it now")

    async def _remove(self, request: Request) -> Response:
        name = request.path_params["name"]
        await self._sources.remove_model(name)
        return self.notice(
            f"model {name} removed from the catalog; its replicas are being stopped",
            link=("/admin/models", "all models"),
        )

    async def _activate_model(self, request: Request) -> Response:
        name = request.path_params["name"]
        view = await self._sources.activate(name)
        error = view.get("error")
        if error:
            return self.refused(f"model {name} was not started: {error.get('message')}", 409)
        ready = view.get("ready_replicas", 0)
        return self.notice(f"model {name} is {view.get('state', 'unknown')} ({ready} ready)")

    async def _create(self, request: Request) -> Response:
        form = await read_form(request)
        key, secret = await self._sources.keys.create(
            name=form.get("name", ""),
            models=form_models(form.get("models", "")),
            rpm=form_int(form, "rpm"),
            tpm=form_int(form, "tpm"),
            budget_tokens=form_int(form, "budget_tokens"),
            period=form.get("period") or None,
            expires_at=form_expiry(form.get("expires_at", "")),
            admin_role=form.get("role", "").strip() or None,
            user_rpm=form_int(form, "user_rpm"),
            user_tpm=form_int(form, "user_tpm"),
            user_budget_tokens=form_int(form, "user_budget_tokens"),
        )
        return self.notice(f"key {key.name} created", secret=secret)

    async def _edit_key(self, request: Request) -> Response:
        form = await read_form(request)
        wanted = KeyFields.from_form(form)
        keys = self._sources.keys
        key = await keys.resolve(request.path_params["ref"])
        # A revoked key is compared with nothing: the whole form goes to the key
        # service, whose answer says the key cannot be changed.
        now = None if key.revoked else KeyFields.of(key)
        edits = wanted.edits(now, KeyFields.shown_in(form))
        if not edits.changed():
            return self.notice(f"nothing to save: the form changes nothing in key {key.name}")
        key = await keys.update(
            key.id,
            name=edits.name,
            models=edits.models,
            rpm=edits.rpm,
            tpm=edits.tpm,
            budget_tokens=edits.budget_tokens,
            period=edits.period,
            expires_at=edits.expires_at,
            admin_role=edits.admin_role,
            user_rpm=edits.user_rpm,
            user_tpm=edits.user_tpm,
            user_budget_tokens=edits.user_budget_tokens,
        )
        return self.notice(f"key {key.name} updated; routers apply it within a few seconds")

    async def _revoke(self, request: Request) -> Response:
        key = await self._sources.keys.revoke(request.path_params["ref"])
        return self.notice(f"key {key.name} revoked: requests with it are refused from now on")

    async def _rotate(self, request: Request) -> Response:
        key, secret = await self._sources.keys.rotate(request.path_params["ref"])
        return self.notice(
            f"key {key.name} has a new secret; the old one stops working", secret=secret
        )


def _model_url(name: str) -> str:
    return f"/admin/models/{quote(name, safe='/')}"
