"""Endpoints as the router sees them, and the pool the balancer picks from.

An `Endpoint` keeps the health state that both the active prober and the
request path update: the probe's verdict, and passive ejection after
consecutive request failures with a backed-off re-admission time. Endpoint
objects are kept across updates (matched by id), so in-flight counts and
ejections survive a change of the endpoint set.

The pool also keeps, by endpoint id, the attempts waiting for an engine's
first byte, so that `abandon` (the control plane: "this node stopped
answering") ends them at once and their requests go elsewhere, whether or not
the endpoint is still in the pool.

Not guaranteed: health is a hint, not a promise; a healthy endpoint may still
fail the next request, which is why the proxy retries.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from llmgw.metrics import EndpointSnapshot

log = logging.getLogger("llmgw.router.endpoints")


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    """What a source of endpoints says about one of them.

    `engine` names the kind of engine ("" when the source does not say) and
    `routes` pairs each client route it serves with the engine's path for it
    (None: every route, each under its own path; the engine answers for itself).
    """

    id: str
    url: str
    models: tuple[str, ...]
    health_path: str = "/v1/models"
    engine: str = ""
    routes: tuple[tuple[str, str], ...] | None = None
    # The client APIs (besides chat completions) the engine serves natively:
    # "messages", "responses". Requests of the others are translated.
    native_apis: frozenset[str] = frozenset()
    # Whether its engine writes a thought as <think>...</think> (its reasoning parser's
    # markup), so a stream broken mid-thought can be continued on it.
    thoughts: bool = False
    # Whether its engine writes a tool call as <tool_call>{json}</tool_call> (its tool
    # parser's markup), so a stream broken mid-call can be continued on it.
    tool_calls: bool = False
    # A model with a canary: the version this replica runs, and the version's weight
    # (its share of new conversations against the other's); "" and 0 otherwise.
    version: str = ""
    weight: int = 0


@dataclass(frozen=True, slots=True)
class EjectionPolicy:
    failure_threshold: int
    base: float
    maximum: float


class Endpoint:
    """One engine replica's URL with its live load and health."""

    __slots__ = (
        "_clock",
        "_policy",
        "consecutive_failures",
        "ejected_until",
        "ejections",
        "engine",
        "health_path",
        "id",
        "in_flight",
        "last_error",
        "models",
        "native_apis",
        "probe_ok",
        "routes",
        "stream_usage",
        "thoughts",
        "tool_calls",
        "url",
        "version",
        "weight",
    )

    def __init__(
        self, spec: EndpointSpec, *, policy: EjectionPolicy, clock: Callable[[], float]
    ) -> None:
        self.id = spec.id
        self.url = spec.url
        self.models = spec.models
        self.health_path = spec.health_path
        self.engine = spec.engine
        self.routes = _routes(spec)
        self.native_apis = spec.native_apis
        self.thoughts = spec.thoughts
        self.tool_calls = spec.tool_calls
        self.version = spec.version
        self.weight = spec.weight
        self._policy = policy
        self._clock = clock
        self.in_flight = 0
        # Optimistic until the first probe: a request that fails is retried elsewhere.
        self.probe_ok = True
        self.consecutive_failures = 0
        self.ejections = 0
        self.ejected_until = 0.0
        self.last_error: str | None = None
        # Whether the engine sends a usage chunk in streams; None until a stream shows it.
        self.stream_usage: bool | None = None

    def available(self, now: float) -> bool:
        return self.probe_ok and now >= self.ejected_until

    def path_for(self, route: str) -> str | None:
        """The engine's path for client route `route`; None when it does not serve it."""
        if self.routes is None:
            return route
        return self.routes.get(route)

    def record_success(self) -> None:
        self.consecutive_failures = 0
        self.ejections = 0

    def record_failure(self, reason: str) -> None:
        """Count a failed request; eject after the threshold, for twice as long each time.

        `reason` becomes `last_error`, which API clients may read in a 503: it names
        the endpoint by id, never by address (the admin API shows `url` beside it)."""
        self.last_error = reason
        self.consecutive_failures += 1
        if self.consecutive_failures < self._policy.failure_threshold:
            return
        duration = min(self._policy.base * (2**self.ejections), self._policy.maximum)
        self.ejections += 1
        self.consecutive_failures = 0
        self.ejected_until = self._clock() + duration
        log.warning(
            "endpoint %s at %s ejected for %.1fs after %d consecutive failures (last: %s)",
            self.id,
            self.url,
            duration,
            self._policy.failure_threshold,
            reason,
        )

    def update(self, spec: EndpointSpec) -> None:
        self.url = spec.url
        self.models = spec.models
        self.health_path = spec.health_path
        self.engine = spec.engine
        self.routes = _routes(spec)
        self.native_apis = spec.native_apis
        self.thoughts = spec.thoughts
        self.tool_calls = spec.tool_calls
        self.version = spec.version
        self.weight = spec.weight

    def describe(self, now: float) -> dict[str, object]:
        """The endpoint as the admin API shows it."""
        return {
            "id": self.id,
            "url": self.url,
            **({"version": self.version} if self.version else {}),
            "models": list(self.models),
            "engine": self.engine or None,
            "routes": sorted(self.routes) if self.routes is not None else None,
            "native_apis": sorted(self.native_apis),
            "healthy": self.available(now),
            "probe_ok": self.probe_ok,
            "ejected": now < self.ejected_until,
            "ejected_for_seconds": round(max(0.0, self.ejected_until - now), 3),
            "consecutive_failures": self.consecutive_failures,
            "in_flight": self.in_flight,
            "last_error": self.last_error,
        }


