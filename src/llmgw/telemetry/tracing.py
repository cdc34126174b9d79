"""Building the tracer: the SDK's sampling, spans exported by a child process, or nothing.

`build_tracing` returns None when tracing is off (no endpoint in the config or in
the standard `OTEL_EXPORTER_OTLP_*` variables, or `OTEL_SDK_DISABLED=true`): the
objects that make spans then skip them with one `is None` check, so tracing off
costs no allocation per request. When on, the SDK's `TracerProvider` is built
from the settings and the standard variables for its resource, sampler and id
generator; spans are made by `llmgw.telemetry.spans` (a few µs each) and batched
(OTEL_BSP_SCHEDULE_DELAY, OTEL_BSP_MAX_EXPORT_BATCH_SIZE, OTEL_BSP_MAX_QUEUE_SIZE)
to a child process, `llmgw.telemetry.export`, which encodes them and sends them
with the SDK's OTLP exporter, so the process serving requests never encodes a
span. `Tracing.shutdown` sends what is left.

Not guaranteed: that spans reach the collector. A collector that is down or slow
loses spans (dropped when the queue is full), never requests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from llmgw.config.telemetry import TelemetryConfig
from llmgw.telemetry.spans import RecordTracer, SpanSink, env_int, env_seconds, export_argv

# Seconds the export process may take to send what is left at shutdown.
_SHUTDOWN_SECONDS = 5.0


class TracingError(Exception):
    """The tracing settings cannot work; the message names the setting."""


@dataclass(frozen=True, slots=True)
class Tracing:
    """The SDK's tracer provider (resource, sampler, ids), the endpoint spans go to,
    and the sink that carries them to the export process."""

    provider: TracerProvider
    endpoint: str
    sink: SpanSink

    def tracer(self, name: str) -> trace.Tracer:
        return RecordTracer(
            scope=name,
            sink=self.sink,
            sampler=self.provider.sampler,
            ids=self.provider.id_generator,
        )

    def shutdown(self) -> None:
        """Send what is queued and wait (bounded) for the export process to finish."""
        self.sink.shutdown(_SHUTDOWN_SECONDS)


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
    name = env.get("OTEL_SERVICE_NAME") or service
    resource = Resource.create({SERVICE_NAME: name})
    sampler = None
    if config.sample_ratio is not None:
        sampler = ParentBased(TraceIdRatioBased(config.sample_ratio))
    provider = TracerProvider(resource=resource, sampler=sampler)
    # The export process reads the standard variables of `env` (the SDK's exporter does).
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | env
    sink = SpanSink(
        argv=export_argv(endpoint=endpoint, service=name),
        env=child_env,
        delay=env_seconds(env, "OTEL_BSP_SCHEDULE_DELAY", 5000),
        batch=env_int(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512),
        max_queue=env_int(env, "OTEL_BSP_MAX_QUEUE_SIZE", 2048),
    )
    return Tracing(provider=provider, endpoint=endpoint, sink=sink)
