"""When a model's replicas are full: the saturation detector the queue asks.

A replica is saturated when its requests in flight (this router's count)
reach its `max_in_flight`: the static endpoint's own, else the catalog
model's, else `router.max_in_flight`. With none of them set a replica has no
limit, and when engine load signals are handed in (`load`), a replica is also
saturated while its engine reports more waiting requests than `max_waiting` or
a KV-cache use over `max_kv_cache`. A model is saturated when every one of its
available replicas is; a model with no available replica is never saturated
here (that is the activation's and the health checks' business).

Fail open: a replica with no limit and no load report has room, always, so
nothing is held back on what is not known.

Not guaranteed: in-flight counts are this router's own; several routers in
front of one replica each fill it up to its limit. A replica that serves
several models is counted once per model's reservations, so for a moment it
can take a request over its limit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from llmgw.router.endpoints import Endpoint, EndpointPool


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What an engine last reported about its own queue (None: not reported)."""

    waiting: int | None = None
    kv_cache: float | None = None


class LoadSource(Protocol):
    """Engine-reported load per endpoint id; None when nothing is known of it."""

    def load(self, endpoint_id: str) -> EngineLoad | None: ...


class Saturation:
    """Decides whether a model has room for one more request now."""

    def __init__(
        self,
        *,
        pool: EndpointPool,
        clock: Callable[[], float],
        default_limit: int | None,
        endpoint_limits: Mapping[str, int] | None = None,
        model_limit: Callable[[str], int | None] | None = None,
        load: LoadSource | None = None,
        max_waiting: int | None = None,
        max_kv_cache: float | None = None,
    ) -> None:
        self._pool = pool
        self._clock = clock
        self._default = default_limit
        self._endpoint_limits = dict(endpoint_limits or {})
        self._model_limit = model_limit
        self._load = load
        self._max_waiting = max_waiting
        self._max_kv = max_kv_cache

    @property
    def may_saturate(self) -> bool:
        """False when nothing can ever be saturated (no limit, no load signals)."""
        return bool(
            self._default is not None
            or self._endpoint_limits
            or self._model_limit is not None
            or self._load is not None
        )

    def limit(self, endpoint: Endpoint, model: str) -> int | None:
        """`endpoint`'s `max_in_flight` for `model`'s requests (None: no limit)."""
        own = self._endpoint_limits.get(endpoint.id)
        if own is not None:
            return own
        if self._model_limit is not None:
            by_model = self._model_limit(model)
            if by_model is not None:
                return by_model
        return self._default

    def _engine_full(self, endpoint: Endpoint) -> bool:
        if self._load is None:
            return False
        report = self._load.load(endpoint.id)
        if report is None:
            return False
        waiting, kv = report.waiting, report.kv_cache
        if self._max_waiting is not None and waiting is not None and waiting > self._max_waiting:
            return True
        return self._max_kv is not None and kv is not None and kv > self._max_kv

    def _room_of(self, endpoint: Endpoint, model: str) -> float:
        if self._engine_full(endpoint):
            return 0.0
        limit = self.limit(endpoint, model)
        if limit is None:
            return math.inf
        return float(max(0, limit - endpoint.in_flight))

    def room(self, model: str, reserved: int = 0) -> float:
        """Requests `model` can take now, less `reserved` (granted, not yet sent);
        `inf` when any available replica has no limit or the model has no
        available replica (fail open)."""
        endpoints = self._pool.by_model.get(model)
        if not endpoints:
            return math.inf
        now = self._clock()
        total = 0.0
        seen = False
        for endpoint in endpoints:
            if not endpoint.available(now):
                continue
            seen = True
            total += self._room_of(endpoint, model)
            if total == math.inf:
                return math.inf
        if not seen:
            return math.inf
        return total - reserved

    def room_and_places(self, model: str, reserved: int = 0) -> tuple[float, float]:
        """`room(model, reserved)` and the model's places: the sum of its available
        replicas' limits (`inf` as in `room`), in one pass."""
        endpoints = self._pool.by_model.get(model)
        if not endpoints:
            return math.inf, math.inf
        now = self._clock()
        room = places = 0.0
        seen = False
        for endpoint in endpoints:
            if not endpoint.available(now):
                continue
            seen = True
            limit = self.limit(endpoint, model)
            full = self._engine_full(endpoint)
            if limit is None:
                places = math.inf
                room += 0.0 if full else math.inf
            else:
                places += limit
                room += 0.0 if full else max(0, limit - endpoint.in_flight)
        if not seen:
            return math.inf, math.inf
        return room - reserved, places

    def with_room(self, model: str, endpoints: list[Endpoint]) -> list[Endpoint]:
        """The endpoints that are not saturated (all of them when none has room,
        so that a request let through still has somewhere to go)."""
        if not self.may_saturate:
            return endpoints
        roomy = [e for e in endpoints if self._room_of(e, model) > 0]
        return roomy if roomy else endpoints

    def models(self) -> list[str]:
        """Every model the pool serves."""
        return self._pool.models()

    def describe(self, model: str) -> dict[str, object]:
        """The model's saturation as the admin API and status show it."""
        endpoints = self._pool.by_model.get(model) or []
        now = self._clock()
        return {
            "saturated": self.room(model) <= 0,
            "replicas": [
                {
                    "id": e.id,
                    "in_flight": e.in_flight,
                    "max_in_flight": self.limit(e, model),
                    "engine_full": self._engine_full(e),
                    "available": e.available(now),
                }
                for e in endpoints
            ],
        }
