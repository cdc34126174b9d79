"""A translated stream that fails after it began ends with each API's own error event."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest
from procs import Server, Sim


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # The engine stalls after 3 tokens; the router's idle deadline ends the stream.
    sim = Sim("--zero-delay", "--stall-after-tokens", "3", model="m1")
    config = Path(tmp_path_factory.mktemp("cfg")) / "llmgw.yaml"
    config.write_text("router: {timeouts: {idle: 0.3}}\n")
    gateway = Server("--endpoint", f"s={sim.url}=m1", "--config", str(config))
    yield gateway
    gateway.proc.stop()
    sim.proc.stop()


def test_messages_stream_ends_with_an_anthropic_error(server: Server) -> None:
    with anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0) as client:
        events = []
        with (
            pytest.raises(anthropic.APIStatusError) as info,
            client.messages.stream(
                model="m1", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
            ) as stream,
        ):
            for event in stream:
                events.append(event.type)
    assert events[0] == "message_start"
    assert events.count("content_block_delta") == 3
    assert "message_stop" not in events
    body = info.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "timeout_error"
    assert "idle deadline of 0.3s" in body["error"]["message"]


def test_responses_stream_ends_with_an_error_event(server: Server) -> None:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        events = list(
            client.responses.create(model="m1", input="hi", max_output_tokens=10, stream=True)
        )
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds.count("response.output_text.delta") == 3
    last = events[-1]
    assert last.type == "error"
    assert last.code == "deadline_exceeded" and "idle deadline" in last.message
    assert "response.completed" not in kinds
