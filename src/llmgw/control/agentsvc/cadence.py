"""The heartbeat interval the server hands out, growing with the fleet.

Every connected agent heartbeats every interval, so the server's heartbeat work
grows with the fleet. `HeartbeatCadence` keeps the configured interval up to
`scale_above` connected nodes; with more it hands out the configured interval
times ceil(nodes / scale_above), so at most about `scale_above` heartbeats
arrive per configured interval, whatever the fleet's size. The factor is a
whole number and moves in steps, so a fleet hovering around a boundary does
not change every agent's interval with each registration: it grows as soon as
the nodes exceed a step and shrinks only once they are a tenth of a step below
the smaller one.

The servicer tells each agent its interval at registration and, for agents that
follow `HeartbeatInterval` messages, again when the factor changes; the
inventory scales each node's missed-heartbeat thresholds by the factor that
node was told.

Not guaranteed: a bound on the heartbeats of agents that do not follow
`HeartbeatInterval` (older agents). They keep the interval of their
registration, and their thresholds stay at that interval's.
"""

from __future__ import annotations

import math

# Shrink only this share of a step below the boundary (hysteresis).
_SHRINK_MARGIN = 0.1


class HeartbeatCadence:
    """The current heartbeat factor for a count of connected nodes."""

    def __init__(self, *, interval: float, scale_above: int) -> None:
        if interval <= 0 or scale_above < 1:
            raise ValueError(
                f"needs interval > 0 and scale_above >= 1, got {interval:g} / {scale_above}"
            )
        self._base = interval
        self._scale_above = scale_above
        self._factor = 1

    @property
    def factor(self) -> int:
        """How many times the configured interval agents are told now."""
        return self._factor

    @property
    def interval(self) -> float:
        """The interval handed out now, in seconds."""
        return self._base * self._factor

    def interval_for(self, factor: float) -> float:
        """The interval, in seconds, of a node told `factor`."""
        return self._base * factor

    def update(self, nodes: int) -> bool:
        """Follow the count of connected nodes; True when the factor changed."""
        wanted = max(1, math.ceil(nodes / self._scale_above))
        if wanted > self._factor:
            self._factor = wanted
            return True
        if wanted < self._factor:
            # Down to the largest factor whose boundary the nodes are well below.
            margin = _SHRINK_MARGIN * self._scale_above
            lower = max(1, math.ceil((nodes + margin) / self._scale_above))
            if lower < self._factor:
                self._factor = lower
                return True
        return False
