"""The OpenAI Responses API (`/v1/responses`) served natively or by translation.

`ResponsesApi.parse` is `responses_request.translate_request`, keeping the
client's body for engines that serve the API natively (`native.with_native`:
their answers pass through untouched); for the others its responder
turns the engine's chat completion into a Response object (output items:
`reasoning` from `reasoning` or `reasoning_content`, a `message` with `output_text`, one
`function_call` per tool call), and a chat completion stream into the Responses
events as chunks arrive: `response.created`, `response.in_progress`, then per
item `response.output_item.added`, `response.content_part.added`,
`response.output_text.delta` (or `response.reasoning_text.delta`,
`response.function_call_arguments.delta`), their `.done` events and
`response.output_item.done`, and last `response.completed` with the usage.
An answer cut by `max_output_tokens` has status `incomplete` with
`incomplete_details.reason` and ends with `response.incomplete`. Errors keep
the OpenAI shape; a stream that fails after it began ends with an `error` event.

Not guaranteed: the response `id` is made here and is not stored; nothing can
be fetched or continued by it (see responses_request for what is refused).
"""

from __future__ import annotations

import secrets
import time
from functools import partial
from typing import Any

import orjson

from llmgw.router.apis import Send
from llmgw.router.apis.native import with_native
from llmgw.router.apis.relay import ResumedSend, TranslatingSend
from llmgw.router.apis.responses_readback import ITEM_KINDS, StreamItem, complete, read_items
from llmgw.router.apis.responses_request import TranslatedRequest, translate_request
from llmgw.router.apis.sse_events import format_event
from llmgw.router.errors import RouterError, error_body, is_openai_error
from llmgw.router.requests import ParsedRequest, Resumable
from llmgw.router.sse import thought

_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def _id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def _usage(usage: Any, estimate: int) -> dict[str, Any]:
    usage = usage if isinstance(usage, dict) else {}
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    prompt = prompt if isinstance(prompt, int) else estimate
    completion = completion if isinstance(completion, int) else 0
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(ident: str, text: str, status: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": ident,
        "status": status,
        "role": "assistant",
        "content": [_text_part(text)] if status != "in_progress" else [],
    }


