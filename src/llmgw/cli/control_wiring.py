"""Adapters between the control plane and the router, built by the composition root.

The router and the control plane never import each other (import-linter keeps
it so): the router declares `Activator` and `EndpointSink`, the controller
declares `EndpointPublisher` and raises its own `ActivationRefused`. These two
small classes translate between them.

Not guaranteed: static endpoints and catalog replicas of one model name are
balanced as one set; the operator decides whether that makes sense.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from llmgw.config import EndpointConfig
from llmgw.control.reachability import ReachabilityGate, ReplicaUnreachable
from llmgw.control.reconciler.controller import Controller
from llmgw.control.reconciler.errors import ActivationRefused, AdapterRefused
from llmgw.control.reconciler.state import ReadyEndpoint
from llmgw.engines import (
    UnknownEngine,
    continues_thoughts,
    continues_tool_calls,
    native_apis_of,
    routes_of,
)
from llmgw.router.endpoints import EndpointSink, EndpointSpec, publish_static
from llmgw.router.errors import AdapterNotLoadable, ModelUnavailable


class PoolPublisher:
    """Publishes Ready replicas into the router's pool, next to any static endpoints."""

    def __init__(self, *, sink: EndpointSink, static: Iterable[EndpointSpec]) -> None:
        self._sink = sink
        self._static_specs = list(static)
        self._static: dict[str, list[EndpointSpec]] = {}
        for spec in self._static_specs:
            for model in spec.models:
                self._static.setdefault(model, []).append(spec)

    def publish_static(self) -> None:
        publish_static(self._sink, self._static_specs)

    def publish(self, names: Sequence[str], endpoints: Sequence[ReadyEndpoint]) -> None:
        replicas = [replica_spec(e, tuple(names)) for e in endpoints]
        # The first name is the model's own: engines serve it under that one.
        for alias in names[1:]:
            self._sink.set_alias(alias, names[0])
        for name in names:
            self._sink.set_model_endpoints(name, [*self._static.get(name, ()), *replicas])

    def withdraw(self, names: Sequence[str]) -> None:
        for name in names:
            self._sink.set_alias(name, None)
            static = self._static.get(name)
            if static:
                self._sink.set_model_endpoints(name, static)
            else:
                self._sink.remove_model(name)


def replica_spec(endpoint: ReadyEndpoint, names: tuple[str, ...]) -> EndpointSpec:
    """A Ready replica as the router sees it, with the routes its engine serves
    (every route, passed as it comes, when its engine is not known) and the client
    APIs it serves natively (none when its engine is not known: they are translated)."""
    routes: tuple[tuple[str, str], ...] | None = None
    native: frozenset[str] = frozenset()
    if endpoint.engine:
        try:
            routes = tuple(routes_of(endpoint.engine).items())
            native = native_apis_of(endpoint.engine, endpoint.engine_args)
        except UnknownEngine:
            routes = None
    return EndpointSpec(
        endpoint.id,
        endpoint.url,
        # One replica serves its base and the adapters loaded in it; the base first.
        (*endpoint.base_names, *names) if endpoint.base_names else names,
        engine=endpoint.engine,
        routes=routes,
        native_apis=native,
        thoughts=continues_thoughts(endpoint.engine, endpoint.engine_args),
        tool_calls=continues_tool_calls(endpoint.engine, endpoint.engine_args),
        version=endpoint.version,
        weight=endpoint.weight,
    )


def static_spec(endpoint: EndpointConfig) -> EndpointSpec:
    """A static endpoint as the router sees it: its engine's routes, narrowed to the
    routes it declares; a declared route its engine is not known to serve goes under
    its own path (the operator may run a newer engine than llmgw knows)."""
    engine_routes = routes_of(endpoint.engine) if endpoint.engine else None
    routes: tuple[tuple[str, str], ...] | None
    if endpoint.routes is not None:
        known = engine_routes or {}
        routes = tuple((r, known.get(r, r)) for r in endpoint.routes)
    else:
        routes = tuple(engine_routes.items()) if engine_routes is not None else None
    return EndpointSpec(
        endpoint.id,
        endpoint.url,
        tuple(endpoint.models),
        endpoint.health_path,
        engine=endpoint.engine or "",
        routes=routes,
        native_apis=endpoint.apis.native(),
        thoughts=continues_thoughts(endpoint.engine or "", endpoint.parser_args()),
        tool_calls=continues_tool_calls(endpoint.engine or "", endpoint.parser_args()),
    )


class ControllerActivator:
    """The router's `Activator`, backed by the controller.

    With a `gate`, activation also waits until this server's router has one of
    the model's replicas (each is checked from here first), and a model whose
    Ready replicas this server cannot reach is refused, naming the replicas by id
    (their URLs go to the server log, the admin API and the dashboard, never to
    API clients).
    """

    def __init__(self, *, controller: Controller, gate: ReachabilityGate | None = None) -> None:
        self._controller = controller
        self._gate = gate

    def knows(self, model: str) -> bool:
        return self._controller.knows(model)

    def engines(self, model: str) -> tuple[str, ...]:
        return self._controller.engines(model)

    async def activate(self, model: str) -> None:
        try:
            await self._controller.activate(model)
        except AdapterRefused as exc:
            # The engine's words about the adapter's files are the client's to fix.
            raise AdapterNotLoadable(
                exc.public, code=exc.code, retry_after=exc.retry_after
            ) from None
        except ActivationRefused as exc:
            # API clients get the public message: no engine output, no addresses.
            raise ModelUnavailable(exc.public, code=exc.code, retry_after=exc.retry_after) from None
        if self._gate is None:
            return
        try:
            await self._gate.wait_routable(model)
        except ReplicaUnreachable as exc:
            raise ModelUnavailable(
                exc.public, code="replica_unreachable", retry_after=math.ceil(exc.retry_after)
            ) from None

    def activity(self, model: str) -> str:
        return self._controller.activity(model)

    def request_started(self, model: str) -> None:
        self._controller.request_started(model)

    def request_finished(self, model: str) -> None:
        self._controller.request_finished(model)

    def saturated(self, model: str) -> None:
        self._controller.saturated(model)
