"""Admin API for the model catalog: list, show, add, replace and remove models, and placement.

The same operations as `llmgw models`. A model's JSON is the shape of a
`models:` entry in the config file (`validate.model_to_dict`); views add
`source` ("config" or "store") and `status` (the model's live state, from the
`ModelControl` the reconciler provides). Writes change only stored models:
config models answer 409 `model_read_only`, and a server without a store
answers 409 `no_store`, because a model it accepted would vanish on restart.

Errors have the OpenAI-style body `{"error": {"message", "type", "param",
"code"}}`; for an invalid model `param` is the dotted path of the field at
fault ("profiles.0.gpus") and `code` is `invalid_model`.

`/admin/api/models/{name}/rollout` shows where a rollout to a changed spec
stands (old and new replicas, the step, why it stopped, the canary); `POST
.../rollout/promote` makes a canary's spec the model's, `POST .../rollout/abort`
drops the canary; `POST .../rollout/undo`
puts the previous spec back (409 `nothing_to_undo` when there is none).

`POST /admin/api/models/{name}/pull` (`{"nodes": N}` or `{"node": [ID, ...]}`)
tells nodes to download the model's hub weights ahead of demand and answers 202
with the pull's state; a model's view carries `pull` (the last pull, per node:
waiting, downloading, done or failed) and `prefetched` (where `prefetch` keeps
the weights).

`GET /admin/api/models` pages and filters on the server (`?limit=`, `?after=`,
`?q=` over names and aliases; see `paging`).

LoRA adapters are entries with `adapter_of` (their base): added, replaced and
removed through the same routes, listed under their base (its view's `adapters`,
each with its own `source`), and shown by name. Removing a base that adapters
name answers 409 `model_has_adapters`, naming them.

Not guaranteed: a model whose own name ends in "/placement", "/activate" or "/rollout" can
be shown only through the list (names may contain '/', and those paths mean the
placement and activation routes of the shorter name).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Protocol

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from llmgw.control.adminapi.paging import BadPageQuery, page_query, take_page, words_of
from llmgw.control.adminapi.responses import error_response, json_response
from llmgw.control.catalog.errors import (
    CatalogError,
    HasAdapters,
    HubUnavailable,
    InvalidModel,
    ModelExists,
    NameTaken,
    NoCanary,
    NoStore,
    NothingToUndo,
    ReadOnlyModel,
    UnknownModel,
)
from llmgw.control.catalog.model import CatalogModel
from llmgw.control.catalog.validate import model_to_dict, parse_model
from llmgw.control.reconciler.pulls import PullRefused
from llmgw.store import StoreError, StoreUnavailable


class ModelCatalog(Protocol):
    """What the routes need of the catalog; `llmgw.control.catalog.Catalog` satisfies it."""

    def models(self) -> list[CatalogModel]: ...

    def get(self, name: str) -> CatalogModel | None: ...

    def adapters(self, base: str | None = None) -> list[CatalogModel]: ...

    def entry(self, name: str) -> CatalogModel | None: ...

    def resolve(self, name: str) -> str | None: ...

    def skipped(self) -> dict[str, str]: ...

    async def add(self, model: CatalogModel) -> CatalogModel: ...

    async def replace(self, name: str, model: CatalogModel) -> CatalogModel: ...

    async def remove(self, name: str) -> CatalogModel: ...

    async def discard(self, name: str) -> str: ...

    def previous(self, name: str) -> CatalogModel | None: ...

    async def undo(self, name: str) -> CatalogModel: ...

    async def promote(self, name: str) -> CatalogModel: ...

    async def abort(self, name: str) -> CatalogModel: ...

    async def pinned(self, model: CatalogModel) -> CatalogModel: ...


class ModelControl(Protocol):
    """What the routes need of the reconciler: live state, placement and activation."""

    def status(self, name: str) -> dict[str, object]:
        """The live state of one catalog model (replicas, failures, ...)."""
        ...

    def statuses(self) -> Mapping[str, dict[str, object]]:
        """`status` of every catalog model at once (one pass over the fleet)."""
        ...

    def explain(self, name: str) -> dict[str, object]:
        """Where a catalog model's replicas would go, and why each node does not fit."""
        ...

    def dry_run(self, model: CatalogModel) -> dict[str, object]:
        """Where `model` would go if it were in the catalog; starts nothing."""
        ...

    async def activate(self, name: str) -> dict[str, object]:
        """Ask for a replica of the model now; its status afterwards."""
        ...


