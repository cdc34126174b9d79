"""Translating Anthropic Messages requests to chat completions and their answers back."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from llmgw.router.apis.messages import MessagesApi, MessageStream, message_from_chat
from llmgw.router.apis.messages_request import translate_request
from llmgw.router.apis.sse_events import SSEEvents
from llmgw.router.errors import InvalidRequest, ModelNotFound


def _req(**body: Any) -> dict[str, Any]:
    body = {"model": "m", "max_tokens": 10, **body}
    parsed = translate_request(orjson.dumps(body))
    assert orjson.loads(parsed.upstream_body) == parsed.body
    return parsed.body


def test_request_fields_are_carried() -> None:
    chat = _req(
        system=[{"type": "text", "text": "Be"}, {"type": "text", "text": "brief"}],
        messages=[
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "s"},
                    {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Oslo"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": "rain",
                        "is_error": True,
                    },
                    {"type": "text", "text": "and?"},
                    {"type": "image", "source": {"type": "url", "url": "http://x/i.png"}},
                ],
            },
        ],
        stop_sequences=["END"],
        temperature=0.2,
        top_p=0.9,
        top_k=5,
        metadata={"user_id": "u1"},
        tools=[{"name": "w", "description": "weather", "input_schema": {"type": "object"}}],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    assert chat["messages"] == [
        {"role": "system", "content": "Be\nbrief"},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "w", "arguments": '{"city":"Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "Error: rain"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "and?"},
                {"type": "image_url", "image_url": {"url": "http://x/i.png"}},
            ],
        },
    ]
    assert chat["stop"] == ["END"] and chat["user"] == "u1"
    assert (chat["temperature"], chat["top_p"], chat["top_k"]) == (0.2, 0.9, 5)
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {"name": "w", "parameters": {"type": "object"}, "description": "weather"},
        }
    ]
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    assert "stream" not in chat


def test_tool_result_images_follow_as_a_user_message() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}
    chat = _req(
        messages=[
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"type": "text", "text": "the screenshot"}, image],
                    }
                ],
            }
        ]
    )
    assert chat["messages"] == [
        {"role": "tool", "tool_call_id": "t1", "content": "the screenshot"},
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}],
        },
    ]


def test_streaming_asks_for_usage() -> None:
    parsed = translate_request(
        orjson.dumps({"model": "m", "max_tokens": 3, "messages": [], "stream": True})
    )
    assert parsed.stream and parsed.client_wants_usage
    assert parsed.body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": []}, "max_tokens"),
        ({"max_tokens": "5", "messages": []}, "max_tokens"),
        ({"max_tokens": 0, "messages": []}, "max_tokens"),
        ({"max_tokens": 5}, "messages"),
        ({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": 3}]}, "messages.0.content"),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document"}]}]},
            "messages.0.content.0.type",
        ),
        ({"max_tokens": 5, "messages": [], "temperature": "hot"}, "temperature"),
        ({"max_tokens": 5, "messages": [], "stop_sequences": "END"}, "stop_sequences"),
        ({"max_tokens": 5, "messages": [], "tools": [{"name": "w"}]}, "tools.0.input_schema"),
        (
            {"max_tokens": 5, "messages": [], "tools": [{"type": "web_search_20250305"}]},
            "tools.0.type",
        ),
        ({"max_tokens": 5, "messages": [], "tool_choice": {"type": "some"}}, "tool_choice.type"),
        ({"max_tokens": 5, "messages": [], "stream": "yes"}, "stream"),
    ],
)
def test_bad_input_names_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        translate_request(orjson.dumps({"model": "m", **body}))
    assert info.value.param == field
    assert field in info.value.message


# vLLM 0.32 names the thought `reasoning`; older releases and SGLang `reasoning_content`.
@pytest.mark.parametrize("thought_field", ["reasoning", "reasoning_content"])
def test_answer_with_tool_calls_and_stop_sequence(thought_field: str) -> None:
    chat = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": "Looking",
                    thought_field: "think",
                    "tool_calls": [
                        {"id": "c1", "function": {"name": "w", "arguments": '{"city":"Oslo"}'}}
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7},
    }
    message = orjson.loads(message_from_chat(chat, "alias", [], 3))
    assert message["model"] == "alias" and message["stop_reason"] == "tool_use"
    assert message["content"] == [
        {"type": "thinking", "thinking": "think", "signature": ""},
        {"type": "text", "text": "Looking"},
        {"type": "tool_use", "id": "c1", "name": "w", "input": {"city": "Oslo"}},
    ]
    assert message["usage"] == {"input_tokens": 12, "output_tokens": 7}
    stopped = {
        "choices": [{"message": {"content": "x"}, "finish_reason": "stop", "stop_reason": "END"}]
    }
    message = orjson.loads(message_from_chat(stopped, "m", ["END"], 3))
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "END")
    assert message["usage"] == {"input_tokens": 3, "output_tokens": 0}


def _events(data: bytes) -> list[dict[str, Any]]:
    out = []
    for name, payload in SSEEvents().feed(data):
        if name == "comment":
            continue
        event = orjson.loads(payload)
        assert event["type"] == name
        out.append(event)
    return out


def test_stream_text_then_tool_call() -> None:
    stream = MessageStream("m", [], 4)
    out = b""
    for delta in (
        {"role": "assistant", "content": "Hi"},
        {"content": " there"},
        {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "w", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '"Oslo"}'}}]},
    ):
        out += stream.chunk({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    out += stream.chunk({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    out += stream.chunk({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 6}})
    out += stream.end()
    events = _events(out)
    assert [e["type"] for e in events] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[0]["message"]["usage"] == {"input_tokens": 4, "output_tokens": 0}
    assert events[6]["index"] == 1
    assert events[6]["content_block"] == {"type": "tool_use", "id": "c1", "name": "w", "input": {}}
    assert "".join(e["delta"]["partial_json"] for e in events[7:9]) == '{"city":"Oslo"}'
    assert events[10]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[10]["usage"] == {"input_tokens": 9, "output_tokens": 6}


class _Sent:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    async def __call__(self, message: Any) -> None:
        self.messages.append(message)


async def test_responder_turns_a_mid_stream_failure_into_an_error_event() -> None:
    api = MessagesApi()
    req = api.parse(orjson.dumps({"model": "m", "max_tokens": 3, "messages": [], "stream": True}))
    sent = _Sent()
    send = api.responder(req, sent)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream; charset=utf-8")],
        }
    )
    chunk = {"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None}]}
    await send(
        {
            "type": "http.response.body",
            "body": b"data: " + orjson.dumps(chunk) + b"\n\n",
            "more_body": True,
        }
    )
    await send({"type": "http.response.body", "body": b": llmgw replica e1\n\n", "more_body": True})
    failure = b'event: error\ndata: {"error":{"message":"gone","type":"upstream_error"}}\n\n'
    await send({"type": "http.response.body", "body": failure, "more_body": False})
    body = b"".join(m.get("body", b"") for m in sent.messages[1:])
    assert b": llmgw replica e1" in body
    events = _events(body)
    assert events[-1] == {"type": "error", "error": {"type": "api_error", "message": "gone"}}
    assert "message_stop" not in [e["type"] for e in events]
    assert sent.messages[-1]["more_body"] is False


async def test_responder_rewrites_a_whole_answer_and_its_length() -> None:
    api = MessagesApi()
    req = api.parse(orjson.dumps({"model": "m", "max_tokens": 3, "messages": []}))
    sent = _Sent()
    send = api.responder(req, sent)
    chat = orjson.dumps({"choices": [{"message": {"content": "ok"}, "finish_reason": "length"}]})
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(chat)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": chat, "more_body": False})
    body = sent.messages[1]["body"]
    assert dict(sent.messages[0]["headers"])[b"content-length"] == str(len(body)).encode()
    assert orjson.loads(body)["stop_reason"] == "max_tokens"


def test_error_body_shape() -> None:
    body = orjson.loads(MessagesApi().error_body(ModelNotFound("no model 'x'")))
    assert body == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "no model 'x'"},
    }
