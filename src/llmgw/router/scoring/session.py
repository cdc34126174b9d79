"""Session affinity: back to the endpoint that served the session last.

The session key comes from a header (`router.routing.session_header`), the
OpenAI `user` field, or (when configured) the API key. The balancer resolves it;
this scorer only remembers session -> endpoint, in a bounded LRU whose entries
expire with the prefix index's TTL (after that the engine holds nothing of the
session anyway).

Not guaranteed: that a session stays on one endpoint; other signals may win
(on its own, pinning spreads shared system prompts over every replica).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from llmgw.router.endpoints import Endpoint
from llmgw.router.scoring import RouteRequest


class SessionScorer:
    name = "session"

    def __init__(self, *, capacity: int, ttl: float, clock: Callable[[], float]) -> None:
        self._capacity = capacity
        self._ttl = ttl
        self._clock = clock
        self._last: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def endpoint_of(self, session: str) -> str | None:
        entry = self._last.get(session)
        if entry is None or entry[1] < self._clock() - self._ttl:
            return None
        return entry[0]

    def score(self, request: RouteRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        target = self.endpoint_of(request.session) if request.session is not None else None
        return [1.0 if ep.id == target else 0.0 for ep in endpoints]

    def chosen(self, request: RouteRequest, endpoint: Endpoint) -> None:
        session = request.session
        if session is None:
            return
        self._last[session] = (endpoint.id, self._clock())
        self._last.move_to_end(session)
        while len(self._last) > self._capacity:
            self._last.popitem(last=False)
