"""Finding `usage` in engine answers without parsing everything."""

from __future__ import annotations

import orjson

from llmgw.router.ids import is_uuid, new_request_id
from llmgw.router.sse import SSERelay
from llmgw.router.usage_scan import find_usage


def test_usage_is_found_in_a_whole_completion() -> None:
    body = orjson.dumps(
        {
            "choices": [{"message": {"content": 'a "usage": {not json}'}}],
            "usage": {
                "prompt_tokens": 3,
                "completion_tokens": 4,
                "prompt_tokens_details": {"cached_tokens": 1},
            },
        }
    )
    assert find_usage(body) == {
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "prompt_tokens_details": {"cached_tokens": 1},
    }
    assert find_usage(b'{"usage": {"prompt_tokens": 9}}') == {"prompt_tokens": 9}
    assert find_usage(b'{"choices": []}') is None
    assert find_usage(b'{"usage":{"prompt_tokens": 9') is None


def test_a_batch_of_events_keeps_everything_but_the_usage_chunk() -> None:
    events = [b'data: {"choices":[{"delta":{"content":"w%d"}}]}\n\n' % i for i in range(5)]
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":5,"total_tokens":7}}\n\n'
    done = b"data: [DONE]\n\n"
    relay = SSERelay(strip_usage=True)
    assert relay.feed(b"".join(events) + usage + done) == b"".join(events) + done
    assert relay.usage == {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}
    crlf = [e.replace(b"\n\n", b"\r\n\r\n") for e in (*events, usage, done)]
    relay = SSERelay(strip_usage=True)
    assert relay.feed(b"".join(crlf)) == b"".join(crlf[:5]) + crlf[6]


def test_request_ids_are_version_4_uuids() -> None:
    ids = {new_request_id() for _ in range(100)}
    assert len(ids) == 100
    for value in ids:
        assert is_uuid(value)
        assert value[14:15] == b"4" and value[19:20] in b"89ab"
    assert not is_uuid(b"trace-77")
