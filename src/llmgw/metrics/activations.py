"""Activations: how many ended how, and how long they took (placing, downloading,
loading and the engine's start, all together); sleeps and wakes of idle replicas
and how long each took."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

# An activation takes seconds (a sleeping or cached engine) to many minutes (a download).
_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200)
# A wake takes a fraction of a second (the sim, a small model) to a few seconds.
_WAKE_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30)


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

        self._sleeps = Counter(
            "llmgw_replica_sleeps",
            "Idle replicas put to sleep (GPU memory released, process kept), by model.",
            ["model"],
            registry=registry,
        )
        self._wake_seconds = Histogram(
            "llmgw_replica_wake_seconds",
            "Seconds from asking a sleeping replica to wake to its serving again.",
            ["model"],
            buckets=_WAKE_BUCKETS,
            registry=registry,
        )

    def slept(self, model: str) -> None:
        self._sleeps.labels(model).inc()

    def woke(self, model: str, seconds: float) -> None:
        self._wake_seconds.labels(model).observe(seconds)

    def ended(self, model: str, outcome: str, seconds: float) -> None:
        self._total.labels(model, outcome).inc()
        if outcome == "ready":
            self._seconds.labels(model).observe(seconds)
