"""Request checking: the field named in the error, the body forwarded as it must be."""

from __future__ import annotations

import orjson
import pytest

from llmgw.router.errors import InvalidJSON, InvalidRequest
from llmgw.router.requests import CHAT, COMPLETIONS, EMBEDDINGS, parse_request


def chat(**fields: object) -> bytes:
    return orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields})


def test_non_streaming_body_is_forwarded_byte_for_byte() -> None:
    raw = b'{"model": "m",  "messages": []}'
    req = parse_request(CHAT, raw)
    assert req.upstream_body is raw
    assert (req.model, req.stream, req.client_wants_usage) == ("m", False, False)


def test_streaming_asks_the_engine_for_usage_and_remembers_the_client_did_not() -> None:
    req = parse_request(CHAT, chat(stream=True, stream_options={"other": 1}))
    sent = orjson.loads(req.upstream_body)
    assert sent["stream_options"] == {"other": 1, "include_usage": True}
    assert req.stream and not req.client_wants_usage


def test_client_asking_for_usage_is_forwarded_unchanged() -> None:
    raw = chat(stream=True, stream_options={"include_usage": True})
    req = parse_request(CHAT, raw)
    assert req.upstream_body is raw
    assert req.client_wants_usage


@pytest.mark.parametrize(
    ("path", "raw", "param", "text"),
    [
        (CHAT, b'{"messages": []}', "model", "provide a 'model'"),
        (CHAT, b'{"model": 3, "messages": []}', "model", "non-empty string, got a number"),
        (CHAT, b'{"model": ""}', "model", "non-empty string"),
        (CHAT, b'{"model": "m"}', "messages", "provide a 'messages'"),
        (CHAT, b'{"model": "m", "messages": "hi"}', "messages", "an array of messages"),
        (COMPLETIONS, b'{"model": "m"}', "prompt", "provide a 'prompt'"),
        (EMBEDDINGS, b'{"model": "m", "input": 5}', "input", "a string or an array"),
        (CHAT, chat(stream="yes"), "stream", "'stream' must be a boolean"),
        (CHAT, chat(max_tokens="10"), "max_tokens", "an integer, got a string"),
        (CHAT, chat(max_tokens=True), "max_tokens", "an integer, got a boolean"),
        (CHAT, chat(temperature="hot"), "temperature", "a number"),
        (CHAT, chat(stream_options=[]), "stream_options", "must be an object"),
        (
            CHAT,
            chat(stream_options={"include_usage": 1}),
            "stream_options.include_usage",
            "boolean",
        ),
        (
            EMBEDDINGS,
            b'{"model": "m", "input": "x", "stream": true}',
            "stream",
            "cannot be streamed",
        ),
    ],
)
def test_bad_fields_are_named(path: str, raw: bytes, param: str, text: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_request(path, raw)
    assert info.value.param == param
    assert text in info.value.message
    assert info.value.status == 400


@pytest.mark.parametrize("raw", [b"", b"{", b"not json", b'{"model": "m",}'])
def test_invalid_json(raw: bytes) -> None:
    with pytest.raises(InvalidJSON) as info:
        parse_request(CHAT, raw)
    assert "not valid JSON" in info.value.message


@pytest.mark.parametrize("raw", [b"[]", b'"text"', b"null", b"3"])
def test_body_must_be_an_object(raw: bytes) -> None:
    with pytest.raises(InvalidRequest, match="must be a JSON object"):
        parse_request(CHAT, raw)
