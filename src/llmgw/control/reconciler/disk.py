"""How many bytes of new weights a node's disk can take, and why not when it cannot.

A node that must download a model's hub snapshot needs room for it on the disk
of its weights directory (`Node.weights_room`): the free space plus what the
agent's eviction (`--weights-max-use`) could free, the snapshots no shard on the
node runs; under a watermark at most what the watermark leaves (a share of the
disk: that share of its size less what is used; a size: that size less the
snapshots held), again plus what eviction could free.

Pure functions over the inventory's view of a node (heartbeats carry the disk
figures, Register the limits). Not guaranteed: downloads placed on one node in
the same plan are each weighed against the same free space, and files other
than snapshots that share the disk can fill it between two heartbeats.
"""

from __future__ import annotations

from llmgw.control.inventory.model import Node


def decimal_size(count: int) -> str:
    """Bytes as the hub counts them (1 GB = 10^9 bytes)."""
    value = float(count)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


def shortfall(node: Node, size: int) -> str | None:
    """Why the node's disk cannot take `size` bytes of weights, or None when it can
    (or when it has not said)."""
    fits = node.weights_room()
    if fits is None or size <= fits:
        return None
    said = f"disk cannot take {decimal_size(size)}: {decimal_size(node.host.disk_free)} free"
    freeable = node.weights_evictable()
    if freeable:
        said += f", {decimal_size(freeable)} of unused snapshots evictable"
    limits = node.limits
    if limits.weights_max_fraction > 0:
        said += f", weights limited to {limits.weights_max_fraction * 100:g}% of the disk"
    elif limits.weights_max_bytes > 0:
        said += f", weights limited to {decimal_size(limits.weights_max_bytes)}"
    return said
