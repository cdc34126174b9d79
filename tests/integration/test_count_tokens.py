"""`/v1/messages/count_tokens` through a real `llmgw server`: counted by the engine's
tokenizer (the sim's `/tokenize`), or estimated when the engine has none."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import pytest
from procs import Server, Sim

MESSAGES: list[anthropic.types.MessageParam] = [
    {"role": "user", "content": "Write about the sea"},
    {"role": "assistant", "content": "The sea is wide."},
    {"role": "user", "content": [{"type": "text", "text": "And the shore?"}]},
]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server]]:
    sim = Sim("--zero-delay", model="m1")
    direct = Server("--endpoint", f"s={sim.url}=m1")
    # A gateway in front of a gateway whose engine serves chat only: no tokenizer route.
    config = tmp_path_factory.mktemp("inner") / "llmgw.yaml"
    config.write_text(
        f"endpoints:\n  - {{id: s, url: '{sim.url}', models: [m1], "
        "routes: [/v1/chat/completions]}\n"
    )
    inner = Server("--config", str(config))
    outer = Server("--endpoint", f"g={inner.url}=m1")
    yield direct, outer
    outer.proc.stop()
    inner.proc.stop()
    direct.proc.stop()
    sim.proc.stop()


def test_counted_by_the_engine_matches_the_usage(servers: tuple[Server, Server]) -> None:
    direct, _ = servers
    with anthropic.Anthropic(base_url=direct.url, api_key="unused", max_retries=0) as client:
        raw = client.messages.with_raw_response.count_tokens(
            model="m1", system="Be brief.", messages=MESSAGES
        )
        counted = raw.parse().input_tokens
        reply = client.messages.create(
            model="m1", max_tokens=3, system="Be brief.", messages=MESSAGES
        )
    assert "x-llmgw-estimated" not in raw.headers
    assert counted == reply.usage.input_tokens > 0


def test_estimated_when_the_engine_has_no_tokenizer(servers: tuple[Server, Server]) -> None:
    _, outer = servers
    with anthropic.Anthropic(base_url=outer.url, api_key="unused", max_retries=0) as client:
        for _ in range(2):  # the second time the replica is known to have none
            raw = client.messages.with_raw_response.count_tokens(model="m1", messages=MESSAGES)
            assert raw.headers["x-llmgw-estimated"] == "true"
            assert raw.parse().input_tokens > 0


def test_errors_in_anthropic_shape(servers: tuple[Server, Server]) -> None:
    direct, _ = servers
    url = direct.url + "/v1/messages/count_tokens"
    missing = httpx.post(url, json={"model": "nope", "messages": MESSAGES})
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "not_found_error"
    bad = httpx.post(url, json={"model": "m1", "messages": "hi"})
    assert bad.status_code == 400
    assert bad.json() == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "messages: must be an array of messages, got a string",
        },
    }
    assert httpx.get(url).status_code == 405
