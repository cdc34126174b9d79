"""Reading back a natively served Messages or Responses stream for a continuation."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from llmgw.router.apis.messages import MessagesApi
from llmgw.router.apis.responses import ResponsesApi
from llmgw.router.apis.sse_events import SSEEvents, format_event
from llmgw.router.requests import ParsedRequest, Resumable


def messages_request() -> ParsedRequest:
    body = {"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
    return MessagesApi().parse(orjson.dumps({**body, "stream": True}))


def responses_request() -> ParsedRequest:
    body = {"model": "m", "input": "hi", "max_output_tokens": 20, "stream": True}
    return ResponsesApi().parse(orjson.dumps(body))


def resume(req: ParsedRequest, sent: bytes) -> Resumable | None:
    assert req.native is not None and req.native.resume is not None
    return req.native.resume(sent)


def anthropic(*events: dict[str, Any]) -> bytes:
    return b"".join(format_event(e["type"], e) for e in events)


START = {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 7}}}
TEXT = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}


def delta(text: str) -> dict[str, Any]:
    return {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": text},
    }


def relayed(resumable: Resumable, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The API's events a continuation's chat chunks become."""
    sent: list[bytes] = []

    async def send(message: Any) -> None:
        sent.append(message.get("body", b""))

    wrapped = resumable.wrap(send)
    body = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    asyncio.run(wrapped({"type": "http.response.body", "body": body, "more_body": False}))
    return [orjson.loads(data) for _, data in SSEEvents().feed(b"".join(sent))]


