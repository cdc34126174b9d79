"""A prefix cache model: which leading blocks of a prompt the engine would not recompute.

Like vLLM's automatic prefix caching, a prompt is cut into full blocks of `block_size`
tokens and each block is named by a chained hash that covers it and every block before
it, so a block only matches when the whole prefix up to it matches. A prompt's cached
prefix is the longest run of leading blocks present. Blocks are kept in LRU order up to
`capacity_blocks`; when a prompt is looked up its blocks are touched from last to
first, so the first block of a chain is the freshest and eviction eats chains from
their tail, as vLLM does.

Not guaranteed: blocks in use by running requests are not pinned (the real engine
would never evict them), the trailing partial block is never cached, and hashes are
Python's `hash`, so a cache is only meaningful inside one process.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence


class PrefixCache:
    """Chained block hashes in LRU order; counts queries and hits in tokens."""

    def __init__(self, *, block_size: int, capacity_blocks: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        if capacity_blocks < 0:
            raise ValueError(f"capacity_blocks must not be negative, got {capacity_blocks}")
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.queries = 0
        self.hits = 0

    @property
    def used_blocks(self) -> int:
        return len(self._blocks)

    @property
    def usage(self) -> float:
        """Fraction of the capacity in use, 0.0 to 1.0 (0.0 when the cache is disabled)."""
        if self.capacity_blocks == 0:
            return 0.0
        return len(self._blocks) / self.capacity_blocks

    def block_hashes(self, namespace: Hashable, tokens: Sequence[Hashable]) -> list[int]:
        """The chained hash of every full block of `tokens`; `namespace` seeds the chain."""
        size = self.block_size
        chain = hash(namespace)
        hashes: list[int] = []
        for end in range(size, len(tokens) + 1, size):
            chain = hash((chain, tuple(tokens[end - size : end])))
            hashes.append(chain)
        return hashes

    def match_and_insert(self, namespace: Hashable, tokens: Sequence[Hashable]) -> int:
        """How many leading tokens of the prompt are cached; then caches all its full blocks.

        The lookup and the insert happen together because that is when the engine
        schedules the prompt: what it computes now is what the next request can reuse.
        """
        self.queries += len(tokens)
        if self.capacity_blocks == 0:
            return 0
        hashes = self.block_hashes(namespace, tokens)
        blocks = self._blocks
        matched = 0
        for block_hash in hashes:
            if block_hash not in blocks:
                break
            matched += 1
        for block_hash in reversed(hashes):
            blocks[block_hash] = None
            blocks.move_to_end(block_hash)
        while len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)
        cached = matched * self.block_size
        self.hits += cached
        return cached
