"""Metrics of the agent service: time spent per inbound message, open streams.

`llmgw_agent_message_seconds{kind}` is observed once per message the servicer
handles (register, heartbeat, shard_status, command_result): the time from
having the decoded message to having applied it (inventory updated, command
answered, `Registered` queued). `llmgw_agent_streams` is read from the
servicer's sessions when Prometheus scrapes; nothing updates it on the stream.
`llmgw_agent_registers_total{outcome}` counts Registers by what became of them:
accepted, reconnected (the node's older stream was closed), in_use (another
stream holds the node id), taken (the id belongs to another certificate),
revoked, invalid, unavailable (the store could not be asked), deferred (told to
come back later: the server was taking registrations at its pace, see
`pacing.py`). Other refusals before the Register is read (a standby's, a
certificate naming another node) are not counted here.
`llmgw_agent_shard_reports_refused_total{reason}` counts shard reports not
believed: unplaced (no placement record of that shard on that node), model
(recorded for another model), endpoint (an engine URL that is not where the
node is).

Not guaranteed: the whole cost of a message. Decoding the protobuf, the gRPC
transport and the event loop's scheduling happen before the clock starts; the
server's CPU time says what all of it costs together. Messages that are
refused (a second Register, an invalid report) are not observed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

MESSAGE_KINDS = ("register", "heartbeat", "shard_status", "command_result")
REGISTER_OUTCOMES = (
    "accepted",
    "reconnected",
    "in_use",
    "taken",
    "revoked",
    "invalid",
    "unavailable",
    "deferred",
)
REFUSED_SHARD_REASONS = ("unplaced", "model", "endpoint")
# Handling a heartbeat is tens of microseconds; the top bucket catches a
# stalled event loop or a registration carrying many shards.
_MESSAGE_BUCKETS = (
    0.00001,
    0.000015,
    0.00002,
    0.00003,
    0.00005,
    0.000075,
    0.0001,
    0.00015,
    0.0002,
    0.0003,
    0.0005,
    0.00075,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
)


class _StreamsCollector(Collector):
    def __init__(self, streams: Callable[[], int]) -> None:
        self._streams = streams

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        family.add_metric([], self._streams())
        yield family

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily("llmgw_agent_streams", "Agent streams open on this server.")


class AgentMetrics:
    """Registers the agent service's metrics on `registry`; `streams` is read at scrape time."""

    def __init__(self, *, registry: CollectorRegistry, streams: Callable[[], int]) -> None:
        self.message_seconds = Histogram(
            "llmgw_agent_message_seconds",
            "Seconds the server spent handling one inbound agent message, by kind.",
            ["kind"],
            buckets=_MESSAGE_BUCKETS,
            registry=registry,
        )
        # Labelled children up front: the message path pays a dict lookup, not
        # prometheus-client's locked label lookup.
        self._by_kind = {kind: self.message_seconds.labels(kind) for kind in MESSAGE_KINDS}
        registry.register(_StreamsCollector(streams))
        self.registers = Counter(
            "llmgw_agent_registers",
            "Agent Registers by outcome: accepted, reconnected, or why refused.",
            ["outcome"],
            registry=registry,
        )
        for outcome in REGISTER_OUTCOMES:
            self.registers.labels(outcome)
        self.refused_shards = Counter(
            "llmgw_agent_shard_reports_refused",
            "Shard reports from agents that were not believed, by why: unplaced, model, endpoint.",
            ["reason"],
            registry=registry,
        )
        for reason in REFUSED_SHARD_REASONS:
            self.refused_shards.labels(reason)

    def refused_shard(self, reason: str) -> None:
        """Count one shard report that was not believed (one of REFUSED_SHARD_REASONS)."""
        self.refused_shards.labels(reason).inc()

    def registered(self, outcome: str) -> None:
        """Count one Register by its outcome (one of REGISTER_OUTCOMES)."""
        self.registers.labels(outcome).inc()

    def handled(self, kind: str | None, seconds: float) -> None:
        """Record one handled message; kinds this server does not know are not recorded."""
        child = self._by_kind.get(kind or "")
        if child is not None:
            child.observe(seconds)
