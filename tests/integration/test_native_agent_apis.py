"""/v1/messages and /v1/responses passed through to an engine that serves them natively.

One real `llmgw sim --native-apis messages,responses` serves two model names; a
real `llmgw server` has two static endpoints on it: `native` (model `nat`,
`apis: {messages: native, responses: native}`) and `translated` (model `tr`, the
default: translation). The official `anthropic` and `openai` SDKs talk to the
server; the sim's `last_request` shows which path each request reached, and the
usage records of the two modes are compared for the same requests.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from procs import Proc, Server, Sim, free_port, free_port_block, llmgw
from test_agent_restart import ready_shards, wait_for
from test_messages_api import new_key, recorded

USER = [{"role": "user", "content": "Write about the sea"}]
WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path, Sim]]:
    data_dir = tmp_path_factory.mktemp("data")
    subprocess.run(
        llmgw("db", "upgrade", "--data-dir", str(data_dir)), check=True, capture_output=True
    )
    sim = Sim(
        "--zero-delay", "--native-apis", "messages,responses", model="nat", extra_models=["tr"]
    )
    config = data_dir / "llmgw.yaml"
    config.write_text(
        "auth: {refresh_interval: 0.2}\n"
        "usage: {flush_interval: 0.05}\n"
        "endpoints:\n"
        f"  - {{id: native, url: '{sim.url}', models: [nat],"
        " apis: {messages: native, responses: native}}\n"
        f"  - {{id: translated, url: '{sim.url}', models: [tr]}}\n"
    )
    server = Server("--config", str(config), auth=True, data_dir=data_dir)
    yield server, data_dir, sim
    server.proc.stop()
    sim.proc.stop()


def _path(sim: Sim) -> object:
    last = sim.stats()["last_request"]
    assert isinstance(last, dict)
    return last["path"]


def _anthropic(server: Server, secret: str) -> anthropic.Anthropic:
    # The SDK sends the key as `x-api-key`.
    return anthropic.Anthropic(base_url=server.url, api_key=secret, max_retries=0)


def _openai(server: Server, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=secret, max_retries=0)


def test_messages_plain_text_reaches_the_engine_as_messages(
    gateway: tuple[Server, Path, Sim],
) -> None:
    server, data_dir, sim = gateway
    key_id, secret = new_key(data_dir)
    with _anthropic(server, secret) as client:
        reply = client.messages.create(model="nat", max_tokens=6, system="Be brief.", messages=USER)
    assert _path(sim) == "/v1/messages"
    assert reply.type == "message" and reply.model == "nat" and reply.id.startswith("msg_")
    assert len(reply.content) == 1 and reply.content[0].type == "text"
    assert len(reply.content[0].text.split()) == 6
    assert reply.stop_reason == "max_tokens"
    assert reply.usage.output_tokens == 6 and reply.usage.input_tokens > 0
    assert recorded(data_dir, key_id, 1) == (1, reply.usage.input_tokens, 6)


def test_messages_stream_carries_input_tokens_in_message_start(
    gateway: tuple[Server, Path, Sim],
) -> None:
    server, data_dir, sim = gateway
    key_id, secret = new_key(data_dir)
    with (
        _anthropic(server, secret) as client,
        client.messages.stream(model="nat", max_tokens=5, messages=USER) as stream,
    ):
        events = list(stream)
        final = stream.get_final_message()
    assert _path(sim) == "/v1/messages"
    kinds = [event.type for event in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    start = events[0]
    assert start.type == "message_start" and start.message.usage.input_tokens > 0
    deltas = [e for e in events if e.type == "content_block_delta"]
    assert len(deltas) == 5
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 5
    assert recorded(data_dir, key_id, 1) == (1, start.message.usage.input_tokens, 5)
    # message_delta carries the engine's input_tokens too (as vLLM's does): the final
    # Message reports the tokens that were billed.
    (delta,) = [e for e in events if e.type == "message_delta"]
    assert delta.type == "message_delta"
    assert delta.usage.input_tokens == final.usage.input_tokens == start.message.usage.input_tokens


def test_messages_tool_call_round_trip(gateway: tuple[Server, Path, Sim]) -> None:
    server, data_dir, sim = gateway
    _, secret = new_key(data_dir)
    tools: list[Any] = [{"name": "get_weather", "description": "Weather", "input_schema": WEATHER}]
    with _anthropic(server, secret) as client:
        call = client.messages.create(
            model="nat",
            max_tokens=4,
            messages=USER,
            tools=tools,
            tool_choice={"type": "tool", "name": "get_weather"},
        )
        assert call.stop_reason == "tool_use"
        use = call.content[0]
        assert use.type == "tool_use" and use.name == "get_weather"
        assert isinstance(use.input, dict) and use.input["days"] == 4
        assert isinstance(use.input["city"], str) and use.input["city"]
        reply = client.messages.create(
            model="nat",
            max_tokens=3,
            tools=tools,
            messages=[
                *USER,
                {"role": "assistant", "content": [use.model_dump()]},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny"}],
                },
            ],
        )
    assert _path(sim) == "/v1/messages"
    assert reply.content[0].type == "text" and reply.stop_reason == "max_tokens"


def test_messages_errors_have_anthropic_shape(gateway: tuple[Server, Path, Sim]) -> None:
    server, data_dir, sim = gateway
    _, secret = new_key(data_dir)
    with _anthropic(server, secret) as client, pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="nope", max_tokens=4, messages=USER)
    assert missing.value.body is not None
    # The engine's own refusal, passed on in the API's shape.
    answer = httpx.post(
        server.url + "/v1/messages",
        headers={"x-api-key": secret},
        json={"model": "nat", "messages": USER},
        timeout=30,
    )
    assert answer.status_code == 400
    assert answer.json()["type"] == "error"
    assert "max_tokens" in answer.json()["error"]["message"]
    assert _path(sim) == "/v1/messages"
    refused = httpx.post(
        server.url + "/v1/messages",
        headers={"x-api-key": "sk-wrong"},
        json={"model": "nat", "max_tokens": 3, "messages": USER},
        timeout=30,
    )
    assert refused.status_code == 401
    assert refused.json()["error"]["type"] == "authentication_error"


def test_responses_plain_text_cut_by_max_output_tokens(
    gateway: tuple[Server, Path, Sim],
) -> None:
    server, data_dir, sim = gateway
    key_id, secret = new_key(data_dir)
    with _openai(server, secret) as client:
        reply = client.responses.create(
            model="nat", instructions="Be brief.", input="Write about the sea", max_output_tokens=6
        )
    assert _path(sim) == "/v1/responses"
    assert reply.object == "response" and reply.model == "nat"
    assert reply.status == "incomplete"
    assert reply.incomplete_details is not None
    assert reply.incomplete_details.reason == "max_output_tokens"
    assert len(reply.output_text.split()) == 6
    assert reply.usage is not None and reply.usage.output_tokens == 6
    assert recorded(data_dir, key_id, 1) == (1, reply.usage.input_tokens, 6)


def test_responses_stream_ends_with_the_usage(gateway: tuple[Server, Path, Sim]) -> None:
    server, data_dir, sim = gateway
    key_id, secret = new_key(data_dir)
    with _openai(server, secret) as client:
        events = list(
            client.responses.create(model="nat", input="Write about the sea", stream=True)
        )
    assert _path(sim) == "/v1/responses"
    assert events[0].type == "response.created"
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) == 16  # the sim's default length
    last = events[-1]
    assert last.type == "response.completed" and last.response.usage is not None
    usage = last.response.usage
    assert recorded(data_dir, key_id, 1) == (1, usage.input_tokens, usage.output_tokens)


def test_responses_tool_call_round_trip(gateway: tuple[Server, Path, Sim]) -> None:
    server, data_dir, _ = gateway
    _, secret = new_key(data_dir)
    tools: list[Any] = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
    with _openai(server, secret) as client:
        call = client.responses.create(
            model="nat", input="Weather?", tools=tools, tool_choice="required"
        )
        item = call.output[0]
        assert item.type == "function_call" and item.name == "get_weather"
        assert '"city"' in item.arguments
        reply = client.responses.create(
            model="nat",
            tools=tools,
            input=[
                {"role": "user", "content": "Weather?"},
                {
                    "type": "function_call",
                    "call_id": item.call_id,
                    "name": item.name,
                    "arguments": item.arguments,
                },
                {"type": "function_call_output", "call_id": item.call_id, "output": "Sunny"},
            ],
        )
    assert reply.status == "completed" and reply.output_text


def test_fields_only_a_native_engine_carries(gateway: tuple[Server, Path, Sim]) -> None:
    server, data_dir, sim = gateway
    _, secret = new_key(data_dir)
    with _openai(server, secret) as client:
        stored = client.responses.create(model="nat", input="Hello", store=True)
        assert stored.store is True and _path(sim) == "/v1/responses"
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model="tr", input="Hello", store=True)
        assert refused.value.param == "store"
        with pytest.raises(openai.BadRequestError) as stateful:
            client.responses.create(model="tr", input="Hello", previous_response_id="resp_x")
        assert stateful.value.param == "previous_response_id"
        # Natively the engine judges it: the sim keeps no responses.
        with pytest.raises(openai.NotFoundError) as unknown:
            client.responses.create(model="nat", input="Hello", previous_response_id="resp_x")
        assert unknown.value.param == "previous_response_id"
        assert _path(sim) == "/v1/responses"


@pytest.mark.parametrize("stream", [False, True])
def test_usage_records_match_between_native_and_translated(
    gateway: tuple[Server, Path, Sim], stream: bool
) -> None:
    server, data_dir, sim = gateway
    native_key, native_secret = new_key(data_dir)
    translated_key, translated_secret = new_key(data_dir)
    for model, secret, path in (
        ("nat", native_secret, "/v1/messages"),
        ("tr", translated_secret, "/v1/chat/completions"),
    ):
        with _anthropic(server, secret) as client:
            if stream:
                with client.messages.stream(
                    model=model, max_tokens=7, system="Be brief.", messages=USER
                ) as events:
                    events.get_final_message()
            else:
                client.messages.create(model=model, max_tokens=7, system="Be brief.", messages=USER)
        assert _path(sim) == path
        with _openai(server, secret) as oai:
            created = oai.responses.create(
                model=model,
                instructions="Be brief.",
                input="Write about the sea",
                max_output_tokens=5,
                stream=stream,
            )
            if stream:
                assert isinstance(created, openai.Stream)
                list(created)
    native = recorded(data_dir, native_key, 2)
    translated = recorded(data_dir, translated_key, 2)
    assert native == translated
    assert native[0] == 2 and native[2] == 12


def test_bad_apis_value_is_a_config_error(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(
        "endpoints:\n"
        "  - {id: a, url: 'http://127.0.0.1:9', models: [m], apis: {messages: natively}}\n"
    )
    result = subprocess.run(
        llmgw("server", "--config", str(config), "--data-dir", str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    assert str(config) in result.stderr
    assert "endpoints[0].apis.messages" in result.stderr
    assert "'native' or 'translate'" in result.stderr
    assert "Traceback" not in result.stderr
    config.write_text(
        "endpoints:\n  - {id: a, url: 'http://127.0.0.1:9', models: [m], apis: {chat: native}}\n"
    )
    result = subprocess.run(
        llmgw("server", "--config", str(config), "--data-dir", str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0 and "endpoints[0].apis.chat" in result.stderr


def test_a_native_stream_that_stalls_ends_with_an_error_event_in_the_apis_shape(
    tmp_path: Path,
) -> None:
    sim = Sim("--zero-delay", "--native-apis", "messages,responses", model="nat")
    config = tmp_path / "llmgw.yaml"
    config.write_text(
        "router: {timeouts: {idle: 1}, attempts: 1}\n"
        "endpoints:\n"
        f"  - {{id: native, url: '{sim.url}', models: [nat],"
        " apis: {messages: native, responses: native}}\n"
    )
    server = Server("--config", str(config))
    try:
        sim.faults(stall_after_tokens=2)
        with httpx.stream(
            "POST",
            server.url + "/v1/messages",
            json={"model": "nat", "max_tokens": 8, "stream": True, "messages": USER},
            timeout=30,
        ) as answer:
            body = answer.read()
        assert answer.status_code == 200
        events = [e for e in body.split(b"\n\n") if e.strip()]
        assert events[0].startswith(b"event: message_start")
        # The sim stalls after two tokens (a starved router may time out before reading
        # both, but never sees more).
        assert sum(1 for e in events if b"text_delta" in e) <= 2
        name, data = events[-1].split(b"\n", 1)
        assert name == b"event: error"
        error = json.loads(data.removeprefix(b"data: "))
        assert error["type"] == "error" and error["error"]["type"] == "timeout_error"
        assert "idle deadline" in error["error"]["message"]
    finally:
        server.proc.stop()
        sim.proc.stop()


def test_a_placed_replica_serves_the_apis_its_engine_arguments_name(tmp_path: Path) -> None:
    (tmp_path / "llmgw.yaml").write_text(
        "control: {heartbeat_interval: 0.3, reconcile_interval: 0.5}\n"
        "models:\n"
        "  - name: agentic\n    weights: none\n    min_replicas: 1\n    keep_alive: -1\n"
        "    profiles: [{name: sim, engine: sim, gpus: 1,\n"
        "                engine_args: [--zero-delay, --native-apis, messages]}]\n"
    )
    agent_port = free_port()
    low = free_port_block(5)
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp_path / "llmgw.yaml"),
        data_dir=tmp_path / "data",
    )  # fmt: skip
    agent = Proc(
        llmgw(
            "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", "node-r",
            "--gpus", "1x24GiB", "--weights-dir", str(tmp_path / "weights"),
            "--port-range", f"{low}-{low + 4}",
        )
    )  # fmt: skip
    try:
        wait_for(lambda: len(ready_shards(server)) == 1, "the replica to be ready")
        wait_for(server.endpoints, "the replica to reach the router")
        [endpoint] = server.endpoints()
        assert endpoint["native_apis"] == ["messages"]
        url = str(endpoint["url"])

        def last_path() -> object:
            last = httpx.get(url + "/sim/stats", timeout=10).json()["last_request"]
            return last["path"]

        with anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0) as client:
            reply = client.messages.create(model="agentic", max_tokens=3, messages=USER)
        assert reply.usage.output_tokens == 3 and last_path() == "/v1/messages"
        with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as oai:
            response = oai.responses.create(model="agentic", input="Hello", max_output_tokens=3)
        assert response.status == "incomplete"
        assert last_path() == "/v1/chat/completions"
    except BaseException:
        print(server.proc.output())
        print(agent.output())
        raise
    finally:
        agent.stop()
        server.proc.stop()
