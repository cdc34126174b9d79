"""The text of a broken stream, and the requests and chunks that continue it.

Pure functions for `llmgw.router.continuation`: `read_back` recovers the answer a
client received from the SSE events relayed to it, `continuation_body` builds the
request that asks another replica for the rest (chat: the text as a final
assistant message with `continue_final_message: true, add_generation_prompt:
false`, a thought so far written back first in the `<think>...</think>` markup
of the reasoning parsers that use it; completions: prompt + text; the token
limits reduced), and `rewrite`
makes the continuation's chunks look like the first answer's (its id, created and
model; no second role chunk; usage and `[DONE]` held back).

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
    """The one tool call a stream was writing when it broke: its index, id, function
    name and arguments (JSON text) so far. `closed`: a continuation finished its
    arguments; what the engine writes after them is the markup's end, not the client's."""

    index: int
    id: str
    name: str
    arguments: str = ""
    closed: bool = False


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
    # The tool call under way when the stream broke (after the text), or None.
    call: ToolCall | None = None
    # Per continuation: the tokens of the answer it was given, and the prompt and
    # completion tokens its engine reported (None: it died before its usage chunk).
    given: list[int] = field(default_factory=list)
    reported: list[int | None] = field(default_factory=list)
    completed: list[int | None] = field(default_factory=list)

    def begin(self) -> None:
        """A continuation starts from the answer so far."""
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
    cannot be continued (no chunk yet, several choices, tool calls, a thought after
    the text began, an error, or a finished answer)."""
    head: dict[str, Any] | None = None
    text: list[str] = []
    thought: list[str] = []
    call: ToolCall | None = None
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
                if thought or choice.get("finish_reason") is not None or delta.get("content"):
                    return None
                before = len(call.arguments) if call is not None else 0
                call = _call_delta(call, delta["tool_calls"])
                if call is None:
                    return None
                # A chunk that only names the call carries no token of the arguments.
                tokens += len(call.arguments) > before
                continue
            piece = _choice_text(choice, chat=chat)
            if piece is None:
                return None
            said, kind = piece
            if said and call is not None:
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
        call=call,
    )


def _call_delta(call: ToolCall | None, deltas: object) -> ToolCall | None:
    """`call` with a chunk's tool-call deltas added; None when they start a second call
    (parallel calls: each would need its own continuation) or are not understood."""
    if not isinstance(deltas, list) or len(deltas) != 1 or not isinstance(deltas[0], dict):
        return None
    delta = deltas[0]
    function = delta.get("function") or {}
    if not isinstance(function, dict):
        return None
    ident, name, more = delta.get("id"), function.get("name"), function.get("arguments") or ""
    if not isinstance(more, str):
        return None
    if call is None:
        if not isinstance(ident, str) or not isinstance(name, str) or not name:
            return None
        return ToolCall(index=delta.get("index", 0), id=ident, name=name, arguments=more)
    if (ident is not None and ident != call.id) or delta.get("index", call.index) != call.index:
        return None
    call.arguments += more
    return call


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
    """The request that continues `splice`'s answer; None when nothing is left to generate."""
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
        if splice.call is not None:
            if splice.reasoning or not splice.call.arguments.startswith("{"):
                return None
            # hermes' markup (Qwen's chat templates and vLLM's `hermes` parser): the
            # call opened, its name, its arguments so far.
            said += (
                '<tool_call>\n{"name": '
                + orjson.dumps(splice.call.name).decode()
                + ', "arguments": '
                + splice.call.arguments
            )
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
        if splice.call is not None:
            return _continued_call(choice, delta, splice, splice.call)
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
    choice: dict[str, Any], delta: dict[str, Any], splice: Splice, call: ToolCall
) -> list[Any] | None:
    """A continuation's chunk while a tool call is under way: the engine's tool parser
    never saw the call open (it reads only what it generates), so it sends the rest of
    the call as text. That text, up to where the arguments' JSON object closes, goes to
    the client as the call's argument deltas (same index); the markup after it
    (`}` and `</tool_call>`) is dropped. The call's end is `finish_reason: tool_calls`."""
    piece = delta.get("content")
    fragment = ""
    if isinstance(piece, str) and piece:
        splice.tokens += 1
        if not call.closed:
            end = _object_end(call.arguments, piece)
            fragment = piece if end is None else piece[:end]
            call.arguments += fragment
            call.closed = end is not None
    finish = choice.get("finish_reason")
    if finish == "stop":
        finish = "tool_calls"
    if not fragment and finish is None:
        return None
    out: dict[str, Any] = {}
    if fragment:
        out["tool_calls"] = [{"index": call.index, "function": {"arguments": fragment}}]
    return [{**choice, "delta": out, "finish_reason": finish}]


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
