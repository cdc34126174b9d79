"""Leadership: the store's lease, standby behaviour, and sharing the leader's view."""

from llmgw.control.leadership.fleet import FleetView, publish_fleet
from llmgw.control.leadership.lease import LEASE_NAME, LeaderInfo, Leadership, LeaseStore
from llmgw.control.leadership.sync import (
    ServerDirectory,
    StorePublisher,
    follow_endpoints,
    published,
    sync_demand,
)
from llmgw.control.leadership.views import LeaderMetrics, leader_routes, leader_view, servers_view

__all__ = [
    "LEASE_NAME",
    "FleetView",
    "LeaderInfo",
    "LeaderMetrics",
    "Leadership",
    "LeaseStore",
    "ServerDirectory",
    "StorePublisher",
    "follow_endpoints",
    "leader_routes",
    "leader_view",
    "publish_fleet",
    "published",
    "servers_view",
    "sync_demand",
]
