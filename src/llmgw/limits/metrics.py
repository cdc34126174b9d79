"""Prometheus metrics of the limiter, registered on a registry handed in by the caller.

Never touches prometheus-client's global default registry. `redis_up` is only
meaningful for a limiter with a Redis URL; it stays 0 for one without.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from llmgw.limits.errors import Reason


class LimitMetrics:
    """Redis health, Redis errors and refusals by reason."""

    def __init__(self, *, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.redis_up = Gauge(
            "llmgw_limits_redis_up",
            "1 while rate limits are shared through Redis, 0 while each router "
            "process enforces them on its own (Redis unreachable or not configured).",
            registry=registry,
        )
        self.redis_errors = Counter(
            "llmgw_limits_redis_errors",
            "Redis calls of the limiter that failed (timeouts, refused connections, "
            "script errors); each one falls back to per-process limits.",
            registry=registry,
        )
        rate_limited = Counter(
            "llmgw_rate_limited",
            "Requests refused with 429, by the limit that refused them.",
            ["reason"],
            registry=registry,
        )
        # Children resolved once: the refusal path pays no labelled lookup.
        self.rate_limited: dict[Reason, Counter] = {
            reason: rate_limited.labels(reason) for reason in ("rpm", "tpm", "budget")
        }
