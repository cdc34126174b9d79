"""The sim's tokenizer, text generator and embedding vectors are deterministic."""

from __future__ import annotations

import math

from llmgw.sim.tokens import (
    CHAT_MESSAGE_OVERHEAD,
    VOCABULARY,
    TextGenerator,
    chat_tokens,
    count_tokens,
    tokenize,
)
from llmgw.sim.vectors import unit_vector


def test_tokenizer_splits_words_and_punctuation() -> None:
    assert tokenize("Hello, world! It's 42.") == [
        "Hello",
        ",",
        "world",
        "!",
        "It",
        "'",
        "s",
        "42",
        ".",
    ]
    assert count_tokens("Hello, world! It's 42.") == 9
    assert count_tokens("   ") == 0


def test_chat_tokens_add_a_fixed_overhead_per_message() -> None:
    turns = [("system", "Be brief."), ("user", "What is two plus two?")]
    tokens = chat_tokens(turns)
    assert len(tokens) == 3 + 6 + 2 * CHAT_MESSAGE_OVERHEAD
    # The same conversation prefix gives the same leading tokens (what a prefix cache needs).
    longer = chat_tokens([*turns, ("assistant", "Four.")])
    assert longer[: len(tokens)] == tokens


def test_same_prompt_same_text_across_generators() -> None:
    first = TextGenerator(seed=7).tokens(b"the prompt", 20)
    second = TextGenerator(seed=7).tokens(b"the prompt", 20)
    assert list(first) == list(second)
    assert list(TextGenerator(seed=8).tokens(b"the prompt", 20)) != list(first)


def test_each_token_is_one_vocabulary_word_with_a_leading_space() -> None:
    tokens = TextGenerator(seed=0).tokens(b"anything", 50)
    assert len(tokens) == 50
    for token in tokens:
        assert token.startswith(" ")
        assert token[1:] in VOCABULARY
    # The tokenizer counts the generated text as exactly as many tokens.
    assert count_tokens("".join(tokens)) == 50


def test_answers_longer_than_the_word_stream_keep_their_length() -> None:
    tokens = TextGenerator(seed=0).tokens(b"long", 20_000)
    assert len(tokens) == 20_000


def test_embedding_vectors_are_deterministic_unit_vectors() -> None:
    first = unit_vector(b"hello", 64)
    assert first == unit_vector(b"hello", 64)
    assert first != unit_vector(b"hellO", 64)
    assert len(first) == 64
    assert math.isclose(math.fsum(value * value for value in first), 1.0, rel_tol=1e-9)
