"""The sim's ASGI app in-process: response shapes, usage counts, errors, loading, disconnects.

A tiny ASGI driver stands in for the server so that a test can read each body message
as it is sent and make the client "disconnect" at a chosen point. Everything runs in
zero-delay mode or on a fake clock: no real sleeping.
"""

from __future__ import annotations

import asyncio
import base64
import struct
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import orjson
import pytest
from prometheus_client import CollectorRegistry

from llmgw.cli.sim_wiring import build_app
from llmgw.sim.app import SimApp
from llmgw.sim.faults import FaultSettings
from llmgw.sim.settings import SimSettings
from llmgw.sim.tokens import CHAT_MESSAGE_OVERHEAD, count_tokens


class Exited(Exception):
    pass


def _exit(code: int) -> NoReturn:
    raise Exited(code)


@dataclass
class Reply:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    chunks: list[bytes] = field(default_factory=list)
    complete: bool = False

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    def json(self) -> Any:
        return orjson.loads(self.body)

    def events(self) -> list[Any]:
        """The SSE data payloads, decoded; the final `[DONE]` stays a string."""
        out: list[Any] = []
        for line in self.body.decode().split("\n\n"):
            if not line:
                continue
            assert line.startswith("data: ")
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else orjson.loads(data))
        return out


async def call(
    app: SimApp,
    method: str,
    path: str,
    body: object = None,
    *,
    headers: list[tuple[bytes, bytes]] | None = None,
    disconnect_after_chunks: int | None = None,
    disconnect: asyncio.Event | None = None,
) -> Reply:
    """Drive one request through the app; the client leaves after n body messages or when
    `disconnect` is set."""
    reply = Reply()
    gone = disconnect or asyncio.Event()
    raw = b"" if body is None else body if isinstance(body, bytes) else orjson.dumps(body)
    sent_body = False

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            reply.status = message["status"]
            reply.headers = {k.decode(): v.decode() for k, v in message["headers"]}
            return
        reply.chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            reply.complete = True
            gone.set()
        elif disconnect_after_chunks is not None and len(reply.chunks) >= disconnect_after_chunks:
            gone.set()

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": headers or [(b"content-type", b"application/json")],
    }
    await asyncio.wait_for(app(scope, receive, send), timeout=10)
    return reply


def _app(
    *,
    faults: FaultSettings | None = None,
    clock: Callable[[], float] = lambda: 0.0,
    **settings: Any,
) -> SimApp:
    defaults: dict[str, Any] = {"models": ("sim-a", "sim-b"), "zero_delay": True}
    return build_app(
        SimSettings(**{**defaults, **settings}),
        faults=faults or FaultSettings(),
        registry=CollectorRegistry(auto_describe=False),
        clock=clock,
        wall_clock=lambda: 1_700_000_000.0,
        exit_process=_exit,
    )


CHAT = {
    "model": "sim-a",
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name three colours, please."},
    ],
}
CHAT_PROMPT_TOKENS = count_tokens("You are terse.") + count_tokens("Name three colours, please.")


async def test_chat_completion_shape_usage_and_determinism() -> None:
    app = _app(output_tokens=7)
    reply = await call(app, "POST", "/v1/chat/completions", CHAT)
    assert reply.status == 200
    data = reply.json()
    assert data["object"] == "chat.completion"
    assert data["model"] == "sim-a"
    assert data["created"] == 1_700_000_000
    [choice] = data["choices"]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "stop"
    assert count_tokens(choice["message"]["content"]) == 7
    assert data["usage"] == {
        "prompt_tokens": CHAT_PROMPT_TOKENS + 2 * CHAT_MESSAGE_OVERHEAD,
        "completion_tokens": 7,
        "total_tokens": CHAT_PROMPT_TOKENS + 2 * CHAT_MESSAGE_OVERHEAD + 7,
    }
    again = (await call(app, "POST", "/v1/chat/completions", CHAT)).json()
    assert again["choices"][0]["message"]["content"] == choice["message"]["content"]
    assert again["id"] != data["id"]


