"""Metrics of the router's request queue.

`llmgw_queue_depth{model,class}` is read from the live queue at scrape time
(nothing on the request path); waits and refusals are recorded as they happen.

Not guaranteed: a model whose queue emptied is no longer listed in the depth
gauge (an absent series reads as 0 in Prometheus).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_WAIT_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

# (model, class, requests waiting)
DepthRow = tuple[str, str, int]


class _DepthCollector(Collector):
    def __init__(self) -> None:
        self.depths: Callable[[], Iterable[DepthRow]] | None = None

    def collect(self) -> Iterator[Metric]:
        if self.depths is None:
            return
        gauge = GaugeMetricFamily(
            "llmgw_queue_depth",
            "Requests waiting in this router's queue for a replica with room.",
            labels=["model", "class"],
        )
        for model, cls, depth in self.depths():
            gauge.add_metric([model, cls], depth)
        yield gauge


class QueueMetrics:
    """Series of the queue, on the registry handed in."""

    def __init__(self, *, registry: CollectorRegistry) -> None:
        self._depth = _DepthCollector()
        registry.register(self._depth)
        self.wait = Histogram(
            "llmgw_queue_wait_seconds",
            "Time requests waited in the queue before going to a replica "
            "(requests that never waited are not counted).",
            ["model", "class"],
            buckets=_WAIT_BUCKETS,
            registry=registry,
        )
        self.refused = Counter(
            "llmgw_queue_refused_total",
            "Requests the queue answered with 429, by reason: queue_full (no place "
            "left), wait_expired (the wait budget ran out).",
            ["model", "class", "reason"],
            registry=registry,
        )
        self.left = Counter(
            "llmgw_queue_abandoned_total",
            "Requests whose client went away while they waited in the queue.",
            ["model", "class"],
            registry=registry,
        )

    def watch(self, depths: Callable[[], Iterable[DepthRow]]) -> None:
        self._depth.depths = depths
