"""Metrics of the data plane.

Per-request series are cached per (model, endpoint) so the request path pays one
dict lookup instead of prometheus-client's locked label lookup per metric.
In-flight counts and endpoint health are not updated on the request path at
all: a collector reads them from the live endpoint objects at scrape time.

Series of endpoints that are gone are removed: each replica gets a new endpoint
id (scale to zero and back makes a new one every time), so keeping them would
grow `/metrics` without bound. They are dropped when the router forgets an
endpoint and again at every scrape (a request that was in flight when its
endpoint went away may re-create them once); their counts are kept in
`totals()`, so the dashboard's rates do not jump back.

Not guaranteed: the last observations of a request still in flight when its
endpoint is removed may be lost from the per-endpoint series.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from llmgw.metrics.history import RouterTotals

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 5)


@dataclass(frozen=True, slots=True)
class EndpointSnapshot:
    """What the scrape-time collector reads of one endpoint."""

    endpoint: str
    in_flight: int
    healthy: bool
    # The model names it serves (for the per-model count of healthy endpoints).
    models: tuple[str, ...] = ()


class _EndpointCollector(Collector):
    """Gauges read at scrape time; first drops the series of endpoints that are gone.

    Registered before every other router metric, so the registry runs it first
    and a scrape never shows a gone endpoint's series.
    """

    def __init__(self, retain: Callable[[Collection[str]], None]) -> None:
        self._retain = retain
        self.snapshot: Callable[[], Iterable[EndpointSnapshot]] | None = None

    def collect(self) -> Iterator[Metric]:
        if self.snapshot is None:
            return
        snapshots = list(self.snapshot())
        self._retain({snap.endpoint for snap in snapshots})
        in_flight = GaugeMetricFamily(
            "llmgw_endpoint_in_flight",
            "Requests currently being served by each endpoint.",
            labels=["endpoint"],
        )
        healthy = GaugeMetricFamily(
            "llmgw_endpoint_healthy",
            "1 when the endpoint takes traffic (probe passing, not ejected), else 0.",
            labels=["endpoint"],
        )
        ready = GaugeMetricFamily(
            "llmgw_model_ready_endpoints",
            "Endpoints of each model that take traffic now (0: requests for it wait for "
            "an activation or fail).",
            labels=["model"],
        )
        by_model: dict[str, int] = {}
        for snap in snapshots:
            in_flight.add_metric([snap.endpoint], snap.in_flight)
            healthy.add_metric([snap.endpoint], 1.0 if snap.healthy else 0.0)
            for model in snap.models:
                by_model[model] = by_model.get(model, 0) + snap.healthy
        for model, count in sorted(by_model.items()):
            ready.add_metric([model], count)
        yield in_flight
        yield healthy
        yield ready


class RequestSeries:
    """The labelled children for one (model, endpoint) pair."""

    __slots__ = ("completion_tokens", "inter_token", "latency", "prompt_tokens", "ttft")

    def __init__(self, metrics: RouterMetrics, model: str, endpoint: str) -> None:
        self.latency = metrics.latency.labels(model, endpoint)
        self.ttft = metrics.ttft.labels(model, endpoint)
        self.inter_token = metrics.inter_token.labels(model, endpoint)
        self.prompt_tokens = metrics.prompt_tokens.labels(model, endpoint)
        self.completion_tokens = metrics.completion_tokens.labels(model, endpoint)


class RouterMetrics:
    """All router metrics, registered on the given registry."""

    def __init__(self, *, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._endpoint_collector = _EndpointCollector(self.retain_endpoints)
        registry.register(self._endpoint_collector)
        self.requests = Counter(
            "llmgw_requests",
            "Requests answered, by model, endpoint ('none' when none was reached), status "
            "and model version (a canary's or the model's own; empty for a model without).",
            ["model", "endpoint", "status", "version"],
            registry=registry,
        )
        self.latency = Histogram(
            "llmgw_request_duration_seconds",
            "Time from receiving a request to sending its last byte.",
            ["model", "endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.ttft = Histogram(
            "llmgw_time_to_first_token_seconds",
            "Time from receiving a streaming request to relaying its first chunk.",
            ["model", "endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.inter_token = Histogram(
            "llmgw_inter_token_seconds",
            "Gap between consecutive chunks relayed from an engine's stream.",
            ["model", "endpoint"],
            buckets=_GAP_BUCKETS,
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "llmgw_prompt_tokens",
            "Prompt tokens, as reported by the engine.",
            ["model", "endpoint"],
            registry=registry,
        )
        self.completion_tokens = Counter(
            "llmgw_completion_tokens",
            "Completion tokens, as reported by the engine.",
            ["model", "endpoint"],
            registry=registry,
        )
        self.retries = Counter(
            "llmgw_retries",
            "Attempts moved to another endpoint before the first byte reached the client.",
            ["model"],
            registry=registry,
        )
        self.upstream_errors = Counter(
            "llmgw_upstream_errors",
            "Failed upstream attempts by kind: connect, status_<code>, timeout_<phase>, "
            "disconnect, payload.",
            ["endpoint", "kind"],
            registry=registry,
        )
        self.continuations = Counter(
            "llmgw_continuations",
            "Streams continued on another replica after their engine failed mid-stream, by "
            "cause: disconnect (connection lost, engine exit), timeout_idle, or abandoned "
            "(the control plane saw the node stop answering).",
            ["model", "cause"],
            registry=registry,
        )
        self.client_disconnects = Counter(
            "llmgw_client_disconnects",
            "Requests whose client went away before the answer was complete.",
            ["model"],
            registry=registry,
        )
        self.route_requests = Counter(
            "llmgw_route_requests",
            "Requests answered, by client route (/v1/chat/completions, /v1/rerank, ...), "
            "model and status.",
            ["route", "model", "status"],
            registry=registry,
        )
        self._series: dict[tuple[str, str], RequestSeries] = {}
        self.request_counter = RequestCounter(self.requests, versioned=True)
        self.route_counter = RequestCounter(self.route_requests)
        # What the series of removed endpoints had counted, so totals() stays monotonic.
        self._retired = RouterTotals(0.0, 0.0, 0.0, 0.0)

    def watch_endpoints(self, snapshot: Callable[[], Iterable[EndpointSnapshot]]) -> None:
        """Expose in-flight and health gauges read from `snapshot` at scrape time;
        the endpoints `snapshot` does not list are gone, and so are their series."""
        self._endpoint_collector.snapshot = snapshot

    def retain_endpoints(self, live: Collection[str]) -> None:
        """Remove every per-endpoint series whose endpoint is not in `live`
        ("none", the label of requests that reached no endpoint, always stays)."""
        gone = self._endpoint_labels() - set(live) - {"none"}
        if not gone:
            return
        requests, errors = _sum_requests(self.requests, gone)
        ttft_sum, ttft_count = _sum_histogram(self.ttft, gone)
        retired = self._retired
        self._retired = RouterTotals(
            retired.requests + requests,
            retired.errors + errors,
            retired.ttft_sum + ttft_sum,
            retired.ttft_count + ttft_count,
        )
        for metric in (
            self.requests,
            self.latency,
            self.ttft,
            self.inter_token,
            self.prompt_tokens,
            self.completion_tokens,
            self.upstream_errors,
        ):
            _remove_series(metric, gone)
        self._series = {k: v for k, v in self._series.items() if k[1] not in gone}
        self.request_counter.forget(gone)

    def _endpoint_labels(self) -> set[str]:
        found: set[str] = set()
        for metric in (self.requests, self.latency, self.upstream_errors):
            for family in metric.collect():
                found.update(sample.labels["endpoint"] for sample in family.samples)
        return found

    def totals(self) -> RouterTotals:
        """Every request answered so far, those answered with a 5xx, and the TTFT
        histogram's sum and count, summed over all models and endpoints."""
        retired = self._retired
        requests, errors = retired.requests, retired.errors
        for metric in self.requests.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    requests += sample.value
                    if sample.labels["status"].startswith("5"):
                        errors += sample.value
        ttft_sum, ttft_count = retired.ttft_sum, retired.ttft_count
        for metric in self.ttft.collect():
            for sample in metric.samples:
                if sample.name.endswith("_sum"):
                    ttft_sum += sample.value
                elif sample.name.endswith("_count"):
                    ttft_count += sample.value
        return RouterTotals(requests, errors, ttft_sum, ttft_count)

    def series(self, model: str, endpoint: str) -> RequestSeries:
        key = (model, endpoint)
        found = self._series.get(key)
        if found is None:
            found = self._series[key] = RequestSeries(self, model, endpoint)
        return found


