"""Keeping a client's body for engines that serve its API natively.

`with_native` parses a body of another API (Messages, Responses) both ways at
once: the chat completion a translation sends, and the client's own bytes for
an engine that speaks the API itself (`NativeRequest`). Which one goes out is
decided per attempt by the proxy, from the endpoint it picked
(`Endpoint.native_apis`), so a model whose replicas differ is served by each in
its own way.

A body the translation refuses but that is valid JSON naming a model (a
Responses `previous_response_id`, an Anthropic server tool) is kept for native
engines only: the translation's error, which names the field, is its answer
when the model has no replica serving the API natively.

Not guaranteed: that a native engine accepts what the translation refused; the
engine answers that in the API's own error shape.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from llmgw.router.errors import InvalidJSON, InvalidRequest
from llmgw.router.requests import CHAT, InvalidModel, NativeRequest, ParsedRequest, model_problem


def with_native(
    api: str, path: str, raw: bytes, translate: Callable[[bytes], ParsedRequest]
) -> ParsedRequest:
    """`raw` translated when it can be, always with its native form; InvalidRequest
    when it is no request of the API at all (not JSON, no model, a bad `stream`)."""
    try:
        req = translate(raw)
    except (InvalidJSON, InvalidModel):
        raise
    except InvalidRequest as exc:
        req = _native_only(raw, exc)
        req.native = NativeRequest(api, path, raw, required=exc)
        return req
    req.native = NativeRequest(api, path, raw)
    return req


def _native_only(raw: bytes, refused: InvalidRequest) -> ParsedRequest:
    """A request only a native engine can serve; `refused` when it names no model."""
    body = orjson.loads(raw)
    if not isinstance(body, dict):
        raise refused
    model = body.get("model")
    stream = body.get("stream", False)
    if model_problem(model) is not None or not isinstance(stream, bool):
        raise refused
    assert isinstance(model, str)
    # Its route is the translation's, though only native endpoints get it.
    return ParsedRequest(
        path=CHAT,
        model=model,
        stream=stream,
        client_wants_usage=False,
        upstream_body=b"",
        body=body,
    )
