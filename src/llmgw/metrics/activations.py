"""Activations: how many ended how, and how long they took (placing, downloading,
loading and the engine's start, all together)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

# An activation takes seconds (a sleeping or cached engine) to many minutes (a download).
_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200)


class ActivationMetrics:
    def __init__(self, *, registry: CollectorRegistry) -> None:
        self._total = Counter(
            "llmgw_activations",
            "Activations on request that ended, by model and outcome (ready, or the "
            "reason they were refused: unplaceable, failed, timeout, ...).",
            ["model", "outcome"],
            registry=registry,
        )
        self._seconds = Histogram(
            "llmgw_activation_seconds",
            "Seconds from a request asking for a model to its first Ready replica.",
            ["model"],
            buckets=_BUCKETS,
            registry=registry,
        )

    def ended(self, model: str, outcome: str, seconds: float) -> None:
        self._total.labels(model, outcome).inc()
        if outcome == "ready":
            self._seconds.labels(model).observe(seconds)
