"""Metrics of cache-aware routing: the prefix hits the router expected, and the
prefix-cache counters the engines report, so the two can be compared.

`llmgw_route_prompt_blocks_total{model}` counts the prompt blocks routed and
`llmgw_route_expected_hit_blocks_total{model}` those the chosen replica was
expected to hold (their ratio is the expected hit ratio). The engines' own
counters are mirrored as `llmgw_engine_prefix_cache_queries_tokens{endpoint}` and
`llmgw_engine_prefix_cache_hits_tokens{endpoint}` (cumulative, as the engine
counts them; a rate() of the ratio is the engines' hit ratio).

What the predicted-TTFT chooser learned per endpoint (absent until learned):
`llmgw_route_batch_size{endpoint}` (sequences the engine runs at once, read from
its metrics while requests wait), `llmgw_route_prefill_seconds_per_block{endpoint}`
and `llmgw_route_slot_seconds{endpoint}` (how long a request holds a slot).

With a shared index (`router.routing.redis_url`),
`llmgw_route_index_shared_total{outcome="sent|applied|dropped"}` counts the
placements this router published, those it applied from other routers, and those
it could not send (Redis down, or a backlog).

Not guaranteed: the two ratios are in different units (router blocks of prompt
bytes, engine tokens); they track each other, they are not equal. Engines that
export no prefix-cache counters are absent from the engine series.
"""

from __future__ import annotations

from collections.abc import Collection

from prometheus_client import CollectorRegistry, Counter, Gauge


class RoutingMetrics:
    """Series of the balancer and the engine metrics reader, on the registry handed in."""

    def __init__(self, *, registry: CollectorRegistry) -> None:
        self._engines: set[str] = set()
        self.prompt_blocks = Counter(
            "llmgw_route_prompt_blocks",
            "Prompt blocks routed by prefix affinity.",
            ["model"],
            registry=registry,
        )
        self.expected_hit_blocks = Counter(
            "llmgw_route_expected_hit_blocks",
            "Prompt blocks the chosen replica was expected to hold in its prefix cache.",
            ["model"],
            registry=registry,
        )
        self.engine_queries = Gauge(
            "llmgw_engine_prefix_cache_queries_tokens",
            "Prompt tokens the engine looked up in its prefix cache (its own counter).",
            ["endpoint"],
            registry=registry,
        )
        self.engine_hits = Gauge(
            "llmgw_engine_prefix_cache_hits_tokens",
            "Prompt tokens the engine found in its prefix cache (its own counter).",
            ["endpoint"],
            registry=registry,
        )
        self._learned: set[str] = set()
        self.batch_size = Gauge(
            "llmgw_route_batch_size",
            "Sequences the engine runs at once, as routing learned it from the engine's "
            "metrics (the requests running while some wait).",
            ["endpoint"],
            registry=registry,
        )
        self.prefill_per_block = Gauge(
            "llmgw_route_prefill_seconds_per_block",
            "Prefill seconds per uncached routing block, as routing learned it from the "
            "first-byte times of the endpoint's streamed answers.",
            ["endpoint"],
            registry=registry,
        )
        self.slot_seconds = Gauge(
            "llmgw_route_slot_seconds",
            "Seconds a request holds an engine slot, as routing learned it from the "
            "requests the endpoint finished.",
            ["endpoint"],
            registry=registry,
        )
        self.index_shared = Counter(
            "llmgw_route_index_shared",
            "Prefix-index placements shared through Redis: sent by this router, applied "
            "from other routers, or dropped (not sent).",
            ["outcome"],
            registry=registry,
        )

    def expected(self, model: str, blocks: int, hit_blocks: int) -> None:
        self.prompt_blocks.labels(model).inc(blocks)
        if hit_blocks:
            self.expected_hit_blocks.labels(model).inc(hit_blocks)

    def engine_counters(self, endpoint: str, queries: float, hits: float) -> None:
        self._engines.add(endpoint)
        self.engine_queries.labels(endpoint).set(queries)
        self.engine_hits.labels(endpoint).set(hits)

    def learned(
        self, endpoint: str, batch: int | None, per_block: float | None, slot: float | None
    ) -> None:
        """What routing learned of `endpoint` (None: not yet; the series stays absent)."""
        for gauge, value in (
            (self.batch_size, batch),
            (self.prefill_per_block, per_block),
            (self.slot_seconds, slot),
        ):
            if value is not None:
                self._learned.add(endpoint)
                gauge.labels(endpoint).set(value)

    def keep_only(self, endpoints: Collection[str]) -> None:
        """Drop the engine series of endpoints no longer in the pool."""
        for endpoint in [e for e in self._engines if e not in endpoints]:
            self._engines.discard(endpoint)
            self.engine_queries.remove(endpoint)
            self.engine_hits.remove(endpoint)
        for endpoint in [e for e in self._learned if e not in endpoints]:
            self._learned.discard(endpoint)
            for gauge in (self.batch_size, self.prefill_per_block, self.slot_seconds):
                gauge.remove(endpoint)  # a no-op for a series never set
