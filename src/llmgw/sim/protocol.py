"""Parsing and checking OpenAI request bodies into what the engine needs.

Each parser takes the decoded JSON body and returns a small frozen record, or raises
`SimError` (400) naming the offending field. The model name is returned as sent (or
None) and checked against the served names by the caller.

A chat with `continue_final_message: true` continues its final message instead of
starting a new one, as vLLM's does: the message is left open (no end marker in the
prompt) and, like vLLM, the sim refuses it together with `add_generation_prompt: true`
(vLLM's default, so a client must send `add_generation_prompt: false` too).
`sequence_after` is the last number of the counting sequence (`w17`) the continued
text ends with: the final message of a continued chat, the prompt of a completion.

Not guaranteed: only the fields the sim acts on are checked (model, messages/prompt/
input, max_tokens, max_completion_tokens, stream, stream_options, continue_final_message,
add_generation_prompt); everything else,
such as temperature or tools, is accepted and ignored. `n` is ignored (one choice),
and batched prompts (several prompts in one completion request) are rejected.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

import orjson

from llmgw.sim.errors import bad_request
from llmgw.sim.tokens import chat_tokens, count_tokens, tokenize


class GenerationRequest(NamedTuple):
    """A chat or completion request, reduced to what drives generation and usage.

    A NamedTuple rather than a frozen dataclass: it is built on every request and is
    three times cheaper to construct.
    """

    model: str | None
    prompt: Sequence[Hashable]
    key: bytes  # canonical bytes of the prompt; seeds the generated text
    max_tokens: int | None
    stream: bool
    include_usage: bool
    # The last `wN` the continued text ends with (0: none), for the counting sequence.
    sequence_after: int = 0
    # The continued final message closed its thought (`</think>`): the rest is the answer.
    thought_closed: bool = False
    # The first function tool the request offers ("" when none, or `tool_choice: none`).
    tool: str = ""
    # The continued final message ends inside a hermes `<tool_call>` (not closed).
    call_open: bool = False


_SEQUENCE_WORD: Final = re.compile(r"w(\d{1,9})")
_WORD_IN_TEXT: Final = re.compile(r"\bw(\d{1,9})\b")


def sequence_end(text: str) -> int:
    """N when the last token of `text` is the sequence word `wN`, else 0."""
    tokens = tokenize(text)
    if not tokens:
        return 0
    found = _SEQUENCE_WORD.fullmatch(tokens[-1])
    return int(found.group(1)) if found is not None else 0


def sequence_end_in_calls(text: str) -> int:
    """N of the last sequence word `wN` anywhere in `text`: a continued message that
    wrote tool calls ends with their markup (`"}}\n</tool_call>`), not with a word."""
    found = _WORD_IN_TEXT.findall(text)
    return int(found[-1]) if found else 0


@dataclass(frozen=True, slots=True)
class EmbeddingInput:
    key: bytes
    tokens: int


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    model: str | None
    inputs: Sequence[EmbeddingInput]
    base64: bool


def _object(body: object) -> dict[str, object]:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def _model(body: dict[str, object]) -> str | None:
    model = body.get("model")
    if model is None or isinstance(model, str):
        return model
    raise bad_request("'model' must be a string", param="model")


def _max_tokens(body: dict[str, object]) -> int | None:
    for field in ("max_completion_tokens", "max_tokens"):
        value = body.get(field)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise bad_request(f"'{field}' must be an integer of at least 1", param=field)
        return value
    return None


def _stream(body: dict[str, object]) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", param="stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object", param="stream_options")
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise bad_request(
            "'stream_options.include_usage' must be a boolean", param="stream_options"
        )
    return stream, include_usage


def _content_text(content: object, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
        return "\n".join(parts)
    raise bad_request(
        f"'messages[{index}].content' must be a string, a list of parts or null",
        param="messages",
    )


def parse_chat(body: object) -> GenerationRequest:
    data = _object(body)
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' is required and must be a non-empty list", param="messages")
    turns: list[tuple[str, str]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_request(
                f"'messages[{index}]' must be an object with a string 'role'", param="messages"
            )
        turns.append((message["role"], _content_text(message.get("content"), index)))
    stream, include_usage = _stream(data)
    continuing = _continues_final_message(data)
    return GenerationRequest(
        model=_model(data),
        prompt=chat_tokens(turns, open_last=continuing),
        key=orjson.dumps(turns),
        max_tokens=_max_tokens(data),
        stream=stream,
        include_usage=include_usage,
        sequence_after=_continued_after(turns[-1][1]) if continuing else 0,
        thought_closed=continuing and "</think>" in turns[-1][1],
        tool=_first_tool(data),
        call_open=continuing
        and turns[-1][1].rfind("<tool_call>") > turns[-1][1].rfind("</tool_call>"),
    )


def _continued_after(text: str) -> int:
    """The last sequence word of a continued message: with calls in it, the last one in
    their arguments."""
    if "<tool_call>" in text:
        return sequence_end_in_calls(text)
    return sequence_end(text)


def _first_tool(data: dict[str, object]) -> str:
    """The name of the first function tool offered, unless `tool_choice` is "none"."""
    tools = data.get("tools")
    if data.get("tool_choice") == "none" or not isinstance(tools, list):
        return ""
    for tool in tools:
        if isinstance(tool, dict) and isinstance(tool.get("function"), dict):
            name = tool["function"].get("name")
            if isinstance(name, str) and name:
                return name
    return ""


def _flag(data: dict[str, object], field: str, default: bool) -> bool:
    value = data.get(field)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"'{field}' must be a boolean", param=field)
    return value


def _continues_final_message(data: dict[str, object]) -> bool:
    """Whether a chat continues its final message; vLLM's 400 for the two flags at once."""
    continuing = _flag(data, "continue_final_message", False)
    if continuing and _flag(data, "add_generation_prompt", True):
        raise bad_request(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            param="continue_final_message",
        )
    return continuing