def chunk(text: str, finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    return {"id": "c", "object": "chat.completion.chunk", "choices": [choice]}


USAGE = {"id": "c", "choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 3}}


def test_a_messages_text_block_goes_on_in_the_same_block() -> None:
    found = resume(
        messages_request(), anthropic(START, {"type": "ping"}, TEXT, delta(" w1"), delta(" w2"))
    )
    assert found is not None
    assert (found.text, found.tokens) == (" w1 w2", 2)
    events = relayed(found, [chunk(" w3", "length"), USAGE])
    assert [e["type"] for e in events] == [
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[0] == delta(" w3")
    assert events[2]["delta"]["stop_reason"] == "max_tokens"
    assert events[2]["usage"] == {"input_tokens": 30, "output_tokens": 3}


def test_messages_streams_that_are_not_continued() -> None:
    req = messages_request()
    thinking = {**TEXT, "content_block": {"type": "thinking", "thinking": ""}}
    tool = {**TEXT, "content_block": {"type": "tool_use", "id": "t", "name": "f", "input": {}}}
    stop = {"type": "content_block_stop", "index": 0}
    error = {"type": "error", "error": {"type": "api_error", "message": "x"}}
    text_after_tool = {**TEXT, "index": 1}
    for sent in (
        b"",
        anthropic(TEXT, delta("w1")),  # no message_start
        # A text or thinking block closed with nothing after it; text after a call.
        anthropic(START, thinking, stop),
        anthropic(START, TEXT, delta("w1"), stop),
        anthropic(START, tool, stop, text_after_tool),
        # A call closed before its input is complete JSON.
        anthropic(START, tool, {**delta("x"), "delta": _json('{"n": 1')}, stop),
        anthropic(START, TEXT, delta("w1"), error),
        b"event: message_start\ndata: not json\n\n",
    ):
        assert resume(req, sent) is None, sent


def _json(partial: str) -> dict[str, Any]:
    return {"type": "input_json_delta", "partial_json": partial}


def test_a_messages_thought_and_calls_go_on_in_their_blocks() -> None:
    thinking = {**TEXT, "content_block": {"type": "thinking", "thinking": ""}}
    first = {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "tool_use", "id": "toolu_1", "name": "count", "input": {}},
    }

    def block_delta(index: int, inner: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": index, "delta": inner}

    sent = anthropic(
        START,
        thinking,
        block_delta(0, {"type": "thinking_delta", "thinking": " w1"}),
        block_delta(0, {"type": "signature_delta", "signature": "s"}),
        {"type": "content_block_stop", "index": 0},
        first,
        block_delta(1, _json('{"n": " w2')),
    )
    found = resume(messages_request(), sent)
    assert found is not None
    assert (found.reasoning, found.text, found.calls, found.tokens) == (
        " w1",
        "",
        (("toolu_1", "count", '{"n": " w2'),),
        2,
    )
    # The open call's arguments go on in block 1; a new call (index 1) opens block 2.
    call = {"index": 0, "function": {"arguments": ' w3"}'}}
    second = {"index": 1, "id": "toolu_2", "type": "function", "function": {"name": "count"}}
    chunks = [
        {"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]},
        {"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [second]}}]},
        {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    events = relayed(found, chunks)
    assert [(e["type"], e.get("index")) for e in events] == [
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("content_block_start", 2),
        ("content_block_stop", 2),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert events[0]["delta"] == _json(' w3"}')
    assert events[2]["content_block"]["id"] == "toolu_2"
    assert events[4]["delta"]["stop_reason"] == "tool_use"


def responses(*events: dict[str, Any]) -> bytes:
    return b"".join(
        format_event(e["type"], {**e, "sequence_number": n}) for n, e in enumerate(events)
    )


CREATED = {"type": "response.created", "response": {"id": "resp_1", "created_at": 5}}
PROGRESS = {"type": "response.in_progress", "response": {"id": "resp_1"}}
ITEM = {
    "type": "response.output_item.added",
    "output_index": 0,
    "item": {"type": "message", "id": "msg_9"},
}
PART = {
    "type": "response.content_part.added",
    "item_id": "msg_9",
    "output_index": 0,
    "content_index": 0,
    "part": {"type": "output_text", "text": ""},
}


def text_delta(text: str) -> dict[str, Any]:
    return {"type": "response.output_text.delta", "item_id": "msg_9", "delta": text}


def test_a_responses_message_goes_on_in_the_same_item_and_numbering() -> None:
    sent = responses(CREATED, PROGRESS, ITEM, PART, text_delta(" w1"))
    found = resume(responses_request(), sent)
    assert found is not None and (found.text, found.tokens) == (" w1", 1)
    events = relayed(found, [chunk(" w2", "stop"), USAGE])
    assert [e["sequence_number"] for e in events] == list(range(5, 5 + len(events)))
    assert events[0]["type"] == "response.output_text.delta"
    assert {e.get("item_id") for e in events[:-2]} == {"msg_9"}
    final = events[-1]
    assert final["type"] == "response.completed"
    assert (final["response"]["id"], final["response"]["created_at"]) == ("resp_1", 5)
    [message] = final["response"]["output"]
    assert message["id"] == "msg_9" and message["content"][0]["text"] == " w1 w2"
    assert final["response"]["usage"]["output_tokens"] == 3


def test_a_responses_thought_and_calls_go_on_in_their_items() -> None:
    reasoning = {**ITEM, "item": {"type": "reasoning", "id": "rs_1"}}
    reasoning_part = {
        **PART,
        "item_id": "rs_1",
        "part": {"type": "reasoning_text", "text": ""},
    }
    thought = {"type": "response.reasoning_text.delta", "item_id": "rs_1", "delta": " w1"}
    shown = {"type": "reasoning", "id": "rs_1", "content": [{"text": " w1"}]}
    call = {
        "type": "response.output_item.added",
        "output_index": 1,
        "item": {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "count"},
    }
    arguments = {
        "type": "response.function_call_arguments.delta",
        "item_id": "fc_1",
        "delta": '{"n": " w2',
    }
    sent = responses(
        CREATED,
        reasoning,
        reasoning_part,
        thought,
        {"type": "response.reasoning_text.done", "item_id": "rs_1", "text": " w1"},
        {"type": "response.output_item.done", "item": shown},
        call,
        arguments,
    )
    found = resume(responses_request(), sent)
    assert found is not None
    assert (found.reasoning, found.calls, found.tokens) == (
        " w1",
        (("call_1", "count", '{"n": " w2'),),
        2,
    )
    rest = {"index": 0, "function": {"arguments": ' w3"}'}}
    events = relayed(
        found,
        [
            {"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [rest]}}]},
            {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        ],
    )
    assert [e["sequence_number"] for e in events] == list(range(8, 8 + len(events)))
    assert [e["type"] for e in events] == [
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[1]["arguments"] == '{"n": " w2 w3"}'
    output = events[-1]["response"]["output"]
    assert [i["id"] for i in output] == ["rs_1", "fc_1"] and output[0] == shown
    assert output[1]["call_id"] == "call_1"


def test_responses_streams_that_are_not_continued() -> None:
    req = responses_request()
    # A function call without its call id and name.
    call = {**ITEM, "item": {"type": "function_call", "id": "fc_1"}}
    # A reasoning item after the message.
    reasoning = {**ITEM, "output_index": 1, "item": {"type": "reasoning", "id": "rs_1"}}
    done = {"type": "response.output_text.done", "item_id": "msg_9", "text": "w1"}
    item_done = {"type": "response.output_item.done", "item": {"type": "message", "id": "msg_9"}}
    for sent in (
        b"",
        responses(PROGRESS),
        responses(CREATED, call),
        responses(CREATED, ITEM, PART, text_delta("w1"), done, item_done, reasoning),
        responses(CREATED, ITEM),  # an item without its text part
        # The text declared done: nothing may follow; the item done with nothing after.
        responses(CREATED, ITEM, PART, text_delta("w1"), done),
        responses(CREATED, ITEM, PART, text_delta("w1"), done, item_done),
    ):
        assert resume(req, sent) is None, sent


def test_a_request_only_a_native_engine_can_take_is_never_resumed() -> None:
    body = {"model": "m", "input": "hi", "previous_response_id": "resp_0", "stream": True}
    req = ResponsesApi().parse(orjson.dumps(body))
    assert req.native is not None and req.native.required is not None
    assert req.native.resume is None
