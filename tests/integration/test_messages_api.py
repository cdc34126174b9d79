"""The official `anthropic` SDK against a real `llmgw server` translating to a real `llmgw sim`."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from procs import Server, Sim, llmgw
from test_gateway_keys_limits_usage import create_key, usage_rows


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path, str]]:
    data_dir = tmp_path_factory.mktemp("data")
    config = data_dir / "llmgw.yaml"
    config.write_text("auth: {refresh_interval: 0.2}\nusage: {flush_interval: 0.05}\n")
    subprocess.run(
        llmgw("db", "upgrade", "--data-dir", str(data_dir)), check=True, capture_output=True
    )
    sim = Sim("--zero-delay", model="m1")
    server = Server(
        "--endpoint", f"s={sim.url}=m1", "--config", str(config), auth=True, data_dir=data_dir
    )
    yield server, data_dir, create_key(data_dir, "--name", "claude")
    server.proc.stop()
    sim.proc.stop()


@pytest.fixture
def client(gateway: tuple[Server, Path, str]) -> Iterator[anthropic.Anthropic]:
    server, _, secret = gateway
    with anthropic.Anthropic(base_url=server.url, api_key=secret, max_retries=0) as api:
        yield api


USER = [{"role": "user", "content": "Write about the sea"}]
TOOLS: list[Any] = [
    {
        "name": "get_weather",
        "description": "Weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]


def new_key(data_dir: Path, *flags: str) -> tuple[str, str]:
    """A fresh key's (id, secret), so each test reads its own usage."""
    result = subprocess.run(
        llmgw(
            "keys",
            "create",
            "--data-dir",
            str(data_dir),
            "--json",
            "--name",
            f"claude-{uuid.uuid4().hex[:8]}",
            *flags,
        ),
        capture_output=True,
        text=True,
        check=True,
    )
    made = json.loads(result.stdout)
    return made["id"], made["secret"]


