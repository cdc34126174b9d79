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

from llmgw.control.reachability import ReachabilityGate, ReplicaUnreachable
from llmgw.control.reconciler.controller import Controller
from llmgw.control.reconciler.errors import ActivationRefused
from llmgw.control.reconciler.state import ReadyEndpoint
from llmgw.router.endpoints import EndpointSink, EndpointSpec, publish_static
from llmgw.router.errors import ModelUnavailable


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
        replicas = [EndpointSpec(e.id, e.url, tuple(names)) for e in endpoints]
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


class ControllerActivator:
    """The router's `Activator`, backed by the controller.

    With a `gate`, activation also waits until this server's router has one of
    the model's replicas (each is checked from here first), and a model whose
    Ready replicas this server cannot reach is refused, naming their URLs.
    """

    def __init__(self, *, controller: Controller, gate: ReachabilityGate | None = None) -> None:
        self._controller = controller
        self._gate = gate

    def knows(self, model: str) -> bool:
        return self._controller.knows(model)

    async def activate(self, model: str) -> None:
        try:
            await self._controller.activate(model)
        except ActivationRefused as exc:
            raise ModelUnavailable(
                exc.message, code=exc.code, retry_after=exc.retry_after
            ) from None
        if self._gate is None:
            return
        try:
            await self._gate.wait_routable(model)
        except ReplicaUnreachable as exc:
            raise ModelUnavailable(
                exc.message, code="replica_unreachable", retry_after=math.ceil(exc.retry_after)
            ) from None

    def request_started(self, model: str) -> None:
        self._controller.request_started(model)

    def request_finished(self, model: str) -> None:
        self._controller.request_finished(model)
