"""Adapters from the control plane to the dashboard's sources (`llmgw.web.DashboardSources`).

The dashboard may not import the control plane (they are siblings in the
layers), so the composition root hands it callables. The reads return exactly
what the admin API's routes return (the same view functions); the actions call
the same services and turn the control plane's exceptions into the
dashboard's `ActionError`, with the status the admin API gives for each.

Not guaranteed: that these stay in step with `llmgw.control.adminapi` by
themselves; the admin API's route bodies are not shared code, so a change
there (a new field in a model's view) must be made here too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from llmgw.auth import KeyService
from llmgw.control.adminapi import node_view
from llmgw.control.catalog import (
    Catalog,
    CatalogError,
    CatalogModel,
    InvalidModel,
    UnknownModel,
    model_to_dict,
    parse_model,
)
from llmgw.control.inventory import Inventory, UnknownNode
from llmgw.control.leadership.fleet import FleetView
from llmgw.control.leadership.views import LeaderSource, leader_view, servers_view
from llmgw.control.reconciler.views import ModelControlService
from llmgw.store import ControlServer, StoreError, StoreUnavailable, TeamRepository, UsageRepository
from llmgw.web import ActionError, DashboardSources, HistorySource
from llmgw.web.sources import TeamPageSources

Json = dict[str, Any]


def _catalog_error(exc: CatalogError) -> ActionError:
    if isinstance(exc, InvalidModel):
        return ActionError(exc.message, status=400)
    if isinstance(exc, UnknownModel):
        return ActionError(exc.message, status=404)
    # ModelExists, NameTaken, ReadOnlyModel, NoStore: the admin API's 409s.
    return ActionError(exc.message, status=409)


def _store_error(exc: StoreError) -> ActionError:
    status = 503 if isinstance(exc, StoreUnavailable) else 500
    return ActionError(f"the store refused the change: {exc}", status=status)


class _Models:
    """The catalog routes' reads and writes, as the dashboard needs them."""

    def __init__(
        self,
        *,
        catalog: Catalog,
        control: ModelControlService,
        pulls: Callable[[str], Json] | None = None,
    ) -> None:
        self._catalog = catalog
        self._control = control
        self._pulls = pulls

    def view(self, model: CatalogModel, status: Json | None = None) -> Json:
        # As `model_routes` shows a model: its spec, where it lives, its live state, and
        # the adapters whose base it is. An adapter has no replicas, so no state.
        if model.adapter_of is not None:
            return {**model_to_dict(model), "source": model.source}
        if status is None:
            status = self._control.status(model.name)
        return {
            **model_to_dict(model),
            "source": model.source,
            "status": status,
            "adapters": [
                {**model_to_dict(a), "source": a.source} for a in self._catalog.adapters(model.name)
            ],
            **(self._pulls(model.name) if self._pulls is not None else {}),
        }

    def listing(self) -> Json:
        statuses = self._control.statuses()
        return {
            "models": [self.view(m, statuses.get(m.name)) for m in self._catalog.models()],
            "skipped": [{"name": n, "reason": r} for n, r in self._catalog.skipped().items()],
        }

    def one(self, name: str) -> Json | None:
        model = self._catalog.get(name)
        return None if model is None else self.view(model)

    def placement(self, name: str) -> Json:
        return self._control.explain(self._catalog.resolve(name) or name)

    async def add(self, spec: object) -> Json:
        try:
            return self.view(await self._catalog.add(parse_model(spec, source="store")))
        except CatalogError as exc:
            raise _catalog_error(exc) from exc
        except StoreError as exc:
            raise _store_error(exc) from exc

    async def replace(self, name: str, spec: object) -> Json:
        canonical = self._catalog.resolve(name) or name
        if isinstance(spec, dict):
            given = spec.setdefault("name", canonical)
            if given not in (name, canonical):
                raise ActionError(
                    f"the model names {given!r} but this is {canonical!r}'s page; a model "
                    "cannot be renamed (add the new name, then remove the old one)"
                )
            spec["name"] = canonical
        try:
            return self.view(await self._catalog.replace(name, parse_model(spec, source="store")))
        except CatalogError as exc:
            raise _catalog_error(exc) from exc
        except StoreError as exc:
            raise _store_error(exc) from exc

    async def remove(self, name: str) -> Json:
        try:
            try:
                model = await self._catalog.remove(name)
            except UnknownModel:
                if name not in self._catalog.skipped():
                    raise
                reason = await self._catalog.discard(name)
                return {"name": name, "discarded": True, "reason": reason}
        except CatalogError as exc:
            raise _catalog_error(exc) from exc
        except StoreError as exc:
            raise _store_error(exc) from exc
        return {**model_to_dict(model), "source": model.source}

    async def activate(self, name: str) -> Json:
        canonical = self._catalog.resolve(name)
        if canonical is None:
            raise _catalog_error(UnknownModel(name))
        return await self._control.activate(canonical)


