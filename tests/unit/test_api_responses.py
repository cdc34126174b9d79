"""Translating OpenAI Responses requests to chat completions and their answers back."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from llmgw.router.apis.responses import ResponseShape, ResponseStream, response_from_chat
from llmgw.router.apis.responses_request import translate_request
from llmgw.router.apis.sse_events import SSEEvents
from llmgw.router.errors import InvalidRequest


def test_request_items_are_carried() -> None:
    req = translate_request(
        orjson.dumps(
            {
                "model": "m",
                "instructions": "Be brief",
                "input": [
                    {"role": "developer", "content": "Use tools"},
                    {
                        "type": "message",
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "Look: "},
                            {"type": "input_image", "image_url": "data:image/png;base64,AA"},
                        ],
                    },
                    {"type": "reasoning", "id": "rs_1", "summary": []},
                    {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
                    {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c1", "output": "rain"},
                    {"type": "function_call_output", "call_id": "c2", "output": "sun"},
                ],
                "max_output_tokens": 9,
                "tools": [{"type": "function", "name": "w", "parameters": {"type": "object"}}],
                "tool_choice": {"type": "function", "name": "w"},
                "parallel_tool_calls": False,
                "text": {"format": {"type": "json_schema", "name": "out", "schema": {}}},
                "store": False,
                "stream": True,
            }
        )
    )
    chat = req.body
    assert [m["role"] for m in chat["messages"]] == [
        "system",
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
    ]
    assert chat["messages"][2]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,AA"},
    }
    assert [c["id"] for c in chat["messages"][3]["tool_calls"]] == ["c1", "c2"]
    assert chat["messages"][5] == {"role": "tool", "tool_call_id": "c2", "content": "sun"}
    assert chat["max_tokens"] == 9 and chat["parallel_tool_calls"] is False
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "w"}}
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": {}},
    }
    assert req.stream and chat["stream_options"] == {"include_usage": True}
    assert req.client_body["instructions"] == "Be brief"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "input"),
        ({"input": 3}, "input"),
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": "x", "conversation": "conv_1"}, "conversation"),
        ({"input": "x", "store": True}, "store"),
        ({"input": "x", "background": True}, "background"),
        ({"input": [{"type": "file_search_call"}]}, "input.0.type"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input.0.role"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
            "input.0.content.0.type",
        ),
        ({"input": [{"type": "function_call", "name": "w"}]}, "input.0.call_id"),
        ({"input": "x", "tools": [{"type": "file_search"}]}, "tools.0.type"),
        ({"input": "x", "tool_choice": "sometimes"}, "tool_choice"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ],
)
def test_bad_input_names_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        translate_request(orjson.dumps({"model": "m", **body}))
    assert info.value.param == field
    assert field in info.value.message


def _shape() -> ResponseShape:
    req = translate_request(orjson.dumps({"model": "alias", "input": "hi", "metadata": {"a": "b"}}))
    return ResponseShape(req, req.client_body)


def test_answer_with_reasoning_text_and_tool_call() -> None:
    chat = {
        "choices": [
            {
                "message": {
                    "content": "Looking",
                    "reasoning_content": "think",
                    "tool_calls": [{"id": "c1", "function": {"name": "w", "arguments": "{}"}}],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {
            "prompt_tokens": 10,
            "completion_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 4},
        },
    }
    response = orjson.loads(response_from_chat(_shape(), chat))
    assert response["status"] == "completed" and response["incomplete_details"] is None
    assert response["model"] == "alias" and response["metadata"] == {"a": "b"}
    assert [o["type"] for o in response["output"]] == ["reasoning", "message", "function_call"]
    assert response["output"][1]["content"][0]["text"] == "Looking"
    call = response["output"][2]
    assert (call["call_id"], call["name"], call["arguments"]) == ("c1", "w", "{}")
    assert response["usage"]["input_tokens_details"]["cached_tokens"] == 4
    assert response["usage"]["total_tokens"] == 15


def _events(data: bytes) -> list[dict[str, Any]]:
    out = []
    for name, payload in SSEEvents().feed(data):
        event = orjson.loads(payload)
        assert event["type"] == name
        out.append(event)
    return out


# vLLM 0.32 names the thought `reasoning`; older releases and SGLang `reasoning_content`.
@pytest.mark.parametrize("thought_field", ["reasoning", "reasoning_content"])
def test_stream_reasoning_text_and_tool_call(thought_field: str) -> None:
    stream = ResponseStream(_shape())
    out = b""
    for delta in (
        {thought_field: "hm"},
        {"content": "Hi"},
        {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "w", "arguments": '{"a"'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]},
    ):
        out += stream.chunk({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    out += stream.chunk({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    out += stream.chunk({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}})
    out += stream.end()
    events = _events(out)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[17]["arguments"] == '{"a":1}'
    final = events[-1]["response"]
    assert [o["type"] for o in final["output"]] == ["reasoning", "message", "function_call"]
    assert [o["id"] for o in final["output"]] == [
        events[7]["item"]["id"],
        events[13]["item"]["id"],
        events[18]["item"]["id"],
    ]
    assert final["usage"]["output_tokens"] == 4


def test_stream_failure_is_an_error_event() -> None:
    stream = ResponseStream(_shape())
    out = stream.chunk({"choices": [{"index": 0, "delta": {"content": "a"}}]})
    out += stream.error({"message": "gone", "code": "engine_unreachable"})
    events = _events(out)
    assert events[-1]["type"] == "error" and events[-1]["code"] == "engine_unreachable"
    assert stream.ended
