"""Series of endpoints the router no longer knows leave `/metrics`; totals do not drop."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import CollectorRegistry

from llmgw.metrics import RouterMetrics
from llmgw.router.admin import create_metrics_app
from llmgw.router.endpoints import EjectionPolicy, EndpointPool, EndpointSpec


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _serve(metrics: RouterMetrics, model: str, endpoint: str, status: int) -> None:
    """What the proxy and the app record for one answered stream."""
    series = metrics.series(model, endpoint)
    series.latency.observe(0.2)
    series.ttft.observe(0.05)
    series.inter_token.observe(0.01)
    series.prompt_tokens.inc(10)
    series.completion_tokens.inc(5)
    metrics.upstream_errors.labels(endpoint, "connect").inc()
    metrics.request_counter.inc(model, endpoint, status)


async def _scrape(registry: CollectorRegistry) -> str:
    transport = httpx.ASGITransport(app=create_metrics_app(registry=registry))
    async with httpx.AsyncClient(transport=transport, base_url="http://metrics") as client:
        resp = await client.get("/metrics")
    assert resp.status_code == 200
    return resp.text


def _lines_naming(text: str, endpoint: str) -> list[str]:
    return [line for line in text.splitlines() if f'endpoint="{endpoint}"' in line]


async def test_a_gone_endpoints_series_leave_metrics_and_totals_stay() -> None:
    registry = CollectorRegistry()
    metrics = RouterMetrics(registry=registry)
    pool = EndpointPool(
        policy=EjectionPolicy(3, 1.0, 30.0), clock=Clock(), on_forget=metrics.retain_endpoints
    )
    metrics.watch_endpoints(pool.snapshots)
    # Scale to zero and back: replica r-1 goes, replica r-2 (a new endpoint id) comes.
    pool.set_model_endpoints("llama", [EndpointSpec("r-1", "http://127.0.0.1:20000", ("llama",))])
    _serve(metrics, "llama", "r-1", 200)
    _serve(metrics, "llama", "r-1", 502)
    metrics.request_counter.inc("llama", "none", 503)
    before = await _scrape(registry)
    assert _lines_naming(before, "r-1"), before
    totals = metrics.totals()
    assert (totals.requests, totals.errors) == (3.0, 2.0)

    pool.set_model_endpoints("llama", [EndpointSpec("r-2", "http://127.0.0.1:20001", ("llama",))])
    _serve(metrics, "llama", "r-2", 200)
    after = await _scrape(registry)
    assert _lines_naming(after, "r-1") == []
    assert 'llmgw_requests_total{endpoint="r-2",model="llama",status="200",version=""} 1.0' in after
    assert (
        'llmgw_requests_total{endpoint="none",model="llama",status="503",version=""} 1.0' in after
    )
    totals = metrics.totals()
    assert (totals.requests, totals.errors) == (4.0, 2.0)
    assert (totals.ttft_sum, totals.ttft_count) == (pytest.approx(0.15), 3.0)

    # A request that was in flight on r-1 when it went away finishes late: its series
    # come back for a moment and the next scrape drops them again, counts kept.
    _serve(metrics, "llama", "r-1", 200)
    late = await _scrape(registry)
    assert _lines_naming(late, "r-1") == []
    assert metrics.totals().requests == 5.0

    pool.remove_model("llama")
    gone = await _scrape(registry)
    assert _lines_naming(gone, "r-2") == []
    assert metrics.totals().requests == 5.0
