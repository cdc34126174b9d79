"""The sim's other engine routes, in vLLM's shapes: rerank, score, tokenizer and audio.

- `/v1/rerank` scores each document by the overlap of its words with the query's
  (Jaccard, case-folded), best first, `top_n` of them (0: all); usage counts
  `total_tokens` (query plus document, per document), as vLLM's rerank does.
- `/v1/score` scores `text_1` against `text_2` the same way (one against many,
  or pair by pair), with vLLM's `data`/`usage`.
- `/tokenize` counts a chat (`messages`) or a `prompt` as a completion's
  `prompt_tokens` would, and returns the token ids; `/detokenize` turns ids back
  into text. A sim token of up to 7 UTF-8 bytes has those bytes, read as one
  big-endian number, as its id; a longer one a hash with bit 62 set, which
  detokenizes as `<unk>` (ids stay within 63 bits, as JSON clients expect).
- `/v1/audio/transcriptions` and `/translations` take multipart/form-data (a
  `file` and a `model`); the text is words of the sim's vocabulary picked by a
  hash of the file, about 2.5 per second of audio, where a second is 32,000
  bytes (16 kHz, 16-bit mono); `response_format` json (with `usage` of type
  `duration`, as vLLM answers) or text.

Rerank, score and audio take the engine's prefill time for their tokens, and
fail when faults say so; the tokenizer answers at once, as vLLM's does.

Not guaranteed: any meaning in the scores or the transcription, streamed audio
answers (`stream` is refused), or that the audio is audio at all.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable, Sequence
from email.message import Message
from email.parser import BytesParser
from email.policy import HTTP
from typing import Final

import orjson

from llmgw.sim.asgi import Receive, Scope, Send, read_body, send_bytes, send_error, send_json
from llmgw.sim.engine import Engine
from llmgw.sim.errors import SimError, bad_request
from llmgw.sim.faults import Faults
from llmgw.sim.inference import Inference
from llmgw.sim.protocol import parse_chat, parse_completion
from llmgw.sim.stats import ModelCounters, SimStats
from llmgw.sim.tokens import VOCABULARY, tokenize

# 16 kHz, 16-bit mono PCM: what Whisper models hear.
AUDIO_BYTES_PER_SECOND: Final = 32_000
# Speech runs at about 150 words a minute.
_WORDS_PER_SECOND: Final = 2.5
# Whisper encodes 30 s of audio as 1,500 frames: 50 per second.
_AUDIO_TOKENS_PER_SECOND: Final = 50
# Tokens up to this many bytes are their own id; longer ones are hashed.
_MAX_TOKEN_BYTES: Final = 7
_HASHED: Final = 1 << 62
UNKNOWN_TOKEN: Final = "<unk>"
_TEXT_HEADERS: Final = ((b"content-type", b"text/plain; charset=utf-8"),)


def token_id(token: object) -> int:
    """The id of a sim token: an id stays itself, short text is its UTF-8 bytes as a
    number, longer text a hash with bit 62 set."""
    if isinstance(token, int):
        return token
    raw = str(token).encode()
    if len(raw) <= _MAX_TOKEN_BYTES:
        return int.from_bytes(raw, "big")
    return _HASHED | int.from_bytes(hashlib.blake2b(raw, digest_size=7).digest(), "big")


def token_text(token: int) -> str:
    """The text of a sim token id (`<unk>` for a hashed one); ValueError for an id no
    sim token has."""
    if token < 0 or token >= 2 * _HASHED:
        raise ValueError(f"{token} is not a token id of llmgw sim")
    if token & _HASHED:
        return UNKNOWN_TOKEN
    return token.to_bytes((token.bit_length() + 7) // 8, "big").decode("utf-8", "replace")


def detokenize(ids: Sequence[int]) -> str:
    """Token texts joined as text: words apart, punctuation against the word before."""
    parts: list[str] = []
    for index, token in enumerate(ids):
        text = token_text(token)
        if index and (text[:1].isalnum() or text[:1] == "_"):
            parts.append(" ")
        parts.append(text)
    return "".join(parts)


def overlap(query: str, document: str) -> float:
    """How much of the two texts' words they share (Jaccard over case-folded tokens)."""
    a = {t.casefold() for t in tokenize(query)}
    b = {t.casefold() for t in tokenize(document)}
    union = a | b
    return len(a & b) / len(union) if union else 0.0


