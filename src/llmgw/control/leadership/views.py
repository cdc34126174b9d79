"""Who leads, for people and for Prometheus: `GET /admin/api/leader` and two gauges;
every server on the store: `GET /admin/api/servers`.

`llmgw_leader{server}` is 1 on the server that holds the lease and 0 on
standbys; `llmgw_leader_epoch` is the epoch of the lease this server last saw;
`llmgw_servers{role}` counts the servers on the store by role (leader, standby,
gone) as this server last read them, so an alert can fire when a standby is gone.
Values are read at request or scrape time. Not guaranteed: a standby's view is
as old as its last look at the lease (a third of the TTL at most).

A server's role in the list is "leader" (it holds the lease as this server
last saw it), "standby" (announced within one lease TTL) or "gone" (silent
longer: killed, frozen or cut off from the store; the leader forgets it after
an hour, and a server that stops cleanly leaves the list at once).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Protocol

import orjson
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from llmgw.control.adminapi.responses import error_response, json_response
from llmgw.control.leadership.lease import LeaderInfo
from llmgw.control.leadership.sync import is_live
from llmgw.store import ControlServer, StoreError


class LeaderSource(Protocol):
    def info(self) -> LeaderInfo: ...


class ServerList(Protocol):
    async def servers(self) -> list[ControlServer]: ...


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


_ROLE_ORDER = {"leader": 0, "standby": 1, "gone": 2}
_SERVERS_HELP = "Servers on the store by role, as this server last read them"


def servers_view(
    servers: list[ControlServer], info: LeaderInfo, now: datetime, ttl: float
) -> list[dict[str, object]]:
    """The servers as `GET /admin/api/servers` lists them: leader, standbys, gone."""
    out: list[dict[str, object]] = []
    for s in servers:
        if s.server == info.leader and info.expires_at is not None and info.expires_at > now:
            role = "leader"
        else:
            role = "standby" if is_live(s, now, ttl) else "gone"
        out.append(
            {
                "server": s.server,
                "role": role,
                "this": s.server == info.server,
                "hostname": s.hostname,
                "version": s.version,
                "api_url": s.api_url,
                "agent_address": s.agent_address or None,
                "started_at": s.started_at.isoformat(),
                "last_seen": s.last_seen.isoformat(),
            }
        )
    out.sort(key=lambda v: (_ROLE_ORDER[str(v["role"])], str(v["server"])))
    return out


def leader_routes(
    *,
    leadership: LeaderSource,
    servers: ServerList,
    wall_clock: Callable[[], datetime],
    ttl: float,
) -> list[Route]:
    async def show(_: Request) -> Response:
        return Response(orjson.dumps(leader_view(leadership.info())), media_type="application/json")

    async def list_servers(_: Request) -> Response:
        try:
            found = await servers.servers()
        except StoreError as exc:
            return error_response(
                503, f"cannot read the servers from the store: {exc}", code="store_unavailable"
            )
        return json_response({"servers": servers_view(found, leadership.info(), wall_clock(), ttl)})

    return [
        Route("/admin/api/leader", show, methods=["GET"]),
        Route("/admin/api/servers", list_servers, methods=["GET"]),
    ]


class LeaderMetrics(Collector):
    """Registers itself on `registry`."""

    def __init__(
        self,
        *,
        registry: CollectorRegistry,
        leadership: LeaderSource,
        servers: Callable[[], list[ControlServer]],
        wall_clock: Callable[[], datetime],
        ttl: float,
    ) -> None:
        self._leadership = leadership
        self._servers = servers
        self._wall_clock = wall_clock
        self._ttl = ttl
        registry.register(self)

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "llmgw_leader", "1 on the server holding the lease", labels=["server"]
        )
        yield GaugeMetricFamily("llmgw_leader_epoch", "Epoch of the lease last seen")
        yield GaugeMetricFamily("llmgw_servers", _SERVERS_HELP, labels=["role"])

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
        listed = servers_view(self._servers(), info, self._wall_clock(), self._ttl)
        servers = GaugeMetricFamily("llmgw_servers", _SERVERS_HELP, labels=["role"])
        for role in _ROLE_ORDER:
            servers.add_metric([role], float(sum(1 for s in listed if s["role"] == role)))
        yield servers