def _routes(spec: EndpointSpec) -> dict[str, str] | None:
    return dict(spec.routes) if spec.routes is not None else None


class FirstByteWait:
    """One attempt waiting for its engine's first byte, under the deadline `timeout`."""

    __slots__ = ("abandoned", "endpoint_id", "timeout")

    def __init__(self, endpoint_id: str, timeout: asyncio.Timeout) -> None:
        self.endpoint_id = endpoint_id
        self.timeout = timeout
        self.abandoned = False

    def abandon(self) -> bool:
        """End the wait now: its deadline fires, and `abandoned` says why. A deadline
        that already fired is left to end the attempt as it does (returns False)."""
        if self.abandoned or self.timeout.expired():
            return False
        self.abandoned = True
        self.timeout.reschedule(0)
        return True


class EndpointSink(Protocol):
    """What a source of endpoints (static config, the control plane) talks to."""

    def set_model_endpoints(self, model: str, specs: Iterable[EndpointSpec]) -> None:
        """Replace the set of Ready endpoints serving `model` (empty: none right now)."""
        ...

    def remove_model(self, model: str) -> None:
        """`model` is no longer served at all."""
        ...

    def set_alias(self, alias: str, model: str | None) -> None:
        """Requests for `alias` go to engines as `model` (None: `alias` is no alias)."""
        ...


class EndpointPool:
    """The endpoints of every model; implements `EndpointSink`."""

    def __init__(
        self,
        *,
        policy: EjectionPolicy,
        clock: Callable[[], float],
        on_forget: Callable[[Collection[str]], None] | None = None,
    ) -> None:
        self._policy = policy
        self._clock = clock
        # Told the ids still known whenever endpoints are forgotten (metrics drop the rest).
        self._on_forget = on_forget
        self._by_id: dict[str, Endpoint] = {}
        self._by_model: dict[str, list[Endpoint]] = {}
        self._aliases: dict[str, str] = {}
        self._waits: dict[str, set[FirstByteWait]] = {}

    def wait_first_byte(self, endpoint_id: str, timeout: asyncio.Timeout) -> FirstByteWait:
        """Note an attempt waiting for `endpoint_id`'s first byte; `first_byte_done` ends it."""
        wait = FirstByteWait(endpoint_id, timeout)
        self._waits.setdefault(endpoint_id, set()).add(wait)
        return wait

    def first_byte_done(self, wait: FirstByteWait) -> None:
        waits = self._waits.get(wait.endpoint_id)
        if waits is not None:
            waits.discard(wait)
            if not waits:
                del self._waits[wait.endpoint_id]

    def abandon(self, endpoint_ids: Iterable[str]) -> int:
        """The engines behind `endpoint_ids` may be gone (their node stopped answering):
        attempts still waiting for their first byte end now. Returns how many."""
        ids = list(endpoint_ids)
        count = 0
        for endpoint_id in ids:
            for wait in tuple(self._waits.get(endpoint_id, ())):
                count += wait.abandon()
        if count:
            log.warning(
                "%d request%s waiting on %s go elsewhere: the node stopped answering",
                count,
                "" if count == 1 else "s",
                ", ".join(ids),
            )
        return count

    @property
    def by_model(self) -> Mapping[str, list[Endpoint]]:
        return self._by_model

    @property
    def aliases(self) -> Mapping[str, str]:
        """Alias -> the model name engines serve it under."""
        return self._aliases

    def set_alias(self, alias: str, model: str | None) -> None:
        if model is None:
            self._aliases.pop(alias, None)
        else:
            self._aliases[alias] = model

    def endpoints(self) -> list[Endpoint]:
        return list(self._by_id.values())

    def models(self) -> list[str]:
        return sorted(self._by_model)

    def set_model_endpoints(self, model: str, specs: Iterable[EndpointSpec]) -> None:
        chosen: list[Endpoint] = []
        for spec in specs:
            existing = self._by_id.get(spec.id)
            if existing is None:
                existing = self._by_id[spec.id] = Endpoint(
                    spec, policy=self._policy, clock=self._clock
                )
            else:
                existing.update(spec)
            chosen.append(existing)
        self._by_model[model] = chosen
        self._forget_unused()

    def remove_model(self, model: str) -> None:
        self._by_model.pop(model, None)
        self._forget_unused()

    def _forget_unused(self) -> None:
        used = {ep.id for eps in self._by_model.values() for ep in eps}
        unused = [i for i in self._by_id if i not in used]
        for endpoint_id in unused:
            del self._by_id[endpoint_id]
        if unused and self._on_forget is not None:
            self._on_forget(used)

    def snapshots(self) -> list[EndpointSnapshot]:
        now = self._clock()
        return [
            EndpointSnapshot(ep.id, ep.in_flight, ep.available(now), tuple(ep.models))
            for ep in self._by_id.values()
        ]


def publish_static(sink: EndpointSink, specs: Iterable[EndpointSpec]) -> None:
    """Router-only mode: hand a fixed list of endpoints to the sink, grouped by model."""
    by_model: dict[str, list[EndpointSpec]] = {}
    for spec in specs:
        for model in spec.models:
            by_model.setdefault(model, []).append(spec)
    for model, model_specs in by_model.items():
        sink.set_model_endpoints(model, model_specs)
