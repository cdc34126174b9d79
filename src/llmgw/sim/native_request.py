"""Parsing Anthropic Messages and OpenAI Responses bodies for the sim's native APIs.

Each parser reduces a body to a `NativeRequest`: the `GenerationRequest` that
drives the engine (the prompt tokenized exactly as the chat path tokenizes the
same conversation, so a request costs the same tokens whichever API it came
in as) plus the tool the answer must call, if the request forces one.

Only what the sim acts on is checked; a wrong field is a `SimError` (400)
naming it. The sim keeps no state, so a Responses `previous_response_id` is
answered 404 (unknown response), as OpenAI answers an id it does not have.

Not guaranteed: images, documents and server tools are accepted and ignored
(they add no prompt tokens); `tool_choice: auto` never calls a tool.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson

from llmgw.sim.errors import SimError, bad_request
from llmgw.sim.protocol import GenerationRequest
from llmgw.sim.tokens import chat_tokens


class Tool(NamedTuple):
    """The tool an answer calls: its name and JSON schema of its arguments."""

    name: str
    schema: dict[str, Any]


class NativeRequest(NamedTuple):
    generation: GenerationRequest
    tool: Tool | None
    body: dict[str, Any]


def _object(body: object) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def _model(body: dict[str, Any]) -> str | None:
    model = body.get("model")
    if model is None or isinstance(model, str):
        return model
    raise bad_request("model: must be a string", param="model")


def _stream(body: dict[str, Any]) -> bool:
    stream = body.get("stream", False)
    if stream is None:
        return False
    if not isinstance(stream, bool):
        raise bad_request("stream: must be a boolean", param="stream")
    return stream


def _limit(body: dict[str, Any], field: str, *, required: bool) -> int | None:
    value = body.get(field)
    if value is None:
        if required:
            raise bad_request(f"{field}: field required", param=field)
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise bad_request(f"{field}: must be an integer of at least 1", param=field)
    return value


def _text(content: Any, where: str) -> str:
    """The text of a content (a string or blocks); other blocks count as their JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where}: must be a string or an array of blocks", param=where)
    parts: list[str] = []
    for block in content:
        if not isinstance(block, dict):
            raise bad_request(f"{where}: every block must be an object", param=where)
        text = block.get("text")
        if isinstance(text, str):
            parts.append(text)
        elif block.get("type") == "tool_result":
            parts.append(_text(block.get("content"), where))
        elif block.get("type") == "tool_use":
            parts.append(orjson.dumps(block.get("input")).decode())
    return "\n".join(parts)


def _generation(
    body: dict[str, Any], turns: list[tuple[str, str]], max_tokens: int | None, tool: str = ""
) -> GenerationRequest:
    return GenerationRequest(
        model=_model(body),
        prompt=chat_tokens(turns),
        key=orjson.dumps(turns),
        max_tokens=max_tokens,
        stream=_stream(body),
        include_usage=True,
        tool=tool,
    )


def _tools(body: dict[str, Any], schema_field: str) -> dict[str, Tool]:
    tools = body.get("tools")
    if tools is None:
        return {}
    if not isinstance(tools, list):
        raise bad_request("tools: must be an array", param="tools")
    found: dict[str, Tool] = {}
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            # Server tools (web search and the like) have no name to call here.
            if isinstance(tool, dict) and "type" in tool:
                continue
            raise bad_request(f"tools.{index}.name: field required", param=f"tools.{index}.name")
        schema = tool.get(schema_field)
        found[tool["name"]] = Tool(tool["name"], schema if isinstance(schema, dict) else {})
    return found


def _forced(tools: dict[str, Tool], name: str | None, where: str) -> Tool:
    if not tools:
        raise bad_request(f"{where}: a tool is required but 'tools' is empty", param=where)
    if name is None:
        return next(iter(tools.values()))
    tool = tools.get(name)
    if tool is None:
        raise bad_request(
            f"{where}: no tool named {name!r} in 'tools' ({', '.join(tools)})", param=where
        )
    return tool


