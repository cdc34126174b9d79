"""Prometheus metrics of usage recording, on a registry handed in by the caller.

Never touches prometheus-client's global default registry.

Not guaranteed: several recorders on one registry; registering twice fails
(duplicate series), so build one `UsageRecorder` per registry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge

DropReason = Literal["queue_full", "write_failed", "refused", "invalid", "closed"]
DROP_REASONS: tuple[DropReason, ...] = (
    "queue_full",
    "write_failed",
    "refused",
    "invalid",
    "closed",
)


class UsageMetrics:
    """Queue depth, records written, records dropped (by reason) and failed writes."""

    def __init__(self, *, registry: CollectorRegistry, queued: Callable[[], float]) -> None:
        self.queued = Gauge(
            "llmgw_usage_queued",
            "Usage records waiting to be written to the store.",
            registry=registry,
        )
        # Read at scrape time: the request path pays nothing for this gauge.
        self.queued.set_function(queued)
        self.written = Counter(
            "llmgw_usage_written",
            "Usage records written to the store.",
            registry=registry,
        )
        dropped = Counter(
            "llmgw_usage_dropped",
            "Usage records lost: queue full (the store is too slow or down), write_failed "
            "(retries exhausted), refused (the store cannot hold the record; its batch's "
            "other records are written), invalid (naive timestamp), closed (recorded "
            "after close).",
            ["reason"],
            registry=registry,
        )
        self.dropped: dict[DropReason, Counter] = {r: dropped.labels(r) for r in DROP_REASONS}
        self.write_errors = Counter(
            "llmgw_usage_write_errors",
            "Failed attempts to write a batch of usage records (each retry counts).",
            registry=registry,
        )