class WeightsPulls(Protocol):
    """What the routes need to pull weights ahead of demand (`reconciler.pulls`)."""

    async def pull(
        self, name: str, *, count: int | None = None, nodes: Sequence[str] = ()
    ) -> dict[str, object]:
        """Pull the model's weights onto `nodes` or `count` nodes; the pull's view."""
        ...

    def view(self, name: str) -> dict[str, object]:
        """`{"pull": ..., "prefetched": ...}`: an operator's last pull and prefetch."""
        ...


_CONFLICTS: dict[type[CatalogError], str | None] = {
    ModelExists: "name",
    NameTaken: None,
    ReadOnlyModel: "name",
    NoStore: None,
    NothingToUndo: "name",
    NoCanary: "name",
    HasAdapters: "name",
}


def _catalog_error(exc: CatalogError) -> Response:
    if isinstance(exc, InvalidModel):
        return error_response(400, exc.message, code=exc.code, param=exc.field or None)
    if isinstance(exc, UnknownModel):
        return error_response(404, exc.message, code=exc.code, param="name")
    if isinstance(exc, HubUnavailable):
        return error_response(503, exc.message, code=exc.code, param="weights")
    for kind, param in _CONFLICTS.items():
        if isinstance(exc, kind):
            return error_response(409, exc.message, code=exc.code, param=param)
    return error_response(400, exc.message, code=exc.code)


def _store_error(exc: StoreError) -> Response:
    if isinstance(exc, StoreUnavailable):
        return error_response(503, str(exc), code="store_unavailable")
    return error_response(500, str(exc), code="store_error")


def _unknown(name: str) -> Response:
    return _catalog_error(UnknownModel(name))


async def _read_body(request: Request) -> object:
    """The request's JSON body; `InvalidJson` when there is none or it does not parse."""
    raw = await request.body()
    if not raw.strip():
        raise _InvalidJson("the body is empty; send the model as a JSON object")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _InvalidJson(f"the body is not valid JSON: {exc}") from exc


def _pull_body(body: object) -> tuple[int | None, list[str]]:
    """`{"nodes": N}` or `{"node": [ID, ...]}` (or `{}`: one node); `_InvalidJson` else."""
    if not isinstance(body, dict):
        raise _InvalidJson('send a JSON object: {"nodes": N} or {"node": ["ID", ...]}')
    unknown = sorted(set(body) - {"nodes", "node"})
    if unknown:
        raise _InvalidJson(
            f"unknown field {unknown[0]!r}; a pull takes nodes (a count) or node (a list of ids)"
        )
    count = body.get("nodes")
    nodes = body.get("node") or []
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
        raise _InvalidJson(f"nodes must be a whole number of at least 1, got {count!r}")
    if not isinstance(nodes, list) or not all(isinstance(n, str) and n for n in nodes):
        raise _InvalidJson(f"node must be a list of node ids, got {nodes!r}")
    if count is not None and nodes:
        raise _InvalidJson("give nodes (a count) or node (a list of ids), not both")
    return count, nodes


class _InvalidJson(Exception):
    """The request body is not JSON; the message says where it broke."""


