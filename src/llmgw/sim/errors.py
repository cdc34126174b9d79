"""OpenAI-shaped errors of the simulated engine.

Every non-2xx answer of the sim carries `{"error": {"message", "type", "param",
"code"}}`, like OpenAI and vLLM, because the gateway's error handling is tested
against it. `SimError` is raised anywhere on the request path and turned into a
response in one place (`llmgw.sim.asgi.send_error`).

Not guaranteed: the `type` strings follow OpenAI's, not vLLM's (which uses Python
exception names such as "BadRequestError"), except on the LoRA adapter endpoints
(`llmgw.sim.lora`), which answer with vLLM's types and integer codes.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

import orjson

_TYPES_BY_STATUS: Final = MappingProxyType(
    {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        405: "invalid_request_error",
        408: "timeout_error",
        413: "invalid_request_error",
        422: "invalid_request_error",
        429: "rate_limit_error",
        503: "service_unavailable",
    }
)


def error_type_for(status: int) -> str:
    if status in _TYPES_BY_STATUS:
        return _TYPES_BY_STATUS[status]
    return "server_error" if status >= 500 else "invalid_request_error"


class SimError(Exception):
    """An error answer: HTTP status plus the OpenAI error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | int,
        error_type: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.error_type = error_type or error_type_for(status)
        self.param = param

    def body(self) -> bytes:
        return orjson.dumps(
            {
                "error": {
                    "message": self.message,
                    "type": self.error_type,
                    "param": self.param,
                    "code": self.code,
                }
            }
        )


def bad_request(message: str, *, param: str | None = None) -> SimError:
    return SimError(400, message, code="invalid_request", param=param)
