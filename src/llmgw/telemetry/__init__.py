"""Traces (OpenTelemetry) and log formats, shared by the gateway, the agent and the sim.

`tracing` builds the SDK's tracer provider (imported by the composition roots only:
the SDK and its exporter are heavy), `propagation` carries W3C trace context on the
request path (the OpenTelemetry API only), `logs` the human and JSON log formats.
Nothing here sets a global tracer provider or touches logging at import: the
composition roots (`llmgw.cli.*`) build a `Tracing` and configure logging, and
pass tracers to the objects that make spans.
"""
