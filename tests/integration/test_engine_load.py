"""The engine load reader against a real `llmgw sim` and an engine without /metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest
from procs import Sim
from prometheus_client import CollectorRegistry

from llmgw.engines.spec import EngineLoad
from llmgw.metrics.routing import RoutingMetrics
from llmgw.router.endpoints import EjectionPolicy, EndpointPool, EndpointSpec, publish_static
from llmgw.router.engine_load import EngineLoadScraper, parse_engine_load, parse_prefix_counters
from llmgw.router.scoring.load import LoadBook
from llmgw.router.upstream import Upstream


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    engine = Sim("--zero-delay", model="m1")
    yield engine
    engine.proc.stop()


async def _no_metrics_server(asked: list[bytes]) -> tuple[asyncio.Server, int]:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        asked.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_reads_load_and_prefix_counters_and_backs_off_without_metrics(sim: Sim) -> None:
    body = {"model": "m1", "prompt": "the same words " * 20, "max_tokens": 2}
    for _ in range(2):
        httpx.post(sim.url + "/v1/completions", json=body, timeout=10).raise_for_status()

    async def scenario() -> None:
        asked: list[bytes] = []
        server, port = await _no_metrics_server(asked)
        clock = time.monotonic
        pool = EndpointPool(policy=EjectionPolicy(3, 1.0, 8.0), clock=clock)
        publish_static(
            pool,
            [
                EndpointSpec("sim", sim.url, ("m1",)),
                EndpointSpec("bare", f"http://127.0.0.1:{port}", ("m1",)),
            ],
        )
        upstream = Upstream(connect_timeout=5.0, idle_timeout=2.0)
        book = LoadBook(clock=clock, stale_after=60.0)
        registry = CollectorRegistry()
        scraper = EngineLoadScraper(
            pool=pool,
            upstream=upstream,
            book=book,
            interval=1.0,
            timeout=5.0,
            clock=clock,
            metrics=RoutingMetrics(registry=registry),
        )
        try:
            await scraper.scrape_all()
            await scraper.scrape_all()
        finally:
            await upstream.close()
            server.close()
            await server.wait_closed()
        report = book.get("sim")
        assert report is not None
        assert (report.running, report.waiting) == (0, 0)
        assert report.kv_cache_usage is not None and 0 <= report.kv_cache_usage <= 1
        assert book.get("bare") is None
        queries = registry.get_sample_value(
            "llmgw_engine_prefix_cache_queries_tokens", {"endpoint": "sim"}
        )
        hits = registry.get_sample_value(
            "llmgw_engine_prefix_cache_hits_tokens", {"endpoint": "sim"}
        )
        assert queries is not None and hits is not None and 0 < hits < queries
        # The endpoint without /metrics was not asked again in the second round.
        assert len(asked) == 1 and asked[0].startswith(b"GET /metrics ")
        assert scraper.rounds == 2

    asyncio.run(scenario())


def test_parses_vllm_and_sglang_pages() -> None:
    vllm = (
        'vllm:num_requests_running{model_name="a"} 3\n'
        'vllm:num_requests_waiting{model_name="a"} 2\n'
        'vllm:kv_cache_usage_perc{model_name="a"} 0.25\n'
        'vllm:prefix_cache_queries_total{model_name="a"} 100\n'
        'vllm:prefix_cache_hits_total{model_name="a"} 40\n'
    )
    assert parse_engine_load(vllm) == EngineLoad(running=3, waiting=2, kv_cache_usage=0.25)
    counters = parse_prefix_counters(vllm)
    assert counters is not None and (counters.queries, counters.hits) == (100, 40)
    sglang = "sglang:num_running_reqs 5\nsglang:num_queue_reqs 1\nsglang:token_usage 0.5\n"
    assert parse_engine_load(sglang) == EngineLoad(running=5, waiting=1, kv_cache_usage=0.5)
    assert parse_engine_load("garbage {{{") == EngineLoad(None, None, None)
    assert parse_prefix_counters(sglang) is None
