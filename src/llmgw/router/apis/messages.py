"""The Anthropic Messages API (`/v1/messages`) served natively or by translation.

`MessagesApi.parse` is `messages_request.translate_request`, keeping the
client's body for engines that serve the API natively (`native.with_native`:
their answers pass through untouched); for the others its responder turns
the engine's chat completion into a Message, and a chat completion stream into
Anthropic's events, one for one as the chunks arrive: `message_start` (with the
router's estimate of `input_tokens`, since engines report the prompt's tokens
only at the end), `ping`, `content_block_start`/`_delta`/`_stop` for text,
`tool_use` (arguments as `input_json_delta`) and `thinking` (from
`reasoning` or `reasoning_content`), `message_delta` (stop reason and the engine's usage, its
exact `input_tokens` included) and `message_stop`. Every error has Anthropic's
shape `{"type": "error", "error": {"type", "message"}}`, in a body or, once a
stream began, as an `error` event.

Not guaranteed: `stop_sequence` names the matched sequence only when the
engine reports it (vLLM's `stop_reason`); otherwise a stop is `end_turn`.
"""

from __future__ import annotations

import secrets
from functools import partial
from typing import Any

import orjson

from llmgw.router.apis import Send
from llmgw.router.apis.messages_request import stop_sequences, translate_request
from llmgw.router.apis.native import with_native
from llmgw.router.apis.relay import ResumedSend, TranslatingSend, error_message, loads
from llmgw.router.apis.sse_events import SSEEvents, format_event
from llmgw.router.errors import RouterError
from llmgw.router.requests import ParsedRequest, Resumable
from llmgw.router.sse import thought

# Anthropic's error type for each status (https://docs.anthropic.com/en/api/errors).
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def error_type(status: int) -> str:
    if status in _ERROR_TYPES:
        return _ERROR_TYPES[status]
    return "invalid_request_error" if status < 500 else "api_error"


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def _message_id() -> str:
    return "msg_" + secrets.token_hex(12)


def _stop_reason(finish: Any, matched: Any, stops: list[str]) -> tuple[str, str | None]:
    if isinstance(matched, str) and matched in stops:
        return "stop_sequence", matched
    if isinstance(finish, str):
        return _STOP_REASONS.get(finish, "end_turn"), None
    return "end_turn", None


def _usage(usage: Any, estimate: int) -> dict[str, int]:
    usage = usage if isinstance(usage, dict) else {}
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    return {
        "input_tokens": prompt if isinstance(prompt, int) else estimate,
        "output_tokens": completion if isinstance(completion, int) else 0,
    }


def _arguments(raw: Any) -> Any:
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str) or not raw.strip():
        return {}
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        # Models do write broken JSON; keep what they wrote rather than lose it.
        return {"_raw_arguments": raw}
    return parsed if isinstance(parsed, dict) else {"value": parsed}


def message_from_chat(chat: dict[str, Any], model: str, stops: list[str], estimate: int) -> bytes:
    """An Anthropic Message from a chat completion body."""
    choices = chat.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    message = choice.get("message") if isinstance(choice, dict) else None
    message = message if isinstance(message, dict) else {}
    content: list[dict[str, Any]] = []
    reasoning = thought(message)
    if reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or "toolu_" + secrets.token_hex(12),
                "name": function.get("name", ""),
                "input": _arguments(function.get("arguments")),
            }
        )
    reason, sequence = _stop_reason(choice.get("finish_reason"), choice.get("stop_reason"), stops)
    return orjson.dumps(
        {
            "id": _message_id(),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": _usage(chat.get("usage"), estimate),
        }
    )


class _Block:
    __slots__ = ("index", "kind", "tool")

    def __init__(self, index: int, kind: str, tool: int = -1) -> None:
        self.index = index
        self.kind = kind
        self.tool = tool


