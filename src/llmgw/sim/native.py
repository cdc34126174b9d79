"""`/v1/messages` and `/v1/responses` served natively by `llmgw sim --native-apis`.

Like vLLM and SGLang, the sim can answer Anthropic's Messages API and OpenAI's
Responses API itself, so a gateway's pass-through of those APIs is tested
without GPUs. Generation is the chat path's (`Inference.run`): same engine,
timing, faults and counters, and the prompt costs the same tokens as the same
conversation sent as a chat completion.

At the edges each API's specification is followed: a generation given a limit
runs to it (as the chat path does), so a Messages answer stops with
`max_tokens` and a Responses answer cut by `max_output_tokens` is `incomplete`
with `incomplete_details.reason`; a Messages stream's `message_start` carries
`input_tokens` and its `message_delta` both counts (as vLLM's does: the final
Message an Anthropic SDK assembles takes `input_tokens` from it); a Responses
stream ends with `response.completed` (or `response.incomplete`) holding the
usage. A request that forces a tool (`tool_choice` `any`/`tool`, or
`required`/a function) is answered with a call of that tool, its arguments
made from its schema. Errors have each API's own shape: Anthropic's
`{"type": "error", "error": {...}}`, OpenAI's `{"error": {...}}`.

Not guaranteed: a tool call's arguments are streamed in one delta at the end.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any, Final

import orjson

from llmgw.sim.asgi import Receive, Scope, Send, send_bytes, send_error
from llmgw.sim.errors import SimError
from llmgw.sim.inference import Inference
from llmgw.sim.native_request import (
    NativeRequest,
    Tool,
    arguments_for,
    parse_messages,
    parse_responses,
)
from llmgw.sim.stats import ModelCounters

_SSE_HEADERS: Final = (
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
)
_ANTHROPIC_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def _id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def _event(name: str, payload: dict[str, Any]) -> dict[str, object]:
    body = b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"
    return {"type": "http.response.body", "body": body, "more_body": True}


async def _start_message_stream(send: Send, model: str, input_tokens: int) -> None:
    """The response head and `message_start` of a Messages stream."""
    await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
    start: dict[str, Any] = {
        "id": _id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 0},
    }
    await send(_event("message_start", {"type": "message_start", "message": start}))


async def _anthropic_error(send: Send, error: SimError) -> None:
    kind = _ANTHROPIC_TYPES.get(error.status, "api_error" if error.status >= 500 else "")
    body = {
        "type": "error",
        "error": {"type": kind or "invalid_request_error", "message": error.message},
    }
    await send_bytes(send, error.status, orjson.dumps(body))


class NativeApis:
    """Handlers of the natively served APIs, over the chat path's `Inference`."""

    def __init__(self, *, inference: Inference) -> None:
        self._inference = inference

    async def _prepare(
        self, scope: Scope, receive: Receive, send: Send, *, messages: bool
    ) -> tuple[NativeRequest, str, ModelCounters] | None:
        """Parse and resolve the request, answering its errors (None: answered or gone)."""
        inference = self._inference
        try:
            data = await inference.begin(scope, receive)
            if data is None:
                return None
            request = parse_messages(data) if messages else parse_responses(data)
            model, counters = inference.resolve(request.generation.model)
        except SimError as exc:
            inference.stats.requests_failed += 1
            await (_anthropic_error(send, exc) if messages else send_error(send, exc))
            return None
        faults = inference.faults
        if faults.should_fail():
            error = await inference.injected_error(receive, faults.settings)
            if error is not None:
                await (_anthropic_error(send, error) if messages else send_error(send, error))
            return None
        return request, model, counters

    async def messages(self, scope: Scope, receive: Receive, send: Send) -> None:
        prepared = await self._prepare(scope, receive, send, messages=True)
        if prepared is None:
            return
        request, model, counters = prepared
        if request.generation.stream:
            await self._messages_stream(receive, send, request, model, counters)
            return
        inference = self._inference
        tokens = await inference.run(
            receive, request.generation, model, counters, inference.faults.settings, None
        )
        if tokens is None:
            return
        usage = {"input_tokens": len(request.generation.prompt), "output_tokens": len(tokens)}
        content = [_message_block(request.tool, tokens)]
        message = {
            "id": _id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": "tool_use" if request.tool else _stop_reason(request),
            "stop_sequence": None,
            "usage": usage,
        }
        await send_bytes(send, 200, orjson.dumps(message))
        inference.completed(counters)

    async def _messages_stream(
        self,
        receive: Receive,
        send: Send,
        request: NativeRequest,
        model: str,
        counters: ModelCounters,
    ) -> None:
        inference = self._inference
        if inference.sequence and request.tool is None:
            await self._messages_blocks_stream(receive, send, request, model, counters)
            return
        tool = request.tool
        block: dict[str, Any] = (
            {"type": "tool_use", "id": _id("toolu_"), "name": tool.name, "input": {}}
            if tool is not None
            else {"type": "text", "text": ""}
        )

        async def emit(index: int, token: str) -> None:
            if index == 0:
                await _start_message_stream(send, model, len(request.generation.prompt))
                await send(
                    _event(
                        "content_block_start",
                        {"type": "content_block_start", "index": 0, "content_block": block},
                    )
                )
            if tool is None:
                delta = {"type": "text_delta", "text": token}
                await send(
                    _event(
                        "content_block_delta",
                        {"type": "content_block_delta", "index": 0, "delta": delta},
                    )
                )

        tokens = await inference.run(
            receive, request.generation, model, counters, inference.faults.settings, emit, send
        )
        if tokens is None:
            return
        if tool is not None:
            arguments = arguments_for(tool, "".join(tokens), len(tokens))
            delta = {"type": "input_json_delta", "partial_json": orjson.dumps(arguments).decode()}
            await send(
                _event(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": 0, "delta": delta},
                )
            )
        await send(_event("content_block_stop", {"type": "content_block_stop", "index": 0}))
        end = {
            "type": "message_delta",
            "delta": {
                "stop_reason": "tool_use" if tool else _stop_reason(request),
                "stop_sequence": None,
            },
            "usage": {"input_tokens": len(request.generation.prompt), "output_tokens": len(tokens)},
        }
        await send(_event("message_delta", end))
        stop = _event("message_stop", {"type": "message_stop"})
        await send({**stop, "more_body": False})
        inference.completed(counters)

    async def _messages_blocks_stream(
        self,
        receive: Receive,
        send: Send,
        request: NativeRequest,
        model: str,
        counters: ModelCounters,
    ) -> None:
        """A counting answer in the blocks the chat path's deltas would make: a
        `thinking` block for the thought, then a `text` block, or one `tool_use` block
        per call (arguments as `input_json_delta` pieces, a word each) when the request
        offers a tool and the sim acts as a tool parser."""
        inference = self._inference
        generation = request.generation
        tokens = inference.tokens(generation)
        parts = inference.parts(generation, tokens)
        state: dict[str, Any] = {"key": None, "index": -1}

        def block_event(name: str, **fields: Any) -> dict[str, object]:
            return _event(name, {"type": name, "index": state["index"], **fields})

        async def emit(index: int, token: str) -> None:
            if index == 0:
                await _start_message_stream(send, model, len(generation.prompt))
            kind, call, piece = parts[index]
            if state["key"] != (kind, call):
                if state["key"] is not None:
                    await send(block_event("content_block_stop"))
                state["key"] = (kind, call)
                state["index"] += 1
                blocks: dict[str, dict[str, Any]] = {
                    "thought": {"type": "thinking", "thinking": "", "signature": ""},
                    "text": {"type": "text", "text": ""},
                    "call": {
                        "type": "tool_use",
                        "id": _id("toolu_"),
                        "name": generation.tool,
                        "input": {},
                    },
                }
                await send(block_event("content_block_start", content_block=blocks[kind]))
            delta = {
                "thought": {"type": "thinking_delta", "thinking": piece},
                "text": {"type": "text_delta", "text": piece},
                "call": {"type": "input_json_delta", "partial_json": piece},
            }[kind]
            await send(block_event("content_block_delta", delta=delta))

        done = await inference.run(
            receive, generation, model, counters, inference.faults.settings, emit, send
        )
        if done is None:
            return
        if state["key"] is not None:
            await send(block_event("content_block_stop"))
        called = any(kind == "call" for kind, _, _ in parts)
        end = {
            "type": "message_delta",
            "delta": {
                "stop_reason": "tool_use" if called else _stop_reason(request),
                "stop_sequence": None,
            },
            "usage": {"input_tokens": len(generation.prompt), "output_tokens": len(done)},
        }
        await send(_event("message_delta", end))
        stop = _event("message_stop", {"type": "message_stop"})
        await send({**stop, "more_body": False})
        inference.completed(counters)

    async def responses(self, scope: Scope, receive: Receive, send: Send) -> None:
        prepared = await self._prepare(scope, receive, send, messages=False)
        if prepared is None:
            return
        request, model, counters = prepared
        shape = _ResponseShape(request, model, int(self._inference.wall_clock()))
        if request.generation.stream:
            await self._responses_stream(receive, send, request, model, counters, shape)
            return
        inference = self._inference
        tokens = await inference.run(
            receive, request.generation, model, counters, inference.faults.settings, None
        )
        if tokens is None:
            return
        await send_bytes(send, 200, orjson.dumps(shape.finished(tokens)))
        inference.completed(counters)

    async def _responses_stream(
        self,
        receive: Receive,
        send: Send,
        request: NativeRequest,
        model: str,
        counters: ModelCounters,
        shape: _ResponseShape,
    ) -> None:
        inference = self._inference
        if inference.sequence and request.tool is None:
            await self._responses_items_stream(receive, send, request, model, counters, shape)
            return
        seq = 0

        def event(kind: str, **fields: Any) -> dict[str, object]:
            nonlocal seq
            seq += 1
            return _event(kind, {"type": kind, "sequence_number": seq - 1, **fields})

        item = shape.item(None)
        where = {"item_id": item["id"], "output_index": 0}

        async def emit(index: int, token: str) -> None:
            if index == 0:
                await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
                await send(event("response.created", response=shape.response("in_progress", [])))
                await send(
                    event("response.in_progress", response=shape.response("in_progress", []))
                )
                await send(event("response.output_item.added", output_index=0, item=item))
                if request.tool is None:
                    part = _text_part("")
                    await send(
                        event("response.content_part.added", **where, content_index=0, part=part)
                    )
            if request.tool is None:
                await send(
                    event(
                        "response.output_text.delta",
                        **where,
                        content_index=0,
                        delta=token,
                        logprobs=[],
                    )
                )

        tokens = await inference.run(
            receive, request.generation, model, counters, inference.faults.settings, emit, send
        )
        if tokens is None:
            return
        done = shape.item(tokens)
        if request.tool is None:
            text = "".join(tokens)
            await send(
                event("response.output_text.done", **where, content_index=0, text=text, logprobs=[])
            )
            await send(
                event("response.content_part.done", **where, content_index=0, part=_text_part(text))
            )
        else:
            arguments = done["arguments"]
            await send(event("response.function_call_arguments.delta", **where, delta=arguments))
            await send(
                event(
                    "response.function_call_arguments.done",
                    **where,
                    name=done["name"],
                    arguments=arguments,
                )
            )
        await send(event("response.output_item.done", output_index=0, item=done))
        final = shape.finished(tokens)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        await send({**event(kind, response=final), "more_body": False})
        inference.completed(counters)

    async def _responses_items_stream(
        self,
        receive: Receive,
        send: Send,
        request: NativeRequest,
        model: str,
        counters: ModelCounters,
        shape: _ResponseShape,
    ) -> None:
        """A counting answer in the items the chat path's deltas would make: a
        `reasoning` item for the thought, then a `message`, or one `function_call` item
        per call (arguments a word a delta) when the request offers a tool and the sim
        acts as a tool parser."""
        inference = self._inference
        generation = request.generation
        parts = inference.parts(generation, inference.tokens(generation))
        called = any(kind == "call" for kind, _, _ in parts)
        status = "incomplete" if generation.max_tokens is not None and not called else "completed"
        done: list[dict[str, Any]] = []
        state: dict[str, Any] = {"seq": 0, "key": None, "item": None}

        def event(kind: str, **fields: Any) -> dict[str, object]:
            state["seq"] += 1
            return _event(kind, {"type": kind, "sequence_number": state["seq"] - 1, **fields})

        async def close() -> None:
            item: _OutputItem | None = state["item"]
            if item is None:
                return
            where = item.where()
            if item.kind == "call":
                await send(
                    event(
                        "response.function_call_arguments.done",
                        **where,
                        name=item.name,
                        arguments=item.text,
                    )
                )
            else:
                name = "reasoning_text" if item.kind == "thought" else "output_text"
                extra: dict[str, Any] = {} if item.kind == "thought" else {"logprobs": []}
                await send(
                    event(
                        f"response.{name}.done", **where, content_index=0, text=item.text, **extra
                    )
                )
                await send(
                    event("response.content_part.done", **where, content_index=0, part=item.part())
                )
            shown = item.shown(status if item.kind == "text" else "completed")
            done.append(shown)
            await send(
                event("response.output_item.done", output_index=item.output_index, item=shown)
            )

        async def emit(index: int, token: str) -> None:
            if index == 0:
                await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
                await send(event("response.created", response=shape.response("in_progress", [])))
                await send(
                    event("response.in_progress", response=shape.response("in_progress", []))
                )
            kind, call, piece = parts[index]
            if state["key"] != (kind, call):
                await close()
                state["key"] = (kind, call)
                item = state["item"] = _OutputItem(kind, len(done), generation.tool)
                await send(
                    event(
                        "response.output_item.added",
                        output_index=item.output_index,
                        item=item.shown("in_progress"),
                    )
                )
                if kind != "call":
                    await send(
                        event(
                            "response.content_part.added",
                            **item.where(),
                            content_index=0,
                            part=item.part(),
                        )
                    )
            item = state["item"]
            item.text += piece
            if kind == "call":
                await send(
                    event("response.function_call_arguments.delta", **item.where(), delta=piece)
                )
            elif kind == "thought":
                await send(
                    event(
                        "response.reasoning_text.delta",
                        **item.where(),
                        content_index=0,
                        delta=piece,
                    )
                )
            else:
                await send(
                    event(
                        "response.output_text.delta",
                        **item.where(),
                        content_index=0,
                        delta=piece,
                        logprobs=[],
                    )
                )

        tokens = await inference.run(
            receive, generation, model, counters, inference.faults.settings, emit, send
        )
        if tokens is None:
            return
        await close()
        final = shape.finished(tokens)
        final["output"] = done
        final["status"] = status
        if status == "completed":
            final["incomplete_details"] = None
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        await send({**event(kind, response=final), "more_body": False})
        inference.completed(counters)


