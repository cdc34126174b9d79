"""The official `openai` Python client works against llmgw unchanged."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from procs import Server, Sim


@pytest.fixture(scope="module")
def client() -> Iterator[openai.OpenAI]:
    sim = Sim("--zero-delay", model="m1")
    server = Server("--endpoint", f"s={sim.url}=m1")
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as api:
        yield api
    server.proc.stop()
    sim.proc.stop()


def test_chat(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="m1", messages=[{"role": "user", "content": "Say hi"}], max_tokens=6
    )
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens == 6


def test_chat_streaming(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="m1", messages=[{"role": "user", "content": "Say hi"}], max_tokens=5, stream=True
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 5
    assert all(c.usage is None for c in chunks)


def test_chat_streaming_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="m1",
        messages=[{"role": "user", "content": "Say hi"}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 4


def test_completions(client: openai.OpenAI) -> None:
    reply = client.completions.create(model="m1", prompt="The capital of France is", max_tokens=3)
    assert reply.choices[0].text
    assert reply.usage is not None and reply.usage.total_tokens == reply.usage.prompt_tokens + 3


def test_embeddings(client: openai.OpenAI) -> None:
    reply = client.embeddings.create(model="m1", input=["one", "two"])
    assert len(reply.data) == 2
    assert len(reply.data[0].embedding) == 64


def test_models(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["m1"]
    assert client.models.retrieve("m1").id == "m1"


def test_errors_surface_as_openai_exceptions(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert info.value.code == "model_not_found"
