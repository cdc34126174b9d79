"""A token bucket in process memory: the per-process state of one RPM or TPM limit.

Capacity is the per-minute limit and it refills continuously at limit/60 per
second, so a key can burst its whole minute at once and then proceeds at the
steady rate. The level may go below zero: TPM is charged an estimate up front
and corrected after the response, and an under-estimate is paid back by later
requests waiting longer. Not thread-safe (one event loop owns it); not shared
between processes (that is `redis_counters`).
"""

from __future__ import annotations


def need(cost: int, capacity: int) -> float:
    """The level a request of `cost` requires before it is admitted.

    At least 1, so a bucket driven negative by an under-estimate refuses even
    zero-token requests until it has refilled; at most the capacity, so a
    request larger than the whole per-minute limit is not refused forever but
    admitted when the bucket is full (and then drives it negative).
    """
    return float(min(max(cost, 1), capacity))


class TokenBucket:
    """Level, capacity and the time of the last refill of one bucket."""

    __slots__ = ("capacity", "level", "rate", "updated")

    def __init__(self, capacity: int, now: float) -> None:
        self.capacity = capacity
        self.rate = capacity / 60.0
        self.level = float(capacity)
        self.updated = now

    def refill(self, now: float, capacity: int) -> float:
        """Bring the level up to `now` (and to a changed capacity); return it."""
        if capacity != self.capacity:
            self.capacity = capacity
            self.rate = capacity / 60.0
            self.level = min(self.level, float(capacity))
        if now > self.updated:
            level = self.level + (now - self.updated) * self.rate
            self.level = level if level < capacity else float(capacity)
            self.updated = now
        return self.level

    def wait(self, cost: int) -> float:
        """Seconds until a request of `cost` fits (0 when it fits now)."""
        short = need(cost, self.capacity) - self.level
        return short / self.rate if short > 0 else 0.0

    def adjust(self, delta: int) -> None:
        """Charge `delta` more tokens (negative gives back, never above capacity)."""
        level = self.level - delta
        self.level = level if level < self.capacity else float(self.capacity)