def _reasoning_item(ident: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if status != "in_progress" else []
    return {"type": "reasoning", "id": ident, "summary": [], "content": content, "status": status}


def _call_item(ident: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": ident,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


class ResponseShape:
    """The parts of a Response that echo the request."""

    def __init__(self, req: ParsedRequest, body: dict[str, Any]) -> None:
        self.req = req
        self.id = _id("resp_")
        self.created = int(time.time())
        self._echo = {
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "metadata": body.get("metadata") or {},
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": None,
            "store": False,
            "temperature": body.get("temperature"),
            "text": body.get("text") or {"format": {"type": "text"}},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_p": body.get("top_p"),
            "truncation": "disabled",
            "user": body.get("user"),
        }

    def response(
        self,
        status: str,
        output: list[dict[str, Any]],
        finish: Any = None,
        usage: Any = None,
    ) -> dict[str, Any]:
        reason = _INCOMPLETE.get(finish) if isinstance(finish, str) else None
        if reason is not None and status == "completed":
            status = "incomplete"
        out: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": reason} if status == "incomplete" else None,
            "model": self.req.model,
            "output": output,
            **self._echo,
        }
        if status != "in_progress":
            out["usage"] = _usage(usage, self.req.prompt_tokens_estimate())
        return out


def response_from_chat(shape: ResponseShape, chat: dict[str, Any]) -> bytes:
    """A Response object from a chat completion body."""
    choices = chat.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    choice = choice if isinstance(choice, dict) else {}
    message = choice.get("message")
    message = message if isinstance(message, dict) else {}
    finish = choice.get("finish_reason")
    item_status = "incomplete" if finish in _INCOMPLETE else "completed"
    output: list[dict[str, Any]] = []
    reasoning = thought(message)
    if reasoning:
        output.append(_reasoning_item(_id("rs_"), reasoning, "completed"))
    text = message.get("content")
    if isinstance(text, str) and text:
        output.append(_message_item(_id("msg_"), text, item_status))
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            arguments = function.get("arguments")
            output.append(
                _call_item(
                    _id("fc_"),
                    call.get("id") or _id("call_"),
                    function.get("name") or "",
                    arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode(),
                    "completed",
                )
            )
    return orjson.dumps(shape.response("completed", output, finish, chat.get("usage")))


class ResponseStream:
    """Chat completion chunks in, Responses API events out."""

    def __init__(self, shape: ResponseShape) -> None:
        self._shape = shape
        self._seq = 0
        self._started = False
        self._item: StreamItem | None = None
        self._done: list[dict[str, Any]] = []
        self._finish: Any = None
        self._usage: Any = None
        self.ended = False

    def resume_at(
        self, seq: int, item: StreamItem | None, done: list[dict[str, Any]] | None = None
    ) -> None:
        """Go on from a stream another engine began: its events up to number `seq`
        went out, and so did the items `done` (as their `output_item.done` showed
        them) and the item still open, `item` (None: none is open), with its part."""
        self._started = True
        self._seq = seq + 1
        self._done = list(done or ())
        self._item = item

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return format_event(kind, payload)

    def _start(self) -> bytes:
        self._started = True
        response = self._shape.response("in_progress", [])
        return self._event("response.created", response=response) + self._event(
            "response.in_progress", response=response
        )

    def _where(self, item: StreamItem) -> dict[str, Any]:
        return {"item_id": item.id, "output_index": item.output_index}

    def _open(self, kind: str, tool: int = -1) -> tuple[StreamItem, bytes]:
        out = self._close()
        item = self._item = StreamItem(kind, len(self._done), tool)
        if kind == "message":
            added = _message_item(item.id, "", "in_progress")
            part: dict[str, Any] | None = _text_part("")
        elif kind == "reasoning":
            added = _reasoning_item(item.id, "", "in_progress")
            part = {"type": "reasoning_text", "text": ""}
        else:
            added = _call_item(item.id, item.call_id, item.name, "", "in_progress")
            part = None
        out += self._event("response.output_item.added", output_index=item.output_index, item=added)
        if part is not None:
            out += self._event(
                "response.content_part.added", **self._where(item), content_index=0, part=part
            )
        return item, out

    def _close(self) -> bytes:
        item, self._item = self._item, None
        if item is None:
            return b""
        where = self._where(item)
        if item.kind == "function_call":
            done = _call_item(item.id, item.call_id, item.name, item.text, "completed")
            out = self._event(
                "response.function_call_arguments.done",
                **where,
                name=item.name,
                arguments=item.text,
            )
        else:
            status = "incomplete" if self._finish in _INCOMPLETE else "completed"
            if item.kind == "message":
                done = _message_item(item.id, item.text, status)
                part = _text_part(item.text)
                out = self._event(
                    "response.output_text.done",
                    **where,
                    content_index=0,
                    text=item.text,
                    logprobs=[],
                )
            else:
                done = _reasoning_item(item.id, item.text, "completed")
                part = {"type": "reasoning_text", "text": item.text}
                out = self._event(
                    "response.reasoning_text.done", **where, content_index=0, text=item.text
                )
            out += self._event("response.content_part.done", **where, content_index=0, part=part)
        self._done.append(done)
        return out + self._event(
            "response.output_item.done", output_index=item.output_index, item=done
        )

    def chunk(self, chunk: dict[str, Any]) -> bytes:
        out = b"" if self._started else self._start()
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage = usage
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                out += self._delta(delta)
            if choice.get("finish_reason") is not None:
                self._finish = choice["finish_reason"]
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        out = b""
        reasoning = thought(delta)
        if reasoning:
            out += self._text("reasoning", "response.reasoning_text.delta", reasoning)
        text = delta.get("content")
        if isinstance(text, str) and text:
            out += self._text("message", "response.output_text.delta", text)
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict):
                out += self._call(call)
        return out

    def _text(self, kind: str, event: str, text: str) -> bytes:
        item, out = self._item, b""
        if item is None or item.kind != kind:
            item, out = self._open(kind)
        item.text += text
        extra: dict[str, Any] = {"logprobs": []} if kind == "message" else {}
        return out + self._event(event, **self._where(item), content_index=0, delta=text, **extra)

    def _call(self, call: dict[str, Any]) -> bytes:
        index = call.get("index", 0)
        found = call.get("function")
        function: dict[str, Any] = found if isinstance(found, dict) else {}
        item, out = self._item, b""
        if item is None or item.kind != "function_call" or item.tool != index:
            out = self._close()
            item = self._item = StreamItem("function_call", len(self._done), index)
            item.call_id = call.get("id") or _id("call_")
            item.name = function.get("name") or ""
            added = _call_item(item.id, item.call_id, item.name, "", "in_progress")
            out += self._event(
                "response.output_item.added", output_index=item.output_index, item=added
            )
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            item.text += arguments
            out += self._event(
                "response.function_call_arguments.delta", **self._where(item), delta=arguments
            )
        return out

    def error(self, error: dict[str, Any]) -> bytes:
        self.ended = True
        return self._event(
            "error",
            code=error.get("code"),
            message=str(error.get("message") or "stream failed"),
            param=error.get("param"),
        )

    def end(self) -> bytes:
        self.ended = True
        out = b"" if self._started else self._start()
        out += self._close()
        response = self._shape.response("completed", self._done, self._finish, self._usage)
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return out + self._event(kind, response=response)


