"""W3C trace context on the request path: read from the client, written to engines.

`traceparent` and `tracestate` are read with OpenTelemetry's own W3C propagator,
never parsed here. They are written here, the same text as the propagator writes
(a test holds them equal): its `inject` cost about 15,000 instructions a
request, paid by every request a sampler leaves out too; llmgw's own recorded
spans format theirs from their ids (no `SpanContext` built). Only the
OpenTelemetry API is imported: this module costs nothing when tracing is off.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

# The W3C propagator holds no state: one instance serves every request.
_PROPAGATOR = TraceContextTextMapPropagator()
_TRACE_HEADERS = (b"traceparent", b"tracestate")

_Headers = list[tuple[bytes, bytes]]


class _HeaderGetter(Getter[_Headers]):
    """Reads ASGI headers (lower-case byte pairs) for the W3C propagator."""

    def get(self, carrier: _Headers, key: str) -> list[str] | None:
        wanted = key.encode()
        values = [v.decode("latin-1") for n, v in carrier if n == wanted]
        return values or None

    def keys(self, carrier: _Headers) -> list[str]:
        return [n.decode("latin-1") for n, _ in carrier]


_GETTER = _HeaderGetter()


def extract_context(headers: _Headers) -> Context:
    """The trace context a client sent (`traceparent`, `tracestate`), if any."""
    return _PROPAGATOR.extract(headers, getter=_GETTER)


def trace_headers(span: trace.Span | None = None) -> list[tuple[bytes, bytes]]:
    """`traceparent` (and `tracestate`) for `span` (default: the current span), to
    send upstream; none for an invalid span (no trace), as the propagator."""
    if span is None:
        span = trace.get_current_span()
    own = getattr(span, "w3c_headers", None)
    if own is not None:
        # llmgw's recorded span writes them from its ids, without a SpanContext.
        headers: list[tuple[bytes, bytes]] = own()
        return headers
    context = span.get_span_context()
    if context == trace.INVALID_SPAN_CONTEXT:
        return []
    headers = [
        (
            b"traceparent",
            b"00-%032x-%016x-%02x" % (context.trace_id, context.span_id, context.trace_flags),
        )
    ]
    if context.trace_state:
        headers.append((b"tracestate", context.trace_state.to_header().encode("latin-1")))
    return headers


def child_span(
    tracer: trace.Tracer,
    name: str,
    attributes: dict[str, Any] | None = None,
    *,
    kind: trace.SpanKind = trace.SpanKind.INTERNAL,
    record_exception: bool = True,
) -> AbstractContextManager[trace.Span]:
    """A span under the current one, for work under which nothing makes spans or
    reads the current span: not made current when the tracer can skip that (llmgw's,
    `start_child`), else as `start_as_current_span` makes it. With `record_exception`
    an exception leaving it is recorded and sets its status, either way."""
    start = getattr(tracer, "start_child", None)
    if start is not None:
        span: AbstractContextManager[trace.Span] = start(name, attributes, kind, record_exception)
        return span
    return tracer.start_as_current_span(
        name,
        kind=kind,
        attributes=attributes,
        record_exception=record_exception,
        set_status_on_exception=record_exception,
    )


def span_trace_id(span: trace.Span) -> int:
    """`span`'s trace id; llmgw's recorded spans give it without building a `SpanContext`."""
    own = getattr(span, "trace_id", None)
    if own is not None:
        trace_id: int = own
        return trace_id
    return span.get_span_context().trace_id


def client_trace_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The client's own `traceparent`/`tracestate`, passed on as they came when this
    gateway does not trace (so an engine that traces joins the client's trace)."""
    return [(name, value) for name, value in headers if name in _TRACE_HEADERS]


def current_trace_id() -> str | None:
    """The current span's trace id (32 hex digits), or None outside a valid span."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return trace.format_trace_id(context.trace_id)
