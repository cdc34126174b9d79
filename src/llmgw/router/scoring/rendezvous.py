"""Rendezvous (highest-random-weight) hashing of a prompt's first blocks.

For a prefix no endpoint has seen, every router replica must pick the same
endpoint without talking to the others. Each endpoint gets the weight
hash(prefix key, endpoint id); the highest wins. The key is the chained hash of
the prompt's shared head (tools and system prompt, at most `key_blocks`
blocks; the first `key_blocks` blocks when there is no such head), so the
conversations that share a system prompt meet on one replica. Adding or
removing an endpoint moves only the prefixes that endpoint wins or held.

Scores are by rank among the candidates (1 for the winner, then evenly lower),
so only the order matters, which is the same on every router.

Not guaranteed: balance. Which prefixes land together is chance; the load
scorer and the balance guard correct it.
"""

from __future__ import annotations

from collections.abc import Sequence
from hashlib import blake2b

from llmgw.router.endpoints import Endpoint
from llmgw.router.scoring import RouteRequest


def rendezvous_weight(key: int, endpoint_id: str) -> int:
    data = key.to_bytes(8, "little") + endpoint_id.encode()
    return int.from_bytes(blake2b(data, digest_size=8).digest(), "little")


class RendezvousScorer:
    name = "rendezvous"

    def __init__(self, *, key_blocks: int) -> None:
        self._key_blocks = key_blocks

    def score(self, request: RouteRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        count = len(endpoints)
        chain = request.blocks
        if not chain or count < 2:
            return [0.0] * count
        head = request.head_blocks or self._key_blocks
        key = chain[min(len(chain), head, self._key_blocks) - 1]
        weights = [rendezvous_weight(key, ep.id) for ep in endpoints]
        order = sorted(range(count), key=weights.__getitem__, reverse=True)
        scores = [0.0] * count
        for rank, index in enumerate(order):
            scores[index] = 1.0 - rank / (count - 1)
        return scores

    def chosen(self, request: RouteRequest, endpoint: Endpoint) -> None:
        return None