def dashboard_sources(
    *,
    inventory: Inventory,
    catalog: Catalog,
    model_control: ModelControlService,
    keys: KeyService,
    usage: UsageRepository,
    leadership: LeaderSource,
    servers: Callable[[], list[ControlServer]],
    lease_ttl: float,
    history: HistorySource,
    wall_clock: Callable[[], datetime],
    agent_listener: Json | None = None,
    fleet: FleetView | None = None,
    queue: Callable[[str], Json | None] | None = None,
    teams: TeamRepository | None = None,
    team_pages: TeamPageSources | None = None,
    pulls: Callable[[str], Json] | None = None,
) -> DashboardSources:
    """The dashboard's sources over the server's real objects. With `fleet`, a
    standby shows the nodes as the leader last wrote them, and refuses to drain. With
    `pulls`, a model's view has its last pull and where `prefetch` keeps its weights."""
    models = _Models(catalog=catalog, control=model_control, pulls=pulls)

    def nodes() -> list[Json]:
        if fleet is not None and not fleet.leading():
            return fleet.latest() or []
        return [node_view(n, inventory.heartbeat_age(n)) for n in inventory.nodes()]

    def node_briefs() -> list[Json]:
        if fleet is not None and not fleet.leading():
            return fleet.latest() or []
        return [
            {
                "id": n.id,
                "hostname": n.hostname,
                "state": n.state,
                "draining": n.draining,
                "labels": n.labels,
                "fabric": n.fabric,
            }
            for n in inventory.briefs()
        ]

    def node_views(ids: Sequence[str]) -> list[Json]:
        if fleet is not None and not fleet.leading():
            wanted = set(ids)
            return [v for v in fleet.latest() or [] if v.get("id") in wanted]
        views = []
        for node_id in ids:
            try:
                node = inventory.node(node_id)
            except UnknownNode:
                continue  # gone since the briefs were read
            views.append(node_view(node, inventory.heartbeat_age(node)))
        return views

    def set_draining(node_id: str, draining: bool) -> Json:
        if fleet is not None and not fleet.leading():
            leader = fleet.leader() or "the leader (none is known right now)"
            raise ActionError(
                f"this server is a standby; only {leader} talks to agents: open its "
                f"dashboard to {'drain' if draining else 'undrain'} node {node_id}",
                status=409,
            )
        try:
            node = inventory.set_draining(node_id, draining)
        except UnknownNode as exc:
            raise ActionError(str(exc), status=404) from exc
        return node_view(node, inventory.heartbeat_age(node))

    return DashboardSources(
        nodes=nodes,
        node_briefs=node_briefs,
        node_views=node_views,
        models=models.listing,
        model=models.one,
        placement=models.placement,
        events=model_control.events,
        leader=lambda: leader_view(leadership.info()),
        servers=lambda: servers_view(servers(), leadership.info(), wall_clock(), lease_ttl),
        set_draining=set_draining,
        add_model=models.add,
        replace_model=models.replace,
        remove_model=models.remove,
        activate=models.activate,
        keys=keys,
        usage=usage,
        history=history,
        wall_clock=wall_clock,
        agent_listener=agent_listener or {"mode": "off", "text": ""},
        queue=queue or (lambda name: None),
        teams=teams,
        team_pages=team_pages,
    )
