"""The admin listener's app (loopback by default) and the metrics-only app.

Serves `/healthz` (the process is up), `/readyz` (at least one endpoint can
take traffic, or a catalog model can be started by a request), `/metrics` and
`GET /admin/api/endpoints` and `GET /admin/api/queue` (each model's waiting
requests by class and whether it is saturated). Every error is an
OpenAI-shaped body, like on the API listener.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from llmgw.router.endpoints import EndpointPool
from llmgw.router.errors import error_body

_CODES = {404: "not_found", 405: "method_not_allowed"}


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        message = f"{request.method} {request.url.path} is not allowed"
    elif exc.status_code == 404:
        message = f"no route {request.method} {request.url.path} on the admin listener"
    else:
        message = str(exc.detail)
    return Response(
        error_body(message, "invalid_request_error", _CODES.get(exc.status_code, "error")),
        status_code=exc.status_code,
        media_type="application/json",
        headers=exc.headers,
    )


def _metrics_route(registry: CollectorRegistry) -> Route:
    async def metrics(_: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return Route("/metrics", metrics, methods=["GET"])


def create_admin_app(
    *,
    pool: EndpointPool,
    registry: CollectorRegistry,
    clock: Callable[[], float],
    extra_routes: Sequence[BaseRoute] = (),
    on_demand: Callable[[], Sequence[str]] = tuple,
    queue: Callable[[], list[dict[str, object]]] | None = None,
) -> Starlette:
    """`on_demand` lists the models a request may start (the catalog's); with
    any of them the server is ready even before an endpoint is."""

    async def healthz(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(_: Request) -> Response:
        now = clock()
        ready = [ep.id for ep in pool.endpoints() if ep.available(now)]
        startable = list(on_demand())
        if ready or startable:
            return JSONResponse(
                {"status": "ready", "healthy_endpoints": ready, "on_demand_models": startable}
            )
        return Response(
            error_body(
                "no endpoint can take traffic yet (none passing its health probe, "
                "and no catalog model a request may start)",
                "service_unavailable",
                "not_ready",
            ),
            status_code=503,
            media_type="application/json",
        )

    async def endpoints(_: Request) -> Response:
        now = clock()
        return JSONResponse({"endpoints": [ep.describe(now) for ep in pool.endpoints()]})

    async def queue_state(_: Request) -> Response:
        return JSONResponse({"models": queue() if queue is not None else []})

    return Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/admin/api/endpoints", endpoints, methods=["GET"]),
            Route("/admin/api/queue", queue_state, methods=["GET"]),
            _metrics_route(registry),
            *extra_routes,
        ],
        exception_handlers={HTTPException: _http_error},
    )


def create_metrics_app(*, registry: CollectorRegistry) -> Starlette:
    """`/metrics` only: safe to expose to Prometheus."""
    return Starlette(
        routes=[_metrics_route(registry)], exception_handlers={HTTPException: _http_error}
    )