class _Translation:
    __slots__ = ("_shape",)

    def __init__(self, shape: ResponseShape) -> None:
        self._shape = shape

    def whole(self, status: int, chat: dict[str, Any] | None, raw: bytes) -> bytes:
        if status < 400 and chat is not None:
            return response_from_chat(self._shape, chat)
        if is_openai_error(raw):
            return raw
        return error_body(raw[:500].decode("utf-8", "replace"), "upstream_error", "engine_error")

    def stream(self) -> ResponseStream:
        return ResponseStream(self._shape)


def resume_stream(req: ParsedRequest, sent: bytes) -> Resumable | None:
    """A natively served Responses stream that broke off after `sent` (whole events),
    read back for a continuation: its thought, text and function calls so far, and a
    `send` that goes on in the Responses events (the same response id, the open item,
    later items after it, the event numbering). None when it cannot be continued: no
    `response.created` yet, items out of the order reasoning, message, function_call
    (see `llmgw.router.continuation`), a reasoning or message item already done with
    nothing after it, an item whose text or arguments were declared done but not the
    item, a function call done whose arguments are not complete JSON, an error, or an
    end."""
    shape = ResponseShape(req, req.client_body if isinstance(req, TranslatedRequest) else {})
    read = read_items(sent)
    if read is None:
        return None
    items, seq = read.items, read.seq
    shape.id = read.id
    if read.created_at is not None:
        shape.created = read.created_at
    last = items[-1] if items else None
    if last is not None and (
        not last.part
        or (last.done is None and last.ending)
        or (
            last.done is not None
            and (last.item.kind != "function_call" or not complete(last.item.text))
        )
    ):
        return None
    stream = ResponseStream(shape)
    done = [r.done for r in items if r.done is not None]
    stream.resume_at(seq, last.item if last is not None and last.done is None else None, done)
    texts = {
        kind: "".join(r.item.text for r in items if r.item.kind == kind) for kind in ITEM_KINDS
    }
    calls = tuple(
        (r.item.call_id, r.item.name, r.item.text) for r in items if r.item.kind == "function_call"
    )
    return Resumable(
        text=texts["message"],
        tokens=sum(len(r.parts) for r in items),
        wrap=lambda send: ResumedSend(stream, send),
        reasoning=texts["reasoning"],
        calls=calls,
    )


class ResponsesApi:
    """`/v1/responses`: passed through to engines that serve it natively, translated
    into `/v1/chat/completions` for the others (`native.with_native`); a native
    stream that breaks off is continued through the translation (`resume_stream`)."""

    def parse(self, raw: bytes) -> ParsedRequest:
        req = with_native("responses", "/v1/responses", raw, translate_request)
        native = req.native
        if native is not None and native.required is None:
            native.resume = partial(resume_stream, req)
        return req

    def responder(self, req: ParsedRequest, send: Send) -> Send:
        body = req.client_body if isinstance(req, TranslatedRequest) else {}
        return TranslatingSend(_Translation(ResponseShape(req, body)), send, req)

    def error_body(self, exc: RouterError) -> bytes:
        return exc.body()
