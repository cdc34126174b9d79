"""Admin API for nodes: `/admin/api/nodes`, one node, the drain flag, weights removal,
removing a node.

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

`POST /admin/api/nodes/{node_id}/remove`, with an optional `{"reason": "..."}`,
revokes the node's certificate key (it cannot reconnect), closes its stream and
forgets it (see `agentsvc.removal`): 200 with what was done, 404 when neither
this server's inventory nor the store knows the node, 400 for a bad body, 503
when the store cannot be reached (nothing changed) or this server runs no agent
service.

`GET /admin/api/nodes` pages and filters on the server (`?limit=`, `?after=`,
`?state=`, `?q=`; see `paging`): a view is built only for the nodes on the page.

On a standby (given `fleet`), the node list and one node are the leader's view,
read from the store (see `leadership.fleet`), with `leader_view_at` saying when
the leader wrote it; 503 when the store cannot be read. Drain, undrain,
weights removal and node removal on a standby answer 409 naming the leader:
only the leader talks to agents.

Not guaranteed: the drain flag only marks the node so no new work is placed
there; moving its replicas away is the reconciler's job. The flag is not
stored and is forgotten on a server restart.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from llmgw.control.adminapi.paging import (
    BadPageQuery,
    PageQuery,
    page_query,
    take_page,
    words_of,
)
from llmgw.control.adminapi.responses import error_response, json_response
from llmgw.control.adminapi.views import node_view
from llmgw.control.agentsvc.errors import (
    AgentServiceError,
    CommandFailed,
    CommandTimeout,
    NodeNotConnected,
)
from llmgw.control.agentsvc.removal import DEFAULT_REASON, Removed
from llmgw.control.inventory.errors import UnknownNode
from llmgw.control.inventory.model import Node, NodeBrief
from llmgw.store import StoreError
from llmgw.store.nodeids import MAX_REASON

log = logging.getLogger(__name__)

RemoveWeights = Callable[[str, str], Awaitable[None]]
"""`remove_weights(node_id, path)`: the agent service's `Dispatcher.remove_weights`."""

RemoveNode = Callable[[str, str], Awaitable[Removed]]
"""`remove_node(node_id, reason)`: `NodeRemoval.remove`."""


class LeaderFleet(Protocol):
    """The leader's view of the nodes, for a standby; `FleetView` satisfies it."""

    def leading(self) -> bool: ...

    def leader(self) -> str | None: ...

    async def nodes(self) -> list[dict[str, Any]]: ...


class NodeDirectory(Protocol):
    """What the routes need of the inventory; `Inventory` satisfies it."""

    def nodes(self) -> Sequence[Node]: ...

    def briefs(self) -> Sequence[NodeBrief]: ...

    def node(self, node_id: str) -> Node: ...

    def set_draining(self, node_id: str, draining: bool) -> Node: ...

    def heartbeat_age(self, node: Node) -> float: ...


NODE_FILTER_STATES = ("ready", "unreachable", "lost", "draining")


def _in_state(state: str, draining: bool, wanted: str | None) -> bool:
    return wanted is None or (draining if wanted == "draining" else state == wanted)


def _node_matches(node: NodeBrief, query: PageQuery) -> bool:
    if not _in_state(node.state, node.draining, query.state):
        return False
    if not query.words:
        return True
    states = [node.state, "draining"] if node.draining else [node.state]
    text = words_of(node.id, node.hostname, *states, labels=(node.labels, node.fabric))
    return all(w in text for w in query.words)


def _view_matches(view: dict[str, Any], query: PageQuery) -> bool:
    state, draining = str(view.get("state", "")), bool(view.get("draining"))
    if not _in_state(state, draining, query.state):
        return False
    if not query.words:
        return True
    states = [state, "draining"] if draining else [state]
    text = words_of(
        view.get("id", ""),
        view.get("hostname", ""),
        *states,
        labels=(view.get("labels"), view.get("fabric")),
    )
    return all(w in text for w in query.words)


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


async def _removal_reason(request: Request) -> str | Response:
    """The body's optional `reason`, or the 400 answer saying what the body may be."""
    raw = await request.body()
    try:
        body = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError as exc:
        return error_response(400, f"the body is not valid JSON: {exc}", code="invalid_json")
    reason = body.get("reason", DEFAULT_REASON) if isinstance(body, dict) else None
    if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON:
        return error_response(
            400,
            f'send nothing, or a JSON object {{"reason": "..."}} with a reason of 1 to '
            f"{MAX_REASON} characters (it is kept with the revoked key)",
            code="invalid_reason",
            param="reason",
        )
    return reason.strip()


def _removed_view(removed: Removed) -> dict[str, object]:
    revocation = removed.revocation
    return {
        "node": removed.node_id,
        "removed": True,
        "revoked": revocation is not None,
        "key_hash": None if revocation is None else revocation.key_hash,
        "revoked_at": None if revocation is None else revocation.revoked_at.isoformat(),
        "reason": None if revocation is None else revocation.reason,
        "stream_closed": removed.closed_peer is not None,
        "peer": removed.closed_peer,
        "forgotten": removed.forgotten,
        "message": removed.summary(),
    }