def transcript(audio: bytes, *, salt: int = 0) -> tuple[str, float]:
    """A deterministic transcript of `audio` and its length in seconds."""
    seconds = round(len(audio) / AUDIO_BYTES_PER_SECOND, 3)
    words = max(1, round(seconds * _WORDS_PER_SECOND))
    start = zlib.crc32(audio, salt)
    chosen = [VOCABULARY[(start + i * 7919) % len(VOCABULARY)] for i in range(words)]
    text = " ".join(chosen)
    return text[:1].upper() + text[1:] + ".", seconds


def _strings(value: object, field: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    raise bad_request(f"'{field}' must be a string or a non-empty array of strings", param=field)


def _model_of(data: dict[str, object]) -> str | None:
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("'model' must be a string", param="model")
    return model


class Extras:
    """Handlers of the sim's rerank, score, tokenizer and audio routes."""

    def __init__(
        self,
        *,
        inference: Inference,
        engine: Engine,
        stats: SimStats,
        faults: Faults,
        wall_clock: Callable[[], float],
    ) -> None:
        # The chat path's ids and model lookup, so every route names models alike.
        self._inference = inference
        self._engine = engine
        self._stats = stats
        self._faults = faults
        self._wall_clock = wall_clock

    def _new_id(self, prefix: str) -> str:
        return self._inference.new_id(prefix)

    def _resolve(self, name: str | None) -> tuple[str, ModelCounters]:
        # An empty `model` names the default model here, as a missing one does.
        return self._inference.resolve(name or None)

    async def _json(self, receive: Receive) -> dict[str, object] | None:
        body = await read_body(receive)
        if body is None:
            return None
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise bad_request(f"the request body is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise bad_request("the request body must be a JSON object")
        return data

    async def _run(self, counters: ModelCounters, tokens: int) -> None:
        """The engine's prefill time for `tokens`; SimError when faults fail the request."""
        self._stats.requests_total += 1
        if self._faults.should_fail():
            self._stats.requests_failed += 1
            raise SimError(
                self._faults.settings.error_status,
                "injected failure: this llmgw sim fails a fraction of requests on purpose "
                "(--error-rate or POST /sim/faults)",
                code="injected_fault",
            )
        await self._engine.encode(
            counters=counters, prompt_tokens=tokens, slow_start=self._faults.settings.slow_start
        )
        counters.request_success += 1
        self._stats.requests_completed += 1

    async def rerank(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            data = await self._json(receive)
            if data is None:
                return
            model, counters = self._resolve(_model_of(data))
            query = data.get("query")
            if not isinstance(query, str):
                raise bad_request("'query' must be a string", param="query")
            documents = _strings(data.get("documents"), "documents")
            top_n = data.get("top_n", 0)
            if not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 0:
                raise bad_request("'top_n' must be an integer >= 0", param="top_n")
            query_tokens = len(tokenize(query))
            tokens = sum(query_tokens + len(tokenize(d)) for d in documents)
            await self._run(counters, tokens)
        except SimError as exc:
            await send_error(send, exc)
            return
        scores = [overlap(query, d) for d in documents]
        order = sorted(range(len(documents)), key=lambda i: (-scores[i], i))
        if top_n:
            order = order[:top_n]
        results = [
            {"index": i, "document": {"text": documents[i]}, "relevance_score": scores[i]}
            for i in order
        ]
        payload = {
            "id": self._new_id("rerank-"),
            "model": model,
            "usage": {"total_tokens": tokens},
            "results": results,
        }
        await send_json(send, 200, payload)

    async def score(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            data = await self._json(receive)
            if data is None:
                return
            model, counters = self._resolve(_model_of(data))
            first = _strings(data.get("text_1"), "text_1")
            second = _strings(data.get("text_2"), "text_2")
            if len(first) == 1:
                first = first * len(second)
            elif len(first) != len(second):
                raise bad_request(
                    f"'text_1' has {len(first)} texts and 'text_2' {len(second)}: give one "
                    "text_1, or as many as text_2",
                    param="text_2",
                )
            pairs = list(zip(first, second, strict=True))
            tokens = sum(len(tokenize(a)) + len(tokenize(b)) for a, b in pairs)
            await self._run(counters, tokens)
        except SimError as exc:
            await send_error(send, exc)
            return
        payload = {
            "id": self._new_id("score-"),
            "object": "list",
            "created": int(self._wall_clock()),
            "model": model,
            "data": [
                {"index": i, "object": "score", "score": overlap(a, b)}
                for i, (a, b) in enumerate(pairs)
            ],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
        }
        await send_json(send, 200, payload)

    async def tokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's `/tokenize`: the prompt tokens of a chat (`messages`) or a `prompt`,
        counted exactly as a completion's `prompt_tokens` would be, and their ids."""
        try:
            data = await self._json(receive)
            if data is None:
                return
            self._resolve(_model_of(data))
            request = parse_chat(data) if "messages" in data else parse_completion(data)
        except SimError as exc:
            await send_error(send, exc)
            return
        cache = self._engine.cache
        payload: dict[str, object] = {
            "count": len(request.prompt),
            # The most tokens the sim's KV cache holds: no sequence can be longer.
            "max_model_len": cache.block_size * cache.capacity_blocks,
            "tokens": [token_id(t) for t in request.prompt],
            "token_strs": (
                [str(t) for t in request.prompt] if data.get("return_token_strs") else None
            ),
        }
        await send_json(send, 200, payload)

    async def detokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's `/detokenize`: `tokens` (ids) back to text, as `prompt`."""
        try:
            data = await self._json(receive)
            if data is None:
                return
            self._resolve(_model_of(data))
            ids = data.get("tokens")
            if not isinstance(ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in ids
            ):
                raise bad_request("'tokens' must be an array of token ids", param="tokens")
            try:
                text = detokenize(ids)
            except ValueError as exc:
                raise bad_request(str(exc), param="tokens") from exc
        except SimError as exc:
            await send_error(send, exc)
            return
        await send_json(send, 200, {"prompt": text})

    async def transcriptions(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._audio(scope, receive, send, salt=0)

    async def translations(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Another salt: a translation is another text than the transcript.
        await self._audio(scope, receive, send, salt=1)

    async def _audio(self, scope: Scope, receive: Receive, send: Send, *, salt: int) -> None:
        try:
            body = await read_body(receive)
            if body is None:
                return
            content_type = dict(scope["headers"]).get(b"content-type", b"")
            form = _form(content_type, body)
            _, counters = self._resolve(_field(form, "model"))
            audio = _file(form)
            if (_field(form, "stream") or "").lower() == "true":
                raise bad_request("llmgw sim does not stream audio answers", param="stream")
            response_format = _field(form, "response_format") or "json"
            if response_format not in ("json", "text"):
                raise bad_request(
                    f"response_format {response_format!r} is not served by llmgw sim; "
                    "use json or text",
                    param="response_format",
                )
            text, seconds = transcript(audio, salt=salt)
            await self._run(counters, max(1, round(seconds * _AUDIO_TOKENS_PER_SECOND)))
        except SimError as exc:
            await send_error(send, exc)
            return
        if response_format == "text":
            await send_bytes(send, 200, text.encode(), _TEXT_HEADERS)
            return
        await send_json(
            send, 200, {"text": text, "usage": {"type": "duration", "seconds": seconds}}
        )


def _form(content_type: bytes, body: bytes) -> Message:
    """The parts of a multipart/form-data body (the stdlib's MIME parser)."""
    if not content_type.lower().startswith(b"multipart/form-data"):
        raise bad_request("the request body must be multipart/form-data", param="file")
    head = b"Content-Type: " + content_type + b"\r\nMIME-Version: 1.0\r\n\r\n"
    message = BytesParser(policy=HTTP).parsebytes(head + body)
    if not message.is_multipart() or message.defects:
        raise bad_request("the request body is not valid multipart/form-data", param="file")
    return message


def _parts(form: Message, name: str) -> list[Message]:
    payload = form.get_payload()
    parts = payload if isinstance(payload, list) else []
    return [
        p
        for p in parts
        if isinstance(p, Message) and p.get_param("name", header="content-disposition") == name
    ]


def _field(form: Message, name: str) -> str | None:
    for part in _parts(form, name):
        value = part.get_payload(decode=True)
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace").strip()
    return None


def _file(form: Message) -> bytes:
    for part in _parts(form, "file"):
        value = part.get_payload(decode=True)
        if isinstance(value, bytes) and value:
            return value
    raise bad_request("you must provide a 'file' part with the audio", param="file")