class _OutputItem:
    """An output item of a counting Responses stream while it is written."""

    def __init__(self, kind: str, output_index: int, name: str) -> None:
        self.kind = kind
        self.output_index = output_index
        self.id = _id({"thought": "rs_", "text": "msg_", "call": "fc_"}[kind])
        self.call_id = _id("call_")
        self.name = name
        self.text = ""

    def where(self) -> dict[str, Any]:
        return {"item_id": self.id, "output_index": self.output_index}

    def part(self) -> dict[str, Any]:
        if self.kind == "thought":
            return {"type": "reasoning_text", "text": self.text}
        return _text_part(self.text)

    def shown(self, status: str) -> dict[str, Any]:
        if self.kind == "call":
            return {
                "type": "function_call",
                "id": self.id,
                "call_id": self.call_id,
                "name": self.name,
                "arguments": self.text if status != "in_progress" else "",
                "status": status,
            }
        content = [] if status == "in_progress" else [self.part()]
        if self.kind == "thought":
            return {
                "type": "reasoning",
                "id": self.id,
                "summary": [],
                "content": content,
                "status": status,
            }
        return {
            "type": "message",
            "id": self.id,
            "status": status,
            "role": "assistant",
            "content": content,
        }


def _stop_reason(request: NativeRequest) -> str:
    # As on the chat path, a generation given a limit runs to it.
    return "max_tokens" if request.generation.max_tokens is not None else "end_turn"


