"""Admin REST routes over the control plane (mounted on the admin listener by the CLI)."""

from llmgw.control.adminapi.config import Reloader, config_routes
from llmgw.control.adminapi.events import EventSource, event_routes
from llmgw.control.adminapi.models import ModelCatalog, ModelControl, model_routes
from llmgw.control.adminapi.nodes import NodeDirectory, node_routes
from llmgw.control.adminapi.views import node_view, shard_view

__all__ = [
    "EventSource",
    "ModelCatalog",
    "ModelControl",
    "NodeDirectory",
    "Reloader",
    "config_routes",
    "event_routes",
    "model_routes",
    "node_routes",
    "node_view",
    "shard_view",
]