def _agent_error(exc: AgentServiceError) -> Response:
    if isinstance(exc, NodeNotConnected):
        return error_response(409, exc.message, code="node_not_connected", param="node_id")
    if isinstance(exc, CommandFailed):
        return error_response(400, exc.message, code="weights_refused", param="path")
    if isinstance(exc, CommandTimeout):
        return error_response(504, exc.message, code="node_timeout")
    return error_response(502, exc.message, code="agent_error")


def node_routes(
    *,
    inventory: NodeDirectory,
    remove_weights: RemoveWeights | None = None,
    remove_node: RemoveNode | None = None,
    fleet: LeaderFleet | None = None,
) -> list[Route]:
    """The node routes; without `remove_weights` / `remove_node` (no agent service)
    weights removal and node removal answer 503. With `fleet`, a standby shows
    the leader's nodes (see the module docstring)."""

    def standby() -> LeaderFleet | None:
        """`fleet` when this server is a standby, else None (its inventory is the fleet)."""
        return fleet if fleet is not None and not fleet.leading() else None

    async def leader_nodes(source: LeaderFleet) -> list[dict[str, Any]] | Response:
        try:
            return await source.nodes()
        except StoreError as exc:
            return error_response(
                503,
                f"this server is a standby and cannot read the leader's view of the nodes "
                f"from the store: {exc}",
                code="store_unavailable",
            )

    def standby_refusal(source: LeaderFleet, node_id: str) -> Response:
        leader = source.leader()
        where = f"the leader, {leader}," if leader else "the leader (none is known right now)"
        return error_response(
            409,
            f"this server is a standby; only {where} talks to agents: run this against "
            f"the leader's admin listener to change node {node_id!r}",
            code="not_leader",
        )

    async def list_nodes(request: Request) -> Response:
        try:
            query = page_query(request.query_params, states=NODE_FILTER_STATES)
        except BadPageQuery as exc:
            return error_response(400, str(exc), code="invalid_parameter", param=exc.param)
        if (source := standby()) is not None:
            found = await leader_nodes(source)
            if isinstance(found, Response):
                return found
            leader = take_page(
                found,
                key=lambda v: str(v["id"]),
                query=query,
                matches=lambda v: _view_matches(v, query),
            )
            return json_response(
                {"nodes": leader.items, "total": leader.total, "next_after": leader.next_after}
            )
        # Filter and page on the briefs first: a node is copied and viewed only
        # when it is on the page.
        page = take_page(
            inventory.briefs(),
            key=lambda n: n.id,
            query=query,
            matches=lambda n: _node_matches(n, query),
        )
        views = []
        for brief in page.items:
            try:
                node = inventory.node(brief.id)
            except UnknownNode:
                continue  # removed since the briefs were read
            views.append(node_view(node, inventory.heartbeat_age(node)))
        return json_response({"nodes": views, "total": page.total, "next_after": page.next_after})

    async def show_node(request: Request) -> Response:
        if (source := standby()) is not None:
            found = await leader_nodes(source)
            if isinstance(found, Response):
                return found
            node_id = request.path_params["node_id"]
            for view in found:
                if view.get("id") == node_id:
                    return json_response(view)
            return error_response(
                404,
                f"no node {node_id!r} in the leader's view of the fleet "
                "(`llmgw nodes list` shows the known ones)",
                code="node_not_found",
                param="node_id",
            )
        try:
            node = inventory.node(request.path_params["node_id"])
        except UnknownNode as exc:
            return _unknown(exc)
        return json_response(node_view(node, inventory.heartbeat_age(node)))

    def set_draining(draining: bool) -> Route:
        async def endpoint(request: Request) -> Response:
            if (source := standby()) is not None:
                return standby_refusal(source, request.path_params["node_id"])
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
        if (source := standby()) is not None:
            return standby_refusal(source, node_id)
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

    async def remove(request: Request) -> Response:
        if remove_node is None:
            return error_response(
                503,
                "removing nodes is not available: this server runs no agent service",
                code="not_available",
            )
        node_id = request.path_params["node_id"]
        if (source := standby()) is not None:
            # The node's stream and inventory entry are the leader's to end.
            return standby_refusal(source, node_id)
        reason = await _removal_reason(request)
        if isinstance(reason, Response):
            return reason
        try:
            removed = await remove_node(node_id, reason)
        except UnknownNode:
            return error_response(
                404,
                f"no node {node_id!r} to remove: this server has no such node and the store "
                "has no certificate key for it (`llmgw nodes list` shows the known ones)",
                code="node_not_found",
                param="node_id",
            )
        except StoreError as exc:
            return error_response(
                503,
                f"node {node_id!r} was not removed, nothing changed: {exc}",
                code="store_unavailable",
            )
        return json_response(_removed_view(removed))

    return [
        Route("/admin/api/nodes", list_nodes, methods=["GET"]),
        Route("/admin/api/nodes/{node_id}/remove", remove, methods=["POST"]),
        Route("/admin/api/nodes/{node_id}", show_node, methods=["GET"]),
        set_draining(True),
        set_draining(False),
        Route("/admin/api/nodes/{node_id}/weights/remove", remove_node_weights, methods=["POST"]),
    ]
