"""`POST /v1/messages/count_tokens`: a Messages prompt's tokens, counted by the engine.

The request is checked and translated as for `/v1/messages` (without
`max_tokens`) and sent to the tokenizer route of one available replica of the
model: `/tokenize` with the chat messages (vLLM applies the chat template, so
the count is what a completion's `prompt_tokens` will be; the sim counts the
same way), `/tokenize` with the text (SGLang, which takes a prompt), or
`/extras/tokenize/count` with the text (llama-cpp-python's server). Which of
them a replica has is learned on its first count and remembered per replica:
a 404 moves on to the next, a 400/422 to the next body shape. A replica whose
engine serves no `/tokenize` (its endpoint's routes) is not asked. With none (or
when the replica cannot be reached) the count is the router's own estimate,
and the answer says so with `x-llmgw-estimated: true`.

Not guaranteed: text counts (SGLang, llama.cpp) leave out the chat template's
own tokens; images are not counted by any engine here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson

from llmgw.engines.routes import TOKENIZE
from llmgw.router.apis.messages_request import translate_request
from llmgw.router.endpoints import Endpoint, EndpointPool
from llmgw.router.errors import ModelNotFound
from llmgw.router.requests import ParsedRequest
from llmgw.router.upstream import Upstream, UpstreamError

# (path, body shape) in the order they are tried.
_ROUTES: tuple[tuple[str, str], ...] = (
    ("/tokenize", "messages"),
    ("/tokenize", "prompt"),
    ("/extras/tokenize/count", "input"),
)
_JSON = ((b"Content-Type", b"application/json"),)
# A tokenizer answers in milliseconds; a replica slower than this is busy generating,
# and an estimate now beats an exact count late.
_TIMEOUT = 5.0


def parse(raw: bytes) -> ParsedRequest:
    """A count_tokens body; InvalidRequest naming the field."""
    return translate_request(raw, counting=True)


def _text(chat: dict[str, Any]) -> str:
    parts: list[str] = []
    for message in chat.get("messages", ()):
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(p["text"] for p in content if p.get("type") == "text")
        for call in message.get("tool_calls") or ():
            parts.append(call["function"]["name"] + call["function"]["arguments"])
    if chat.get("tools"):
        parts.append(orjson.dumps(chat["tools"]).decode())
    return "\n".join(parts)


def _body(shape: str, model: str, chat: dict[str, Any]) -> bytes:
    if shape == "messages":
        body: dict[str, Any] = {
            "model": model,
            "messages": chat["messages"],
            "add_generation_prompt": True,
        }
        if chat.get("tools"):
            body["tools"] = chat["tools"]
        return orjson.dumps(body)
    key = "prompt" if shape == "prompt" else "input"
    return orjson.dumps({"model": model, key: _text(chat)})


def _count(raw: bytes) -> int | None:
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(parsed, dict):
        return None
    count = parsed.get("count")
    if isinstance(count, int) and not isinstance(count, bool):
        return count
    tokens = parsed.get("tokens")
    return len(tokens) if isinstance(tokens, list) else None


class TokenCounter:
    """Counts prompt tokens at an engine's tokenizer, or estimates them."""

    def __init__(
        self, *, pool: EndpointPool, upstream: Upstream, clock: Callable[[], float]
    ) -> None:
        self._pool = pool
        self._upstream = upstream
        self._clock = clock
        # endpoint id -> index into _ROUTES of its tokenizer, or len(_ROUTES) for none.
        self._learned: dict[str, int] = {}

    async def count(self, req: ParsedRequest) -> tuple[int, bool]:
        """(input tokens, whether they are estimated); ModelNotFound for an unknown model."""
        endpoints = self._pool.by_model.get(req.model)
        if endpoints is None:
            raise ModelNotFound(
                f"model '{req.model}' is not served here; GET /v1/models lists the models",
                param="model",
            )
        now = self._clock()
        # An endpoint whose engine has no tokenizer (by its routes) is not asked.
        ready = [e for e in endpoints if e.available(now) and e.path_for(TOKENIZE) is not None]
        if ready:
            endpoint = min(ready, key=lambda e: e.in_flight)
            model = self._pool.aliases.get(req.model, req.model)
            counted = await self._at_engine(endpoint, model, req.body)
            if counted is not None:
                return counted, False
        return req.prompt_tokens_estimate(), True

    async def _at_engine(self, endpoint: Endpoint, model: str, chat: dict[str, Any]) -> int | None:
        index = self._learned.get(endpoint.id, 0)
        while index < len(_ROUTES):
            path, shape = _ROUTES[index]
            try:
                async with asyncio.timeout(_TIMEOUT):
                    resp = await self._upstream.request(
                        b"POST", endpoint.url, path, _body(shape, model, chat), _JSON
                    )
                    try:
                        raw = await resp.read()
                    except BaseException:
                        resp.close()
                        raise
                resp.release()
            except (UpstreamError, TimeoutError):
                return None
            if resp.status == 200:
                counted = _count(raw)
                if counted is not None:
                    self._learned[endpoint.id] = index
                    return counted
                return None
            if resp.status == 404:
                # No such route: skip the other shapes of the same path.
                index += 1
                while index < len(_ROUTES) and _ROUTES[index][0] == path:
                    index += 1
            elif resp.status in (400, 422):
                index += 1
            else:
                return None
        self._learned[endpoint.id] = len(_ROUTES)
        return None
