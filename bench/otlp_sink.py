"""An OTLP/HTTP trace sink for benchmarks: answers `POST /v1/traces` with 200 and
counts export requests and bytes; `GET /stats` returns the counts, and the spans
of the first export decoded with the official protos (proof that spans arrived,
without paying to decode every one on the load generator's core).

Usage: python bench/otlp_sink.py PORT
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

_ANSWER = ExportTraceServiceResponse().SerializeToString()


class _Counts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.bytes = 0
        self.first_spans: list[str] = []


def main() -> None:
    counts = _Counts()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            with counts.lock:
                counts.requests += 1
                counts.bytes += len(body)
                first = not counts.first_spans
            if first:
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                names = [
                    span.name
                    for rs in request.resource_spans
                    for ss in rs.scope_spans
                    for span in ss.spans
                ]
                with counts.lock:
                    counts.first_spans = names
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(_ANSWER)))
            self.end_headers()
            self.wfile.write(_ANSWER)

        def do_GET(self) -> None:
            with counts.lock:
                body = json.dumps(
                    {
                        "requests": counts.requests,
                        "bytes": counts.bytes,
                        "first_spans": counts.first_spans,
                    }
                ).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.serve_forever()


if __name__ == "__main__":
    main()
