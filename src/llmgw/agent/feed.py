"""Fan-out of shard reports from the supervisor to whoever is listening.

The supervisor publishes every transition; the connection subscribes while a
stream is open. Publishing with no subscriber drops the report on purpose:
the next Register carries every shard's current state, so nothing that matters
is lost while disconnected.

Not guaranteed: delivery. Subscribers must not block (they queue).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from llmgw.agent.shard import ShardReport


class StatusFeed:
    """Delivers each published report to the current subscribers, synchronously."""

    def __init__(self) -> None:
        self._subscribers: list[Callable[[ShardReport], None]] = []

    def publish(self, report: ShardReport) -> None:
        for subscriber in list(self._subscribers):
            subscriber(report)

    @contextmanager
    def subscribe(self, subscriber: Callable[[ShardReport], None]) -> Iterator[None]:
        self._subscribers.append(subscriber)
        try:
            yield
        finally:
            self._subscribers.remove(subscriber)
