"""The span export process: span records from the gateway's pipe, sent with the SDK's OTLP exporter.

`python -m llmgw.telemetry.export ENDPOINT SERVICE` reads frames from stdin (a
4-byte length, then one marshalled list of `llmgw.telemetry.spans.Record`s, written by
the gateway that started this process and no one else),
rebuilds each as the SDK's `ReadableSpan` and exports them with the official
`OTLPSpanExporter` (OTLP/HTTP, protobuf), in batches of OTEL_BSP_MAX_EXPORT_BATCH_SIZE.
The standard variables it reads are the SDK's (OTEL_RESOURCE_ATTRIBUTES,
OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION, ...): it inherits the
gateway's environment. Encoding and sending happen here, not in the process
that serves requests, at the lowest CPU priority (nice 19). It ends when its
stdin does, after sending what it read.

Not guaranteed: delivery. A collector that refuses or is down loses those
batches (the exporter retries with backoff within its timeout, then gives up;
this process logs it and goes on).
"""

from __future__ import annotations

import logging
import marshal
import os
import signal
import sys
from collections.abc import Iterator
from typing import IO, Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

from llmgw.telemetry.spans import FRAME, Record, env_int

log = logging.getLogger("llmgw.telemetry.export")

_KINDS = {kind.value: kind for kind in SpanKind}
_CODES = {code.value: code for code in StatusCode}
_NO_STATE = TraceState()


def frames(stream: IO[bytes]) -> Iterator[list[Record]]:
    """The lists of records on `stream`, until it ends (a cut-off last frame is dropped)."""
    while True:
        head = stream.read(FRAME.size)
        if len(head) < FRAME.size:
            return
        (size,) = FRAME.unpack(head)
        data = stream.read(size)
        if len(data) < size:
            return
        records: list[Record] = marshal.loads(data)
        yield records


class Rebuilder:
    """Records as the SDK's `ReadableSpan`s of one resource."""

    def __init__(self, resource: Resource) -> None:
        self._resource = resource
        self._scopes: dict[str, InstrumentationScope] = {}

    def span(self, record: Record) -> ReadableSpan:
        (
            scope, name, trace_id, span_id, flags, state, parent_id, parent_remote, kind,
            start, end, attributes, events, links, code, description,
        ) = record  # fmt: skip
        trace_state = TraceState.from_header([state]) if state else _NO_STATE
        context = SpanContext(
            trace_id, span_id, is_remote=False, trace_flags=TraceFlags(flags),
            trace_state=trace_state,
        )  # fmt: skip
        parent = None
        if parent_id:
            parent = SpanContext(
                trace_id, parent_id, is_remote=parent_remote, trace_flags=TraceFlags(flags)
            )
        instrumentation = self._scopes.get(scope)
        if instrumentation is None:
            instrumentation = self._scopes[scope] = InstrumentationScope(scope)
        return ReadableSpan(
            name=name,
            context=context,
            parent=parent,
            resource=self._resource,
            attributes=attributes,
            events=[Event(n, a, timestamp=t) for n, t, a in events],
            links=[
                Link(SpanContext(t, s, is_remote=False, trace_flags=TraceFlags(f)), a)
                for t, s, f, a in links
            ],
            kind=_KINDS.get(kind, SpanKind.INTERNAL),
            status=Status(_CODES.get(code, StatusCode.UNSET), description),
            start_time=start,
            end_time=end,
            instrumentation_scope=instrumentation,
        )


def run(stream: IO[bytes], exporter: Any, rebuilder: Rebuilder, batch: int) -> int:
    """Export every record on `stream`; the number of spans the exporter refused."""
    failed = 0
    for records in frames(stream):
        spans = [rebuilder.span(r) for r in records]
        for start in range(0, len(spans), batch):
            chunk = spans[start : start + batch]
            result = exporter.export(chunk)
            if result.name != "SUCCESS":
                failed += len(chunk)
    return failed


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m llmgw.telemetry.export ENDPOINT SERVICE", file=sys.stderr)
        return 2
    endpoint, service = argv
    # Ctrl-C reaches the whole process group: the gateway decides when this ends
    # (by closing stdin), so that what it sent last is exported.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The lowest priority: exporting takes only CPU that serving does not want (on a
    # busy host spans wait in the gateway's queue, and are dropped when it is full).
    os.nice(19)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    batch = env_int(os.environ, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)
    resource = Resource.create({SERVICE_NAME: service})
    exporter = OTLPSpanExporter(endpoint=endpoint)
    try:
        failed = run(sys.stdin.buffer, exporter, Rebuilder(resource), batch)
    finally:
        exporter.shutdown()  # type: ignore[no-untyped-call]
    if failed:
        log.warning("tracing: the collector at %s did not take %d spans", endpoint, failed)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
