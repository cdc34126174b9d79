"""End to end: the Anthropic Messages and OpenAI Responses APIs, translated by the real
`llmgw server` for the real llama.cpp engine serving the quickstart's chat model
(SmolLM2-135M-Instruct), driven by the official `anthropic` and `openai` SDKs.

The tiny model's words are not asserted, only the protocol: shapes, stop reasons,
event order, and that the same prompt costs the same input tokens whichever API
carries it. A forced tool choice makes llama-cpp-python constrain the answer to a
call of the named function, so the tool round trip does not depend on the model's
choice.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from procs import Proc, Server, free_port

pytestmark = [pytest.mark.engine, pytest.mark.timeout(300)]

MODEL = "smollm2"
TOOLS: list[Any] = [
    {
        "name": "get_weather",
        "description": "Weather in a city",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]
HI: list[anthropic.types.MessageParam] = [{"role": "user", "content": "Say hi"}]


def _file(name: str) -> str:
    raw = os.environ.get(name)
    if not raw or not Path(raw).is_file():
        pytest.fail(
            f"{name}={raw!r} is not set or is no file: this test needs the real llama.cpp "
            f"engine and SmolLM2-135M-Instruct. Run `make test`, which sets {name}.",
            pytrace=False,
        )
    return raw


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PORT", "HOST")}
    engine = Proc(
        [
            _file("LLMGW_ENGINE_PYTHON"),
            "-m",
            "llama_cpp.server",
            "--model",
            _file("LLMGW_CHAT_MODEL_FILE"),
            "--model_alias",
            MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_ctx",
            "2048",
            "--interrupt_requests",
            "False",
        ],
        env=env,
    )
    try:
        engine.wait_http(f"http://127.0.0.1:{port}/v1/models", timeout=120)
        gateway = Server("--endpoint", f"e=http://127.0.0.1:{port}={MODEL}")
        yield gateway
        gateway.proc.stop()
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def claude(server: Server) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(
        base_url=server.url, api_key="unused", max_retries=0, timeout=120
    ) as client:
        yield client


@pytest.fixture(scope="module")
def oai(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120
    ) as client:
        yield client


def test_same_prompt_same_input_tokens_in_every_api(
    claude: anthropic.Anthropic, oai: openai.OpenAI
) -> None:
    chat = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hi"}], max_tokens=4
    )
    message = claude.messages.create(model=MODEL, max_tokens=4, messages=HI)
    response = oai.responses.create(model=MODEL, input="Say hi", max_output_tokens=4)
    assert chat.usage is not None and response.usage is not None
    assert message.usage.input_tokens == chat.usage.prompt_tokens == response.usage.input_tokens
    assert message.usage.output_tokens == response.usage.output_tokens == 4
    assert message.stop_reason == "max_tokens" and message.content[0].type == "text"
    assert response.status == "incomplete" and response.output_text


def test_messages_stream(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(model=MODEL, max_tokens=6, messages=HI) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert "content_block_delta" in kinds
    assert final.usage.output_tokens == 6 and final.stop_reason == "max_tokens"


def test_messages_tool_round_trip(claude: anthropic.Anthropic) -> None:
    asked = claude.messages.create(
        model=MODEL,
        max_tokens=40,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    )
    assert asked.stop_reason == "tool_use"
    (call,) = [b for b in asked.content if b.type == "tool_use"]
    assert call.name == "get_weather" and isinstance(call.input, dict)
    answered = claude.messages.create(
        model=MODEL,
        max_tokens=8,
        tools=TOOLS,
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": asked.content},  # type: ignore[typeddict-item]
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny"}],
            },
        ],
    )
    assert answered.type == "message" and answered.usage.input_tokens > asked.usage.input_tokens


def test_responses_stream_and_function_call(oai: openai.OpenAI) -> None:
    events = list(
        oai.responses.create(model=MODEL, input="Say hi", max_output_tokens=5, stream=True)
    )
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.incomplete"
    assert kinds.count("response.output_text.delta") >= 1
    called = oai.responses.create(
        model=MODEL,
        input="Weather in Paris?",
        max_output_tokens=40,
        tools=[
            {
                "type": "function",
                "name": "get_weather",
                **{k: v for k, v in TOOLS[0].items() if k == "description"},
                "parameters": TOOLS[0]["input_schema"],
                "strict": None,
            }
        ],
        tool_choice={"type": "function", "name": "get_weather"},
    )
    calls = [o for o in called.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert calls[0].call_id and isinstance(calls[0].arguments, str)
