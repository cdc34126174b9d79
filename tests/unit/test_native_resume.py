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
    for sent in (
        b"",
        anthropic(TEXT, delta("w1")),  # no message_start
        anthropic(START, thinking),
        anthropic(START, tool),
        anthropic(START, TEXT, delta("w1"), stop),
        anthropic(START, TEXT, delta("w1"), error),
        b"event: message_start\ndata: not json\n\n",
    ):
        assert resume(req, sent) is None, sent


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


def test_responses_streams_that_are_not_continued() -> None:
    req = responses_request()
    call = {**ITEM, "item": {"type": "function_call", "id": "fc_1"}}
    reasoning = {**ITEM, "item": {"type": "reasoning", "id": "rs_1"}}
    done = {"type": "response.output_text.done", "item_id": "msg_9", "text": "w1"}
    for sent in (
        b"",
        responses(PROGRESS),
        responses(CREATED, call),
        responses(CREATED, reasoning),
        responses(CREATED, ITEM),  # an item without its text part
        responses(CREATED, ITEM, PART, text_delta("w1"), done),
    ):
        assert resume(req, sent) is None, sent


def test_a_request_only_a_native_engine_can_take_is_never_resumed() -> None:
    body = {"model": "m", "input": "hi", "previous_response_id": "resp_0", "stream": True}
    req = ResponsesApi().parse(orjson.dumps(body))
    assert req.native is not None and req.native.required is not None
    assert req.native.resume is None
