"""Real vLLM behind llmgw: activation from zero, the OpenAI, Anthropic and Responses
APIs (native in vLLM, passed through), tokenizing, and usage as vLLM counts it.

SmolLM2-135M-Instruct with temperature 0 answers "The capital of France is Paris."
to the question about France; other answers are not asserted word for word.
"""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest
from vllm_fleet import MODEL, Fleet, data_events, stream_lines

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_a_stream_sent_while_nothing_runs_waits_with_keepalives_and_is_answered_by_vllm(
    vllm_fleet: Fleet,
) -> None:
    record = vllm_fleet.activation
    assert record.replica_before == []
    assert record.status == 200
    # The headers went out while vLLM loaded; comments kept the connection alive.
    assert any(c.startswith(": llmgw is starting model smollm2") for c in record.comments)
    assert record.done, record.events
    text = "".join(
        c["delta"].get("content") or "" for e in record.events for c in e.get("choices", [])
    )
    assert "Paris" in text, text
    [shard] = vllm_fleet.ready()
    assert shard["model"] == MODEL and shard["pid"]
    shown = vllm_fleet.cli("models", "show", MODEL).stdout
    assert "ready" in shown and "cpu-node" in shown, shown


def test_chat_through_the_openai_sdk_bills_what_vllm_counted(vllm_fleet: Fleet) -> None:
    with openai.OpenAI(
        base_url=vllm_fleet.server.url + "/v1", api_key=vllm_fleet.key, max_retries=0,
        timeout=120,
    ) as client:  # fmt: skip
        answer = client.chat.completions.create(
            model=MODEL, messages=QUESTION, temperature=0, max_tokens=12,  # type: ignore[arg-type]
            extra_headers={"x-request-id": "vllm-chat-sdk"},
        )  # fmt: skip
    assert answer.choices[0].message.content == "The capital of France is Paris."
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None
    # The same request straight to vLLM: llmgw passes vLLM's own counts on.
    direct = httpx.post(
        vllm_fleet.endpoint_url() + "/v1/chat/completions",
        json={"model": MODEL, "messages": QUESTION, "temperature": 0, "max_tokens": 12},
        timeout=120,
    ).json()
    assert answer.usage.prompt_tokens == direct["usage"]["prompt_tokens"]
    assert answer.usage.completion_tokens == direct["usage"]["completion_tokens"]
    record = vllm_fleet.record("vllm-chat-sdk")
    assert record["model"] == MODEL and record["status"] == 200, record
    assert record["prompt_tokens"] == answer.usage.prompt_tokens, record
    assert record["completion_tokens"] == answer.usage.completion_tokens, record


def test_completions_and_a_stream_with_usage(vllm_fleet: Fleet) -> None:
    with vllm_fleet.client() as client:
        plain = client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "The capital of France is", "max_tokens": 6,
                  "temperature": 0},
        )  # fmt: skip
        assert plain.status_code == 200, plain.text
        body = plain.json()
        assert body["object"] == "text_completion" and body["choices"][0]["text"]
        assert body["usage"]["completion_tokens"] == 6
        status, lines = stream_lines(
            client,
            "/v1/chat/completions",
            {"model": MODEL, "messages": QUESTION, "temperature": 0, "max_tokens": 12,
             "stream": True, "stream_options": {"include_usage": True}},
            headers={"x-request-id": "vllm-chat-stream"},
        )  # fmt: skip
    assert status == 200
    events, done = data_events(lines)
    assert done
    usage = events[-1]["usage"]
    assert events[-1]["choices"] == [] and usage["completion_tokens"] == 8, events[-1]
    record = vllm_fleet.record("vllm-chat-stream")
    assert (record["prompt_tokens"], record["completion_tokens"]) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    ), record


def test_anthropic_messages_pass_through_to_vllm(vllm_fleet: Fleet) -> None:
    with anthropic.Anthropic(
        base_url=vllm_fleet.server.url, api_key=vllm_fleet.key, max_retries=0, timeout=120
    ) as claude:
        message = claude.messages.create(
            model=MODEL, max_tokens=12, extra_body={"temperature": 0},
            messages=[{"role": "user", "content": "What is the capital of France?"}],
        )  # fmt: skip
        assert message.content[0].type == "text"
        assert "Paris" in message.content[0].text
        assert message.stop_reason == "end_turn"
        with claude.messages.stream(
            model=MODEL, max_tokens=4, extra_body={"temperature": 0},
            extra_headers={"x-request-id": "vllm-messages-stream"},
            messages=[{"role": "user", "content": "What is the capital of France?"}],
        ) as stream:  # fmt: skip
            kinds = [event.type for event in stream]
            final = stream.get_final_message()
        counted = claude.messages.count_tokens(
            model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}]
        )
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.usage.output_tokens == 4 and final.stop_reason == "max_tokens"
    assert final.usage.input_tokens == message.usage.input_tokens
    assert counted.input_tokens == message.usage.input_tokens
    record = vllm_fleet.record("vllm-messages-stream")
    assert record["completion_tokens"] == 4, record
    assert record["prompt_tokens"] == final.usage.input_tokens, record


def test_openai_responses_pass_through_to_vllm(vllm_fleet: Fleet) -> None:
    with openai.OpenAI(
        base_url=vllm_fleet.server.url + "/v1", api_key=vllm_fleet.key, max_retries=0,
        timeout=120,
    ) as client:  # fmt: skip
        response = client.responses.create(
            model=MODEL, input="What is the capital of France?", max_output_tokens=12,
            temperature=0,
        )  # fmt: skip
        assert "Paris" in response.output_text
        assert response.usage is not None and response.usage.output_tokens > 0
        with client.responses.stream(
            model=MODEL, input="What is the capital of France?", max_output_tokens=4,
            temperature=0,
        ) as stream:  # fmt: skip
            kinds = [event.type for event in stream]
            final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
    assert "response.output_text.delta" in kinds
    assert final.usage is not None and final.usage.output_tokens == 4
    assert final.usage.input_tokens == response.usage.input_tokens


def test_tokenize_and_detokenize_go_to_vllm(vllm_fleet: Fleet) -> None:
    with vllm_fleet.client() as client:
        tokens = client.post("/tokenize", json={"model": MODEL, "prompt": "Hello world"})
        assert tokens.status_code == 200, tokens.text
        ids = tokens.json()["tokens"]
        assert tokens.json()["count"] == len(ids) > 0
        text = client.post("/detokenize", json={"model": MODEL, "tokens": ids})
        assert text.status_code == 200, text.text
        assert text.json()["prompt"] == "Hello world"
