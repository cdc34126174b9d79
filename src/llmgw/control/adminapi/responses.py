"""JSON responses of the admin API, and its OpenAI-style error bodies.

Every admin route answers JSON; every failure has the body
`{"error": {"message", "type", "param", "code"}}` that the router uses too, so
one client-side parser reads both. `type` is "invalid_request_error" for 4xx
and "api_error" for 5xx.
Not guaranteed: anything beyond the shape; messages are for people.
"""

from __future__ import annotations

import orjson
from starlette.responses import Response


def json_response(payload: object, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


def error_response(status: int, message: str, *, code: str, param: str | None = None) -> Response:
    kind = "api_error" if status >= 500 else "invalid_request_error"
    return json_response(
        {"error": {"message": message, "type": kind, "param": param, "code": code}}, status
    )
