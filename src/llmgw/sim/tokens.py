"""Deterministic tokenizer and text generator of the simulated engine.

The tokenizer splits text into words and single punctuation marks; a token is a
string, and a chat prompt is the tokens of every message plus a fixed per-message
overhead. The generator answers a prompt with words from a fixed vocabulary, each
token one word with a leading space, chosen by a hash of the prompt and the seed, so
the same prompt gives the same text on every run and every machine.

In `sequence` mode (`counting`) an answer counts instead: ` w1 w2 w3 ...`, or from
`w(N+1)` when the text it continues ends with `wN`, so a stream spliced from several
answers shows any gap or repeated token.

Not guaranteed: any relation to a real tokenizer's counts, or that two different
prompts give different text (prompts share one precomputed word stream and only pick
their starting point in it).
"""

from __future__ import annotations

import random
import re
import zlib
from collections.abc import Hashable, Sequence
from typing import Final

_TOKEN_PATTERN: Final = re.compile(r"\w+|[^\w\s]")

# Tokens a chat template would add around each message: start marker, role, separator,
# end marker. Four, like the overhead OpenAI documents for its chat format.
CHAT_MESSAGE_OVERHEAD: Final = 4

VOCABULARY: Final = (
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with",
    "on", "by", "at", "from", "this", "model", "token", "request", "server", "cache",
    "prefix", "batch", "stream", "latency", "router", "replica", "engine", "gateway",
    "quickly", "slowly", "every", "some", "many", "few", "data", "answer", "question",
    "system", "user", "assistant", "text", "word", "sentence", "value", "result", "time",
    "node", "memory", "block", "queue", "load", "balance", "health", "metric", "simple",
    "large", "small", "fast", "green", "blue", "river", "mountain",
)  # fmt: skip

# Length of the precomputed word stream; a prompt's hash picks where in it the answer
# starts. Long enough that answers of typical lengths rarely overlap.
_STREAM_LENGTH: Final = 8192


def tokenize(text: str) -> list[str]:
    """The tokens of `text`: runs of word characters and single other non-space chars."""
    return _TOKEN_PATTERN.findall(text)


def count_tokens(text: str) -> int:
    return len(_TOKEN_PATTERN.findall(text))


def chat_tokens(messages: Sequence[tuple[str, str]], *, open_last: bool = False) -> list[Hashable]:
    """The prompt tokens of a chat: per message (role, text), the overhead markers and text.

    The role is part of the tokens so that a prefix cache sees the same chain for the
    same conversation prefix, and a different one when only roles differ. With
    `open_last` the final message has no end marker: it is being continued.
    """
    tokens: list[Hashable] = []
    for role, text in messages:
        tokens.append("<|start|>")
        tokens.append(role)
        tokens.append("<|sep|>")
        tokens.extend(_TOKEN_PATTERN.findall(text))
        tokens.append("<|end|>")
    if open_last and tokens:
        tokens.pop()
    return tokens


class TextGenerator:
    """Picks the tokens of an answer from a word stream fixed by the seed.

    Everything random happens once, in the constructor; an answer is a slice of a
    precomputed tuple, which keeps the per-request cost flat for zero-delay benchmarks.
    """

    def __init__(self, *, seed: int) -> None:
        rng = random.Random(seed)
        stream = tuple(" " + rng.choice(VOCABULARY) for _ in range(_STREAM_LENGTH))
        self._stream = stream
        # Doubled so that any answer up to the stream's length is one slice, no wrapping.
        self._doubled = stream + stream
        self._salt = zlib.crc32(seed.to_bytes(16, "little", signed=True))

    def tokens(self, key: bytes, count: int) -> Sequence[str]:
        """`count` tokens answering the prompt whose canonical bytes are `key`."""
        start = zlib.crc32(key, self._salt) % _STREAM_LENGTH
        if count <= _STREAM_LENGTH:
            return self._doubled[start : start + count]
        whole, rest = divmod(count, _STREAM_LENGTH)
        rotated = self._doubled[start : start + _STREAM_LENGTH]
        return rotated * whole + rotated[:rest]


def counting(after: int, count: int) -> list[str]:
    """`count` tokens of the counting sequence after `wN` (N = `after`): ` w{N+1}`, ..."""
    return [f" w{n}" for n in range(after + 1, after + 1 + count)]
