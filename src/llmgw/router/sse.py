"""Relaying an engine's server-sent events without re-serializing them.

Bytes are forwarded as whole events, exactly as the engine wrote them, as soon
as each event is complete. The only event ever touched is the usage chunk
(`"choices": []` with a `usage` object): it is parsed to record tokens and
dropped when the client did not ask for it.

Engines that never send a usage chunk in streams (llama.cpp's server ignores
`stream_options`) are relayed in *counting* mode: every event is parsed, the
chunks that carry generated text are counted, `[DONE]` is held back, and at the
end a usage chunk is made from the count (completion tokens: exact for engines
that stream one token per chunk) and the router's estimate of the prompt
tokens. The proxy picks counting mode per endpoint until that endpoint shows it
sends usage itself, so engines that do pay nothing for it.

`NativeRelay` relays a stream of another API (Anthropic Messages, OpenAI
Responses) from an engine that serves it natively: events pass through
untouched, and the usage objects they carry (Messages: `message_start`'s
input tokens, `message_delta`'s output tokens; Responses: the final response's
`usage`) are read and merged, later values winning.

Events may end with "\\n\\n" or "\\r\\n\\r\\n". Not guaranteed: events with bare
"\\r" line endings are relayed but not inspected.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from llmgw.router.usage_scan import usages_in

EVENT_END = re.compile(rb"\r?\n\r?\n")
_DONE = b"[DONE]"


def last_event_end(buf: bytes) -> int:
    """Index just past the last complete event in `buf`, or 0."""
    lf = buf.rfind(b"\n\n")
    crlf = buf.rfind(b"\r\n\r\n")
    end = 0
    if lf >= 0:
        end = lf + 2
    if crlf >= 0 and crlf + 4 > end:
        end = crlf + 4
    return end


def event_payload(event: bytes) -> bytes | None:
    """The data of an event with one `data:` line; None for comments and others."""
    for line in event.splitlines():
        if line.startswith(b"data:"):
            return line[5:].strip()
    return None


def _chunk(payload: bytes) -> dict[str, Any] | None:
    if not payload.startswith(b"{"):
        return None
    try:
        parsed = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _usage_of(chunk: dict[str, Any]) -> dict[str, Any] | None:
    usage = chunk.get("usage")
    if isinstance(usage, dict) and not chunk.get("choices"):
        return usage
    return None


def thought(part: dict[str, Any]) -> str:
    """The thought a chat message or delta carries: vLLM's `reasoning` (older releases
    and SGLang: `reasoning_content`); "" when it carries none."""
    for name in ("reasoning", "reasoning_content"):
        piece = part.get(name)
        if isinstance(piece, str) and piece:
            return piece
    return ""


def _carries_text(chunk: dict[str, Any]) -> bool:
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        if choice.get("text"):
            return True
        delta = choice.get("delta")
        if isinstance(delta, dict) and (
            delta.get("content") or thought(delta) or delta.get("tool_calls")
        ):
            return True
    return False


class SSERelay:
    """Feeds engine bytes in, gives back what to send to the client."""

    __slots__ = (
        "_held_done",
        "_last",
        "_pending",
        "count_tokens",
        "counted",
        "strip_usage",
        "usage",
    )

    def __init__(self, *, strip_usage: bool, count_tokens: bool = False) -> None:
        self.strip_usage = strip_usage
        self.count_tokens = count_tokens
        self.usage: dict[str, Any] | None = None
        self.counted = 0
        self._pending = b""
        self._held_done = b""
        self._last: dict[str, Any] | None = None

    def feed(self, data: bytes) -> bytes:
        buf = self._pending + data if self._pending else data
        end = last_event_end(buf)
        if end == 0:
            self._pending = buf
            return b""
        complete = buf[:end]
        self._pending = buf[end:]
        if self.count_tokens:
            return self._inspect(complete)
        # OpenAI sends `"usage": null` on every chunk; only a usage object matters.
        marker = complete.rfind(b'"usage":{')
        if marker < 0:
            marker = complete.rfind(b'"usage": {')
        if marker < 0:
            return complete
        return self._take_usage_event(complete, marker)

    def finish(self, *, prompt_tokens_estimate: int) -> bytes:
        """The bytes that end the stream once the engine has closed it.

        In counting mode without an engine usage chunk, the usage is made here,
        and sent to the client if it asked for it, before the held `[DONE]`.
        """
        tail, self._pending = self._pending, b""
        if self.count_tokens and self.usage is None:
            self.usage = {
                "prompt_tokens": prompt_tokens_estimate,
                "completion_tokens": self.counted,
                "total_tokens": prompt_tokens_estimate + self.counted,
            }
            if not self.strip_usage:
                tail += self._usage_event(self.usage)
        tail += self._held_done
        self._held_done = b""
        return tail

    def abandon(self) -> None:
        """Forget what is pending: the stream ends with an error instead."""
        self._pending = b""
        self._held_done = b""

    def _take_usage_event(self, complete: bytes, marker: int) -> bytes:
        """Parse only the event holding `marker`; drop it if it is the usage chunk to strip."""
        start = last_event_end(complete[:marker])
        found = EVENT_END.search(complete, marker)
        end = found.end() if found is not None else len(complete)
        payload = event_payload(complete[start:end])
        chunk = _chunk(payload) if payload is not None else None
        usage = _usage_of(chunk) if chunk is not None else None
        if usage is None:
            return complete
        self.usage = usage
        if self.strip_usage:
            return complete[:start] + complete[end:]
        return complete

    def _inspect(self, complete: bytes) -> bytes:
        kept: list[bytes] = []
        pos = 0
        for match in EVENT_END.finditer(complete):
            event = complete[pos : match.end()]
            pos = match.end()
            payload = event_payload(event)
            if payload is None:
                kept.append(event)
                continue
            if payload == _DONE and self.count_tokens:
                self._held_done = event
                continue
            chunk = _chunk(payload)
            if chunk is None:
                kept.append(event)
                continue
            usage = _usage_of(chunk)
            if usage is not None:
                self.usage = usage
                if self.strip_usage:
                    continue
            elif self.count_tokens:
                self._last = chunk
                if _carries_text(chunk):
                    self.counted += 1
            kept.append(event)
        return b"".join(kept)

    def _usage_event(self, usage: dict[str, Any]) -> bytes:
        last = self._last or {}
        chunk = {
            "id": last.get("id", ""),
            "object": last.get("object", "chat.completion.chunk"),
            "created": last.get("created", 0),
            "model": last.get("model", ""),
            "choices": [],
            "usage": usage,
        }
        return b"data: " + orjson.dumps(chunk) + b"\n\n"


class NativeRelay:
    """Feeds a native stream's bytes in, gives them back by whole events, reading usage."""

    __slots__ = ("_pending", "usage")

    def __init__(self) -> None:
        self.usage: dict[str, Any] | None = None
        self._pending = b""

    @property
    def counted(self) -> int:
        """Output tokens the stream reported so far (for a stream cut short)."""
        usage = self.usage or {}
        output = usage.get("output_tokens")
        return output if isinstance(output, int) and output > 0 else 0

    def feed(self, data: bytes) -> bytes:
        buf = self._pending + data if self._pending else data
        end = last_event_end(buf)
        if end == 0:
            self._pending = buf
            return b""
        complete = buf[:end]
        self._pending = buf[end:]
        if b'"usage"' in complete:
            for usage in usages_in(complete):
                self.usage = {**self.usage, **usage} if self.usage else usage
        return complete

    def finish(self, *, prompt_tokens_estimate: int) -> bytes:
        """What is left once the engine closed the stream (the estimate is unused:
        a native stream reports its own usage)."""
        del prompt_tokens_estimate
        tail, self._pending = self._pending, b""
        return tail

    def abandon(self) -> None:
        """Forget what is pending: the stream ends with an error instead."""
        self._pending = b""
