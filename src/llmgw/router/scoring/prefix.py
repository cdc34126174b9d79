"""Prefix affinity: send a prompt where its prefix was sent before.

Each endpoint has an approximate index of the block chains recently sent to it
(`blocks.prompt_blocks`): a bounded LRU of block hashes with the time each was
last sent, entries older than the TTL counting as gone. An endpoint's score is
the fraction of the request's blocks whose prefix it holds.

A chain is inserted last block first, so a prompt's first blocks are always the
most recent ones of their chain: LRU eviction takes a conversation's tail
before its system prompt, as an engine's prefix cache does. That keeps "block k
is held" implying "blocks before k are held", so the longest held prefix is
found by binary search: O(log n) look-ups per endpoint, not O(n).

Not guaranteed: that the engine still holds what the index says; the engine
evicts by its own memory pressure, which the TTL and size only approximate.
An index lives in this router, learning from its own placements; with
`router.routing.redis_url` it also applies the other routers' (`share`), and
without it rendezvous hashing makes independent routers agree on most cold
prefixes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence

from llmgw.router.endpoints import Endpoint
from llmgw.router.scoring import RouteRequest


class PrefixIndex:
    """Per endpoint: block hash -> last time it was sent there (LRU, bounded)."""

    def __init__(self, *, capacity: int, ttl: float, clock: Callable[[], float]) -> None:
        self._capacity = capacity
        self._ttl = ttl
        self._clock = clock
        self._by_endpoint: dict[str, OrderedDict[int, float]] = {}

    def add(self, endpoint_id: str, chain: Sequence[int]) -> None:
        blocks = self._by_endpoint.get(endpoint_id)
        if blocks is None:
            blocks = self._by_endpoint[endpoint_id] = OrderedDict()
        now = self._clock()
        move = blocks.move_to_end
        for block in reversed(chain):
            blocks[block] = now
            move(block)
        while len(blocks) > self._capacity:
            blocks.popitem(last=False)

    def match(self, endpoint_id: str, chain: Sequence[int]) -> int:
        """How many leading blocks of `chain` the endpoint holds (not expired)."""
        blocks = self._by_endpoint.get(endpoint_id)
        if not blocks or not chain:
            return 0
        oldest = self._clock() - self._ttl
        get = blocks.get
        low, high = 0, len(chain)
        while low < high:
            mid = (low + high + 1) // 2
            seen = get(chain[mid - 1])
            if seen is not None and seen >= oldest:
                low = mid
            else:
                high = mid - 1
        return low

    def size(self, endpoint_id: str) -> int:
        blocks = self._by_endpoint.get(endpoint_id)
        return len(blocks) if blocks else 0

    def keep_only(self, endpoint_ids: Collection[str]) -> None:
        """Forget endpoints that left the pool."""
        for endpoint_id in [i for i in self._by_endpoint if i not in endpoint_ids]:
            del self._by_endpoint[endpoint_id]


class PrefixScorer:
    """Score: the fraction of the prompt's blocks whose prefix the endpoint holds."""

    name = "prefix"

    def __init__(self, *, index: PrefixIndex) -> None:
        self._index = index

    def score(self, request: RouteRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        chain = request.blocks
        if not chain:
            return [0.0] * len(endpoints)
        total = len(chain)
        match = self._index.match
        return [match(ep.id, chain) / total for ep in endpoints]

    def chosen(self, request: RouteRequest, endpoint: Endpoint) -> None:
        if request.blocks:
            self._index.add(endpoint.id, request.blocks)
