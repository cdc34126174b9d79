"""Chained block hashes of a request's prompt, for prefix affinity.

The prompt is walked as an engine's chat template would render it, without
serializing the body again: the tools first, then each message's role and text
in order, with a separator at each role boundary. The bytes are cut into blocks
of a fixed size and each block's hash covers every block before it (a chain),
so equal hashes mean equal prefixes and two prompts match block for block up
to where they differ. The last, partial block is hashed too, so that short
prompts have a key as well. The number of whole blocks before the first user
or assistant turn is returned with the chain: rendezvous hashing keys on that
shared head, not on a user's own words.

Hashes are BLAKE2b (8 bytes), stable across processes and machines: every
router replica computes the same chain for the same prompt, which rendezvous
hashing relies on. Work is capped by `max_bytes` from the start of the prompt.

Not guaranteed: that block boundaries fall where the engine's token blocks do;
the router estimates which endpoint holds a prefix, the engine decides.
"""

from __future__ import annotations

from collections.abc import Iterator
from hashlib import blake2b
from typing import Any

import orjson

_ROLE = b"\x00"


def _message_pieces(messages: list[Any]) -> Iterator[bytes]:
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        yield _ROLE + (role.encode() if isinstance(role, str) else b"?") + _ROLE
        content = message.get("content")
        if isinstance(content, str):
            yield content.encode()
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    yield part["text"].encode()
                else:
                    yield orjson.dumps(part)
        calls = message.get("tool_calls")
        if calls is not None:
            yield orjson.dumps(calls)


def _pieces(body: dict[str, Any]) -> Iterator[bytes]:
    tools = body.get("tools")
    if tools is not None:
        yield _ROLE + b"tools" + _ROLE + orjson.dumps(tools)
    messages = body.get("messages")
    if isinstance(messages, list):
        yield from _message_pieces(messages)
        return
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        yield prompt.encode()
    elif isinstance(prompt, list):
        for item in prompt:
            yield item.encode() if isinstance(item, str) else orjson.dumps(item)


_FIRST_TURN = (_ROLE + b"user" + _ROLE, _ROLE + b"assistant" + _ROLE)


def prompt_blocks(
    body: dict[str, Any], *, block_bytes: int, max_bytes: int
) -> tuple[list[int], int]:
    """The chained hashes of the prompt's blocks in `body` (chat or completions), and
    how many whole blocks lie before the first user or assistant turn (the shared
    head: tools and system prompt; 0 when there is none)."""
    parts: list[bytes] = []
    size = 0
    head = -1
    for piece in _pieces(body):
        if head < 0 and piece in _FIRST_TURN:
            head = size
        parts.append(piece)
        size += len(piece)
        if size >= max_bytes:
            break
    if not size:
        return [], 0
    data = memoryview(b"".join(parts))[:max_bytes]
    chain: list[int] = []
    # One running hash over the prompt, read at each block's end: block k's value
    # covers every byte before it, as a chain would, for one pass over the bytes.
    # Whole blocks only: engines cache whole blocks of tokens, so a tail shorter
    # than a block (or a prompt shorter than one) is nothing an engine keeps, and
    # affinity to it would pin every short prompt to one replica.
    running = blake2b(digest_size=8)
    from_bytes = int.from_bytes
    for start in range(0, len(data) - block_bytes + 1, block_bytes):
        running.update(data[start : start + block_bytes])
        chain.append(from_bytes(running.copy().digest(), "little"))
    return chain, max(0, head) // block_bytes
