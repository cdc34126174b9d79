"""vLLM-named Prometheus metrics of the simulated engine.

`SimCollector` reads the plain counters in `SimStats`, the scheduler and the prefix
cache at scrape time and yields them under vLLM's names, each labelled
`engine="0"` and `model_name="..."`, as vLLM 0.32 labels them (its KV-cache gauge
is `vllm:kv_cache_usage_perc`; `vllm:gpu_cache_usage_perc` is the name older vLLM
used, which llmgw also reads). The CLI registers it in a `CollectorRegistry` it creates; the
default global registry is never touched.

With LoRA on, `vllm:lora_requests_info` names the adapters with requests running.

Not guaranteed: the full vLLM metric set (only the names a router reads: queue
gauges, cache usage, prefix-cache and token counters, successes). The cache is shared
by all served names, so `vllm:kv_cache_usage_perc` has the same value under each.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llmgw.sim.cache import PrefixCache
from llmgw.sim.lora import LoraAdapters
from llmgw.sim.scheduler import Clock
from llmgw.sim.stats import ModelCounters, SimStats

_LABELS = ["engine", "model_name"]
# vLLM labels every metric with its engine core's index; the sim is one engine.
_ENGINE = "0"

_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("vllm:num_requests_running", "Number of requests in model execution batches.", "running"),
    ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", "waiting"),
)

_COUNTERS: tuple[tuple[str, str, str], ...] = (
    (
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        "prefix_cache_queries",
    ),
    (
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        "prefix_cache_hits",
    ),
    ("vllm:prompt_tokens", "Number of prefill tokens processed.", "prompt_tokens"),
    ("vllm:generation_tokens", "Number of generation tokens processed.", "generation_tokens"),
    ("vllm:request_success", "Count of successfully processed requests.", "request_success"),
)


def _value(counters: ModelCounters, field: str) -> float:
    return float(getattr(counters, field))


class SimCollector(Collector):
    """Yields the sim's metrics from its live objects on every scrape."""

    def __init__(
        self,
        *,
        stats: SimStats,
        cache: PrefixCache,
        adapters: LoraAdapters | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._stats = stats
        self._cache = cache
        self._adapters = adapters
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        models = self._stats.models
        for name, documentation, field in _GAUGES:
            gauge = GaugeMetricFamily(name, documentation, labels=_LABELS)
            for model, counters in models.items():
                gauge.add_metric([_ENGINE, model], _value(counters, field))
            yield gauge
        usage = GaugeMetricFamily(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            labels=_LABELS,
        )
        for model in models:
            usage.add_metric([_ENGINE, model], self._cache.usage)
        yield usage
        for name, documentation, field in _COUNTERS:
            counter = CounterMetricFamily(name, documentation, labels=_LABELS)
            for model, counters in models.items():
                counter.add_metric([_ENGINE, model], _value(counters, field))
            yield counter
        adapters = self._adapters
        if adapters is not None and self._clock is not None:
            # vLLM's one info gauge about LoRA: the names of the adapters with requests
            # running, comma-joined, valued with the time of the scrape.
            info = GaugeMetricFamily(
                "vllm:lora_requests_info",
                "Running stats on lora requests.",
                labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
            )
            running = ",".join(sorted(adapters.running))
            info.add_metric([str(adapters.max_loras), running, ""], self._clock())
            yield info
