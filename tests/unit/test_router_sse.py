"""The SSE relay forwards engine bytes unchanged except the usage chunk."""

from __future__ import annotations

import orjson

from llmgw.router.sse import SSERelay

CHUNK = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":" hi"}}]}\n\n'
USAGE = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}\n\n'
DONE = b"data: [DONE]\n\n"


def test_complete_events_pass_through_byte_for_byte() -> None:
    relay = SSERelay(strip_usage=False)
    assert relay.feed(CHUNK + CHUNK) == CHUNK + CHUNK
    assert relay.feed(DONE) == DONE
    assert relay.usage is None


def test_partial_events_are_held_until_complete() -> None:
    relay = SSERelay(strip_usage=False)
    assert relay.feed(CHUNK[:10]) == b""
    assert relay.feed(CHUNK[10:-1]) == b""
    assert relay.feed(CHUNK[-1:] + CHUNK[:5]) == CHUNK
    assert relay.finish(prompt_tokens_estimate=0) == CHUNK[:5]


def test_usage_chunk_is_read_and_removed_when_client_did_not_ask() -> None:
    relay = SSERelay(strip_usage=True)
    out = relay.feed(CHUNK + USAGE + DONE)
    assert out == CHUNK + DONE
    assert relay.usage == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}


def test_usage_chunk_is_read_and_kept_when_client_asked() -> None:
    relay = SSERelay(strip_usage=False)
    assert relay.feed(CHUNK + USAGE + DONE) == CHUNK + USAGE + DONE
    assert relay.usage is not None
    assert relay.usage["completion_tokens"] == 2


def test_usage_chunk_split_across_reads_is_still_found() -> None:
    relay = SSERelay(strip_usage=True)
    assert relay.feed(USAGE[:30]) == b""
    assert relay.feed(USAGE[30:] + DONE) == DONE
    assert relay.usage is not None


def test_crlf_events_as_sse_starlette_writes_them() -> None:
    chunk = CHUNK.replace(b"\n\n", b"\r\n\r\n")
    usage = USAGE.replace(b"\n\n", b"\r\n\r\n").replace(b'"usage":{', b'"usage": {')
    relay = SSERelay(strip_usage=True)
    assert relay.feed(chunk + usage) == chunk
    assert relay.usage is not None
    assert relay.usage["prompt_tokens"] == 5


def test_null_usage_on_every_chunk_is_not_mistaken_for_the_usage_chunk() -> None:
    chunk = b'data: {"choices":[{"delta":{"content":"a"}}],"usage":null}\n\n'
    relay = SSERelay(strip_usage=True)
    assert relay.feed(chunk) == chunk
    assert relay.usage is None


def test_usage_alongside_choices_is_kept() -> None:
    chunk = b'data: {"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":1}}\n\n'
    relay = SSERelay(strip_usage=True)
    assert relay.feed(chunk) == chunk


LLAMA_EVENTS = [
    b'data: {"id":"c1","object":"text_completion","created":5,"model":"g","choices":[{"text":" Paris","index":0,"finish_reason":null}]}\n\n',
    b'data: {"id":"c1","object":"text_completion","created":5,"model":"g","choices":[{"text":".","index":0,"finish_reason":null}]}\n\n',
    b'data: {"id":"c1","object":"text_completion","created":5,"model":"g","choices":[{"text":"","index":0,"finish_reason":"length"}]}\n\n',
    b": ping - 2026-11-30\n\n",
    b"data: [DONE]\n\n",
]


def test_counting_mode_makes_usage_for_engines_that_send_none() -> None:
    relay = SSERelay(strip_usage=False, count_tokens=True)
    out = b"".join(relay.feed(e) for e in LLAMA_EVENTS)
    assert out == b"".join(LLAMA_EVENTS[:4])  # [DONE] held back
    tail = relay.finish(prompt_tokens_estimate=9)
    usage_event, done = tail.split(b"\n\n")[:2]
    chunk = orjson.loads(usage_event[len(b"data: ") :])
    assert chunk["choices"] == []
    assert chunk["usage"] == {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}
    assert (chunk["id"], chunk["object"], chunk["model"]) == ("c1", "text_completion", "g")
    assert done + b"\n\n" == b"data: [DONE]\n\n"


def test_counting_mode_without_client_asking_sends_no_usage() -> None:
    relay = SSERelay(strip_usage=True, count_tokens=True)
    for event in LLAMA_EVENTS:
        relay.feed(event)
    assert relay.finish(prompt_tokens_estimate=3) == b"data: [DONE]\n\n"
    assert relay.usage is not None
    assert relay.usage["completion_tokens"] == 2


def test_counting_mode_prefers_the_engine_usage_when_it_comes() -> None:
    relay = SSERelay(strip_usage=True, count_tokens=True)
    assert relay.feed(CHUNK + USAGE + DONE) == CHUNK
    assert relay.finish(prompt_tokens_estimate=100) == DONE
    assert relay.usage == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
