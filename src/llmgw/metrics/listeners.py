"""Metrics of the HTTP listeners' connections: how many are open, and how many were cut.

`llmgw_http_connections{listener}` counts the admitted connections open now;
`llmgw_http_connections_cut_total{listener,reason}` counts connections this
process closed on its own: `header_timeout` (the request line and headers did
not arrive in time), `body_timeout` (the body stalled: answered 408) and
`over_limit` (beyond `server.max_connections`: answered 503).

Not guaranteed: connections the kernel refused before the process accepted them
(a full backlog) are not seen here.
"""

from __future__ import annotations

from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge

CutReason = Literal["header_timeout", "body_timeout", "over_limit"]


class ListenerMetrics:
    """Series of the HTTP listeners, on the registry handed in."""

    def __init__(self, *, registry: CollectorRegistry) -> None:
        self._open = Gauge(
            "llmgw_http_connections",
            "Connections open on each HTTP listener, counting only those within "
            "server.max_connections.",
            ["listener"],
            registry=registry,
        )
        self._cut = Counter(
            "llmgw_http_connections_cut_total",
            "Connections closed by the server: header_timeout (headers incomplete in "
            "time), body_timeout (the body stalled; answered 408), over_limit (beyond "
            "server.max_connections; answered 503).",
            ["listener", "reason"],
            registry=registry,
        )

    def opened(self, listener: str) -> None:
        self._open.labels(listener).inc()

    def closed(self, listener: str) -> None:
        self._open.labels(listener).dec()

    def cut(self, listener: str, reason: CutReason) -> None:
        self._cut.labels(listener, reason).inc()
