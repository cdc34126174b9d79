"""The router's exception tree and the one place failures become OpenAI error bodies.

Every error a client sees has the body `{"error": {"message", "type", "param",
"code"}}` and the status of its class. Foreign errors (upstream client, asyncio,
orjson) are translated into these at the boundary where they happen.
"""

from __future__ import annotations

import orjson


class RouterError(Exception):
    """Base of every failure the router answers a client with."""

    status = 500
    type = "server_error"
    code: str | None = "internal_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        # The endpoint that produced the error, for the x-llmgw-replica header.
        self.endpoint_id: str | None = None

    def headers(self) -> list[tuple[bytes, bytes]]:
        """Extra response headers this error carries."""
        return []

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.code, self.param)


class ClientClosed(RouterError):
    """The client went away before its request was complete (nginx's 499)."""

    status = 499
    type = "invalid_request_error"
    code = "client_closed_request"


class InvalidRequest(RouterError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class InvalidJSON(InvalidRequest):
    code = "invalid_json"


class ModelNotFound(RouterError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class RouteNotFound(RouterError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class RouteNotServed(RouterError):
    """The model is served here, but no engine behind it serves the route asked for."""

    status = 404
    type = "invalid_request_error"
    code = "route_not_served"


class MethodNotAllowed(RouterError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"

    def __init__(self, message: str, *, allowed: str) -> None:
        super().__init__(message)
        self.allowed = allowed

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"allow", self.allowed.encode())]


class BodyTooLarge(RouterError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class NoHealthyEndpoint(RouterError):
    """The model is known but no endpoint serving it can take traffic now."""

    status = 503
    type = "service_unavailable"
    code = "no_healthy_replica"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"retry-after", str(self.retry_after).encode())]


class ModelUnavailable(RouterError):
    """A catalog model has no ready replica and none could be started in time.

    `code` says why (model_unplaceable, model_failed, activation_timeout, ...)."""

    status = 503
    type = "service_unavailable"

    def __init__(self, message: str, *, code: str, retry_after: int) -> None:
        super().__init__(message, param="model")
        self.code = code
        self.retry_after = retry_after

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"retry-after", str(self.retry_after).encode())]


class AdapterNotLoadable(ModelUnavailable):
    """The engine refused to load the LoRA adapter the request names (its files are
    missing or bad, its rank is over the base's limit): the message carries the
    engine's words. A client error: the same request fails the same way."""

    status = 400
    type = "invalid_request_error"

    def headers(self) -> list[tuple[bytes, bytes]]:
        return []


class EngineUnreachable(RouterError):
    """Every attempt failed to connect to, or lost, its engine before an answer."""

    status = 502
    type = "upstream_error"
    code = "engine_unreachable"


class DeadlineExceeded(RouterError):
    status = 504
    type = "timeout_error"
    code = "deadline_exceeded"


class EngineError(RouterError):
    """An engine answered with an error; status and body are relayed."""

    type = "upstream_error"
    code = "engine_error"

    def __init__(self, message: str, *, status: int, raw_body: bytes | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.raw_body = raw_body

    def body(self) -> bytes:
        if self.raw_body is not None and is_openai_error(self.raw_body):
            return self.raw_body
        return super().body()


class Refused(RouterError):
    """A refusal decided outside the router (authentication, limits), carried as is."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        type_: str,
        code: str,
        extra_headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.code = code
        self._extra = extra_headers or []

    def headers(self) -> list[tuple[bytes, bytes]]:
        return self._extra


class StoreUnavailableError(RouterError):
    status = 503
    type = "service_unavailable"
    code = "store_unavailable"


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> bytes:
    return orjson.dumps(
        {"error": {"message": message, "type": type_, "param": param, "code": code}}
    )


def is_openai_error(raw: bytes) -> bool:
    """True when `raw` already is `{"error": {"message": ...}}`."""
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(parsed, dict):
        return False
    inner = parsed.get("error")
    return isinstance(inner, dict) and isinstance(inner.get("message"), str)


def engine_error_message(status: int, raw: bytes) -> str:
    """A readable message for an engine's error answer, whatever its body looks like."""
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        inner = parsed.get("error")
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
        detail = parsed.get("detail") or parsed.get("message")
        if detail is not None:
            return f"engine answered {status}: {detail}"
    text = raw[:200].decode("utf-8", "replace").strip()
    return f"engine answered {status}" + (f": {text}" if text else "")