def _message_block(tool: Tool | None, tokens: Sequence[str]) -> dict[str, Any]:
    if tool is None:
        return {"type": "text", "text": "".join(tokens)}
    return {
        "type": "tool_use",
        "id": _id("toolu_"),
        "name": tool.name,
        "input": arguments_for(tool, "".join(tokens), len(tokens)),
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class _ResponseShape:
    """One Response's fixed parts (ids, echoed settings) and how it looks when done."""

    def __init__(self, request: NativeRequest, model: str, created: int) -> None:
        body = request.body
        self._request = request
        self._item_id = _id("fc_" if request.tool else "msg_")
        self._call_id = _id("call_")
        self._head: dict[str, Any] = {
            "id": _id("resp_"),
            "object": "response",
            "created_at": created,
            "error": None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "metadata": body.get("metadata") or {},
            "model": model,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": None,
            "store": bool(body.get("store", True)),
            "temperature": body.get("temperature"),
            "text": body.get("text") or {"format": {"type": "text"}},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_p": body.get("top_p"),
            "truncation": body.get("truncation") or "disabled",
            "user": body.get("user"),
        }

    def _incomplete(self) -> bool:
        return self._request.tool is None and self._request.generation.max_tokens is not None

    def item(self, tokens: Sequence[str] | None) -> dict[str, Any]:
        """The answer's output item: in progress (no tokens yet) or done."""
        tool = self._request.tool
        status = "in_progress" if tokens is None else "completed"
        if tokens is not None and self._incomplete():
            status = "incomplete"
        if tool is not None:
            arguments = ""
            if tokens is not None:
                args = arguments_for(tool, "".join(tokens), len(tokens))
                arguments = orjson.dumps(args).decode()
            return {
                "type": "function_call",
                "id": self._item_id,
                "call_id": self._call_id,
                "name": tool.name,
                "arguments": arguments,
                "status": status,
            }
        content = [] if tokens is None else [_text_part("".join(tokens))]
        return {
            "type": "message",
            "id": self._item_id,
            "status": status,
            "role": "assistant",
            "content": content,
        }

    def response(self, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            **self._head,
            "status": status,
            "incomplete_details": None,
            "output": output,
            "usage": None,
        }

    def finished(self, tokens: Sequence[str]) -> dict[str, Any]:
        prompt = len(self._request.generation.prompt)
        incomplete = self._incomplete()
        out = self.response("incomplete" if incomplete else "completed", [self.item(tokens)])
        if incomplete:
            out["incomplete_details"] = {"reason": "max_output_tokens"}
        out["usage"] = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": len(tokens),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + len(tokens),
        }
        return out
