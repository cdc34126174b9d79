"""Reading each engine's load from its metrics page, off the request path.

Every `interval` seconds, `GET <endpoint url>/metrics` of every endpoint in the
pool, concurrently, and record what it says in the `LoadBook` the scorers and
the queue read (requests running and waiting, KV-cache use); the engine's
prefix-cache counters (queried and hit tokens) go to `RoutingMetrics`. Pages are read with vLLM's
names first (vLLM and `llmgw sim`), then SGLang's, so static endpoints need no
engine kind. An endpoint that answers 404 (llama.cpp's server exports nothing
by default) is asked again only after `missing_backoff` seconds.

Not guaranteed: freshness. A report is as old as the last read; the router's
own in-flight counts fill the gap, and the book ignores reports older than its
`stale_after`. A failed read is not a health signal (the health prober
decides that); the endpoint's last report just ages out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass

from llmgw.engines import sglang
from llmgw.engines.prometheus import metric_max, metric_sum, parse_samples
from llmgw.engines.spec import EngineLoad
from llmgw.engines.vllm import parse_vllm_metrics
from llmgw.metrics.routing import RoutingMetrics
from llmgw.router.endpoints import Endpoint, EndpointPool
from llmgw.router.scoring.load import LoadBook
from llmgw.router.upstream import Upstream, UpstreamError

log = logging.getLogger("llmgw.router.engine_load")

_PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries")
_PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits")


@dataclass(frozen=True, slots=True)
class PrefixCounters:
    """An engine's prefix-cache counters: tokens looked up, tokens found cached."""

    queries: float
    hits: float


def parse_engine_load(text: str) -> EngineLoad:
    """Load from a vLLM-, sim- or SGLang-named metrics page; never raises."""
    load = parse_vllm_metrics(text)
    if load.running is not None or load.waiting is not None:
        return load
    samples = parse_samples(text, {sglang.RUNNING, sglang.WAITING, sglang.TOKEN_USAGE})
    return EngineLoad.from_readings(
        running=metric_sum(samples, sglang.RUNNING),
        waiting=metric_sum(samples, sglang.WAITING),
        kv_cache_usage=metric_max(samples, sglang.TOKEN_USAGE),
    )


def parse_prefix_counters(text: str) -> PrefixCounters | None:
    """The vLLM prefix-cache counters on the page (summed over models), or None."""
    samples = parse_samples(text, {*_PREFIX_QUERIES, *_PREFIX_HITS})
    queries = [metric_sum(samples, name) for name in _PREFIX_QUERIES]
    hits = [metric_sum(samples, name) for name in _PREFIX_HITS]
    query = next((q for q in queries if q is not None), None)
    hit = next((h for h in hits if h is not None), None)
    if query is None or hit is None:
        return None
    return PrefixCounters(queries=query, hits=hit)


class EngineLoadScraper:
    def __init__(
        self,
        *,
        pool: EndpointPool,
        upstream: Upstream,
        book: LoadBook,
        interval: float,
        timeout: float,
        clock: Callable[[], float],
        missing_backoff: float = 60.0,
        metrics: RoutingMetrics | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        forget: Sequence[Callable[[Collection[str]], None]] = (),
    ) -> None:
        """`forget` are told, after each round, the endpoint ids in the pool (what
        learns per endpoint drops the others)."""
        self._forget = tuple(forget)
        self._pool = pool
        self._upstream = upstream
        self._book = book
        self._interval = interval
        self._timeout = timeout
        self._clock = clock
        self._missing_backoff = missing_backoff
        self._metrics = metrics
        self._sleep = sleep
        self._skip_until: dict[str, float] = {}
        self.rounds = 0

    async def run(self) -> None:
        """Read every engine's metrics forever; the first round starts at once."""
        while True:
            await self.scrape_all()
            await self._sleep(self._interval)

    async def scrape_all(self) -> None:
        endpoints = self._pool.endpoints()
        ids = {ep.id for ep in endpoints}
        self._book.keep_only(ids)
        if self._metrics is not None:
            self._metrics.keep_only(ids)
        now = self._clock()
        due = [ep for ep in endpoints if self._skip_until.get(ep.id, 0.0) <= now]
        if due:
            await asyncio.gather(*(self._scrape(ep) for ep in due))
        for forget in self._forget:
            forget(ids)
        self.rounds += 1

    async def _scrape(self, endpoint: Endpoint) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                resp = await self._upstream.request(b"GET", endpoint.url, "/metrics")
                try:
                    body = await resp.read()
                finally:
                    resp.release()
        except (TimeoutError, UpstreamError) as exc:
            log.debug("reading %s/metrics failed: %s", endpoint.url, exc or "timed out")
            return
        if resp.status == 404:
            log.info(
                "endpoint %s has no /metrics (404); routing uses this router's counts "
                "for it and asks again in %gs",
                endpoint.id,
                self._missing_backoff,
            )
            self._skip_until[endpoint.id] = self._clock() + self._missing_backoff
            return
        if resp.status != 200:
            return
        text = body.decode("utf-8", "replace")
        self._book.record(endpoint.id, parse_engine_load(text))
        if self._metrics is not None:
            counters = parse_prefix_counters(text)
            if counters is not None:
                self._metrics.engine_counters(endpoint.id, counters.queries, counters.hits)