async def test_max_tokens_sets_the_exact_length_and_finish_reason_length() -> None:
    app = _app()
    for field_name in ("max_tokens", "max_completion_tokens"):
        reply = await call(app, "POST", "/v1/chat/completions", {**CHAT, field_name: 40})
        data = reply.json()
        assert data["usage"]["completion_tokens"] == 40
        assert data["choices"][0]["finish_reason"] == "length"


async def test_missing_model_uses_the_first_served_name() -> None:
    app = _app()
    body = {key: value for key, value in CHAT.items() if key != "model"}
    assert (await call(app, "POST", "/v1/chat/completions", body)).json()["model"] == "sim-a"


async def test_chat_stream_one_token_per_chunk_then_usage_then_done() -> None:
    app = _app()
    body = {**CHAT, "model": "sim-b", "stream": True, "max_tokens": 5}
    body["stream_options"] = {"include_usage": True}
    reply = await call(app, "POST", "/v1/chat/completions", body)
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = reply.events()
    assert events[-1] == "[DONE]"
    *tokens, usage_chunk, _ = events
    assert len(tokens) == 5
    assert tokens[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("role" not in chunk["choices"][0]["delta"] for chunk in tokens[1:])
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in tokens)
    assert all("usage" not in chunk for chunk in tokens)
    assert [chunk["choices"][0]["finish_reason"] for chunk in tokens] == [None] * 4 + ["length"]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 5
    assert usage_chunk["usage"]["prompt_tokens"] == CHAT_PROMPT_TOKENS + 2 * CHAT_MESSAGE_OVERHEAD
    streamed = "".join(chunk["choices"][0]["delta"]["content"] for chunk in tokens)
    whole = (await call(app, "POST", "/v1/chat/completions", {**CHAT, "max_tokens": 5})).json()
    assert streamed == whole["choices"][0]["message"]["content"]


async def test_stream_without_include_usage_has_no_usage_chunk() -> None:
    app = _app(output_tokens=3)
    reply = await call(app, "POST", "/v1/chat/completions", {**CHAT, "stream": True})
    events = reply.events()
    assert len(events) == 4
    assert all("usage" not in event for event in events[:-1])
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


