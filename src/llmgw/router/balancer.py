"""Least-outstanding-requests balancing by the power of two random choices.

Two random healthy candidates are drawn and the one with fewer requests in
flight wins: close to the best choice at O(1) cost, and without the herd that
"always the least loaded" causes when many routers share stale counts.
Not guaranteed: fairness between models; each model's endpoints are balanced
on their own.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Sequence

from llmgw.router.endpoints import Endpoint


class Balancer:
    def __init__(self, *, clock: Callable[[], float], rng: random.Random) -> None:
        self._clock = clock
        self._rng = rng

    def pick(self, endpoints: Sequence[Endpoint], exclude: Collection[Endpoint]) -> Endpoint | None:
        now = self._clock()
        candidates = [ep for ep in endpoints if ep not in exclude and ep.available(now)]
        count = len(candidates)
        if count == 0:
            return None
        if count == 1:
            return candidates[0]
        randrange = self._rng.randrange
        i = randrange(count)
        j = randrange(count - 1)
        if j >= i:
            j += 1
        first, second = candidates[i], candidates[j]
        return first if first.in_flight <= second.in_flight else second
