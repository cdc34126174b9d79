"""Metrics of cache-aware routing: the prefix hits the router expected, and the
prefix-cache counters the engines report, so the two can be compared.

`llmgw_route_prompt_blocks_total{model}` counts the prompt blocks routed and
`llmgw_route_expected_hit_blocks_total{model}` those the chosen replica was
expected to hold (their ratio is the expected hit ratio). The engines' own
counters are mirrored as `llmgw_engine_prefix_cache_queries_tokens{endpoint}` and
`llmgw_engine_prefix_cache_hits_tokens{endpoint}` (cumulative, as the engine
counts them; a rate() of the ratio is the engines' hit ratio).

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

    def keep_only(self, endpoints: Collection[str]) -> None:
        """Drop the engine series of endpoints no longer in the pool."""
        for endpoint in [e for e in self._engines if e not in endpoints]:
            self._engines.discard(endpoint)
            self.engine_queries.remove(endpoint)
            self.engine_hits.remove(endpoint)
