"""The inference endpoints: `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`.

Each request is counted, checked for an injected crash, parsed, recorded as
`last_request`, possibly failed on purpose, then run through the engine. Streaming
answers are SSE with one token per chunk (the first chat chunk also carries the
assistant role, the last one the finish reason), an optional usage chunk with empty
`choices` (vLLM's `stream_options.include_usage`), then `data: [DONE]`. Response
headers of a stream are sent with its first token, so a slow start delays the first
byte of the response, headers included.

Injected cuts (`break_after_tokens`, `exit_after_tokens`) apply to these chat and
completion routes, and to the natively served APIs' streams: after N tokens the
connection is closed without the rest of the answer (a stream without its final
chunk and `[DONE]`; a whole answer shorter than its `content-length`), or the
process exits.

Not guaranteed: a client that disconnects is only noticed while something could take
time (any timing, a slow start or a stall). In zero-delay mode without faults the
response is written in one go and counted as completed even if nobody reads it.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import orjson

from llmgw.sim.asgi import Receive, Scope, Send, read_body, send_bytes, send_error
from llmgw.sim.asgi import until_disconnect as _until_disconnect
from llmgw.sim.engine import Engine, GenerationCut
from llmgw.sim.errors import SimError, bad_request
from llmgw.sim.faults import Faults, FaultSettings
from llmgw.sim.lora import LoraAdapters
from llmgw.sim.protocol import (
    GenerationRequest,
    parse_chat,
    parse_completion,
    parse_embedding,
)
from llmgw.sim.stats import LastRequest, ModelCounters, SimStats
from llmgw.sim.tokens import TextGenerator, counting
from llmgw.sim.vectors import to_base64, unit_vector

_SSE_HEADERS: Final = (
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
)
_DONE: Final = b"data: [DONE]\n\n"


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _sse(payload: object) -> dict[str, object]:
    return {
        "type": "http.response.body",
        "body": b"data: " + orjson.dumps(payload) + b"\n\n",
        "more_body": True,
    }


class _ChunkTemplate:
    """The bytes of one kind of token chunk, split around the token's JSON string.

    Rendering a chunk is then two concatenations instead of building and serialising a
    dict per token; the template is made by orjson itself, so it is the same JSON.
    """

    __slots__ = ("_prefix", "_suffix")

    _MARK: Final = "\x00llmgw-token\x00"

    def __init__(
        self,
        head: dict[str, object],
        *,
        chat: bool,
        first: bool,
        finish: str | None,
        field: str = "content",
    ) -> None:
        choice: dict[str, object]
        if chat:
            delta = {"role": "assistant", field: self._MARK} if first else {field: self._MARK}
            choice = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": self._MARK}
        choice["logprobs"] = None
        choice["finish_reason"] = finish
        rendered = b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n"
        self._prefix, self._suffix = rendered.split(orjson.dumps(self._MARK))

    def message(self, token: str) -> dict[str, object]:
        return {
            "type": "http.response.body",
            "body": self._prefix + orjson.dumps(token) + self._suffix,
            "more_body": True,
        }


class Inference:
    """Handlers of the three inference endpoints, sharing counters, faults and the engine."""

    def __init__(
        self,
        *,
        models: Sequence[str],
        engine: Engine,
        generator: TextGenerator,
        stats: SimStats,
        faults: Faults,
        output_tokens: int,
        embedding_dim: int,
        wall_clock: Callable[[], float],
        sequence: bool = False,
        reasoning_words: int = 0,
        tool_calls: bool = False,
        tool_call_words: int = 0,
        adapters: LoraAdapters | None = None,
    ) -> None:
        # Acting as vLLM's hermes tool parser: a request offering tools gets a call
        # (several, of `tool_call_words` words each, when that is set).
        self._tool_calls = tool_calls and sequence
        self._call_words = tool_call_words
        self._sequence = sequence
        # Sequence words up to w<reasoning_words> are the thought (see `_thought`).
        self._reasoning_words = reasoning_words if sequence else 0
        self._adapters = adapters
        self._default_model = models[0]
        self._served = ", ".join(models)
        self._engine = engine
        self._generator = generator
        self._stats = stats
        self._faults = faults
        self._output_tokens = output_tokens
        self._embedding_dim = embedding_dim
        self._wall_clock = wall_clock
        self._id_base = secrets.token_hex(4)
        self._ids = itertools.count(1)

    def new_id(self, prefix: str) -> str:
        return f"{prefix}{self._id_base}{next(self._ids):08x}"

    def resolve(self, name: str | None) -> tuple[str, ModelCounters]:
        if name is None:
            name = self._default_model
        counters = self._stats.models.get(name)
        adapters = self._adapters
        if counters is None and adapters is not None and adapters.get(name) is not None:
            # An adapter is counted under its base model, as vLLM labels its metrics.
            return name, self._stats.models[adapters.parent]
        if counters is None:
            raise SimError(
                404,
                f"The model '{name}' does not exist on this engine; it serves: {self._served}.",
                code="model_not_found",
                error_type="invalid_request_error",
                param="model",
            )
        return name, counters

    def tokens(self, request: GenerationRequest) -> Sequence[str]:
        """The answer's tokens: hashed words, or the counting sequence in sequence mode."""
        count = request.max_tokens or self._output_tokens
        if self._sequence:
            return counting(request.sequence_after, count)
        return self._generator.tokens(request.key, count)

    def _thought(self, request: GenerationRequest, tokens: Sequence[str]) -> int:
        """How many of `tokens` (the counting sequence after `request.sequence_after`)
        are the thought: the words up to w<reasoning_words>. A continued message that
        closed its thought (`</think>`) has none left, as vLLM's parser sees the end of
        the thought in the prompt."""
        if not self._reasoning_words or request.thought_closed:
            return 0
        return max(0, min(len(tokens), self._reasoning_words - request.sequence_after))

    def _cut(self, faults: FaultSettings) -> int | None:
        """After how many tokens an injected break or exit cuts a generation (None: never)."""
        cuts = [n for n in (faults.break_after_tokens, faults.exit_after_tokens) if n is not None]
        return min(cuts) if cuts else None

    def _exits_at(self, faults: FaultSettings, cut: int | None) -> bool:
        """Whether the cut at `cut` tokens is the process exiting (else the connection breaks)."""
        return faults.exit_after_tokens is not None and faults.exit_after_tokens == cut

    def needs_watch(self, faults: FaultSettings) -> bool:
        return (
            not self._engine.scheduler.instant
            or faults.slow_start > 0
            or faults.stall_after_tokens is not None
        )

    async def watch(self, receive: Receive, work: Awaitable[None], watch: bool) -> bool:
        """Run `work`, watching for a disconnect only when it could take time."""
        if not watch:
            await work
            return True
        if await _until_disconnect(receive, work):
            return True
        self._stats.requests_cancelled += 1
        return False

    async def begin(self, scope: Scope, receive: Receive) -> object | None:
        """Count the request, crash if told to, read and decode its body (None: gone)."""
        self._faults.on_inference_request()
        stats = self._stats
        stats.requests_total += 1
        body = await read_body(receive)
        if body is None:
            stats.requests_cancelled += 1
            return None
        try:
            data: object = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise bad_request(f"the request body is not valid JSON: {exc}") from exc
        stats.last_request = LastRequest(scope["path"], data, scope["headers"])
        return data

    async def injected_error(self, receive: Receive, faults: FaultSettings) -> SimError | None:
        """The injected failure to answer, after the slow start (None: the client left)."""
        if faults.slow_start > 0:
            pause = self._engine.scheduler.pause(faults.slow_start)
            if not await self.watch(receive, pause, True):
                return None
        self._stats.requests_failed += 1
        return SimError(
            faults.error_status,
            "injected failure: this llmgw sim fails a fraction of requests on purpose "
            "(--error-rate or POST /sim/faults)",
            code="injected_fault",
        )

    async def _injected_failure(self, receive: Receive, send: Send, faults: FaultSettings) -> None:
        error = await self.injected_error(receive, faults)
        if error is not None:
            await send_error(send, error)

    async def run(
        self,
        receive: Receive,
        request: GenerationRequest,
        model: str,
        counters: ModelCounters,
        faults: FaultSettings,
        emit: Callable[[int, str], Awaitable[None]] | None,
        send: Send | None = None,
    ) -> Sequence[str] | None:
        """Generate `request`'s tokens through the engine (each handed to `emit` as it
        comes); None when the client left, or when an injected cut ended a stream (its
        body stays incomplete: the server closes the connection; with `send`, a cut at
        0 tokens sends the stream's headers first). For the other APIs' handlers
        (`native`); cuts apply to their streams only."""
        tokens = self.tokens(request)
        cut = self._cut(faults) if emit is not None else None
        work = self._engine.generate(
            model=model,
            counters=counters,
            prompt=request.prompt,
            tokens=tokens,
            stall_after=faults.stall_after_tokens,
            slow_start=faults.slow_start,
            emit=emit,
            cut_after=cut,
        )
        try:
            if not await self.watch(receive, work, self.needs_watch(faults)):
                return None
        except GenerationCut:
            if self._exits_at(faults, cut):
                self._faults.exit_now()
            if cut == 0 and send is not None:
                await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            return None
        return tokens

    def parts(
        self, request: GenerationRequest, tokens: Sequence[str]
    ) -> list[tuple[str, int, str]]:
        """A new answer's tokens as the chat path streams them, for the other APIs'
        handlers: ("thought", -1, token) for the thought, ("call", N, piece of call N's
        arguments) when the request offers a tool and the sim acts as a tool parser,
        else ("text", -1, token)."""
        thinking = self._thought(request, tokens)
        if not (self._tool_calls and request.tool):
            return [("thought" if i < thinking else "text", -1, t) for i, t in enumerate(tokens)]
        per_call = self._call_words or len(tokens)
        last = len(tokens) - 1
        out: list[tuple[str, int, str]] = []
        for index, token in enumerate(tokens):
            if index < thinking:
                out.append(("thought", -1, token))
                continue
            call, word = divmod(index - thinking, per_call)
            closes = word == per_call - 1 or index == last
            piece = ('{"n": "' if word == 0 else "") + token + ('"}' if closes else "")
            out.append(("call", call, piece))
        return out

    @property
    def sequence(self) -> bool:
        return self._sequence

    def completed(self, counters: ModelCounters) -> None:
        counters.request_success += 1
        self._stats.requests_completed += 1

    @property
    def faults(self) -> Faults:
        return self._faults

    @property
    def stats(self) -> SimStats:
        return self._stats

    @property
    def wall_clock(self) -> Callable[[], float]:
        return self._wall_clock

    async def chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._generation(scope, receive, send, chat=True)

    async def completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._generation(scope, receive, send, chat=False)

    async def _generation(self, scope: Scope, receive: Receive, send: Send, *, chat: bool) -> None:
        try:
            data = await self.begin(scope, receive)
            if data is None:
                return
            request = parse_chat(data) if chat else parse_completion(data)
            model, counters = self.resolve(request.model)
        except SimError as exc:
            self._stats.requests_failed += 1
            await send_error(send, exc)
            return
        faults = self._faults.settings
        if self._faults.should_fail():
            await self._injected_failure(receive, send, faults)
            return
        if request.stream:
            await self._stream(receive, send, request, model, counters, faults, chat=chat)
        else:
            await self._respond(receive, send, request, model, counters, faults, chat=chat)

    async def _respond(
        self,
        receive: Receive,
        send: Send,
        request: GenerationRequest,
        model: str,
        counters: ModelCounters,
        faults: FaultSettings,
        *,
        chat: bool,
    ) -> None:
        tokens = self.tokens(request)
        cut = self._cut(faults)
        work = self._engine.generate(
            model=model,
            counters=counters,
            prompt=request.prompt,
            tokens=tokens,
            stall_after=faults.stall_after_tokens,
            slow_start=faults.slow_start,
            emit=None,
            cut_after=cut,
        )
        try:
            if not await self.watch(receive, work, self.needs_watch(faults)):
                return
        except GenerationCut:
            if self._exits_at(faults, cut):
                self._faults.exit_now()
            body = orjson.dumps(self._whole(request, model, tokens, chat=chat))
            # Headers promise the whole answer; half of it comes, then the connection closes.
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send(
                {"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True}
            )
            return
        await send_bytes(send, 200, orjson.dumps(self._whole(request, model, tokens, chat=chat)))
        counters.request_success += 1
        self._stats.requests_completed += 1

    def _whole(
        self, request: GenerationRequest, model: str, tokens: Sequence[str], *, chat: bool
    ) -> dict[str, object]:
        finish = "length" if request.max_tokens is not None else "stop"
        thinking = self._thought(request, tokens) if chat else 0
        text = "".join(tokens[thinking:])
        choice: dict[str, object]
        if chat:
            message: dict[str, object] = {"role": "assistant", "content": text}
            if thinking:
                message["reasoning"] = "".join(tokens[:thinking])
            choice = {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return {
            "id": self.new_id("chatcmpl-" if chat else "cmpl-"),
            "object": "chat.completion" if chat else "text_completion",
            "created": int(self._wall_clock()),
            "model": model,
            "choices": [choice],
            "usage": _usage(len(request.prompt), len(tokens)),
        }

    async def _stream(
        self,
        receive: Receive,
        send: Send,
        request: GenerationRequest,
        model: str,
        counters: ModelCounters,
        faults: FaultSettings,
        *,
        chat: bool,
    ) -> None:
        tokens = self.tokens(request)
        finish = "length" if request.max_tokens is not None else "stop"
        last = len(tokens) - 1
        cut = self._cut(faults)
        head: dict[str, object] = {
            "id": self.new_id("chatcmpl-" if chat else "cmpl-"),
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(self._wall_clock()),
            "model": model,
        }
        first = _ChunkTemplate(head, chat=chat, first=True, finish=None)
        middle = _ChunkTemplate(head, chat=chat, first=False, finish=None)
        final = _ChunkTemplate(head, chat=chat, first=last == 0, finish=finish)
        if chat and self._tool_calls and request.tool:
            await self._stream_call(receive, send, request, tokens, head, counters, faults)
            return
        thinking = self._thought(request, tokens) if chat else 0
        thought = middle
        if thinking:
            first = _ChunkTemplate(head, chat=chat, first=True, finish=None, field="reasoning")
            thought = _ChunkTemplate(head, chat=chat, first=False, finish=None, field="reasoning")

        async def emit(index: int, token: str) -> None:
            if index == 0:
                await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            if index < thinking and index != last:
                template = first if index == 0 else thought
            else:
                template = final if index == last else first if index == 0 else middle
            await send(template.message(token))

        await self._generate_stream(
            receive, send, request, tokens, head, counters, faults, emit=emit, cut=cut
        )

    async def _generate_stream(
        self,
        receive: Receive,
        send: Send,
        request: GenerationRequest,
        tokens: Sequence[str],
        head: dict[str, object],
        counters: ModelCounters,
        faults: FaultSettings,
        *,
        emit: Callable[[int, str], Awaitable[None]],
        cut: int | None,
    ) -> None:
        """Generate `tokens` through `emit`, then end the stream: the usage chunk when
        asked for and `[DONE]`; a cut (a fault) ends it with the body incomplete."""
        work = self._engine.generate(
            model=str(head["model"]),
            counters=counters,
            prompt=request.prompt,
            tokens=tokens,
            stall_after=faults.stall_after_tokens,
            slow_start=faults.slow_start,
            emit=emit,
            cut_after=cut,
        )
        try:
            if not await self.watch(receive, work, self.needs_watch(faults)):
                return
        except GenerationCut:
            if self._exits_at(faults, cut):
                self._faults.exit_now()
            if cut == 0:
                await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            # Returning with the body incomplete: the server closes the connection.
            return
        if request.include_usage:
            usage = _usage(len(request.prompt), len(tokens))
            await send(_sse({**head, "choices": [], "usage": usage}))
        await send({"type": "http.response.body", "body": _DONE, "more_body": False})
        counters.request_success += 1
        self._stats.requests_completed += 1

    async def _stream_call(
        self,
        receive: Receive,
        send: Send,
        request: GenerationRequest,
        tokens: Sequence[str],
        head: dict[str, object],
        counters: ModelCounters,
        faults: FaultSettings,
    ) -> None:
        """Calls of the request's first tool, arguments `{"n": "<the words>"}`, streamed
        as vLLM's hermes parser streams them: the thought first (with a reasoning parser),
        then per call its index, id, type and name, then the arguments' JSON text in
        pieces. Each call holds `tool_call_words` words (0: one call holds them all), so
        an answer may make parallel calls (index 0, 1, ...). A continued message that
        ends inside a `<tool_call>` gets the rest of that call as text, as vLLM's parser
        (which reads only what the model generates, and so never sees the call open)
        sends it; the calls after it are the parser's own, numbered from 0."""
        last = len(tokens) - 1
        thinking = self._thought(request, tokens)
        per_call = self._call_words or len(tokens) + request.sequence_after + 1
        # The call of each word: words after the thought (w1..wK) fill calls in order.
        offset = request.sequence_after - self._reasoning_words
        open_call = (thinking + offset) // per_call
        # The parser's own numbering of the calls it sent (from 0), and chunks sent.
        state = {"calls": 0, "chunks": 0}

        def chunk(delta: dict[str, object], end: str | None) -> dict[str, object]:
            if state["chunks"] == 0:
                delta = {"role": "assistant", **delta}
            state["chunks"] += 1
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": end}
            return _sse({**head, "choices": [choice]})

        async def emit(index: int, token: str) -> None:
            if index == 0:
                await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            if index < thinking:
                await send(chunk({"reasoning": token}, None))
                return
            position = index + offset
            call, word = divmod(position, per_call)
            opens = ('{"n": "' if word == 0 else "") + token
            closes = word == per_call - 1 or index == last
            if request.call_open and call == open_call:
                # The call the continued message left open: text, as the parser sees it.
                text = opens + ('"}}\n</tool_call>' if closes else "")
                await send(chunk({"content": text}, "stop" if index == last else None))
                return
            if word == 0 or index == thinking:
                state["calls"] += 1
                opened = {
                    "index": state["calls"] - 1,
                    "id": "chatcmpl-tool-" + secrets.token_hex(8),
                    "type": "function",
                    "function": {"name": request.tool},
                }
                await send(chunk({"tool_calls": [opened]}, None))
            arguments = {
                "index": state["calls"] - 1,
                "function": {"arguments": opens + ('"}' if closes else "")},
            }
            end = "tool_calls" if index == last else None
            await send(chunk({"tool_calls": [arguments]}, end))

        await self._generate_stream(
            receive, send, request, tokens, head, counters, faults, emit=emit, cut=self._cut(faults)
        )

    async def embeddings(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            data = await self.begin(scope, receive)
            if data is None:
                return
            request = parse_embedding(data)
            model, counters = self.resolve(request.model)
        except SimError as exc:
            self._stats.requests_failed += 1
            await send_error(send, exc)
            return
        faults = self._faults.settings
        if self._faults.should_fail():
            await self._injected_failure(receive, send, faults)
            return
        prompt_tokens = sum(item.tokens for item in request.inputs)
        work = self._engine.encode(
            counters=counters, prompt_tokens=prompt_tokens, slow_start=faults.slow_start
        )
        if not await self.watch(receive, work, self.needs_watch(faults)):
            return
        dim = self._embedding_dim
        items: list[dict[str, object]] = []
        for index, item in enumerate(request.inputs):
            vector = unit_vector(item.key, dim)
            embedding: object = to_base64(vector) if request.base64 else vector
            items.append({"object": "embedding", "index": index, "embedding": embedding})
        payload = {
            "id": self.new_id("embd-"),
            "object": "list",
            "created": int(self._wall_clock()),
            "model": model,
            "data": items,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }
        await send_bytes(send, 200, orjson.dumps(payload))
        counters.request_success += 1
        self._stats.requests_completed += 1
