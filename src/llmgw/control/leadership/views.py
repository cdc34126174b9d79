"""Who leads, for people and for Prometheus: `GET /admin/api/leader` and two gauges.

`llmgw_leader{server}` is 1 on the server that holds the lease and 0 on
standbys; `llmgw_leader_epoch` is the epoch of the lease this server last saw.
Values are read at request or scrape time. Not guaranteed: a standby's view is
as old as its last look at the lease (a third of the TTL at most).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import orjson
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from llmgw.control.leadership.lease import LeaderInfo


class LeaderSource(Protocol):
    def info(self) -> LeaderInfo: ...


def leader_view(info: LeaderInfo) -> dict[str, object]:
    return {
        "server": info.server,
        "role": info.role,
        "role_since": info.role_since.isoformat(),
        "leader": info.leader,
        "epoch": info.epoch,
        "leader_since": info.since.isoformat() if info.since else None,
        "lease_expires_at": info.expires_at.isoformat() if info.expires_at else None,
        "leader_agent_address": info.agent_address,
    }


def leader_routes(*, leadership: LeaderSource) -> list[Route]:
    async def show(_: Request) -> Response:
        return Response(orjson.dumps(leader_view(leadership.info())), media_type="application/json")

    return [Route("/admin/api/leader", show, methods=["GET"])]


class LeaderMetrics(Collector):
    """Registers itself on `registry`."""

    def __init__(self, *, registry: CollectorRegistry, leadership: LeaderSource) -> None:
        self._leadership = leadership
        registry.register(self)

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "llmgw_leader", "1 on the server holding the lease", labels=["server"]
        )
        yield GaugeMetricFamily("llmgw_leader_epoch", "Epoch of the lease last seen")

    def collect(self) -> Iterator[Metric]:
        info = self._leadership.info()
        leader = GaugeMetricFamily(
            "llmgw_leader", "1 on the server holding the lease", labels=["server"]
        )
        leader.add_metric([info.server], 1.0 if info.role == "leader" else 0.0)
        yield leader
        epoch = GaugeMetricFamily("llmgw_leader_epoch", "Epoch of the lease last seen")
        epoch.add_metric([], float(info.epoch or 0))
        yield epoch