async def test_completions_stream_and_not() -> None:
    app = _app()
    body = {"model": "sim-a", "prompt": "The capital of France is", "max_tokens": 4}
    data = (await call(app, "POST", "/v1/completions", body)).json()
    assert data["object"] == "text_completion"
    assert data["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    events = (await call(app, "POST", "/v1/completions", {**body, "stream": True})).events()
    assert [event["object"] for event in events[:-1]] == ["text_completion"] * 4
    assert (
        "".join(event["choices"][0]["text"] for event in events[:-1]) == data["choices"][0]["text"]
    )
    ids = await call(app, "POST", "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 1})
    assert ids.json()["usage"]["prompt_tokens"] == 3


async def test_embeddings_float_and_base64() -> None:
    app = _app(embedding_dim=8)
    body = {"model": "sim-a", "input": ["hello world", "bye"]}
    data = (await call(app, "POST", "/v1/embeddings", body)).json()
    assert [item["index"] for item in data["data"]] == [0, 1]
    assert data["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    first = data["data"][0]["embedding"]
    assert len(first) == 8
    encoded = await call(app, "POST", "/v1/embeddings", {**body, "encoding_format": "base64"})
    raw = base64.b64decode(encoded.json()["data"][0]["embedding"])
    assert struct.unpack("<8f", raw) == pytest.approx(first, rel=1e-6)
    tokens = await call(app, "POST", "/v1/embeddings", {"input": [[1, 2], [3]]})
    assert tokens.json()["usage"]["prompt_tokens"] == 3


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        (
            "/v1/chat/completions",
            {"model": "nope", "messages": CHAT["messages"]},
            404,
            "model_not_found",
        ),
        ("/v1/chat/completions", b"{not json", 400, "invalid_request"),
        ("/v1/chat/completions", {"model": "sim-a"}, 400, "invalid_request"),
        ("/v1/chat/completions", {**CHAT, "max_tokens": 0}, 400, "invalid_request"),
        ("/v1/chat/completions", {**CHAT, "stream": "yes"}, 400, "invalid_request"),
        ("/v1/completions", {"prompt": ["a", "b"]}, 400, "invalid_request"),
        ("/v1/embeddings", {"input": []}, 400, "invalid_request"),
        ("/v1/nothing", {}, 404, "not_found"),
    ],
)
async def test_errors_are_openai_shaped(path: str, body: object, status: int, code: str) -> None:
    app = _app()
    reply = await call(app, "POST", path, body)
    assert reply.status == status
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    assert error["message"]


async def test_wrong_method_is_405_with_allow_header() -> None:
    reply = await call(_app(), "GET", "/v1/chat/completions")
    assert reply.status == 405
    assert reply.headers["allow"] == "POST"
    assert reply.json()["error"]["code"] == "method_not_allowed"


async def test_loading_answers_503_except_metrics_and_sim_routes() -> None:
    now = [100.0]
    app = _app(load_time=5.0, clock=lambda: now[0])
    for method, path in (("GET", "/health"), ("GET", "/v1/models"), ("POST", "/v1/completions")):
        reply = await call(app, method, path, {"prompt": "x"})
        assert reply.status == 503
        assert reply.json() == {
            "error": {
                "message": "model is loading",
                "type": "service_unavailable",
                "param": None,
                "code": "loading",
            }
        }
    assert (await call(app, "GET", "/metrics")).status == 200
    assert (await call(app, "GET", "/sim/stats")).status == 200
    now[0] = 105.0
    health = await call(app, "GET", "/health")
    assert (health.status, health.body) == (200, b"")
    models = (await call(app, "GET", "/v1/models")).json()
    assert [model["id"] for model in models["data"]] == ["sim-a", "sim-b"]
    assert models["data"][0]["owned_by"] == "llmgw-sim"


async def test_stall_then_disconnect_is_counted_as_cancelled() -> None:
    app = _app(faults=FaultSettings(stall_after_tokens=2))
    body = {**CHAT, "stream": True, "max_tokens": 10}
    reply = await call(app, "POST", "/v1/chat/completions", body, disconnect_after_chunks=2)
    assert len(reply.chunks) == 2
    assert not reply.complete
    stats = (await call(app, "GET", "/sim/stats")).json()
    assert stats["requests_cancelled"] == 1
    assert stats["requests_completed"] == 0
    assert stats["running"] == 0


async def test_non_streaming_request_cancelled_during_slow_start() -> None:
    app = _app(faults=FaultSettings(slow_start=30.0))
    hang_up = asyncio.Event()
    task = asyncio.ensure_future(
        call(app, "POST", "/v1/chat/completions", CHAT, disconnect=hang_up)
    )
    for _ in range(20):
        await asyncio.sleep(0)
    assert (await call(app, "GET", "/sim/stats")).json()["running"] == 1
    hang_up.set()
    reply = await task
    assert reply.status == 0  # nothing was sent
    stats = (await call(app, "GET", "/sim/stats")).json()
    assert (stats["running"], stats["requests_cancelled"]) == (0, 1)


async def test_injected_errors_and_runtime_fault_updates() -> None:
    app = _app()
    reply = await call(app, "POST", "/sim/faults", {"error_rate": 1.0, "error_status": 503})
    assert reply.json()["error_rate"] == 1.0
    failed = await call(app, "POST", "/v1/chat/completions", CHAT)
    assert failed.status == 503
    assert failed.json()["error"]["code"] == "injected_fault"
    bad = await call(app, "POST", "/sim/faults", {"error_rate": "all"})
    assert bad.status == 400
    assert "error_rate" in bad.json()["error"]["message"]
    await call(app, "POST", "/sim/faults", {"error_rate": 0})
    assert (await call(app, "POST", "/v1/chat/completions", CHAT)).status == 200
    current = (await call(app, "GET", "/sim/faults")).json()
    assert current == {
        "error_rate": 0.0,
        "error_status": 503,
        "crash_after": None,
        "stall_after_tokens": None,
        "break_after_tokens": None,
        "exit_after_tokens": None,
        "slow_start": 0.0,
    }
    stats = (await call(app, "GET", "/sim/stats")).json()
    assert (stats["requests_total"], stats["requests_failed"], stats["requests_completed"]) == (
        2,
        1,
        1,
    )


async def test_crash_after_exits_before_answering() -> None:
    app = _app(faults=FaultSettings(crash_after=1))
    assert (await call(app, "POST", "/v1/chat/completions", CHAT)).status == 200
    with pytest.raises(Exited):
        await call(app, "POST", "/v1/chat/completions", CHAT)


async def test_last_request_and_stats_shape() -> None:
    app = _app()
    headers = [(b"Content-Type", b"application/json"), (b"X-Request-Id", b"abc-123")]
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    await call(app, "POST", "/v1/chat/completions", body, headers=headers)
    stats = (await call(app, "GET", "/sim/stats")).json()
    assert set(stats) == {
        "requests_total",
        "requests_completed",
        "requests_cancelled",
        "requests_failed",
        "running",
        "waiting",
        "prefix_cache_queries",
        "prefix_cache_hits",
        "last_request",
        "sleep",
    }
    last = stats["last_request"]
    assert last["path"] == "/v1/chat/completions"
    assert last["body"]["stream_options"] == {"include_usage": True}
    assert last["headers"]["x-request-id"] == "abc-123"


async def test_metrics_use_vllm_names_with_model_labels() -> None:
    app = _app(block_size=2)
    long_prompt = {"model": "sim-b", "prompt": "one two three four five six", "max_tokens": 3}
    await call(app, "POST", "/v1/completions", long_prompt)
    await call(app, "POST", "/v1/completions", long_prompt)
    text = (await call(app, "GET", "/metrics")).body.decode()
    expected = {
        'vllm:num_requests_running{engine="0",model_name="sim-b"} 0.0',
        'vllm:num_requests_waiting{engine="0",model_name="sim-b"} 0.0',
        'vllm:prefix_cache_queries_total{engine="0",model_name="sim-b"} 12.0',
        'vllm:prefix_cache_hits_total{engine="0",model_name="sim-b"} 6.0',
        'vllm:prompt_tokens_total{engine="0",model_name="sim-b"} 12.0',
        'vllm:generation_tokens_total{engine="0",model_name="sim-b"} 6.0',
        'vllm:request_success_total{engine="0",model_name="sim-b"} 2.0',
        'vllm:request_success_total{engine="0",model_name="sim-a"} 0.0',
    }
    assert expected <= set(text.splitlines())
    assert 'vllm:kv_cache_usage_perc{engine="0",model_name="sim-a"}' in text


async def test_a_one_token_stream_carries_role_and_finish_reason_in_its_only_chunk() -> None:
    body = {**CHAT, "stream": True, "max_tokens": 1}
    chunk, done = (await call(_app(), "POST", "/v1/chat/completions", body)).events()
    assert done == "[DONE]"
    assert chunk["choices"][0]["delta"]["role"] == "assistant"
    assert chunk["choices"][0]["delta"]["content"].startswith(" ")
    assert chunk["choices"][0]["finish_reason"] == "length"


def _words(events: list[Any], *, chat: bool = True) -> str:
    key = "delta" if chat else None
    out = ""
    for event in events:
        if event == "[DONE]" or not event["choices"]:
            continue
        choice = event["choices"][0]
        out += choice[key]["content"] if key else choice["text"]
    return out


async def test_sequence_mode_counts_and_a_continued_chat_goes_on_from_its_last_word() -> None:
    app = _app(text="sequence")
    reply = await call(app, "POST", "/v1/chat/completions", {**CHAT, "max_tokens": 4})
    assert reply.json()["choices"][0]["message"]["content"] == " w1 w2 w3 w4"
    continued = {
        **CHAT,
        "messages": [*CHAT["messages"], {"role": "assistant", "content": " w1 w2 w3"}],
        "continue_final_message": True,
        "add_generation_prompt": False,
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = (await call(app, "POST", "/v1/chat/completions", continued)).events()
    assert _words(events) == " w4 w5 w6"
    # The final message is left open: no end marker, its three tokens in the prompt.
    assert events[-2]["usage"]["prompt_tokens"] == (
        CHAT_PROMPT_TOKENS + 3 * CHAT_MESSAGE_OVERHEAD - 1 + 3
    )
    # Without continue_final_message the answer is a new turn: it starts again.
    new_turn = {**continued, "continue_final_message": False}
    del new_turn["add_generation_prompt"]
    assert _words((await call(app, "POST", "/v1/chat/completions", new_turn)).events()) == (
        " w1 w2 w3"
    )


async def test_continue_final_message_with_add_generation_prompt_is_refused_as_vllm_does() -> None:
    app = _app(text="sequence")
    body = {**CHAT, "continue_final_message": True}
    reply = await call(app, "POST", "/v1/chat/completions", body)
    assert reply.status == 400
    assert (
        "Cannot set both `continue_final_message` and `add_generation_prompt`"
        in (reply.json()["error"]["message"])
    )
    bad = {**CHAT, "continue_final_message": "yes", "add_generation_prompt": False}
    assert (await call(app, "POST", "/v1/chat/completions", bad)).status == 400


async def test_sequence_mode_completions_continue_from_the_prompt() -> None:
    app = _app(text="sequence")
    body = {"model": "sim-a", "prompt": "Count: w1 w2", "max_tokens": 3, "stream": True}
    events = (await call(app, "POST", "/v1/completions", body)).events()
    assert _words(events, chat=False) == " w3 w4 w5"
    plain = {"model": "sim-a", "prompt": ["Count:"], "max_tokens": 2}
    assert (await call(app, "POST", "/v1/completions", plain)).json()["choices"][0]["text"] == (
        " w1 w2"
    )


async def test_break_after_tokens_ends_a_stream_mid_body_and_cuts_a_whole_answer() -> None:
    app = _app(text="sequence", faults=FaultSettings(break_after_tokens=3))
    body = {**CHAT, "max_tokens": 10, "stream": True}
    reply = await call(app, "POST", "/v1/chat/completions", body)
    assert reply.status == 200
    assert not reply.complete
    assert _words(reply.events()) == " w1 w2 w3"
    whole = await call(app, "POST", "/v1/chat/completions", {**CHAT, "max_tokens": 10})
    assert not whole.complete
    assert len(whole.body) < int(whole.headers["content-length"])
    early = _app(faults=FaultSettings(break_after_tokens=0))
    first = await call(early, "POST", "/v1/chat/completions", body)
    assert (first.status, first.body, first.complete) == (200, b"", False)


async def test_exit_after_tokens_exits_mid_stream_after_sending_them() -> None:
    app = _app(text="sequence", faults=FaultSettings(exit_after_tokens=2, break_after_tokens=5))
    sent: list[bytes] = []

    async def receive() -> dict[str, Any]:
        if not sent:
            sent.append(b"")
            body = orjson.dumps({**CHAT, "max_tokens": 10, "stream": True})
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.body":
            sent.append(message["body"])

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
    with pytest.raises(Exited):
        await asyncio.wait_for(app(scope, receive, send), timeout=10)
    assert b"".join(sent).count(b"data: ") == 2
