"""The prefix cache: chained full blocks, longest leading match, LRU eviction by chain tail."""

from __future__ import annotations

import pytest

from llmgw.sim.cache import PrefixCache


def _prompt(prefix: str, count: int) -> list[str]:
    return [f"{prefix}{index}" for index in range(count)]


def test_first_query_misses_then_full_blocks_hit() -> None:
    cache = PrefixCache(block_size=4, capacity_blocks=100)
    prompt = _prompt("t", 10)  # two full blocks and a partial one
    assert cache.match_and_insert("m", prompt) == 0
    assert cache.used_blocks == 2
    assert cache.match_and_insert("m", prompt) == 8
    assert (cache.queries, cache.hits) == (20, 8)


def test_only_the_shared_leading_blocks_match() -> None:
    cache = PrefixCache(block_size=4, capacity_blocks=100)
    cache.match_and_insert("m", _prompt("t", 12))
    diverging = [*_prompt("t", 6), "x", *_prompt("t", 12)[7:]]  # differs inside block 1
    assert cache.match_and_insert("m", diverging) == 4
    # Block 2 is identical on its own, but its chain hash covers the diverging block 1.
    assert cache.match_and_insert("m", [*_prompt("u", 8), *_prompt("t", 12)[8:]]) == 0


def test_namespaces_do_not_share_blocks() -> None:
    cache = PrefixCache(block_size=4, capacity_blocks=100)
    cache.match_and_insert("model-a", _prompt("t", 8))
    assert cache.match_and_insert("model-b", _prompt("t", 8)) == 0


def test_lru_eviction_drops_the_least_recently_used_chain_tail_first() -> None:
    cache = PrefixCache(block_size=2, capacity_blocks=4)
    first = _prompt("a", 4)  # 2 blocks
    second = _prompt("b", 4)  # 2 blocks
    cache.match_and_insert("m", first)
    cache.match_and_insert("m", second)
    assert cache.usage == 1.0
    cache.match_and_insert("m", first)  # touch: now `second` is the least recently used
    cache.match_and_insert("m", _prompt("c", 2))  # one new block evicts second's tail
    assert cache.used_blocks == 4
    assert cache.match_and_insert("m", first) == 4
    # second's head survived, its tail was evicted: a one-block prefix still matches.
    assert cache.match_and_insert("m", second) == 2


def test_zero_capacity_disables_the_cache() -> None:
    cache = PrefixCache(block_size=2, capacity_blocks=0)
    cache.match_and_insert("m", _prompt("a", 4))
    assert cache.match_and_insert("m", _prompt("a", 4)) == 0
    assert cache.usage == 0.0
    assert cache.queries == 8


def test_invalid_sizes_are_rejected() -> None:
    with pytest.raises(ValueError, match="block_size"):
        PrefixCache(block_size=0, capacity_blocks=1)
    with pytest.raises(ValueError, match="capacity_blocks"):
        PrefixCache(block_size=1, capacity_blocks=-1)
