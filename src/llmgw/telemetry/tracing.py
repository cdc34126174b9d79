"""Building the tracer: the OpenTelemetry SDK with an OTLP/HTTP exporter, or nothing.

`build_tracing` returns None when tracing is off (no endpoint in the config or in
the standard `OTEL_EXPORTER_OTLP_*` variables, or `OTEL_SDK_DISABLED=true`): the
objects that make spans then skip them with one `is None` check, so tracing off
costs no allocation per request. When on, spans are batched and exported by the
SDK's own thread; `Tracing.shutdown` flushes what is left.

Not guaranteed: that spans reach the collector. A collector that is down or slow
loses spans (the SDK drops them when its queue is full), never requests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from llmgw.config.telemetry import TelemetryConfig

# Seconds the exporter may take to send what is left at shutdown.
_SHUTDOWN_MILLIS = 5000


class TracingError(Exception):
    """The tracing settings cannot work; the message names the setting."""


@dataclass(frozen=True, slots=True)
class Tracing:
    """A tracer provider and the endpoint its spans go to."""

    provider: TracerProvider
    endpoint: str

    def tracer(self, name: str) -> trace.Tracer:
        return self.provider.get_tracer(name)

    def shutdown(self) -> None:
        """Export what is queued (bounded), then stop the exporter's thread."""
        self.provider.force_flush(_SHUTDOWN_MILLIS)
        self.provider.shutdown()


def _endpoint(config: TelemetryConfig, env: dict[str, str]) -> str | None:
    if config.otlp_endpoint is not None:
        parts = urlsplit(config.otlp_endpoint)
        if parts.path in ("", "/"):
            return config.otlp_endpoint.rstrip("/") + "/v1/traces"
        return config.otlp_endpoint
    if env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if base:
        return base.rstrip("/") + "/v1/traces"
    return None


def build_tracing(
    config: TelemetryConfig, *, service: str, env: dict[str, str] | None = None
) -> Tracing | None:
    """The tracer provider `config` and the `OTEL_*` environment ask for; None when off.

    `service` is the service name unless OTEL_SERVICE_NAME says otherwise; the other
    standard variables (OTEL_RESOURCE_ATTRIBUTES, OTEL_EXPORTER_OTLP_HEADERS, ...,
    OTEL_TRACES_SAMPLER when `sample_ratio` is unset) are read by the SDK itself."""
    env = dict(os.environ) if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    endpoint = _endpoint(config, env)
    if endpoint is None:
        return None
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise TracingError(
            f"OTLP endpoint {endpoint!r} is not an http(s) URL; set telemetry.otlp_endpoint "
            "or OTEL_EXPORTER_OTLP_ENDPOINT to the collector's OTLP/HTTP address "
            "(for example http://127.0.0.1:4318)"
        )
    resource = Resource.create({SERVICE_NAME: env.get("OTEL_SERVICE_NAME") or service})
    sampler = None
    if config.sample_ratio is not None:
        sampler = ParentBased(TraceIdRatioBased(config.sample_ratio))
    provider = TracerProvider(resource=resource, sampler=sampler)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return Tracing(provider=provider, endpoint=endpoint)
