"""Admin API for the control plane's recent decisions: `GET /admin/api/events`.

Placement decisions (start, stop), activations, failures, readiness, models
that cannot be placed and node transitions (kind "node": registered,
unreachable, lost, ready again, draining) and hub downloads (kind "download": a
download's start, each quarter, its end with duration and size), newest first, as the reconciler
recorded them. `?model=NAME` keeps one model's events, `?node=ID` one node's;
`?limit=N` (default 100) caps the list.

Not guaranteed: history. The reconciler keeps the last few hundred events in
memory; they are gone after a restart.
"""

from __future__ import annotations

from typing import Protocol

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

DEFAULT_LIMIT = 100


class EventSource(Protocol):
    def events(self) -> list[dict[str, object]]: ...


def _error(message: str, param: str) -> Response:
    body = {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": param,
            "code": "invalid_parameter",
        }
    }
    return Response(orjson.dumps(body), status_code=400, media_type="application/json")


def event_routes(*, source: EventSource) -> list[Route]:
    async def list_events(request: Request) -> Response:
        raw_limit = request.query_params.get("limit", str(DEFAULT_LIMIT))
        if not raw_limit.isdigit() or int(raw_limit) < 1:
            return _error(f"limit must be a positive whole number, got {raw_limit!r}", "limit")
        model = request.query_params.get("model")
        node = request.query_params.get("node")
        events = [
            e
            for e in source.events()
            if (model is None or e["model"] == model) and (node is None or e["node"] == node)
        ]
        payload = {"events": events[: int(raw_limit)]}
        return Response(orjson.dumps(payload), media_type="application/json")

    return [Route("/admin/api/events", list_events, methods=["GET"])]