def _is_token_ids(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(item, int) and not isinstance(item, bool) for item in value
    )


def _single_prompt(prompt: object) -> tuple[Sequence[Hashable], bytes]:
    if isinstance(prompt, str):
        return tokenize(prompt), prompt.encode()
    if isinstance(prompt, list) and _is_token_ids(prompt) and prompt:
        return prompt, orjson.dumps(prompt)
    if isinstance(prompt, list) and len(prompt) == 1:
        return _single_prompt(prompt[0])
    if isinstance(prompt, list) and len(prompt) > 1:
        raise bad_request(
            "batched prompts are not supported by llmgw sim: send one prompt per request",
            param="prompt",
        )
    raise bad_request(
        "'prompt' is required: a string, a list of token ids, or a one-element list of those",
        param="prompt",
    )


def parse_completion(body: object) -> GenerationRequest:
    data = _object(body)
    raw = data.get("prompt")
    prompt, key = _single_prompt(raw)
    stream, include_usage = _stream(data)
    text = raw[0] if isinstance(raw, list) and len(raw) == 1 else raw
    return GenerationRequest(
        model=_model(data),
        prompt=prompt,
        key=key,
        max_tokens=_max_tokens(data),
        stream=stream,
        include_usage=include_usage,
        sequence_after=sequence_end(text) if isinstance(text, str) else 0,
    )


def _embedding_input(value: object) -> EmbeddingInput | None:
    if isinstance(value, str):
        return EmbeddingInput(key=value.encode(), tokens=count_tokens(value))
    if _is_token_ids(value) and isinstance(value, list) and value:
        return EmbeddingInput(key=orjson.dumps(value), tokens=len(value))
    return None


def parse_embedding(body: object) -> EmbeddingRequest:
    data = _object(body)
    raw = data.get("input")
    single = _embedding_input(raw)
    inputs: list[EmbeddingInput] = []
    if single is not None:
        inputs.append(single)
    elif isinstance(raw, list) and raw:
        for item in raw:
            parsed = _embedding_input(item)
            if parsed is None:
                inputs = []
                break
            inputs.append(parsed)
    if not inputs:
        raise bad_request(
            "'input' is required: a string, a list of strings, a list of token ids, "
            "or a list of token-id lists, none of them empty",
            param="input",
        )
    encoding = data.get("encoding_format", "float")
    if encoding is None:
        encoding = "float"
    if encoding not in ("float", "base64"):
        raise bad_request("'encoding_format' must be 'float' or 'base64'", param="encoding_format")
    return EmbeddingRequest(model=_model(data), inputs=inputs, base64=encoding == "base64")
