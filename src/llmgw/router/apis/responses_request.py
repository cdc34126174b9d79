"""OpenAI Responses requests (`POST /v1/responses`) translated into chat completions.

Carried: `model`, `input` (a string, or items: messages with `input_text`,
`input_image` and `output_text` parts, `function_call` and
`function_call_output`), `instructions`, `max_output_tokens`, `temperature`,
`top_p`, function `tools`, `tool_choice`, `parallel_tool_calls`, `text.format`
(JSON schema or JSON object), `user`/`safety_identifier`, `metadata` (echoed
back) and `stream`. Every field is checked for its type first; a wrong one is
refused naming it (`input.1.content.0.type`).

Refused, naming the field, because a chat completion engine keeps no state and
runs no hosted tools: `previous_response_id`, `conversation`, `store: true`,
`background: true`, `prompt` (stored prompt templates), and tools other than
functions (`web_search`, `file_search`, ...). Dropped: `reasoning` (the
engine's own setting applies), earlier turns' `reasoning` items, `include`,
`truncation`, `service_tier`, `prompt_cache_key`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

from llmgw.router.apis.fields import field_error, kind_of, number_field
from llmgw.router.errors import InvalidJSON, InvalidRequest
from llmgw.router.requests import CHAT, ParsedRequest, check_model

_ROLES = ("user", "assistant", "system", "developer")
# Fields a stateless translation cannot honour, with why.
_STATEFUL = {
    "previous_response_id": "responses are not stored here, so there is none to continue; "
    "send the whole conversation in 'input'",
    "conversation": "conversations are not stored here; send the whole conversation in 'input'",
    "prompt": "stored prompt templates are not kept here; send the instructions and input",
}


def _part(part: Any, where: str, role: str) -> dict[str, Any]:
    if not isinstance(part, dict):
        raise field_error(where, "a content part object", part)
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text"):
        text = part.get("text")
        if not isinstance(text, str):
            raise field_error(f"{where}.text", "a string", text)
        return {"type": "text", "text": text}
    if kind == "refusal" and role == "assistant":
        refusal = part.get("refusal")
        if not isinstance(refusal, str):
            raise field_error(f"{where}.refusal", "a string", refusal)
        return {"type": "text", "text": refusal}
    if kind == "input_image" and role == "user":
        url = part.get("image_url")
        if not isinstance(url, str):
            raise InvalidRequest(
                f"{where}.image_url: must be a URL or data URL string "
                "(file_id images are not stored here)",
                param=f"{where}.image_url",
            )
        image: dict[str, Any] = {"url": url}
        if isinstance(part.get("detail"), str) and part["detail"] != "auto":
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    raise InvalidRequest(
        f"{where}.type: part type {kind!r} in a {role} message cannot be translated to a chat "
        "completion (input_text, input_image and output_text can)",
        param=f"{where}.type",
    )


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in _ROLES:
        raise InvalidRequest(
            f"{where}.role: must be one of {', '.join(_ROLES)}, got {role!r}",
            param=f"{where}.role",
        )
    role = "system" if role == "developer" else role
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise field_error(f"{where}.content", "a string or an array of content parts", content)
    parts = [_part(p, f"{where}.content.{j}", role) for j, p in enumerate(content)]
    if all(p["type"] == "text" for p in parts):
        return {"role": role, "content": "".join(p["text"] for p in parts)}
    return {"role": role, "content": parts}


def _string(item: dict[str, Any], field: str, where: str) -> str:
    value = item.get(field)
    if not isinstance(value, str):
        raise field_error(f"{where}.{field}", "a string", value)
    return value


def _input(items: Any, out: list[dict[str, Any]]) -> None:
    if isinstance(items, str):
        out.append({"role": "user", "content": items})
        return
    if not isinstance(items, list):
        raise field_error("input", "a string or an array of input items", items)
    for i, item in enumerate(items):
        where = f"input.{i}"
        if not isinstance(item, dict):
            raise field_error(where, "an input item object", item)
        kind = item.get("type", "message")
        if kind == "message":
            out.append(_message(item, where))
        elif kind == "function_call":
            call = {
                "id": _string(item, "call_id", where),
                "type": "function",
                "function": {
                    "name": _string(item, "name", where),
                    "arguments": _string(item, "arguments", where),
                },
            }
            last = out[-1] if out else None
            # Parallel calls of one turn are one assistant message in a chat.
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                # "" rather than null: llama-cpp-python refuses a null content.
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if isinstance(output, list):
                output = "".join(
                    _part(p, f"{where}.output.{j}", "user").get("text", "")
                    for j, p in enumerate(output)
                )
            if not isinstance(output, str):
                raise field_error(f"{where}.output", "a string or an array of text parts", output)
            out.append(
                {"role": "tool", "tool_call_id": _string(item, "call_id", where), "content": output}
            )
        elif kind == "reasoning":
            continue  # an earlier turn's reasoning: engines take none back
        else:
            raise InvalidRequest(
                f"{where}.type: item type {kind!r} cannot be translated to a chat completion "
                "(message, function_call and function_call_output can)",
                param=f"{where}.type",
            )


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise field_error("tools", "an array", tools)
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        where = f"tools.{i}"
        if not isinstance(tool, dict):
            raise field_error(where, "an object", tool)
        if tool.get("type") != "function":
            raise InvalidRequest(
                f"{where}.type: hosted tool {tool.get('type')!r} cannot run on this model's "
                "engine; only function tools are supported",
                param=f"{where}.type",
            )
        function: dict[str, Any] = {"name": _string(tool, "name", where)}
        for field in ("description", "parameters", "strict"):
            if tool.get(field) is not None:
                function[field] = tool[field]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": _string(choice, "name", "tool_choice")}}
    raise InvalidRequest(
        "tool_choice: must be 'auto', 'none', 'required' or {\"type\": \"function\", "
        f'"name": ...}}, got {orjson.dumps(choice).decode()[:80]}',
        param="tool_choice",
    )


def _text_format(text: Any, chat: dict[str, Any]) -> None:
    if not isinstance(text, dict):
        raise field_error("text", "an object", text)
    fmt = text.get("format")
    if fmt is None:
        return
    if not isinstance(fmt, dict):
        raise field_error("text.format", "an object", fmt)
    kind = fmt.get("type")
    if kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif kind == "json_object":
        chat["response_format"] = {"type": "json_object"}
    elif kind != "text":
        raise InvalidRequest(
            f"text.format.type: must be text, json_schema or json_object, got {kind!r}",
            param="text.format.type",
        )


def _refuse_state(body: dict[str, Any]) -> None:
    for field, why in _STATEFUL.items():
        if body.get(field) is not None:
            raise InvalidRequest(f"{field}: not supported: {why}", param=field)
    if body.get("store") is True:
        raise InvalidRequest(
            "store: true is not supported: this model's engine keeps no responses; "
            "send store: false (or leave it out)",
            param="store",
        )
    if body.get("background") is True:
        raise InvalidRequest(
            "background: true is not supported: responses are not stored to be polled",
            param="background",
        )


def _options(body: dict[str, Any], chat: dict[str, Any]) -> None:
    limit = body.get("max_output_tokens")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise field_error("max_output_tokens", "an integer of at least 1", limit)
        chat["max_tokens"] = limit
    for field in ("temperature", "top_p"):
        value = number_field(body, field)
        if value is not None:
            chat[field] = value
    for field in ("user", "safety_identifier"):
        value = body.get(field)
        if value is not None:
            if not isinstance(value, str):
                raise field_error(field, "a string", value)
            chat["user"] = value
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise field_error("metadata", "an object", metadata)
    if body.get("text") is not None:
        _text_format(body["text"], chat)
    if body.get("tools") is not None:
        tools = _tools(body["tools"])
        if tools:
            chat["tools"] = tools
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    parallel = body.get("parallel_tool_calls")
    if parallel is not None:
        if not isinstance(parallel, bool):
            raise field_error("parallel_tool_calls", "a boolean", parallel)
        if "tools" in chat:
            chat["parallel_tool_calls"] = parallel


@dataclasses.dataclass(slots=True)
class TranslatedRequest(ParsedRequest):
    """A chat completion request made from a client's body in another API, which it
    keeps (a Response echoes the request's settings)."""

    client_body: dict[str, Any] = dataclasses.field(default_factory=dict)


def translate_request(raw: bytes) -> TranslatedRequest:
    """A Responses body as a chat completion request; InvalidRequest naming the field."""
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
    if body.get("input") is None:
        raise InvalidRequest("input: field required", param="input")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise field_error("stream", "a boolean", stream)
    _refuse_state(body)
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise field_error("instructions", "a string", instructions)
        messages.append({"role": "system", "content": instructions})
    _input(body["input"], messages)
    chat: dict[str, Any] = {"model": model, "messages": messages}
    _options(body, chat)
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return TranslatedRequest(CHAT, model, stream, True, orjson.dumps(chat), chat, client_body=body)
