"""The inventory's exception tree.

`InventoryError` is the base; `UnknownNode` is the only failure callers are
expected to handle (an admin asked about a node no agent has registered).
"""

from __future__ import annotations


class InventoryError(Exception):
    """Base of every failure the inventory reports."""


class UnknownNode(InventoryError):
    """No agent has registered a node with this id since the server started."""

    def __init__(self, node_id: str) -> None:
        super().__init__(
            f"no node {node_id!r} is known: no agent has registered with that id since this "
            "server started (`llmgw nodes list` shows the known ones)"
        )
        self.node_id = node_id