class MessageStream:
    """Chat completion chunks in, Anthropic Messages events out."""

    def __init__(self, model: str, stops: list[str], estimate: int) -> None:
        self._model = model
        self._stops = stops
        self._estimate = estimate
        self._started = False
        self._block: _Block | None = None
        self._next_index = 0
        self._finish: Any = None
        self._matched: Any = None
        self._usage: Any = None
        self.ended = False

    def resume_at(
        self, block: int | None, kind: str = "text", tool: int = -1, after: int = 0
    ) -> None:
        """Go on from a stream another engine began: its `message_start` went out,
        and so did the block numbered `block` of `kind` (for a tool_use block, the
        chat index of its call, `tool`), still open (None: no block is open, and the
        next one is numbered `after`)."""
        self._started = True
        if block is not None:
            self._block = _Block(block, kind, tool)
            after = block + 1
        self._next_index = after

    def start(self) -> bytes:
        self._started = True
        message: dict[str, Any] = {
            "id": _message_id(),
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self._estimate, "output_tokens": 0},
        }
        return format_event(
            "message_start", {"type": "message_start", "message": message}
        ) + format_event("ping", {"type": "ping"})

    def _open(self, kind: str, block: dict[str, Any], tool: int = -1) -> bytes:
        out = self._close()
        self._block = _Block(self._next_index, kind, tool)
        self._next_index += 1
        return out + format_event(
            "content_block_start",
            {"type": "content_block_start", "index": self._block.index, "content_block": block},
        )

    def _close(self) -> bytes:
        if self._block is None:
            return b""
        index, self._block = self._block.index, None
        return format_event("content_block_stop", {"type": "content_block_stop", "index": index})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        assert self._block is not None
        return format_event(
            "content_block_delta",
            {"type": "content_block_delta", "index": self._block.index, "delta": delta},
        )

    def chunk(self, chunk: dict[str, Any]) -> bytes:
        out = b"" if self._started else self.start()
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage = usage
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                out += self._choice_delta(delta)
            if choice.get("finish_reason") is not None:
                self._finish = choice["finish_reason"]
                self._matched = choice.get("stop_reason")
        return out

    def _choice_delta(self, delta: dict[str, Any]) -> bytes:
        out = b""
        reasoning = thought(delta)
        if reasoning:
            if self._block is None or self._block.kind != "thinking":
                out += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out += self._delta({"type": "thinking_delta", "thinking": reasoning})
        text = delta.get("content")
        if isinstance(text, str) and text:
            if self._block is None or self._block.kind != "text":
                out += self._open("text", {"type": "text", "text": ""})
            out += self._delta({"type": "text_delta", "text": text})
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict):
                out += self._tool_delta(call)
        return out

    def _tool_delta(self, call: dict[str, Any]) -> bytes:
        out = b""
        index = call.get("index", 0)
        found = call.get("function")
        function: dict[str, Any] = found if isinstance(found, dict) else {}
        if self._block is None or self._block.kind != "tool_use" or self._block.tool != index:
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": call.get("id") or "toolu_" + secrets.token_hex(12),
                "name": function.get("name") or "",
                "input": {},
            }
            out += self._open("tool_use", block, index)
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            out += self._delta({"type": "input_json_delta", "partial_json": arguments})
        return out

    def error(self, error: dict[str, Any]) -> bytes:
        self.ended = True
        return _error_event(error)

    def end(self) -> bytes:
        """The events that close the message, once the engine's stream is over."""
        self.ended = True
        out = b"" if self._started else self.start()
        out += self._close()
        reason, sequence = _stop_reason(self._finish, self._matched, self._stops)
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": _usage(self._usage, self._estimate),
        }
        return (
            out
            + format_event("message_delta", delta)
            + format_event("message_stop", {"type": "message_stop"})
        )


def _error_event(error: dict[str, Any]) -> bytes:
    # The router's own mid-stream failures are upstream errors and deadlines.
    status = 504 if error.get("type") == "timeout_error" else 502
    message = error.get("message")
    return format_event("error", anthropic_error(status, str(message or "stream failed")))


class _Translation:
    """Chat completion answers to one Messages request, as Anthropic's answers."""

    __slots__ = ("_req",)

    def __init__(self, req: ParsedRequest) -> None:
        self._req = req

    def whole(self, status: int, chat: dict[str, Any] | None, raw: bytes) -> bytes:
        if status < 400 and chat is not None:
            return message_from_chat(
                chat,
                self._req.model,
                stop_sequences(self._req),
                self._req.prompt_tokens_estimate(),
            )
        return orjson.dumps(anthropic_error(status, error_message(chat, raw)))

    def stream(self) -> MessageStream:
        req = self._req
        return MessageStream(req.model, stop_sequences(req), req.prompt_tokens_estimate())


_DELTAS = {"thinking": "thinking_delta", "text": "text_delta", "tool_use": "input_json_delta"}
_PIECES = {"thinking_delta": "thinking", "text_delta": "text", "input_json_delta": "partial_json"}


class _ReadBlock:
    """A content block of a broken stream, as the client received it."""

    __slots__ = ("call", "id", "index", "kind", "name", "parts", "stopped")

    def __init__(self, index: int, content: dict[str, Any], call: int) -> None:
        self.index = index
        self.kind = str(content.get("type"))
        self.id = content.get("id")
        self.name = content.get("name")
        self.call = call
        self.parts: list[str] = []
        self.stopped = False


