"""Placement rules out a node whose disk cannot take the weights it must download.

The room is the free space plus what eviction could free (snapshots no live shard
runs), capped by the agent's watermark; explain names the shortfall per node, and
the fast path (`Fleet.place`) agrees with explain.
"""

from __future__ import annotations

import dataclasses

from test_placement import make_model, make_node, make_shard

from llmgw.control.inventory.model import HeldWeights, HostLimits, HostReading, Node
from llmgw.control.reconciler import Fleet, explain

GB = 10**9
COMMIT = "c" * 40


def disk(node: Node, total: int, free: int, **limits: float) -> Node:
    return dataclasses.replace(
        node, host=HostReading(disk_total=total, disk_free=free), limits=HostLimits(**limits)
    )


def test_room_is_free_plus_evictable_under_the_watermark() -> None:
    unused = HeldWeights("org/old", "a" * 40, 20 * GB, None)
    used = HeldWeights("org/busy", "b" * 40, 30 * GB, None)
    running = make_shard("r1", "busy", port=20000)  # weights org/busy
    node = dataclasses.replace(make_node("n"), weights=(unused, used), shards={"r1": running})
    # No watermark: nothing is evicted; only the free space counts.
    assert disk(node, 100 * GB, 10 * GB).weights_room() == 10 * GB
    # 85% of 100 GB with 90 GB used: -5 GB, plus the 20 GB no shard runs.
    at_85 = disk(node, 100 * GB, 10 * GB, weights_max_fraction=0.85)
    assert at_85.weights_evictable() == 20 * GB
    assert at_85.weights_room() == 15 * GB
    # A size limit: 60 GB of snapshots, 50 GB held, 20 GB evictable; the free space caps it.
    assert disk(node, 100 * GB, 10 * GB, weights_max_bytes=60 * GB).weights_room() == 30 * GB
    assert disk(node, 100 * GB, 5 * GB, weights_max_bytes=90 * GB).weights_room() == 25 * GB
    # An older agent that reported nothing: unknown, nothing ruled out.
    assert dataclasses.replace(node, host=HostReading()).weights_room() is None


def test_a_node_that_cannot_take_the_download_is_ruled_out_unless_it_holds_it() -> None:
    model = dataclasses.replace(
        make_model(), weights="org/llama@main", weights_commit=COMMIT, weights_bytes=15_200 * 10**6
    )
    full = disk(make_node("node-a"), 100 * GB, 3_100 * 10**6)
    roomy = disk(make_node("node-b"), 100 * GB, 50 * GB)
    result = explain(model, [full, roomy])
    assert result.placement is not None and result.placement.node_id == "node-b"
    [rejection] = result.verdicts[0].rejections
    assert rejection.node_id == "node-a"
    assert rejection.reason == "disk cannot take 15.2 GB: 3.1 GB free"
    fast = Fleet([full, roomy]).place(model)
    assert fast is not None and fast.node_id == "node-b"
    # Alone, it is not placed, and the summary says why.
    alone = explain(model, [full])
    assert alone.placement is None and "disk cannot take 15.2 GB" in alone.summary()
    assert Fleet([full]).place(model) is None
    # Holding the snapshot, it needs no room: it wins (locality).
    held = HeldWeights("org/llama", COMMIT, 15_200 * 10**6, None)
    holder = dataclasses.replace(full, weights=(held,))
    placed = Fleet([holder, roomy]).place(model)
    assert placed is not None and placed.node_id == "node-a"
    # The watermark and what eviction frees are named.
    marked = disk(make_node("node-a"), 100 * GB, 20 * GB, weights_max_fraction=0.85)
    reason = explain(model, [marked, roomy]).verdicts[0].rejections[0].reason
    assert reason == "disk cannot take 15.2 GB: 20.0 GB free, weights limited to 85% of the disk"