def model_routes(
    *, catalog: ModelCatalog, control: ModelControl, pulls: WeightsPulls | None = None
) -> list[Route]:
    """The catalog routes under /admin/api/models and /admin/api/placement; without
    `pulls` (no control plane) POST .../pull answers 409 `no_control_plane`."""

    def adapter_view(adapter: CatalogModel) -> dict[str, object]:
        return {**model_to_dict(adapter), "source": adapter.source}

    def view(model: CatalogModel, status: dict[str, object] | None = None) -> dict[str, object]:
        if model.adapter_of is not None:
            return adapter_view(model)
        return {
            **model_to_dict(model),
            "source": model.source,
            "status": control.status(model.name) if status is None else status,
            **(pulls.view(model.name) if pulls is not None else {}),
            "adapters": [adapter_view(a) for a in catalog.adapters(model.name)],
        }

    async def guarded(request: Request, handler: _Handler) -> Response:
        try:
            return await handler(request)
        except _InvalidJson as exc:
            return error_response(400, str(exc), code="invalid_json")
        except CatalogError as exc:
            return _catalog_error(exc)
        except StoreError as exc:
            return _store_error(exc)

    async def list_models(request: Request) -> Response:
        try:
            query = page_query(request.query_params)
        except BadPageQuery as exc:
            return error_response(400, str(exc), code="invalid_parameter", param=exc.param)
        skipped = [{"name": n, "reason": r} for n, r in catalog.skipped().items()]
        page = take_page(
            catalog.models(),
            key=lambda m: m.name,
            query=query,
            matches=lambda m: all(w in words_of(m.name, *m.aliases) for w in query.words),
        )
        statuses = control.statuses()
        models = [view(m, statuses.get(m.name)) for m in page.items]
        return json_response(
            {
                "models": models,
                "skipped": skipped,
                "total": page.total,
                "next_after": page.next_after,
            }
        )

    async def show_model(request: Request) -> Response:
        model = catalog.entry(request.path_params["name"])
        return (
            _unknown(request.path_params["name"]) if model is None else json_response(view(model))
        )

    async def add_model(request: Request) -> Response:
        model = parse_model(await _read_body(request), source="store")
        return json_response(view(await catalog.add(model)), status=201)

    async def replace_model(request: Request) -> Response:
        name = request.path_params["name"]
        body = await _read_body(request)
        canonical = catalog.resolve(name) or name
        if isinstance(body, dict):
            given = body.setdefault("name", canonical)
            if given not in (name, canonical):
                raise InvalidModel(
                    f"model {canonical!r}, field 'name': the body names {given!r} but the "
                    f"path names {name!r}; a model cannot be renamed (add the new name, then "
                    "remove the old one)",
                    "name",
                )
            body["name"] = canonical
        model = parse_model(body, source="store")
        return json_response(view(await catalog.replace(name, model)))

    async def remove_model(request: Request) -> Response:
        name = request.path_params["name"]
        try:
            model = await catalog.remove(name)
        except UnknownModel:
            if name not in catalog.skipped():
                raise
            reason = await catalog.discard(name)
            return json_response({"name": name, "discarded": True, "reason": reason})
        return json_response({**model_to_dict(model), "source": model.source})

    def own_model(asked: str) -> str | Response:
        """The own name of the model `asked` means, or the error for an unknown name or an
        adapter (which has no replicas of its own to place or start)."""
        name = catalog.resolve(asked)
        if name is None:
            return _unknown(asked)
        entry = catalog.entry(name)
        if entry is not None and entry.adapter_of is not None:
            return error_response(
                409,
                f"{name!r} is a LoRA adapter of {entry.adapter_of!r}: it has no replicas of "
                f"its own and runs in its base's; ask about {entry.adapter_of!r} instead",
                code="model_is_adapter",
                param="name",
            )
        return name

    async def placement(request: Request) -> Response:
        name = own_model(request.path_params["name"])
        if isinstance(name, Response):
            return name
        return json_response(control.explain(name))

    async def dry_run(request: Request) -> Response:
        model = parse_model(await _read_body(request), source="store")
        if model.adapter_of is not None:
            return error_response(
                400,
                f"{model.name!r} is a LoRA adapter of {model.adapter_of!r}: it is placed "
                f"nowhere itself but loaded into {model.adapter_of!r}'s replicas; dry-run "
                "the base model instead",
                code="model_is_adapter",
                param="adapter_of",
            )
        # Pinned as an add would pin it, so the dry run knows what each node must
        # download and whether its disk can take it; an unreachable hub only leaves
        # that unknown.
        with contextlib.suppress(HubUnavailable):
            model = await catalog.pinned(model)
        return json_response(control.dry_run(model))

    async def activate(request: Request) -> Response:
        name = own_model(request.path_params["name"])
        if isinstance(name, Response):
            return name
        return json_response(await control.activate(name))

    async def pull(request: Request) -> Response:
        name = catalog.resolve(request.path_params["name"])
        if name is None:
            return _unknown(request.path_params["name"])
        if pulls is None:
            return error_response(
                409,
                "this server has no control plane (router-only): there are no nodes to pull "
                "weights onto",
                code="no_control_plane",
            )
        # Starlette keeps the body: `_read_body` reads it again without the network.
        body = await _read_body(request) if (await request.body()).strip() else {}
        count, nodes = _pull_body(body)
        try:
            return json_response(await pulls.pull(name, count=count, nodes=nodes), status=202)
        except PullRefused as exc:
            return error_response(exc.status, exc.message, code=exc.code, param=exc.param)

    def rollout_view(model: CatalogModel) -> dict[str, object]:
        status = control.status(model.name)
        replicas = status.get("replicas")
        rows = replicas if isinstance(replicas, list) else []
        previous = catalog.previous(model.name) if model.source == "store" else None
        return {
            "model": model.name,
            "rollout": status.get("rollout"),
            "desired_replicas": status.get("desired_replicas"),
            "ready_replicas": status.get("ready_replicas"),
            "new_replicas": [r for r in rows if r.get("spec") == "current"],
            "old_replicas": [r for r in rows if r.get("spec") == "old"],
            "max_surge": model.max_surge,
            "max_unavailable": model.max_unavailable,
            # The canary beside the model's own spec (None without one), with its replicas.
            "canary": None
            if model.canary is None
            else {
                "name": model.canary.name,
                "weight": model.canary.weight,
                "stable": model.canary.stable_name,
                "stable_weight": model.canary.stable_weight,
                "replicas": [r for r in rows if r.get("version") == model.canary.name],
                # Why the canary is stopped (a replica of it failed), or None.
                "halted": status.get("canary_halt"),
            },
            # What `undo` would bring back (weights and profiles), or None.
            "previous": None
            if previous is None
            else {
                "weights": previous.weights,
                "profiles": model_to_dict(previous)["profiles"],
            },
        }

    async def rollout_status(request: Request) -> Response:
        model = catalog.get(request.path_params["name"])
        if model is None:
            return _unknown(request.path_params["name"])
        return json_response(rollout_view(model))

    async def rollout_undo(request: Request) -> Response:
        model = await catalog.undo(request.path_params["name"])
        return json_response(rollout_view(model))

    async def rollout_promote(request: Request) -> Response:
        model = await catalog.promote(request.path_params["name"])
        return json_response(rollout_view(model))

    async def rollout_abort(request: Request) -> Response:
        model = await catalog.abort(request.path_params["name"])
        return json_response(rollout_view(model))

    def route(path: str, handler: _Handler, method: str) -> Route:
        async def endpoint(request: Request) -> Response:
            return await guarded(request, handler)

        return Route(path, endpoint, methods=[method])

    one = "/admin/api/models/{name:path}"
    return [
        route("/admin/api/models", list_models, "GET"),
        route("/admin/api/models", add_model, "POST"),
        route("/admin/api/placement/dry-run", dry_run, "POST"),
        # Before the plain model routes: a name may contain '/', so these suffixes
        # must be tried first.
        route(one + "/placement", placement, "GET"),
        route(one + "/activate", activate, "POST"),
        route(one + "/pull", pull, "POST"),
        route(one + "/rollout/undo", rollout_undo, "POST"),
        route(one + "/rollout/promote", rollout_promote, "POST"),
        route(one + "/rollout/abort", rollout_abort, "POST"),
        route(one + "/rollout", rollout_status, "GET"),
        route(one, show_model, "GET"),
        route(one, replace_model, "PUT"),
        route(one, remove_model, "DELETE"),
    ]


class _Handler(Protocol):
    async def __call__(self, request: Request, /) -> Response: ...
