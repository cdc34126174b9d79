"""The official `openai` SDK's `responses` client against a real `llmgw server` and `llmgw sim`."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from procs import Server, Sim, llmgw
from test_messages_api import new_key, recorded


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
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
    yield server, data_dir
    server.proc.stop()
    sim.proc.stop()


def _client(server: Server, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=secret, max_retries=0)


def test_plain_text_cut_by_max_output_tokens(gateway: tuple[Server, Path]) -> None:
    server, data_dir = gateway
    key_id, secret = new_key(data_dir)
    with _client(server, secret) as client:
        reply = client.responses.create(
            model="m1",
            instructions="Be brief.",
            input="Write about the sea",
            max_output_tokens=6,
            temperature=0.5,
            store=False,
        )
    assert reply.object == "response" and reply.id.startswith("resp_") and reply.model == "m1"
    assert reply.status == "incomplete"
    assert reply.incomplete_details is not None
    assert reply.incomplete_details.reason == "max_output_tokens"
    assert len(reply.output_text.split()) == 6
    assert reply.usage is not None and reply.usage.output_tokens == 6
    assert reply.usage.total_tokens == reply.usage.input_tokens + 6
    assert reply.instructions == "Be brief." and reply.max_output_tokens == 6
    assert recorded(data_dir, key_id, 1) == (1, reply.usage.input_tokens, 6)


def test_streaming_event_by_event(gateway: tuple[Server, Path]) -> None:
    server, data_dir = gateway
    key_id, secret = new_key(data_dir)
    with _client(server, secret) as client:
        events = list(
            client.responses.create(
                model="m1",
                input=[{"role": "user", "content": "Write about the sea"}],
                max_output_tokens=5,
                stream=True,
            )
        )
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds.count("response.output_text.delta") == 5
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response  # type: ignore[union-attr]
    assert len(final.output_text.split()) == 5
    assert final.usage is not None and final.usage.output_tokens == 5
    assert recorded(data_dir, key_id, 1) == (1, final.usage.input_tokens, 5)


def test_stream_helper_and_tool_round_trip_shape(gateway: tuple[Server, Path]) -> None:
    # The sim does not choose tools: this checks that function tools, a call and
    # its output are carried to the engine and answered in the Responses shape.
    server, data_dir = gateway
    _, secret = new_key(data_dir)
    tools: list[Any] = [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    with (
        _client(server, secret) as client,
        client.responses.stream(
            model="m1",
            tools=tools,
            tool_choice="auto",
            input=[
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "type": "function_call",
                    "call_id": "call_1",
                    "name": "get_weather",
                    "arguments": '{"city":"Paris"}',
                },
                {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
            ],
        ) as stream,
    ):
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    # Not cut short (no max_output_tokens), so it ends with response.completed,
    # which the SDK's stream helper needs.
    assert final.status == "completed" and final.output_text == text and text
    assert final.tools[0].name == "get_weather"  # type: ignore[union-attr]


def test_what_translation_cannot_carry_names_the_field(gateway: tuple[Server, Path]) -> None:
    server, data_dir = gateway
    _, secret = new_key(data_dir)
    with _client(server, secret) as client:
        cases: list[tuple[str, dict[str, Any]]] = [
            ("previous_response_id", {"previous_response_id": "resp_123"}),
            ("store", {"store": True}),
            ("tools.0.type", {"tools": [{"type": "web_search"}]}),
            ("max_output_tokens", {"max_output_tokens": "5"}),
        ]
        for field, extra in cases:
            with pytest.raises(openai.BadRequestError) as info:
                client.responses.create(model="m1", input="hi", **extra)
            assert info.value.param == field, info.value.message
            assert field in info.value.message
        with pytest.raises(openai.NotFoundError) as missing:
            client.responses.create(model="nope", input="hi")
        assert missing.value.code == "model_not_found"
    with _client(server, "sk-wrong") as stranger, pytest.raises(openai.AuthenticationError):
        stranger.responses.create(model="m1", input="hi")