def parse_messages(data: object) -> NativeRequest:
    """An Anthropic Messages body (`max_tokens` and `messages` required)."""
    body = _object(data)
    max_tokens = _limit(body, "max_tokens", required=True)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages: must be a non-empty array", param="messages")
    turns: list[tuple[str, str]] = []
    system = body.get("system")
    if system is not None:
        turns.append(("system", _text(system, "system")))
    for index, message in enumerate(messages):
        where = f"messages.{index}"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise bad_request(f"{where}.role: must be 'user' or 'assistant'", param=where)
        turns.append((message["role"], _text(message.get("content"), f"{where}.content")))
    tools = _tools(body, "input_schema")
    tool: Tool | None = None
    choice = body.get("tool_choice")
    if choice is not None:
        if not isinstance(choice, dict):
            raise bad_request("tool_choice: must be an object", param="tool_choice")
        kind = choice.get("type")
        if kind == "any":
            tool = _forced(tools, None, "tool_choice")
        elif kind == "tool":
            name = choice.get("name")
            tool = _forced(tools, name if isinstance(name, str) else "", "tool_choice.name")
        elif kind not in ("auto", "none"):
            raise bad_request(
                "tool_choice.type: must be one of auto, any, tool, none", param="tool_choice.type"
            )
    # The first tool offered, for a sim acting as a tool parser (as on the chat path).
    offered = (
        "" if isinstance(choice, dict) and choice.get("type") == "none" else next(iter(tools), "")
    )
    return NativeRequest(_generation(body, turns, max_tokens, offered), tool, body)


def _response_input(items: Any, turns: list[tuple[str, str]]) -> None:
    if isinstance(items, str):
        turns.append(("user", items))
        return
    if not isinstance(items, list):
        raise bad_request("input: must be a string or an array of items", param="input")
    for index, item in enumerate(items):
        where = f"input.{index}"
        if not isinstance(item, dict):
            raise bad_request(f"{where}: must be an object", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise bad_request(
                    f"{where}.role: must be user, assistant, system or developer",
                    param=f"{where}.role",
                )
            role = "system" if role == "developer" else role
            turns.append((role, _text(item.get("content"), f"{where}.content")))
        elif kind == "function_call_output":
            output = item.get("output")
            turns.append(("tool", output if isinstance(output, str) else _text(output, where)))
        elif kind == "function_call":
            turns.append(("assistant", ""))


def parse_responses(data: object) -> NativeRequest:
    """An OpenAI Responses body (`input` required)."""
    body = _object(data)
    previous = body.get("previous_response_id")
    if previous is not None:
        raise SimError(
            404,
            f"Previous response with id {previous!r} not found: llmgw sim stores no responses",
            code="previous_response_not_found",
            error_type="invalid_request_error",
            param="previous_response_id",
        )
    if body.get("input") is None:
        raise bad_request("input: field required", param="input")
    turns: list[tuple[str, str]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad_request("instructions: must be a string", param="instructions")
        turns.append(("system", instructions))
    _response_input(body["input"], turns)
    max_tokens = _limit(body, "max_output_tokens", required=False)
    tools = _tools(body, "parameters")
    tool: Tool | None = None
    choice = body.get("tool_choice")
    if choice == "required":
        tool = _forced(tools, None, "tool_choice")
    elif isinstance(choice, dict):
        name = choice.get("name")
        tool = _forced(tools, name if isinstance(name, str) else "", "tool_choice.name")
    elif choice not in (None, "auto", "none"):
        raise bad_request(
            "tool_choice: must be auto, none, required or a function", param="tool_choice"
        )
    offered = "" if choice == "none" else next(iter(tools), "")
    return NativeRequest(_generation(body, turns, max_tokens, offered), tool, body)


def arguments_for(tool: Tool, text: str, count: int) -> dict[str, Any]:
    """A call's arguments made from the schema: strings get the generated text."""
    properties = tool.schema.get("properties")
    if not isinstance(properties, dict):
        return {}
    values: dict[str, Any] = {}
    for name, prop in properties.items():
        kind = prop.get("type") if isinstance(prop, dict) else None
        if kind == "integer":
            values[name] = count
        elif kind == "number":
            values[name] = float(count)
        elif kind == "boolean":
            values[name] = True
        elif kind == "array":
            values[name] = []
        elif kind == "object":
            values[name] = {}
        else:
            values[name] = text.strip()
    return values