def _sum_requests(counter: Counter, endpoints: set[str]) -> tuple[float, float]:
    requests = errors = 0.0
    for family in counter.collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels["endpoint"] in endpoints:
                requests += sample.value
                if sample.labels["status"].startswith("5"):
                    errors += sample.value
    return requests, errors


def _sum_histogram(histogram: Histogram, endpoints: set[str]) -> tuple[float, float]:
    total = count = 0.0
    for family in histogram.collect():
        for sample in family.samples:
            if sample.labels["endpoint"] not in endpoints:
                continue
            if sample.name.endswith("_sum"):
                total += sample.value
            elif sample.name.endswith("_count"):
                count += sample.value
    return total, count


def _remove_series(metric: MetricWrapperBase, endpoints: set[str]) -> None:
    names = metric._labelnames  # the label order remove() takes
    doomed: set[tuple[str, ...]] = set()
    for family in metric.collect():
        for sample in family.samples:
            if sample.labels.get("endpoint") in endpoints:
                doomed.add(tuple(sample.labels[name] for name in names))
    for values in doomed:
        metric.remove(*values)


class RequestCounter:
    """`llmgw_requests` (or `llmgw_route_requests`) with its labelled children cached
    (statuses are few): labels (model, endpoint, status) or (route, model, status)."""

    __slots__ = ("_children", "_counter", "_versioned")

    def __init__(self, counter: Counter, *, versioned: bool = False) -> None:
        self._counter = counter
        # Whether the counter has a fourth label, the model version.
        self._versioned = versioned
        self._children: dict[tuple[str, str, int, str], Counter] = {}

    def inc(self, model: str, endpoint: str, status: int, version: str = "") -> None:
        key = (model, endpoint, status, version)
        child = self._children.get(key)
        if child is None:
            values = (model, endpoint, str(status), *((version,) if self._versioned else ()))
            child = self._children[key] = self._counter.labels(*values)
        child.inc()

    def forget(self, endpoints: set[str]) -> None:
        """Drop the cached children of `endpoints` (their series were removed)."""
        self._children = {k: v for k, v in self._children.items() if k[1] not in endpoints}
