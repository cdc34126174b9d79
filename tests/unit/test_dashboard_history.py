"""The overview's charts: the router's totals, the last hour's history, the SVG geometry."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from llmgw.metrics import MetricsHistory, RouterMetrics, RouterTotals
from llmgw.web.charts import line_chart, nice_ceiling, share


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Counters:
    def __init__(self) -> None:
        self.totals = RouterTotals(0, 0, 0, 0)

    def add(self, requests: float, errors: float, streams: float, ttft: float) -> None:
        t = self.totals
        self.totals = RouterTotals(
            t.requests + requests, t.errors + errors, t.ttft_sum + ttft, t.ttft_count + streams
        )

    def __call__(self) -> RouterTotals:
        return self.totals


def test_router_totals_sum_every_model_and_count_5xx_as_errors() -> None:
    metrics = RouterMetrics(registry=CollectorRegistry())
    for status, times in ((200, 7), (404, 2), (429, 1), (499, 1), (502, 2), (503, 1)):
        for _ in range(times):
            metrics.request_counter.inc("llama", "gpu1", status)
    metrics.request_counter.inc("other", "none", 200)
    metrics.series("llama", "gpu1").ttft.observe(0.2)
    metrics.series("other", "gpu2").ttft.observe(0.4)
    totals = metrics.totals()
    assert totals.requests == 15 and totals.errors == 3
    assert totals.ttft_count == 2 and totals.ttft_sum == pytest.approx(0.6)


def test_each_interval_gets_its_rate_error_share_and_mean_ttft() -> None:
    clock, counters = Clock(), Counters()
    history = MetricsHistory(sample=counters, clock=clock, interval=10.0, window=60.0)
    assert history.tick() is None  # the first sample only sets the baseline
    counters.add(requests=50, errors=5, streams=4, ttft=2.0)
    clock.now += 10
    point = history.tick()
    assert point is not None
    assert point.requests_per_second == 5.0
    assert point.error_rate == 0.1
    assert point.ttft_seconds == 0.5
    clock.now += 10
    quiet = history.tick()
    assert quiet is not None
    assert (quiet.requests_per_second, quiet.error_rate, quiet.ttft_seconds) == (0.0, None, None)


def test_the_window_keeps_only_the_last_hour() -> None:
    clock, counters = Clock(), Counters()
    history = MetricsHistory(sample=counters, clock=clock, interval=10.0, window=60.0)
    for _ in range(20):
        counters.add(10, 0, 0, 0)
        history.tick()
        clock.now += 10
    points = history.points()
    assert len(points) == 6
    assert all(p.at >= clock.now - 60 for p in points)
    # Nothing sampled for a while (a paused process): old points age out of the view.
    clock.now += 35
    assert len(history.points()) == 2


def test_a_counter_reset_counts_from_zero_instead_of_going_negative() -> None:
    clock, counters = Clock(), Counters()
    history = MetricsHistory(sample=counters, clock=clock, interval=10.0)
    counters.add(1000, 0, 0, 0)
    history.tick()
    counters.totals = RouterTotals(30, 0, 0, 0)
    clock.now += 10
    point = history.tick()
    assert point is not None and point.requests_per_second == 3.0


async def test_run_samples_every_interval_with_the_injected_sleep() -> None:
    clock, counters = Clock(), Counters()
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        counters.add(20, 1, 0, 0)
        clock.now += seconds
        if len(waits) == 4:
            raise asyncio.CancelledError

    history = MetricsHistory(sample=counters, clock=clock, interval=10.0, sleep=sleep)
    with pytest.raises(asyncio.CancelledError):
        await history.run()
    assert waits == [10.0] * 4
    assert [p.requests_per_second for p in history.points()] == [2.0, 2.0, 2.0]
    assert [p.error_rate for p in history.points()] == [0.05] * 3


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="interval"):
        MetricsHistory(sample=Counters(), clock=Clock(), interval=0)
    with pytest.raises(ValueError, match="interval"):
        MetricsHistory(sample=Counters(), clock=Clock(), interval=60, window=30)


def test_chart_geometry() -> None:
    assert [nice_ceiling(v) for v in (0, 0.3, 1, 3, 7, 12, 2400)] == [1, 0.5, 1, 5, 10, 20, 2500]
    chart = line_chart(
        "rate",
        [(0, 1.0), (50, 2.0), (60, None), (70, 4.0), (100, 0.0)],
        x_range=(0, 100),
        fmt=lambda v: f"{v:g}",
        left_label="-1h",
        right_label="now",
    )
    # The gap at x=60 splits the line; the top is rounded up to 5.
    assert chart.segments == ("0.0,62.8 150.0,47.6", "210.0,17.2 300.0,78.0")
    assert chart.top_label == "5" and chart.latest == "0" and not chart.empty
    lone = line_chart("x", [(10, None), (20, 3.0), (30, None)], x_range=(0, 40),
                      fmt=str, left_label="", right_label="")  # fmt: skip
    assert lone.segments == () and lone.dots == ((150.0, 32.4),)
    quiet = line_chart("errors", [(0, 0.0), (1, 0.0)], x_range=(0, 1), fmt=str,
                       left_label="", right_label="", min_top=0.01)  # fmt: skip
    assert quiet.top_label == "0.01" and quiet.segments == ("0.0,78.0 300.0,78.0",)
    empty = line_chart("x", [], x_range=(0, 1), fmt=str, left_label="", right_label="")
    assert empty.empty and empty.latest == "no data yet"
    assert (share(5, 10), share(20, 10), share(1, 0)) == (50.0, 100.0, 0.0)