def recorded(data_dir: Path, key_id: str, requests: int) -> tuple[int, int, int]:
    """(requests, prompt tokens, completion tokens) of a key once `requests` are recorded."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rows = usage_rows(data_dir, key_id=key_id, group_by=())
        if rows and rows[0].requests >= requests:
            return rows[0].requests, rows[0].prompt_tokens, rows[0].completion_tokens
        time.sleep(0.05)
    raise AssertionError(f"key {key_id} has not {requests} requests recorded")


def test_plain_text(gateway: tuple[Server, Path, str]) -> None:
    server, data_dir, _ = gateway
    key_id, secret = new_key(data_dir)
    with anthropic.Anthropic(base_url=server.url, api_key=secret, max_retries=0) as client:
        reply = client.messages.create(
            model="m1",
            max_tokens=6,
            system="Be brief.",
            messages=USER,
            extra_body={"temperature": 0.5},
        )
    assert reply.type == "message" and reply.role == "assistant" and reply.model == "m1"
    assert reply.id.startswith("msg_")
    assert len(reply.content) == 1 and reply.content[0].type == "text"
    assert reply.content[0].text
    assert reply.stop_reason == "max_tokens"
    assert reply.usage.output_tokens == 6 and reply.usage.input_tokens > 0
    assert recorded(data_dir, key_id, 1) == (1, reply.usage.input_tokens, 6)


def test_streaming_event_by_event(gateway: tuple[Server, Path, str]) -> None:
    server, data_dir, _ = gateway
    key_id, secret = new_key(data_dir)
    with (
        anthropic.Anthropic(base_url=server.url, api_key=secret, max_retries=0) as client,
        client.messages.stream(model="m1", max_tokens=5, messages=USER) as stream,
    ):
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start"
    assert events[0].message.usage.input_tokens > 0  # type: ignore[union-attr]
    assert kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == 1 and kinds.count("content_block_stop") == 1
    deltas = [e for e in events if e.type == "content_block_delta"]
    assert len(deltas) == 5
    assert final.content[0].type == "text"
    assert len(final.content[0].text.split()) == 5
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 5
    assert recorded(data_dir, key_id, 1) == (1, final.usage.input_tokens, 5)


def test_a_streamed_message_reports_the_input_tokens_that_were_billed(
    gateway: tuple[Server, Path, str],
) -> None:
    # The router's estimate (message_start: engines count the prompt only at the
    # end) and the engine's count differ for this prompt; the final Message the SDK
    # assembles must hold the engine's count, which is what the key is charged.
    server, data_dir, _ = gateway
    key_id, secret = new_key(data_dir)
    prompt = [{"role": "user", "content": "Write about the sea and the ships on it. " * 6}]
    with (
        anthropic.Anthropic(base_url=server.url, api_key=secret, max_retries=0) as client,
        client.messages.stream(model="m1", max_tokens=3, messages=prompt) as stream,
    ):
        events = list(stream)
        final = stream.get_final_message()
    start = events[0]
    (delta,) = [e for e in events if e.type == "message_delta"]
    assert start.type == "message_start" and delta.type == "message_delta"
    billed = recorded(data_dir, key_id, 1)
    assert billed == (1, final.usage.input_tokens, 3)
    assert delta.usage.input_tokens == final.usage.input_tokens
    assert start.message.usage.input_tokens != final.usage.input_tokens


def test_tool_round_trip_shape(client: anthropic.Anthropic) -> None:
    # The sim does not choose tools; this checks that tool definitions, a tool call
    # and its result are carried to the engine and answered in the Messages shape.
    reply = client.messages.create(
        model="m1",
        max_tokens=4,
        tools=TOOLS,
        tool_choice={"type": "auto"},
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me look."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"}],
            },
        ],
    )
    assert reply.content[0].type == "text" and reply.usage.output_tokens == 4


def test_errors_in_anthropic_shape(
    client: anthropic.Anthropic, gateway: tuple[Server, Path, str]
) -> None:
    with pytest.raises(anthropic.BadRequestError) as bad:
        # The SDK checks max_tokens itself; its generic post sends what we give it.
        client.post("/v1/messages", body={"model": "m1", "messages": USER}, cast_to=object)
    body = bad.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as wrong:
        client.messages.create(
            model="m1",
            max_tokens=5,
            messages=[{"role": "user", "content": [{"type": "text", "text": 3}]}],  # type: ignore[list-item]
        )
    assert "messages.0.content.0.text" in wrong.value.message
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="nope", max_tokens=5, messages=USER)
    assert isinstance(missing.value.body, dict)
    assert missing.value.body["error"]["type"] == "not_found_error"
    server, _, _ = gateway
    with (
        anthropic.Anthropic(base_url=server.url, api_key="sk-wrong", max_retries=0) as stranger,
        pytest.raises(anthropic.AuthenticationError) as denied,
    ):
        stranger.messages.create(model="m1", max_tokens=5, messages=USER)
    assert isinstance(denied.value.body, dict)
    assert denied.value.body["error"]["type"] == "authentication_error"
    get = httpx.get(server.url + "/v1/messages")
    assert get.status_code == 405 and get.json()["type"] == "error"


def test_limits_and_metrics_as_for_chat(gateway: tuple[Server, Path, str]) -> None:
    server, data_dir, _ = gateway
    _, secret = new_key(data_dir, "--rpm", "1")
    with anthropic.Anthropic(base_url=server.url, api_key=secret, max_retries=0) as client:
        client.messages.create(model="m1", max_tokens=2, messages=USER)
        with pytest.raises(anthropic.RateLimitError) as limited:
            client.messages.create(model="m1", max_tokens=2, messages=USER)
    body = limited.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "rate_limit_error"
    assert limited.value.response.headers.get("retry-after")
    limited_lines = [
        line
        for line in server.metrics().splitlines()
        if line.startswith("llmgw_requests_total{")
        and 'model="m1"' in line
        and 'status="429"' in line
    ]
    assert limited_lines and float(limited_lines[0].rsplit(" ", 1)[1]) >= 1
