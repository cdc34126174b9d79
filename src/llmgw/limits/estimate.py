"""A cheap estimate of a request's prompt tokens, taken before it is sent upstream.

Roughly 4 characters per token plus a few tokens of framing per chat message,
the rule of thumb OpenAI documents for English text. It is deliberately not a
tokenizer: it costs microseconds, is wrong by tens of percent for code or
non-Latin scripts, and the limiter corrects TPM and budgets with the real usage
afterwards. `max_tokens` is not counted (completion tokens are charged when
they are known). Never raises on odd bodies: fields it does not understand
count nothing, since validating requests is the router's job.
"""

from __future__ import annotations

from typing import Any

import orjson

_CHARS_PER_TOKEN = 4
_PER_MESSAGE = 4  # role and separators around each chat message
_PER_REPLY = 3  # the assistant reply is primed with a few tokens
_PER_NON_TEXT_PART = 85  # an image or audio part; OpenAI's low-detail image cost


def estimate_prompt_tokens(body: dict[str, Any]) -> int:
    """Estimated prompt tokens of a chat, completion or embedding request body."""
    chars = 0
    tokens = 0
    messages = body.get("messages")
    if isinstance(messages, list):
        tokens += _PER_REPLY
        for message in messages:
            tokens += _PER_MESSAGE
            if not isinstance(message, dict):
                continue
            content = message.get("content")
            if isinstance(content, str):
                chars += len(content)
            elif isinstance(content, list):
                for part in content:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        chars += len(part["text"])
                    elif isinstance(part, str):
                        chars += len(part)
                    else:
                        tokens += _PER_NON_TEXT_PART
            name = message.get("name")
            if isinstance(name, str):
                chars += len(name)
            tool_calls = message.get("tool_calls")
            if tool_calls:
                chars += _json_chars(tool_calls)
    for field in ("prompt", "input"):
        value = body.get(field)
        if value is not None:
            more_chars, more_tokens = _text_or_ids(value)
            chars += more_chars
            tokens += more_tokens
    for field in ("tools", "functions"):
        value = body.get(field)
        if value:
            chars += _json_chars(value)
    return tokens + -(-chars // _CHARS_PER_TOKEN)


def _text_or_ids(value: object) -> tuple[int, int]:
    """(characters, tokens) of a prompt/input: text, token ids, or lists of either."""
    if isinstance(value, str):
        return len(value), 0
    if isinstance(value, int):
        return 0, 1
    if isinstance(value, list):
        chars = tokens = 0
        for item in value:
            more_chars, more_tokens = _text_or_ids(item)
            chars += more_chars
            tokens += more_tokens
        return chars, tokens
    return 0, 0


def _json_chars(value: object) -> int:
    try:
        return len(orjson.dumps(value))
    except TypeError:  # not JSON-serialisable: not something the upstream will accept either
        return 0
