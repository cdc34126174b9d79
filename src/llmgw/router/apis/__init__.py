"""Client APIs other than OpenAI's chat/completions/embeddings, served over the same proxy.

Each API is an adapter pair behind `ClientApi`: `parse` turns the client's body
into the request the proxy sends to an engine (a chat completion when
translating), and `responder` wraps the ASGI `send` so the engine's answer (one
JSON body or SSE events) reaches the client in the API's own shape. The proxy
never knows which API a request came in as; errors raised before the first byte
are shaped by `error_body`.

An endpoint whose engine serves the API itself (`Endpoint.native_apis`: vLLM
serves Messages and Responses, SGLang Responses; static endpoints say so with
`apis:`) gets the client's body as is instead (`native.with_native`), and its
answer passes through untouched; usage is read from it all the same.

Not guaranteed: an API's fields that a chat completion cannot carry are either
refused with an error naming the field or dropped, as each adapter documents;
such a request goes to native endpoints only, when the model has some.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

from llmgw.router.errors import RouterError
from llmgw.router.requests import ParsedRequest

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]


class ClientApi(Protocol):
    """One client API on the API listener (e.g. Anthropic Messages at /v1/messages)."""

    def parse(self, raw: bytes) -> ParsedRequest:
        """The request to proxy; InvalidRequest naming the field when `raw` is wrong."""
        ...

    def responder(self, req: ParsedRequest, send: Send) -> Send:
        """A `send` that turns the engine's answer to `req` into this API's answer."""
        ...

    def error_body(self, exc: RouterError) -> bytes:
        """The body of an error answer in this API's error shape."""
        ...
