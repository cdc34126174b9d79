"""Anthropic Messages requests (`POST /v1/messages`) translated into chat completions.

Carried: `model`, `max_tokens`, `system` (a string or text blocks), `messages`
with text, image, `tool_use` and `tool_result` blocks, `stop_sequences`,
`temperature`, `top_p`, `top_k`, `tools`, `tool_choice`, `metadata.user_id`
and `stream`. Every field is checked for its type before anything is sent, and
a wrong one is refused naming the field (`messages.2.content.0.type`).

Not carried (dropped, since a chat completion has no place for them and they
do not change what a correct answer is): `cache_control` on any block,
`thinking` (the engine's own reasoning setting applies), `service_tier`,
`container`, `mcp_servers`, citations on documents. `document` blocks and
server tools (`web_search`, `code_execution`, ...) are refused, naming the
field: the engine cannot run them.
"""

from __future__ import annotations

from typing import Any

import orjson

from llmgw.router.apis.fields import field_error, kind_of, number_field
from llmgw.router.errors import InvalidJSON, InvalidRequest
from llmgw.router.requests import CHAT, ParsedRequest, check_model

_ROLES = ("user", "assistant")
_TOOL_CHOICES = ("auto", "any", "tool", "none")


def _text_of(blocks: Any, field: str) -> str:
    """The text of a string or an array of text blocks (system, tool_result content)."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise field_error(field, "a string or an array of text blocks", blocks)
    parts: list[str] = []
    for i, block in enumerate(blocks):
        where = f"{field}.{i}"
        if not isinstance(block, dict):
            raise field_error(where, "a content block object", block)
        if block.get("type") != "text":
            raise InvalidRequest(
                f"{where}.type: only text blocks are allowed here, got {block.get('type')!r}",
                param=f"{where}.type",
            )
        text = block.get("text")
        if not isinstance(text, str):
            raise field_error(f"{where}.text", "a string", text)
        parts.append(text)
    return "\n".join(parts)


def _image(block: dict[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, dict):
        raise field_error(f"{where}.source", "an object", source)
    kind = source.get("type")
    if kind == "base64":
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str):
            raise field_error(f"{where}.source.media_type", "a string", media)
        if not isinstance(data, str):
            raise field_error(f"{where}.source.data", "a string", data)
        url = f"data:{media};base64,{data}"
    elif kind == "url":
        link = source.get("url")
        if not isinstance(link, str):
            raise field_error(f"{where}.source.url", "a string", link)
        url = link
    else:
        raise InvalidRequest(
            f"{where}.source.type: must be 'base64' or 'url', got {kind!r}",
            param=f"{where}.source.type",
        )
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_use(block: dict[str, Any], where: str) -> dict[str, Any]:
    ident, name, args = block.get("id"), block.get("name"), block.get("input", {})
    if not isinstance(ident, str):
        raise field_error(f"{where}.id", "a string", ident)
    if not isinstance(name, str):
        raise field_error(f"{where}.name", "a string", name)
    if not isinstance(args, dict):
        raise field_error(f"{where}.input", "an object", args)
    return {
        "id": ident,
        "type": "function",
        "function": {"name": name, "arguments": orjson.dumps(args).decode()},
    }


def _tool_result(block: dict[str, Any], where: str, images: list[dict[str, Any]]) -> dict[str, Any]:
    """A `tool` message; the result's images go to `images` (a chat tool message holds
    only text, so they follow as a user message)."""
    ident = block.get("tool_use_id")
    if not isinstance(ident, str):
        raise field_error(f"{where}.tool_use_id", "a string", ident)
    content = block.get("content", "")
    if isinstance(content, list):
        texts: list[Any] = []
        for k, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "image":
                images.append(_image(part, f"{where}.content.{k}"))
            else:
                texts.append(part)
        content = texts
    text = _text_of(content, f"{where}.content") if content else ""
    if block.get("is_error") is True:
        text = f"Error: {text}" if text else "Error"
    return {"role": "tool", "tool_call_id": ident, "content": text}


def _message(message: Any, i: int) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages (tool results become `tool` messages)."""
    where = f"messages.{i}"
    if not isinstance(message, dict):
        raise field_error(where, "an object", message)
    role = message.get("role")
    if role not in _ROLES:
        raise InvalidRequest(
            f"{where}.role: must be 'user' or 'assistant', got {role!r}", param=f"{where}.role"
        )
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise field_error(f"{where}.content", "a string or an array of content blocks", content)
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    images: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}.content.{j}"
        if not isinstance(block, dict):
            raise field_error(at, "a content block object", block)
        kind = block.get("type")
        if kind == "text":
            text = block.get("text")
            if not isinstance(text, str):
                raise field_error(f"{at}.text", "a string", text)
            parts.append({"type": "text", "text": text})
        elif kind == "image" and role == "user":
            parts.append(_image(block, at))
        elif kind == "tool_use" and role == "assistant":
            calls.append(_tool_use(block, at))
        elif kind == "tool_result" and role == "user":
            results.append(_tool_result(block, at, images))
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue  # an earlier turn's reasoning: engines take none back
        else:
            raise InvalidRequest(
                f"{at}.type: block type {kind!r} in a {role} message cannot be translated "
                "to a chat completion (text, image, tool_use and tool_result can)",
                param=f"{at}.type",
            )
    out: list[dict[str, Any]] = list(results)
    parts = images + parts
    if role == "assistant":
        # "" rather than null beside tool calls: llama-cpp-python refuses a null content.
        text = "".join(p["text"] for p in parts)
        if text or calls:
            reply: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                reply["tool_calls"] = calls
            out.append(reply)
    elif parts:
        if all(p["type"] == "text" for p in parts):
            out.append({"role": "user", "content": "\n".join(p["text"] for p in parts)})
        else:
            out.append({"role": "user", "content": parts})
    return out


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise field_error("tools", "an array", tools)
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        where = f"tools.{i}"
        if not isinstance(tool, dict):
            raise field_error(where, "an object", tool)
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise InvalidRequest(
                f"{where}.type: server tool {kind!r} cannot run on this model's engine; "
                "only client tools (name, input_schema) are supported",
                param=f"{where}.type",
            )
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not name:
            raise field_error(f"{where}.name", "a non-empty string", name)
        if not isinstance(schema, dict):
            raise field_error(f"{where}.input_schema", "a JSON schema object", schema)
        function: dict[str, Any] = {"name": name, "parameters": schema}
        description = tool.get("description")
        if description is not None:
            if not isinstance(description, str):
                raise field_error(f"{where}.description", "a string", description)
            function["description"] = description
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> tuple[Any, bool]:
    """The chat `tool_choice` and whether parallel tool calls are allowed."""
    if not isinstance(choice, dict):
        raise field_error("tool_choice", "an object", choice)
    kind = choice.get("type")
    if kind not in _TOOL_CHOICES:
        raise InvalidRequest(
            f"tool_choice.type: must be one of {', '.join(_TOOL_CHOICES)}, got {kind!r}",
            param="tool_choice.type",
        )
    parallel = choice.get("disable_parallel_tool_use") is not True
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str):
            raise field_error("tool_choice.name", "a string", name)
        return {"type": "function", "function": {"name": name}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[kind], parallel


def _options(body: dict[str, Any], chat: dict[str, Any], *, counting: bool) -> None:
    max_tokens = body.get("max_tokens")
    if max_tokens is None and not counting:
        raise InvalidRequest("max_tokens: field required", param="max_tokens")
    if max_tokens is not None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise InvalidRequest(
                f"max_tokens: must be an integer of at least 1, got {max_tokens!r}",
                param="max_tokens",
            )
        chat["max_tokens"] = max_tokens
    for field in ("temperature", "top_p", "top_k"):
        value = number_field(body, field)
        if value is not None:
            chat[field] = value
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise field_error("stop_sequences", "an array of strings", stops)
        if stops:
            chat["stop"] = stops
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise field_error("metadata", "an object", metadata)
        user = metadata.get("user_id")
        if user is not None:
            if not isinstance(user, str):
                raise field_error("metadata.user_id", "a string", user)
            chat["user"] = user


def translate_request(raw: bytes, *, counting: bool = False) -> ParsedRequest:
    """A Messages body as a chat completion request; InvalidRequest naming the field.
    `counting`: a count_tokens body, which has no `max_tokens`."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSON(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidRequest(f"request body must be a JSON object, got {kind_of(body)}")
    model = body.get("model")
    if model is None:
        raise InvalidRequest("model: field required", param="model")
    model = check_model(model, "model:")
    messages = body.get("messages")
    if messages is None:
        raise InvalidRequest("messages: field required", param="messages")
    if not isinstance(messages, list):
        raise field_error("messages", "an array of messages", messages)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise field_error("stream", "a boolean", stream)
    chat: dict[str, Any] = {"model": model}
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        text = _text_of(system, "system")
        if text:
            out.append({"role": "system", "content": text})
    for i, message in enumerate(messages):
        out.extend(_message(message, i))
    chat["messages"] = out
    _options(body, chat, counting=counting)
    tools = body.get("tools")
    if tools is not None:
        translated = _tools(tools)
        if translated:
            chat["tools"] = translated
    choice = body.get("tool_choice")
    if choice is not None:
        chat["tool_choice"], parallel = _tool_choice(choice)
        if not parallel and "tools" in chat:
            chat["parallel_tool_calls"] = False
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return ParsedRequest(CHAT, model, stream, True, orjson.dumps(chat), chat)


def stop_sequences(req: ParsedRequest) -> list[str]:
    """The stop sequences the translated request carries."""
    stop = req.body.get("stop")
    return stop if isinstance(stop, list) else []
