"""End to end: real requests through the real `llmgw server` to the real llama.cpp engine.

Gemma 3 270M is a base model. With temperature 0, "The capital of France is the city of"
continues " Paris. It is the most visited city ..." every time (also after other
prompts, streamed or not); the shorter "The capital of France is" continues " the
capital of France. ..." with llama-cpp-python 0.3.36, so it is not used. Chat prompts
through a base model often come back as a bare newline, so the chat test asserts the
OpenAI response shape only.

Streaming usage: llama-cpp-python's server ignores `stream_options` and never sends a
usage chunk itself. A client that asks for `include_usage` must still get one from
llmgw (the last chunk before `[DONE]`, with `choices: []`), and a client that does not
ask must not get one.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.engine

PROMPT = "The capital of France is the city of"
# The name the engine serves the model under (`--model_alias`) and llmgw routes by.
MODEL = "gemma-3-270m"


def sse_events(client: httpx.Client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST a streaming request; return the JSON events, checking the stream ends with [DONE]."""
    events: list[dict[str, Any]] = []
    done = False
    with client.stream("POST", path, json=body) as resp:
        assert resp.status_code == 200, resp.read().decode(errors="replace")
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line.removeprefix("data:").strip()
            assert not done, f"data after [DONE]: {data!r}"
            if data == "[DONE]":
                done = True
                continue
            events.append(json.loads(data))
    assert done, f"the stream ended without data: [DONE] after {len(events)} events"
    return events


def completion_text(events: list[dict[str, Any]]) -> list[str]:
    """The non-empty text pieces of a completions stream, in order."""
    return [c["text"] for e in events for c in e.get("choices", []) if c.get("text")]


def test_completion_answers_paris_with_consistent_usage(client: httpx.Client) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    resp = client.post("/v1/completions", json=body)

    assert resp.status_code == 200, resp.text
    data = resp.json()
    assert data["object"] == "text_completion"
    choice = data["choices"][0]
    assert choice["text"].strip(), data
    assert "Paris" in choice["text"], data
    assert choice["finish_reason"] in ("stop", "length"), data
    usage = data["usage"]
    assert usage["prompt_tokens"] > 0, usage
    assert usage["completion_tokens"] > 0, usage
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], usage
    if choice["finish_reason"] == "length":
        assert usage["completion_tokens"] == body["max_tokens"], usage


def test_streaming_completion_with_include_usage_ends_with_a_usage_chunk(
    client: httpx.Client,
) -> None:
    body = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": 12,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = sse_events(client, "/v1/completions", body)

    pieces = completion_text(events)
    assert "".join(pieces).strip(), events
    assert "Paris" in "".join(pieces), events
    with_usage = [e for e in events if e.get("usage")]
    assert len(with_usage) == 1, f"expected exactly one usage chunk, got {with_usage}"
    last = events[-1]
    assert last is with_usage[0], f"the usage chunk must be the last one before [DONE]: {events}"
    assert last["choices"] == [], last
    usage = last["usage"]
    # llama.cpp streams one chunk per generated token (Gemma's tokens for this answer are
    # all printable), so the count of text chunks is the count of completion tokens.
    assert usage["completion_tokens"] == len(pieces), (usage, pieces)
    assert usage["prompt_tokens"] > 0, usage
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], usage


def test_streaming_completion_without_include_usage_has_no_usage_chunk(
    client: httpx.Client,
) -> None:
    body = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": 6,
        "temperature": 0,
        "stream": True,
    }
    events = sse_events(client, "/v1/completions", body)

    assert "".join(completion_text(events)).strip(), events
    assert [e for e in events if e.get("usage")] == [], events
    assert all(e.get("choices") for e in events), events


def test_chat_completion_has_the_openai_shape(client: httpx.Client) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 8,
        "temperature": 0,
    }
    resp = client.post("/v1/chat/completions", json=body)

    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    data = resp.json()
    assert data["object"] == "chat.completion", data
    assert isinstance(data["id"], str) and data["id"], data
    assert isinstance(data["created"], int), data
    assert isinstance(data["model"], str), data
    choice = data["choices"][0]
    assert choice["index"] == 0, data
    assert choice["message"]["role"] == "assistant", data
    assert isinstance(choice["message"]["content"], str), data
    assert choice["finish_reason"] in ("stop", "length"), data
    usage = data["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], usage
