"""The text of a broken stream, and the requests and chunks that continue it.

Pure functions for `llmgw.router.continuation`: `read_back` recovers the answer a
client received from the SSE events relayed to it, `continuation_body` builds the
request that asks another replica for the rest (chat: the text as a final
assistant message with `continue_final_message: true, add_generation_prompt:
false`, a thought so far written back first in the `<think>...</think>` markup
of the reasoning parsers that use it, then the text, then the tool calls so far in
hermes' `<tool_call>` markup, the last one open while its arguments are;
completions: prompt + text; the token limits reduced), and `rewrite` makes the
continuation's chunks look like the first answer's (its id, created and model; no
second role chunk; the open call's rest, which the engine sends as text, as that
call's argument deltas; the engine's own calls at the client's next indexes;
usage and `[DONE]` held back).

Not guaranteed: the tokens of the first attempt (whose engine died before it
reported them) are chunks that carry text, exact only where the engine streamed one
token per chunk (vLLM, SGLang, llama.cpp and the sim do, except that vLLM sends
several in one chunk when its output backs up); a continuation that reported its
usage counts as it reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from llmgw.router.requests import ParsedRequest
from llmgw.router.sse import EVENT_END, event_payload
from llmgw.router.sse import thought as thought_of

_MAX_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens")


@dataclass(slots=True)
class ToolCall:
    """A tool call the client was sent: its index (the client's), id, function name
    and arguments (JSON text) so far."""

    index: int
    id: str
    name: str
    arguments: str = ""

    def complete(self) -> bool:
        """Whether its arguments' JSON object is closed (the call needs nothing more)."""
        return bool(self.arguments) and _object_end("", self.arguments) is not None


@dataclass(slots=True)
class Splice:
    """The answer so far as the client saw it, and what the next continuation needs."""

    chat: bool
    head: dict[str, Any]
    text: str
    tokens: int
    continued: int = 0
    # The thought so far (`reasoning` / `reasoning_content` deltas), before the text.
    reasoning: str = ""
    # The tool calls the client was sent (after the text), in index order; the last
    # one may be under way.
    calls: list[ToolCall] = field(default_factory=list)
    # While a continuation runs: the client's index of the engine's own call 0 (its tool
    # parser numbers only the calls it parsed), and the call it goes on as text (the
    # one left open in the markup it was given; None once its arguments closed).
    call_base: int = 0
    text_call: int | None = None
    # A continuation sent tool-call deltas llmgw did not understand: not continued again.
    lost: bool = False
    # Per continuation: the tokens of the answer it was given, and the prompt and
    # completion tokens its engine reported (None: it died before its usage chunk).
    given: list[int] = field(default_factory=list)
    reported: list[int | None] = field(default_factory=list)
    completed: list[int | None] = field(default_factory=list)

    def begin(self) -> None:
        """A continuation starts from the answer so far."""
        self.call_base = len(self.calls)
        last = self.calls[-1] if self.calls else None
        self.text_call = last.index if last is not None and not last.complete() else None
        self.given.append(self.tokens)
        self.reported.append(None)
        self.completed.append(None)

    def completion_tokens(self) -> int:
        """The tokens the client received: chunks with text, counted, except for each
        continuation that reported its own count (exact, where an engine sent several
        tokens in one chunk, as vLLM does when its output queue backs up)."""
        if not self.given:
            return self.tokens
        ends = [*self.given[1:], self.tokens]
        total = self.given[0]
        for start, end, reported in zip(self.given, ends, self.completed, strict=True):
            total += reported if reported is not None else end - start
        return total

    def prompt_tokens(self, estimate: int) -> int:
        """Every prompt token the engines processed: the first attempt's (its engine
        died before reporting it: the first reported continuation's prompt less the
        tokens it was given, else `estimate`, the router's), and each continuation's
        (one that did not report it: the first attempt's plus the tokens it was given)."""
        pairs = list(zip(self.given, self.reported, strict=True))
        first = next(
            (max(prompt - given, 0) for given, prompt in pairs if prompt is not None), estimate
        )
        return first + sum(
            prompt if prompt is not None else first + given for given, prompt in pairs
        )


def read_back(sent: bytes, *, chat: bool) -> Splice | None:
    """The answer the client received, from the events relayed to it; None when it
    cannot be continued (no chunk yet, several choices, a thought after the text
    began, text or a thought after a tool call, tool-call deltas it does not
    understand, an error, or a finished answer)."""
    head: dict[str, Any] | None = None
    text: list[str] = []
    thought: list[str] = []
    calls: list[ToolCall] = []
    tokens = 0
    for event in EVENT_END.split(sent):
        if not event:
            continue
        if event.startswith(b"event: error") or event.startswith(b"event:error"):
            return None
        payload = event_payload(event)
        if payload is None or not payload.startswith(b"{"):
            continue
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(chunk, dict):
            return None
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices:
            continue
        if head is None:
            head = {k: chunk[k] for k in ("id", "object", "created", "model") if k in chunk}
        for choice in choices:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if chat and isinstance(delta, dict) and delta.get("tool_calls"):
                if (
                    choice.get("finish_reason") is not None
                    or delta.get("content")
                    or thought_of(delta)
                ):
                    return None
                added = _add_call_deltas(calls, delta["tool_calls"])
                if added is None:
                    return None
                # A chunk that only names a call carries no token of the arguments.
                tokens += added
                continue
            piece = _choice_text(choice, chat=chat)
            if piece is None:
                return None
            said, kind = piece
            if said and calls:
                return None
            if not said:
                continue
            if kind == "thought":
                if text:
                    return None
                thought.append(said)
            else:
                text.append(said)
            tokens += 1
    if head is None:
        return None
    return Splice(
        chat=chat,
        head=head,
        text="".join(text),
        tokens=tokens,
        reasoning="".join(thought),
        calls=calls,
    )


def _add_call_deltas(calls: list[ToolCall], deltas: object) -> int | None:
    """Add a chunk's tool-call deltas to `calls`: a delta with the next index opens a
    call (its id and name), one with the last call's index adds to its arguments.
    Whether the chunk carried arguments (1 token) or not (0); None when the deltas are
    not understood (a call named twice, or an earlier call going on after a later one
    opened: llmgw could not write them back in order)."""
    if not isinstance(deltas, list) or not deltas:
        return None
    carried = 0
    for delta in deltas:
        if not isinstance(delta, dict):
            return None
        function = delta.get("function") or {}
        if not isinstance(function, dict):
            return None
        index, ident = delta.get("index", 0), delta.get("id")
        name, more = function.get("name"), function.get("arguments") or ""
        if not isinstance(index, int) or not isinstance(more, str):
            return None
        if index == len(calls):
            if not isinstance(ident, str) or not isinstance(name, str) or not name:
                return None
            calls.append(ToolCall(index=index, id=ident, name=name, arguments=more))
        elif calls and index == calls[-1].index:
            if (ident is not None and ident != calls[-1].id) or name:
                return None
            calls[-1].arguments += more
        else:
            return None
        carried |= bool(more)
    return carried


def _choice_text(choice: object, *, chat: bool) -> tuple[str, str] | None:
    """The text a chunk's choice adds and whether it is the answer ("text") or the
    thought ("thought"); None when the answer cannot be continued."""
    if not isinstance(choice, dict) or choice.get("index", 0) != 0:
        return None
    if choice.get("finish_reason") is not None:
        return None
    if not chat:
        piece = choice.get("text")
        return (piece if isinstance(piece, str) else "", "text")
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return ("", "text")
    if delta.get("tool_calls") or delta.get("function_call"):
        return None
    thought = thought_of(delta)
    piece = delta.get("content")
    if thought and piece:
        return None
    if thought:
        return (thought, "thought")
    return (piece if isinstance(piece, str) else "", "text")


def remaining(body: dict[str, Any], sent_tokens: int) -> int | None:
    """Tokens the request may still generate (None: it set no limit)."""
    for name in _MAX_TOKEN_FIELDS:
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return max(value - sent_tokens, 0)
    return None


def continuation_body(req: ParsedRequest, splice: Splice) -> bytes | None:
    """The request that continues `splice`'s answer; None when nothing is left to generate
    or the answer cannot be written back."""
    if splice.lost:
        return None
    body = dict(req.body)
    for name in _MAX_TOKEN_FIELDS:
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            left = value - splice.tokens
            if left <= 0:
                return None
            body[name] = left
    body["stream"] = True
    body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    body.pop("echo", None)
    if splice.chat:
        messages = list(body["messages"])
        last = messages[-1] if messages else None
        said = splice.text
        if splice.calls:
            markup = _calls_markup(splice.calls)
            if markup is None:
                return None
            said += markup
        if splice.reasoning:
            # The thought in the markup of the parsers that read it back (deepseek_r1,
            # qwen3): an open <think> while the thought was under way, closed once the
            # answer began, so the engine's parser sees where the thought ends.
            said = "<think>" + splice.reasoning + ("</think>" + said if said else "")
        if (
            body.get("continue_final_message")
            and isinstance(last, dict)
            and last.get("role") == "assistant"
            and isinstance(last.get("content"), str)
        ):
            if splice.reasoning:
                # A prefilled answer before a thought: no markup says how they join.
                return None
            # The client prefilled the answer itself: extend its message.
            messages[-1] = {**last, "content": last["content"] + said}
        else:
            messages.append({"role": "assistant", "content": said})
        body["messages"] = messages
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    else:
        prompt = body["prompt"]
        if isinstance(prompt, list):
            body["prompt"] = [prompt[0] + splice.text]
        else:
            body["prompt"] = prompt + splice.text
    return orjson.dumps(body)


def _calls_markup(calls: list[ToolCall]) -> str | None:
    """The calls in hermes' markup (Qwen's chat templates and vLLM's `hermes` parser):
    each `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one a line,
    the last left open after its arguments so far when they are not complete; None
    when arguments are not a JSON object (nothing to write them back as)."""
    parts: list[str] = []
    for call in calls:
        if call.arguments and not call.arguments.lstrip().startswith("{"):
            return None
        opened = '<tool_call>\n{"name": ' + orjson.dumps(call.name).decode() + ', "arguments": '
        if call.complete():
            parts.append(opened + call.arguments + "}\n</tool_call>")
        elif call is calls[-1]:
            parts.append(opened + call.arguments)
        else:
            return None
    return "\n".join(parts)


def rewrite(events: bytes, splice: Splice) -> tuple[bytes, dict[str, Any] | None]:
    """A continuation's complete events as the client's stream goes on: the first
    answer's id, created and model; no role chunk; usage held back; no `[DONE]` (the
    stream's end sends it). Also the continuation's usage object, when it came."""
    out: list[bytes] = []
    found: dict[str, Any] | None = None
    for event in EVENT_END.split(events):
        if not event:
            continue
        payload = event_payload(event)
        if payload is None:
            out.append(event + b"\n\n")
            continue
        if payload == b"[DONE]":
            continue
        try:
            chunk = orjson.loads(payload) if payload.startswith(b"{") else None
        except orjson.JSONDecodeError:
            chunk = None
        if not isinstance(chunk, dict):
            out.append(event + b"\n\n")
            continue
        choices = chunk.get("choices")
        usage = chunk.get("usage")
        if not choices:
            if isinstance(usage, dict):
                found = usage
            else:
                out.append(event + b"\n\n")
            continue
        kept = _continued_choice(choices, splice)
        if kept is None:
            continue
        chunk = {**chunk, **splice.head, "choices": kept}
        chunk.pop("usage", None)
        out.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
    return b"".join(out), found


def _continued_choice(choices: list[Any], splice: Splice) -> list[Any] | None:
    """The chunk's choices for the client (None: drop the chunk), adding its text to
    `splice`."""
    choice = choices[0]
    if not isinstance(choice, dict):
        return None
    choice = dict(choice)
    if splice.chat:
        delta = choice.get("delta")
        delta = dict(delta) if isinstance(delta, dict) else {}
        delta.pop("role", None)
        choice["delta"] = delta
        piece = delta.get("content")
        if splice.calls or delta.get("tool_calls"):
            return _continued_call(choice, delta, splice)
        thought = thought_of(delta)
        if thought:
            splice.reasoning += thought
            splice.tokens += 1
    else:
        piece = choice.get("text")
    if isinstance(piece, str) and piece:
        splice.text += piece
        splice.tokens += 1
    elif choice.get("finish_reason") is None and not (
        splice.chat and any(value for name, value in choice["delta"].items() if name != "content")
    ):
        # The opening role chunk (or an empty one): the client has had it.
        return None
    return [choice]


def _continued_call(
    choice: dict[str, Any], delta: dict[str, Any], splice: Splice
) -> list[Any] | None:
    """A continuation's chunk once tool calls began. The engine's tool parser never saw
    the calls it was given (it reads only what it generates), so it sends the rest of
    a call left open as text: that text, up to where the arguments' JSON object
    closes, goes to the client as that call's argument deltas (same index), and the
    markup after it (`}` and `</tool_call>`) is dropped. The calls it parses itself it
    numbers from 0: they go on from the client's next index. The calls' end is
    `finish_reason: tool_calls`."""
    piece = delta.get("content")
    out: dict[str, Any] = {}
    if isinstance(piece, str) and piece:
        splice.tokens += 1
        if splice.text_call is not None:
            call = splice.calls[splice.text_call]
            end = _object_end(call.arguments, piece)
            fragment = piece if end is None else piece[:end]
            call.arguments += fragment
            if end is not None:
                splice.text_call = None
            if fragment:
                out["tool_calls"] = [{"index": call.index, "function": {"arguments": fragment}}]
    deltas = delta.get("tool_calls")
    if isinstance(deltas, list) and deltas:
        moved = [_renumbered(d, splice) for d in deltas if isinstance(d, dict)]
        carried = _add_call_deltas(splice.calls, moved)
        if carried is None:
            # Not understood: relayed as they came; another continuation could not write
            # the calls back.
            splice.lost = True
            carried = 1
        splice.tokens += carried
        out["tool_calls"] = [*out.get("tool_calls", ()), *moved]
    thought = thought_of(delta)
    if thought:
        splice.reasoning += thought
        splice.tokens += 1
        out.update({k: v for k, v in delta.items() if k in ("reasoning", "reasoning_content")})
    finish = choice.get("finish_reason")
    if finish == "stop" and splice.calls:
        finish = "tool_calls"
    if not out and finish is None:
        return None
    return [{**choice, "delta": out, "finish_reason": finish}]


def _renumbered(delta: dict[str, Any], splice: Splice) -> dict[str, Any]:
    """An engine's tool-call delta with the client's index (the engine numbers the calls
    of the continuation from 0)."""
    index = delta.get("index", 0)
    if isinstance(index, int) and not isinstance(index, bool):
        return {**delta, "index": index + splice.call_base}
    return delta


def _object_end(written: str, more: str) -> int | None:
    """Where in `more` the JSON object that `written` opened (and `more` goes on) closes:
    the index just past its closing brace, or None while it is still open. Strings and
    their escapes are skipped, so a brace in a string does not count."""
    depth, in_string, escaped = 0, False, False
    for position, char in enumerate(written + more):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0 and position >= len(written):
                return position - len(written) + 1
    return None


def add_usage(splice: Splice, usage: dict[str, Any]) -> None:
    """Keep the prompt and completion tokens the continuation under way reported."""
    if not splice.reported:
        return
    prompt = usage.get("prompt_tokens")
    if isinstance(prompt, int) and not isinstance(prompt, bool) and prompt > 0:
        splice.reported[-1] = prompt
    completion = usage.get("completion_tokens")
    if isinstance(completion, int) and not isinstance(completion, bool) and completion >= 0:
        splice.completed[-1] = completion