def _read_blocks(sent: bytes, estimate: int) -> tuple[list[_ReadBlock], int] | None:
    """The blocks of a broken Messages stream and the prompt tokens its
    `message_start` reported (else `estimate`); None when it cannot be continued."""
    started = False
    blocks: list[_ReadBlock] = []
    for name, data in SSEEvents().feed(sent):
        if name in ("comment", "ping"):
            continue
        event = loads(data)
        if event is None:
            return None
        kind = event.get("type")
        last = blocks[-1] if blocks else None
        if kind == "message_start" and not started:
            started = True
            usage = (event.get("message") or {}).get("usage") or {}
            reported = usage.get("input_tokens") if isinstance(usage, dict) else None
            if isinstance(reported, int) and not isinstance(reported, bool) and reported > 0:
                estimate = reported
        elif kind == "content_block_start" and started and (last is None or last.stopped):
            content, index = event.get("content_block"), event.get("index")
            if not isinstance(content, dict) or content.get("type") not in _DELTAS:
                return None
            if not isinstance(index, int) or isinstance(index, bool):
                return None
            calls = sum(b.kind == "tool_use" for b in blocks)
            block = _ReadBlock(index, content, calls)
            if not _in_order(blocks, block):
                return None
            blocks.append(block)
        elif kind == "content_block_delta" and last is not None and not last.stopped:
            delta = event.get("delta") or {}
            if not isinstance(delta, dict) or event.get("index") != last.index:
                return None
            if delta.get("type") == "signature_delta" and last.kind == "thinking":
                continue
            piece = delta.get(_PIECES.get(str(delta.get("type")), ""))
            if delta.get("type") != _DELTAS[last.kind] or not isinstance(piece, str):
                return None
            if piece:
                last.parts.append(piece)
        elif kind == "content_block_stop" and last is not None and not last.stopped:
            if event.get("index") != last.index:
                return None
            last.stopped = True
        else:
            return None
    return (blocks, estimate) if started else None


def _in_order(blocks: list[_ReadBlock], block: _ReadBlock) -> bool:
    """Whether `block` may follow `blocks` in an answer llmgw can write back: one
    thought first, then text, then tool calls (each with an id and a name)."""
    kinds = [b.kind for b in blocks]
    if block.kind == "thinking":
        return not kinds
    if block.kind == "text":
        return "text" not in kinds and "tool_use" not in kinds
    return isinstance(block.id, str) and isinstance(block.name, str) and bool(block.name)


def resume_stream(req: ParsedRequest, sent: bytes) -> Resumable | None:
    """A natively served Messages stream that broke off after `sent` (whole events),
    read back for a continuation: its thought, text and tool calls so far, and a
    `send` that goes on in Anthropic's events (the same message, the open block,
    block numbers after the last). None when it cannot be continued: no
    `message_start` yet, blocks out of the order thinking, text, tool_use (see
    `llmgw.router.continuation`), a thinking or text block already stopped with
    nothing after it, a stopped tool_use block whose input is not complete JSON, an
    error, or an end."""
    read = _read_blocks(sent, req.prompt_tokens_estimate())
    if read is None:
        return None
    blocks, estimate = read
    last = blocks[-1] if blocks else None
    if (
        last is not None
        and last.stopped
        and (last.kind != "tool_use" or not _complete("".join(last.parts)))
    ):
        return None
    stream = MessageStream(req.model, stop_sequences(req), estimate)
    if last is None:
        stream.resume_at(None)
    elif last.stopped:
        stream.resume_at(None, after=last.index + 1)
    else:
        stream.resume_at(last.index, last.kind, last.call)
    pieces = {
        kind: "".join(p for b in blocks if b.kind == kind for p in b.parts) for kind in _DELTAS
    }
    calls = tuple(
        (str(b.id), str(b.name), "".join(b.parts)) for b in blocks if b.kind == "tool_use"
    )
    return Resumable(
        text=pieces["text"],
        tokens=sum(len(b.parts) for b in blocks),
        wrap=lambda send: ResumedSend(stream, send),
        reasoning=pieces["thinking"],
        calls=calls,
    )


def _complete(arguments: str) -> bool:
    try:
        return isinstance(orjson.loads(arguments), dict)
    except orjson.JSONDecodeError:
        return False


class MessagesApi:
    """`/v1/messages`: passed through to engines that serve it natively, translated
    into `/v1/chat/completions` for the others (`native.with_native`); a native
    stream that breaks off is continued through the translation (`resume_stream`)."""

    def parse(self, raw: bytes) -> ParsedRequest:
        req = with_native("messages", "/v1/messages", raw, translate_request)
        native = req.native
        if native is not None and native.required is None:
            native.resume = partial(resume_stream, req)
        return req

    def responder(self, req: ParsedRequest, send: Send) -> Send:
        return TranslatingSend(_Translation(req), send, req)

    def error_body(self, exc: RouterError) -> bytes:
        return orjson.dumps(anthropic_error(exc.status, exc.message))
