"""Settings of traces and the access log (`telemetry:` in the server's config file)."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator


class TelemetryConfig(BaseModel):
    """Where traces go, how many, and whether API requests are logged one line each."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    otlp_endpoint: str | None = Field(
        default=None,
        description=(
            "The OTLP/HTTP collector traces are sent to (http://collector:4318; "
            "/v1/traces is added when the URL has no path). Unset: the standard "
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT, and with "
            "neither tracing is off, which costs the request path one check."
        ),
    )
    sample_ratio: Annotated[float, Field(ge=0.0, le=1.0)] | None = Field(
        default=None,
        description=(
            "Share of requests traced (0 to 1) when the client sent no sampled "
            "traceparent; a client's sampling decision is kept. Unset: OTEL_TRACES_SAMPLER "
            "and OTEL_TRACES_SAMPLER_ARG, else every request (parent-based, always on)."
        ),
    )
    access_log: bool = Field(
        default=False,
        description=(
            "One log line per API request (logger llmgw.access: route, model, status, "
            "replica, key id, latency, request and trace id; never a body). Off by "
            "default: the usage store already keeps each request's record."
        ),
    )
    access_log_sample: Annotated[float, Field(gt=0.0, le=1.0)] = Field(
        default=1.0,
        description=(
            "Share of successful requests the access log writes (errors are always "
            "written); lower it on busy gateways."
        ),
    )

    @field_validator("otlp_endpoint")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(
                f"{value!r} is not an http(s) URL of an OTLP/HTTP collector "
                "(for example http://127.0.0.1:4318)"
            )
        return value
