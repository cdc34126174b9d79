"""Admin API for nodes: `/admin/api/nodes`, one node, the drain flag, weights removal.

The same operations as `llmgw nodes`. Served on the admin listener (the CLI
mounts these routes behind the admin guard). Errors have the OpenAI-style body
`{"error": {"message", "type", "param", "code"}}`.

`POST /admin/api/nodes/{node_id}/weights/remove` with `{"path": "..."}` asks
the node's agent to delete a file or tree inside its weights directory
(relative to it, or absolute) and answers once the agent has: 200, or 404 (no
such node), 400 (bad body, or the node refused: outside the weights directory,
in use by a shard), 409 (the node has no open agent stream), 504 (the node did
not answer in time; it may still act), 503 (this server runs no agent service).
A path that was already absent counts as removed.

Not guaranteed: the drain flag only marks the node so no new work is placed
there; moving its replicas away is the reconciler's job. The flag is not
stored and is forgotten on a server restart.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from llmgw.control.adminapi.responses import error_response, json_response
from llmgw.control.adminapi.views import node_view
from llmgw.control.agentsvc.errors import (
    AgentServiceError,
    CommandFailed,
    CommandTimeout,
    NodeNotConnected,
)
from llmgw.control.inventory.errors import UnknownNode
from llmgw.control.inventory.model import Node

log = logging.getLogger(__name__)

RemoveWeights = Callable[[str, str], Awaitable[None]]
"""`remove_weights(node_id, path)`: the agent service's `Dispatcher.remove_weights`."""


class NodeDirectory(Protocol):
    """What the routes need of the inventory; `Inventory` satisfies it."""

    def nodes(self) -> Sequence[Node]: ...

    def node(self, node_id: str) -> Node: ...

    def set_draining(self, node_id: str, draining: bool) -> Node: ...

    def heartbeat_age(self, node: Node) -> float: ...


def _unknown(exc: UnknownNode) -> Response:
    return error_response(404, str(exc), code="node_not_found", param="node_id")


async def _weights_path(request: Request) -> str | Response:
    """The body's `path`, or the 400 answer saying what the body must be."""
    raw = await request.body()
    try:
        body = orjson.loads(raw) if raw.strip() else None
    except orjson.JSONDecodeError as exc:
        return error_response(400, f"the body is not valid JSON: {exc}", code="invalid_json")
    path = body.get("path") if isinstance(body, dict) else None
    if not isinstance(path, str) or not path.strip():
        return error_response(
            400,
            'send a JSON object {"path": "..."} naming the file or directory to remove, '
            "inside the node's weights directory (relative to it, or absolute)",
            code="invalid_path",
            param="path",
        )
    return path


def _agent_error(exc: AgentServiceError) -> Response:
    if isinstance(exc, NodeNotConnected):
        return error_response(409, exc.message, code="node_not_connected", param="node_id")
    if isinstance(exc, CommandFailed):
        return error_response(400, exc.message, code="weights_refused", param="path")
    if isinstance(exc, CommandTimeout):
        return error_response(504, exc.message, code="node_timeout")
    return error_response(502, exc.message, code="agent_error")


def node_routes(
    *, inventory: NodeDirectory, remove_weights: RemoveWeights | None = None
) -> list[Route]:
    """The node routes; without `remove_weights` (no agent service) weights removal is 503."""

    async def list_nodes(_: Request) -> Response:
        return json_response(
            {"nodes": [node_view(n, inventory.heartbeat_age(n)) for n in inventory.nodes()]}
        )

    async def show_node(request: Request) -> Response:
        try:
            node = inventory.node(request.path_params["node_id"])
        except UnknownNode as exc:
            return _unknown(exc)
        return json_response(node_view(node, inventory.heartbeat_age(node)))

    def set_draining(draining: bool) -> Route:
        async def endpoint(request: Request) -> Response:
            try:
                node = inventory.set_draining(request.path_params["node_id"], draining)
            except UnknownNode as exc:
                return _unknown(exc)
            return json_response(node_view(node, inventory.heartbeat_age(node)))

        action = "drain" if draining else "undrain"
        return Route(f"/admin/api/nodes/{{node_id}}/{action}", endpoint, methods=["POST"])

    async def remove_node_weights(request: Request) -> Response:
        if remove_weights is None:
            return error_response(
                503,
                "removing weights is not available: this server runs no agent service",
                code="not_available",
            )
        node_id = request.path_params["node_id"]
        try:
            inventory.node(node_id)
        except UnknownNode as exc:
            return _unknown(exc)
        path = await _weights_path(request)
        if isinstance(path, Response):
            return path
        log.info("removing weights %r on node %s (admin API)", path, node_id)
        try:
            await remove_weights(node_id, path)
        except AgentServiceError as exc:
            log.warning("weights %r on node %s not removed: %s", path, node_id, exc.message)
            return _agent_error(exc)
        return json_response({"node": node_id, "path": path, "removed": True})

    return [
        Route("/admin/api/nodes", list_nodes, methods=["GET"]),
        Route("/admin/api/nodes/{node_id}", show_node, methods=["GET"]),
        set_draining(True),
        set_draining(False),
        Route("/admin/api/nodes/{node_id}/weights/remove", remove_node_weights, methods=["POST"]),
    ]
