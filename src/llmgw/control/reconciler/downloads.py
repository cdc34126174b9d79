"""Hub downloads as events: each one's start, every quarter of the way, and its end.

A node's agent reports a shard that waits for its hub weights with a `download`
(bytes done of the total, rate, files in flight). The controller hands every
shard report to `DownloadWatch.observe`, which follows one download per (node,
snapshot) however many shards wait for it, and returns what an operator should
read in `llmgw events` and the dashboard: `downloading org/name@abc1234 (15.2 GB)
on node n1`, `org/name@abc1234 on node n1: 50% of 15.2 GB, 120.0 MB/s, 1 min
left`, `downloaded org/name@abc1234 (15.2 GB) on node n1 in 2 min`.

Not guaranteed: an event for every quarter (a download faster than the agent's
report interval may pass several at once: only the furthest is told); the start
of a download this server began to watch mid-way (a leader that took over tells
it from where it first saw it, with the node's own start time for the duration).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from llmgw.control.inventory.model import Download, Shard
from llmgw.control.reconciler.disk import decimal_size

MILESTONES = (25, 50, 75)
"""Percentages told as events on the way (the end is told on its own)."""


@dataclass
class _Watched:
    download: Download
    first_seen: datetime  # this server's clock, when the node's start is unknown
    told: int = 0  # the furthest milestone already told
    shards: set[str] = field(default_factory=set)  # those waiting for it


@dataclass
class DownloadWatch:
    """The downloads under way on the fleet, as their shards last reported them."""

    _watched: dict[tuple[str, str, str], _Watched] = field(default_factory=dict)

    def observe(self, node_id: str, shard: Shard, now: datetime) -> list[str]:
        """The events a shard report makes (usually none)."""
        if shard.download is not None:
            return self._moved(node_id, shard, shard.download, now)
        for key, watched in list(self._watched.items()):
            if key[0] == node_id and shard.id in watched.shards:
                del self._watched[key]
                return [self._ended(node_id, shard, watched, now)]
        return []

    def forget_node(self, node_id: str) -> None:
        """A node removed from the fleet: its downloads are no longer followed."""
        for key in [k for k in self._watched if k[0] == node_id]:
            del self._watched[key]

    def _moved(self, node_id: str, shard: Shard, download: Download, now: datetime) -> list[str]:
        key = (node_id, download.repo, download.revision)
        watched = self._watched.get(key)
        events: list[str] = []
        if watched is None:
            watched = self._watched[key] = _Watched(download=download, first_seen=now)
            size = f" ({decimal_size(download.total)})" if download.total else ""
            events.append(f"downloading {download.short()}{size} on node {node_id}")
        watched.download = download
        watched.shards.add(shard.id)
        percent = download.percent or 0
        reached = max((m for m in MILESTONES if m <= percent), default=0)
        if reached > watched.told:
            watched.told = reached
            text = (
                f"{download.short()} on node {node_id}: {percent}% of "
                f"{decimal_size(download.total)}"
            )
            if download.rate > 0:
                text += f", {decimal_size(int(download.rate))}/s"
            eta = download.eta_seconds
            if eta is not None:
                text += f", {_duration(eta)} left"
            if download.files:
                text += f" ({download.files[0]})"
            events.append(text)
        return events

    def _ended(self, node_id: str, shard: Shard, watched: _Watched, now: datetime) -> str:
        download = watched.download
        began = download.started or watched.first_seen
        ended = shard.since if download.started is not None else now
        took = _duration(max(0.0, (ended - began).total_seconds()))
        size = decimal_size(download.total or download.done)
        if shard.state in ("failed", "stopped"):
            reason = f": {shard.message}" if shard.message else ""
            return (
                f"download of {download.short()} on node {node_id} ended at "
                f"{download.percent or 0}% of {size} after {took}{reason}"
            )
        return f"downloaded {download.short()} ({size}) on node {node_id} in {took}"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"
